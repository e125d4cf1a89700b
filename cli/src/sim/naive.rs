//! Strategy (a): naive layered retries, modelled directly (this is what
//! retrywise replaces, so it does not go through the engine).
//!
//! Three layers, outermost first: the client's retry loop calls the SDK, the
//! SDK calls the gateway, the gateway calls the upstream. Each layer makes up to
//! `attempts` attempts with a fixed backoff, retries every failure (errors,
//! 429/529, timeouts — Retry-After is ignored), and has its own per-attempt
//! timeout. There is no end-to-end deadline: when an outer layer's attempt times
//! out, the inner call is not cancelled — it keeps retrying, orphaned, and its
//! result is thrown away.
//!
//! The user behind the client still has a deadline (the same one the engine
//! strategies get): a request not answered by then counts as failed at the
//! deadline, while the layers below, unaware, go on working.

use super::core::{Arrivals, Metrics, Queue, EV_ARRIVAL};
use super::rng::Rng;
use super::scenario::Scenario;
use super::upstream::{Reply, Upstream};
use std::sync::atomic::{AtomicU64, Ordering};

const NONE: u32 = u32::MAX;
const EV_PHYS_DONE: u8 = 0;
const EV_PHYS_FAIL: u8 = 1;
const EV_TIMEOUT: u8 = 2;
const EV_RETRY: u8 = 3;
const EV_USER_DEADLINE: u8 = 4;

#[derive(Debug, Clone, Copy)]
struct NCall {
    parent: u32,
    parent_token: u32,
    token: u32,
    layer: u8,
    attempt: u8,
    waiting: bool,
    /// Attempts count toward the measured totals (inherited from the logical request).
    measured: bool,
    /// Root only: the user still waits for this measured request.
    open: bool,
    serial: u32,
    arrival_us: u64,
}

struct Run<'a> {
    sc: &'a Scenario,
    q: Queue,
    up: Upstream,
    m: Metrics,
    calls: Vec<NCall>,
    free: Vec<u32>,
    next_token: u32,
    timeouts_us: [u64; 3],
    backoff_us: u64,
    last: u8,
    arrivals: Arrivals,
}

impl Run<'_> {
    fn alloc(&mut self, c: NCall) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.calls[i as usize] = c;
                i
            }
            None => {
                self.calls.push(c);
                (self.calls.len() - 1) as u32
            }
        }
    }

    fn token(&mut self) -> u32 {
        self.next_token = self.next_token.wrapping_add(1);
        self.next_token
    }

    fn start_attempt(&mut self, id: u32, now: u64) {
        let token = self.token();
        let c = &mut self.calls[id as usize];
        c.attempt += 1;
        c.token = token;
        c.waiting = true;
        let layer = c.layer;
        let measured = c.measured;
        if layer == self.last {
            self.m.attempt(now, measured);
            let cond = self.sc.conditions(now / 1000);
            let r = self.up.send(now, &cond);
            let timeout_at = now + self.timeouts_us[layer as usize];
            let (t, kind) = if r.at_us > timeout_at {
                (timeout_at, EV_PHYS_FAIL)
            } else if r.reply == Reply::Ok {
                (r.at_us, EV_PHYS_DONE)
            } else {
                (r.at_us, EV_PHYS_FAIL)
            };
            if kind == EV_PHYS_FAIL && c.attempt < self.sc.naive_layers[layer as usize].attempts {
                // Nothing outside this call can change what it does next (an outer
                // timeout orphans it but does not cancel it): schedule the retry
                // right away instead of a failure event that would only do so.
                self.calls[id as usize].waiting = false;
                self.q.push(t + self.backoff_us, EV_RETRY, id, token);
            } else {
                self.q.push(t, kind, id, token);
            }
        } else {
            self.q
                .push(now + self.timeouts_us[layer as usize], EV_TIMEOUT, id, token);
            let child = self.alloc(NCall {
                parent: id,
                parent_token: token,
                token: 0,
                layer: layer + 1,
                attempt: 0,
                waiting: false,
                measured,
                open: false,
                serial: 0,
                arrival_us: 0,
            });
            self.start_attempt(child, now);
        }
    }

    /// The current attempt of `id` ended.
    fn on_result(&mut self, id: u32, ok: bool, now: u64) {
        let c = &mut self.calls[id as usize];
        c.waiting = false;
        if ok {
            self.finish(id, true, now);
        } else if c.attempt < self.sc.naive_layers[c.layer as usize].attempts {
            let token = c.token;
            self.q.push(now + self.backoff_us, EV_RETRY, id, token);
        } else {
            self.finish(id, false, now);
        }
    }

    fn finish(&mut self, id: u32, ok: bool, now: u64) {
        let c = self.calls[id as usize];
        self.calls[id as usize].waiting = false;
        self.free.push(id);
        if c.parent == NONE {
            self.calls[id as usize].serial = 0;
            if c.open {
                self.m.done(c.arrival_us, now, ok);
                self.arrivals.finished();
            }
            return;
        }
        let p = self.calls[c.parent as usize];
        if p.waiting && p.token == c.parent_token {
            self.on_result(c.parent, ok, now);
        }
        // Otherwise the parent gave up on this attempt (timeout): an orphan's result is dropped.
    }
}

/// Runs strategy (a); `progress` receives the simulated time in ms.
pub fn run(sc: &Scenario, progress: &AtomicU64) -> (Metrics, Upstream) {
    let mut r = Run {
        sc,
        q: Queue::default(),
        up: Upstream::new(sc.upstream, Rng::stream(sc.seed, 2)),
        m: Metrics::default(),
        calls: Vec::new(),
        free: Vec::new(),
        next_token: 0,
        timeouts_us: sc.naive_layers.map(|l| l.timeout_ms * 1000),
        backoff_us: sc.naive_backoff_ms * 1000,
        last: (sc.naive_layers.len() - 1) as u8,
        arrivals: Arrivals::new(sc),
    };
    r.q.push(r.arrivals.first(), EV_ARRIVAL, 0, 0);
    let deadline_us = sc.deadline_ms * 1000;
    let mut serial: u32 = 0;
    let mut n: u64 = 0;
    while let Some(e) = r.q.pop() {
        if !r.arrivals.more() {
            break;
        }
        n += 1;
        if n & 0xFFFF == 0 {
            progress.store(e.t / 1000, Ordering::Relaxed);
        }
        if e.kind == EV_ARRIVAL {
            let (measured, _, next) = r.arrivals.take(sc);
            if let Some(next) = next {
                r.q.push(next, EV_ARRIVAL, 0, 0);
            }
            serial = serial.wrapping_add(1).max(1);
            let id = r.alloc(NCall {
                parent: NONE,
                parent_token: 0,
                token: 0,
                layer: 0,
                attempt: 0,
                waiting: false,
                measured,
                open: measured,
                serial,
                arrival_us: e.t,
            });
            if measured {
                r.m.arrival(e.t);
                r.q.push(e.t + deadline_us, EV_USER_DEADLINE, id, serial);
            }
            r.start_attempt(id, e.t);
            continue;
        }
        if e.kind == EV_USER_DEADLINE {
            let c = &mut r.calls[e.id as usize];
            if c.parent == NONE && c.serial == e.token && c.open {
                // The user gives up; the layers below do not know and go on.
                c.open = false;
                r.m.done(c.arrival_us, e.t, false);
                r.arrivals.finished();
            }
            continue;
        }
        let c = r.calls[e.id as usize];
        if c.token != e.token {
            continue;
        }
        if e.kind == EV_RETRY {
            if !c.waiting {
                r.start_attempt(e.id, e.t);
            }
        } else if c.waiting {
            r.on_result(e.id, e.kind == EV_PHYS_DONE, e.t);
        }
    }
    progress.store(u64::MAX, Ordering::Relaxed);
    (r.m, r.up)
}
