//! Pieces every strategy's event loop shares: the event queue, the arrival
//! process and the per-second metrics.

use super::rng::Rng;
use super::scenario::Scenario;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One scheduled event. Ordered by time, then kind, call and token: a total
/// order over pending events (no two share all four), so a run is a pure
/// function of the seed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ev {
    /// Time, µs.
    pub t: u64,
    /// Strategy-defined kind.
    pub kind: u8,
    /// Slot of the call the event belongs to.
    pub id: u32,
    /// Token of the attempt (stale events carry an old token and are ignored).
    pub token: u32,
}

const WHEEL_BITS: u32 = 15;
const WHEEL: u64 = 1 << WHEEL_BITS;
const CHUNK: usize = 32;
const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Chunk {
    evs: [Ev; CHUNK],
    len: u32,
    next: u32,
}

/// The event queue: a timing wheel of 1 ms slots (2^15 ms ≈ 33 s ahead, past
/// every timeout in the scenarios) plus a heap for events further out. A slot is
/// a list of fixed-size chunks from one pool (memory follows the events pending,
/// not the busiest millisecond ever seen); when the clock reaches a slot, its
/// events are sorted into `cur`.
///
/// Events must never be scheduled before the last one popped (time only moves
/// forward), which holds because every event is scheduled while handling one.
#[derive(Debug)]
pub struct Queue {
    heads: Vec<u32>,
    chunks: Vec<Chunk>,
    free: Vec<u32>,
    /// The current millisecond's events, latest first.
    cur: Vec<Ev>,
    cur_ms: u64,
    count: usize,
    far: BinaryHeap<Reverse<Ev>>,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            heads: vec![NIL; WHEEL as usize],
            chunks: Vec::new(),
            free: Vec::new(),
            cur: Vec::new(),
            cur_ms: 0,
            count: 0,
            far: BinaryHeap::new(),
        }
    }
}

impl Queue {
    #[inline]
    fn slot_push(&mut self, ms: u64, ev: Ev) {
        let slot = (ms & (WHEEL - 1)) as usize;
        let h = self.heads[slot];
        if h != NIL {
            let c = &mut self.chunks[h as usize];
            if (c.len as usize) < CHUNK {
                c.evs[c.len as usize] = ev;
                c.len += 1;
                return;
            }
        }
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.chunks.push(Chunk {
                    evs: [Ev::default(); CHUNK],
                    len: 0,
                    next: NIL,
                });
                (self.chunks.len() - 1) as u32
            }
        };
        let c = &mut self.chunks[idx as usize];
        c.evs[0] = ev;
        c.len = 1;
        c.next = h;
        self.heads[slot] = idx;
    }

    /// Schedules an event at `t` µs (not before the last event popped).
    #[inline]
    pub fn push(&mut self, t: u64, kind: u8, id: u32, token: u32) {
        let ev = Ev { t, kind, id, token };
        self.count += 1;
        let ms = (t / 1000).max(self.cur_ms);
        if ms == self.cur_ms {
            let pos = self.cur.partition_point(|e| e > &ev);
            self.cur.insert(pos, ev);
        } else if ms - self.cur_ms >= WHEEL {
            self.far.push(Reverse(ev));
        } else {
            self.slot_push(ms, ev);
        }
    }

    /// Takes the next event.
    #[inline]
    pub fn pop(&mut self) -> Option<Ev> {
        if self.count == 0 {
            return None;
        }
        loop {
            if let Some(e) = self.cur.pop() {
                self.count -= 1;
                return Some(e);
            }
            self.cur_ms += 1;
            let horizon = self.cur_ms + WHEEL;
            while let Some(Reverse(e)) = self.far.peek().copied() {
                if e.t / 1000 >= horizon {
                    break;
                }
                self.far.pop();
                self.slot_push((e.t / 1000).max(self.cur_ms), e);
            }
            let slot = (self.cur_ms & (WHEEL - 1)) as usize;
            let mut h = std::mem::replace(&mut self.heads[slot], NIL);
            while h != NIL {
                let c = &self.chunks[h as usize];
                self.cur.extend_from_slice(&c.evs[..c.len as usize]);
                self.free.push(h);
                h = c.next;
            }
            if self.cur.len() > 1 {
                self.cur.sort_unstable_by(|a, b| b.cmp(a));
            }
        }
    }

    /// True when nothing is pending.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// Event kind reserved for arrivals.
pub const EV_ARRIVAL: u8 = 255;

/// Poisson arrivals at `qps × surge factor`, each assigned to a random instance.
///
/// Only arrivals inside the window (`duration`) are measured. Traffic goes on
/// after the window while measured requests are still in flight, so their last
/// retries meet a realistic upstream and retry budget instead of an idle world.
#[derive(Debug)]
pub struct Arrivals {
    rng: Rng,
    next_us: u64,
    /// End of the measured window, µs.
    pub window_end_us: u64,
    qps: f64,
    instances: u64,
    /// Measured requests still in flight.
    pub outstanding: u64,
}

impl Arrivals {
    /// Arrivals for the scenario (same seed → same arrivals for every strategy).
    pub fn new(sc: &Scenario) -> Self {
        let mut a = Arrivals {
            rng: Rng::stream(sc.seed, 1),
            next_us: 0,
            window_end_us: sc.duration_s * 1_000_000,
            qps: sc.qps,
            instances: sc.instances as u64,
            outstanding: 0,
        };
        a.next_us = a.gap(sc, 0);
        a
    }

    fn gap(&mut self, sc: &Scenario, now_us: u64) -> u64 {
        let rate = self.qps * sc.conditions(now_us / 1000).qps_factor;
        now_us + self.rng.exp(1e6 / rate).max(1.0) as u64
    }

    /// Time of the first arrival.
    pub fn first(&self) -> u64 {
        self.next_us
    }

    /// Takes the arrival due now: whether it is measured, its instance, and the
    /// time of the next arrival (none once the window is over and no measured
    /// request is left in flight).
    pub fn take(&mut self, sc: &Scenario) -> (bool, u32, Option<u64>) {
        let measured = self.next_us < self.window_end_us;
        if measured {
            self.outstanding += 1;
        }
        let inst = if self.instances > 1 {
            self.rng.below(self.instances) as u32
        } else {
            0
        };
        self.next_us = self.gap(sc, self.next_us);
        (measured, inst, self.more().then_some(self.next_us))
    }

    /// A measured request finished.
    pub fn finished(&mut self) {
        self.outstanding -= 1;
    }

    /// Whether the run must go on: inside the window, or measured requests in flight.
    pub fn more(&self) -> bool {
        self.next_us < self.window_end_us || self.outstanding > 0
    }
}

/// Longest latency the histograms resolve (1 ms buckets); longer ones land in the last bucket.
pub const MAX_LATENCY_MS: usize = 400_000;

/// Per-second series and latency histograms of one strategy.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Logical requests by arrival second.
    pub logical: Vec<u32>,
    /// Physical attempts by start second.
    pub attempts: Vec<u32>,
    /// Successful logical requests by arrival second.
    pub ok_by_arrival: Vec<u32>,
    /// Successful logical requests by completion second (goodput).
    pub ok_by_completion: Vec<u32>,
    /// Retries the budget refused, by second.
    pub budget_refusals: Vec<u32>,
    /// Calls stopped by an open breaker, by second.
    pub breaker_stops: Vec<u32>,
    lat_all: Vec<u32>,
    lat_ok: Vec<u32>,
    /// Logical requests begun.
    pub total_logical: u64,
    /// Physical attempts started by measured requests.
    pub total_attempts: u64,
    /// Logical requests that succeeded.
    pub total_ok: u64,
    /// Logical requests that finished (success or not).
    pub total_done: u64,
    /// Attempts an engine's breaker admitted while open or half-open (its probes).
    pub probes: u64,
    /// Breakers opened by the fleet's quorum (`--shared`).
    pub fleet_opened: u64,
}

#[inline]
pub fn bump(v: &mut Vec<u32>, i: usize) {
    if v.len() <= i {
        v.resize(i + 1, 0);
    }
    v[i] += 1;
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            logical: Vec::new(),
            attempts: Vec::new(),
            ok_by_arrival: Vec::new(),
            ok_by_completion: Vec::new(),
            budget_refusals: Vec::new(),
            breaker_stops: Vec::new(),
            lat_all: vec![0; MAX_LATENCY_MS + 1],
            lat_ok: vec![0; MAX_LATENCY_MS + 1],
            total_logical: 0,
            total_attempts: 0,
            total_ok: 0,
            total_done: 0,
            probes: 0,
            fleet_opened: 0,
        }
    }
}

impl Metrics {
    /// A logical request arrived.
    #[inline]
    pub fn arrival(&mut self, t_us: u64) {
        bump(&mut self.logical, (t_us / 1_000_000) as usize);
        self.total_logical += 1;
    }

    /// A physical attempt started (the series counts all traffic; the total only measured requests).
    #[inline]
    pub fn attempt(&mut self, t_us: u64, measured: bool) {
        bump(&mut self.attempts, (t_us / 1_000_000) as usize);
        self.total_attempts += measured as u64;
    }

    /// A logical request that arrived at `arrival_us` finished at `now_us`.
    #[inline]
    pub fn done(&mut self, arrival_us: u64, now_us: u64, ok: bool) {
        let ms = ((now_us - arrival_us) / 1000).min(MAX_LATENCY_MS as u64) as usize;
        self.lat_all[ms] += 1;
        self.total_done += 1;
        if ok {
            self.lat_ok[ms] += 1;
            self.total_ok += 1;
            bump(&mut self.ok_by_arrival, (arrival_us / 1_000_000) as usize);
            bump(&mut self.ok_by_completion, (now_us / 1_000_000) as usize);
        }
    }

    /// A call stopped at `t_us` for `reason`.
    #[inline]
    pub fn stop(&mut self, t_us: u64, reason: retrywise::Reason) {
        let s = (t_us / 1_000_000) as usize;
        match reason {
            retrywise::Reason::BudgetExhausted => bump(&mut self.budget_refusals, s),
            retrywise::Reason::BreakerOpen => bump(&mut self.breaker_stops, s),
            _ => {}
        }
    }

    /// Latency percentile over every finished logical request (`q` in [0, 1]), ms.
    pub fn latency_all(&self, q: f64) -> Option<u64> {
        percentile(&self.lat_all, q)
    }

    /// Latency percentile over successful logical requests, ms.
    pub fn latency_ok(&self, q: f64) -> Option<u64> {
        percentile(&self.lat_ok, q)
    }
}

/// Nearest-rank percentile of a 1-ms histogram.
pub fn percentile(hist: &[u32], q: f64) -> Option<u64> {
    let total: u64 = hist.iter().map(|&c| c as u64).sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0u64;
    for (ms, &c) in hist.iter().enumerate() {
        seen += c as u64;
        if seen >= rank {
            return Some(ms as u64);
        }
    }
    Some(hist.len() as u64 - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_orders_by_time_then_call() {
        let mut q = Queue::default();
        q.push(5, 0, 1, 0);
        q.push(3, 0, 2, 0);
        q.push(5, 0, 3, 0);
        q.push(200_000_000, 0, 4, 0); // beyond the wheel
        q.push(1_500, 0, 5, 0);
        let first = q.pop().unwrap();
        assert_eq!(first.id, 2);
        q.push(4, 0, 6, 0); // into the current, already sorted slot
        q.push(150_000_000, 0, 7, 0);
        let order: Vec<u32> = std::iter::from_fn(|| q.pop()).map(|e| e.id).collect();
        assert_eq!(order, vec![6, 1, 3, 5, 7, 4]);
        assert!(q.is_empty());
    }

    #[test]
    fn queue_matches_a_heap_on_random_schedules() {
        let mut rng = Rng::new(3);
        let mut q = Queue::default();
        let mut h = BinaryHeap::new();
        let mut seq = 0u64;
        let mut now = 0u64;
        for step in 0..200_000u32 {
            if step % 3 != 2 || h.is_empty() {
                let t = now + rng.below(if step % 7 == 0 { 300_000_000 } else { 5_000 });
                seq += 1;
                q.push(t, 0, step, 0);
                h.push(Reverse((t, seq, step)));
            } else {
                let a = q.pop().unwrap();
                let Reverse((t, _, id)) = h.pop().unwrap();
                assert_eq!((a.t, a.id), (t, id));
                now = t;
            }
        }
        while let Some(Reverse((t, _, id))) = h.pop() {
            let a = q.pop().unwrap();
            assert_eq!((a.t, a.id), (t, id));
        }
        assert!(q.pop().is_none());
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut h = vec![0u32; 10];
        h[1] = 50;
        h[9] = 50;
        assert_eq!(percentile(&h, 0.5), Some(1));
        assert_eq!(percentile(&h, 0.51), Some(9));
        assert_eq!(percentile(&h, 0.99), Some(9));
        assert_eq!(percentile(&[0, 0], 0.5), None);
    }
}
