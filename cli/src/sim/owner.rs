//! Strategies (b) and (c): one retry owner, driven through the real
//! `retrywise::Engine` exactly like a gateway would drive it — `begin`, then
//! `next_attempt` / perform the I/O / `report`, sleeping `decision.delay`
//! between attempts. The simulation only moves a [`ManualClock`] to each event's
//! time; every decision (retry or stop, wait, budget, breaker) is the engine's.

use super::core::{Arrivals, Metrics, Queue, EV_ARRIVAL};
use super::rng::{mix, Rng};
use super::scenario::Scenario;
use super::shared::{Shared, EV_SYNC};
use super::upstream::{Limits, Reply, Upstream};
use retrywise::{Action, BreakerState, Call, CallSpec, Engine, ErrorKind, ManualClock, Mode, Outcome, Policy, Stats};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const EV_DONE: u8 = 0;
const EV_WAKE: u8 = 1;

/// The upstream's name in the engine (breaker and budget scope).
pub const UPSTREAM: &str = "provider";

/// What the client saw for an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Reply(Reply),
    Timeout,
}

struct Slot {
    call: Option<Call>,
    inst: u32,
    token: u32,
    measured: bool,
    arrival_us: u64,
    seen: Seen,
    /// The rate limit the last answer stated.
    limits: Option<Limits>,
}

struct Run<'a> {
    sc: &'a Scenario,
    engines: &'a [Engine],
    q: Queue,
    up: Upstream,
    m: Metrics,
    slots: Vec<Slot>,
    free: Vec<u32>,
    next_token: u32,
    clock: ManualClock,
    clock_us: u64,
    arrivals: Arrivals,
}

impl Run<'_> {
    #[inline]
    fn advance(&mut self, now: u64) {
        if now > self.clock_us {
            self.clock.advance(Duration::from_micros(now - self.clock_us));
            self.clock_us = now;
        }
    }

    fn try_attempt(&mut self, id: u32, now: u64) {
        let slot = &mut self.slots[id as usize];
        let Some(call) = slot.call.as_mut() else { return };
        // An attempt the breaker admits while open or half-open is a probe.
        let state = self.engines[slot.inst as usize].breaker_state(UPSTREAM);
        let probe = matches!(state, BreakerState::Open | BreakerState::HalfOpen);
        match call.next_attempt() {
            Ok(a) => {
                self.m.probes += probe as u64;
                self.next_token = self.next_token.wrapping_add(1);
                slot.token = self.next_token;
                let timeout_at = now + a.timeouts().total.as_micros() as u64;
                self.m.attempt(now, slot.measured);
                let cond = self.sc.conditions(now / 1000);
                let r = self.up.send(now, &cond);
                let (t, seen) = if r.at_us > timeout_at {
                    (timeout_at, Seen::Timeout)
                } else {
                    (r.at_us, Seen::Reply(r.reply))
                };
                slot.seen = seen;
                slot.limits = r.limits;
                self.q.push(t, EV_DONE, id, slot.token);
            }
            // Not yet (the breaker admits probes later, within the deadline): ask again then.
            Err(stopped) if !stopped.is_final() => {
                let wait = stopped.wait.unwrap_or_default().as_micros() as u64;
                let token = slot.token;
                self.q.push(now + wait, EV_WAKE, id, token);
            }
            Err(stopped) => {
                if slot.measured {
                    self.m.stop(now, stopped.reason);
                }
                self.finish(id, false, now)
            }
        }
    }

    fn on_done(&mut self, id: u32, now: u64) {
        let slot = &mut self.slots[id as usize];
        let Some(call) = slot.call.as_mut() else { return };
        let mut outcome = match slot.seen {
            Seen::Reply(Reply::Ok) => Outcome::status(200),
            Seen::Reply(Reply::Error(s)) => Outcome::status(s),
            Seen::Reply(Reply::Overloaded) => Outcome::status(529),
            Seen::Reply(Reply::Down) => Outcome::status(503),
            Seen::Reply(Reply::RateLimited(secs)) => Outcome::status(429).header("retry-after", &secs.to_string()),
            Seen::Timeout => Outcome::error(ErrorKind::FirstByteTimeout),
        };
        if let (Seen::Reply(_), Some(l)) = (slot.seen, slot.limits) {
            for (name, value) in l.headers() {
                outcome.headers.insert(name, &value);
            }
        }
        let d = call.report(&outcome);
        match d.action {
            Action::Succeeded => self.finish(id, true, now),
            Action::Retry | Action::Fallback => {
                let token = slot.token;
                self.q.push(now + d.delay.as_micros() as u64, EV_WAKE, id, token);
            }
            // No hedging here: no sibling to wait for.
            Action::Wait => unreachable!("the simulator sends no hedges"),
            Action::Stop | Action::Reconcile => {
                if slot.measured {
                    self.m.stop(now, d.reason);
                }
                self.finish(id, false, now)
            }
        }
    }

    fn finish(&mut self, id: u32, ok: bool, now: u64) {
        let slot = &mut self.slots[id as usize];
        slot.call = None;
        let (arrival, measured) = (slot.arrival_us, slot.measured);
        self.free.push(id);
        if measured {
            self.m.done(arrival, now, ok);
            self.arrivals.finished();
        }
    }
}

/// Builds one engine per instance, all on the same manual clock.
pub fn engines(policy: &Policy, sc: &Scenario, clock: &ManualClock) -> Result<Vec<Engine>, String> {
    (0..sc.instances)
        .map(|i| {
            Engine::builder(policy.clone())
                .clock(Arc::new(clock.clone()))
                .seed(mix(sc.seed ^ mix(0xE000 + i as u64)))
                .mode(Mode::default())
                .build()
                .map_err(|e| format!("policy {}: {e}", policy.version))
        })
        .collect()
}

/// Runs an engine-driven strategy with `policy`; returns the metrics, the
/// upstream, and each instance's `Engine::stats()` at the end.
pub fn run(sc: &Scenario, policy: &Policy, progress: &AtomicU64) -> Result<(Metrics, Upstream, Vec<Stats>), String> {
    let clock = ManualClock::new();
    let engines = engines(policy, sc, &clock)?;
    let spec = CallSpec::new(UPSTREAM).deadline_ms(sc.deadline_ms);
    let mut r = Run {
        sc,
        engines: &engines,
        q: Queue::default(),
        up: Upstream::new(sc.upstream, Rng::stream(sc.seed, 2)),
        m: Metrics::default(),
        slots: Vec::new(),
        free: Vec::new(),
        next_token: 0,
        clock,
        clock_us: 0,
        arrivals: Arrivals::new(sc),
    };
    r.q.push(r.arrivals.first(), EV_ARRIVAL, 0, 0);
    let mut shared = match sc.shared {
        true => Some(Shared::attach(&engines, &mut r.q)?),
        false => None,
    };
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
            let (measured, inst, next) = r.arrivals.take(sc);
            if let Some(next) = next {
                r.q.push(next, EV_ARRIVAL, 0, 0);
            }
            r.advance(e.t);
            if measured {
                r.m.arrival(e.t);
            }
            let call = engines[inst as usize].begin(spec.clone());
            let slot = Slot {
                call: Some(call),
                inst,
                token: 0,
                measured,
                arrival_us: e.t,
                seen: Seen::Timeout,
                limits: None,
            };
            let id = match r.free.pop() {
                Some(i) => {
                    r.slots[i as usize] = slot;
                    i
                }
                None => {
                    r.slots.push(slot);
                    (r.slots.len() - 1) as u32
                }
            };
            r.try_attempt(id, e.t);
            continue;
        }
        if e.kind == EV_SYNC {
            if let Some(sh) = shared.as_mut() {
                r.advance(e.t);
                sh.sync(e.id, e.t, &r.clock, &mut r.q);
            }
            continue;
        }
        let s = &r.slots[e.id as usize];
        if s.token != e.token || s.call.is_none() {
            continue;
        }
        r.advance(e.t);
        match e.kind {
            EV_DONE => r.on_done(e.id, e.t),
            _ => r.try_attempt(e.id, e.t),
        }
    }
    progress.store(u64::MAX, Ordering::Relaxed);
    r.m.fleet_opened = shared.map_or(0, |s| s.opened);
    let stats = engines.iter().map(Engine::stats).collect();
    Ok((r.m, r.up, stats))
}
