//! Circuit breaker per scope: closed → open → half-open → closed, with a
//! count- or time-based rolling window (O(1) updates), `min_calls` before any
//! rate is judged, failure-rate / slow-call-rate / consecutive-failure trips,
//! open durations that grow on repeated trips (with jitter so instances do not
//! probe in lockstep), bounded half-open probes and manual overrides.

use crate::policy::{Breaker as BreakerPolicy, BreakerOverride, WindowKind};
use crate::sync::Mutex;
use crate::types::ErrorClass;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;

/// Breaker state as seen by callers and telemetry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    /// Calls flow; outcomes are recorded.
    Closed,
    /// Calls are refused until the open period ends.
    Open,
    /// A few probes test recovery.
    HalfOpen,
    /// Manually forced open.
    ForcedOpen,
    /// Manually forced closed (still recording).
    ForcedClosed,
    /// No breaker.
    Disabled,
    /// Records, never trips.
    MetricsOnly,
}

impl BreakerState {
    /// Stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
            BreakerState::ForcedOpen => "forced_open",
            BreakerState::ForcedClosed => "forced_closed",
            BreakerState::Disabled => "disabled",
            BreakerState::MetricsOnly => "metrics_only",
        }
    }
}

impl From<BreakerOverride> for BreakerState {
    fn from(o: BreakerOverride) -> Self {
        match o {
            BreakerOverride::ForceOpen => BreakerState::ForcedOpen,
            BreakerOverride::ForceClosed => BreakerState::ForcedClosed,
            BreakerOverride::Disabled => BreakerState::Disabled,
            BreakerOverride::MetricsOnly => BreakerState::MetricsOnly,
        }
    }
}

/// A state change, for telemetry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Transition {
    /// Previous state.
    pub from: BreakerState,
    /// New state.
    pub to: BreakerState,
    /// Why: `failure_rate`, `slow_call_rate`, `consecutive_failures`,
    /// `open_elapsed`, `probe_failed`, `probes_succeeded`.
    pub reason: &'static str,
    /// How long the breaker stays open (0 unless `to` is open), ms.
    pub open_for_ms: u64,
}

/// Whether an attempt may go to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Go; `probe` is true in half-open (the permit must be returned by `record` or `release`).
    Allowed {
        /// This attempt is a half-open probe.
        probe: bool,
    },
    /// Refused; the breaker may admit probes after `retry_in_ms`.
    Rejected {
        /// Time until the open period ends, ms (0 when only probe slots are full).
        retry_in_ms: u64,
    },
}

/// How an attempt's outcome counts for the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// A success.
    Success,
    /// A failure of a counted class.
    Failure,
    /// Not the upstream's fault (invalid request, auth, cancelled, ...): ignored.
    Ignored,
}

/// Breaker parameters compiled from the policy.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerParams {
    kind: WindowKind,
    size: u64,
    bucket_ms: u64,
    buckets: u32,
    min_calls: u32,
    failure_rate: Option<f64>,
    slow_call_ms: Option<u64>,
    slow_call_rate: Option<f64>,
    consecutive: Option<u32>,
    counted: [bool; 9],
    open_ms: u64,
    open_factor: f64,
    open_max_ms: u64,
    open_jitter: f64,
    probes: u32,
    close_after: u32,
}

impl BreakerParams {
    /// Compiles validated policy values.
    pub fn new(p: &BreakerPolicy) -> Self {
        let mut counted = [false; 9];
        for c in &p.count_classes {
            counted[c.code() as usize % 9] = true;
        }
        let buckets = p.buckets.max(1);
        BreakerParams {
            kind: p.window,
            size: p.window_size.max(1),
            bucket_ms: (p.window_size / buckets as u64).max(1),
            buckets,
            min_calls: p.min_calls,
            failure_rate: p.failure_rate,
            slow_call_ms: p.slow_call_ms,
            slow_call_rate: p.slow_call_rate,
            consecutive: p.consecutive_failures,
            counted,
            open_ms: p.open_ms,
            open_factor: p.open_factor,
            open_max_ms: p.open_max_ms,
            open_jitter: p.open_jitter,
            probes: p.half_open_probes.max(1),
            close_after: p.close_after.max(1),
        }
    }

    /// Whether a failure of this class counts against the upstream.
    pub fn counts(&self, class: ErrorClass) -> bool {
        !matches!(class, ErrorClass::InvalidRequest | ErrorClass::AuthOrPolicy)
            && self.counted[class.code() as usize % 9]
    }

    /// Whether an attempt of this duration is slow.
    pub fn is_slow(&self, elapsed_ms: u64) -> bool {
        self.slow_call_ms.is_some_and(|s| elapsed_ms >= s)
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    epoch: u64,
    calls: u32,
    failures: u32,
    slow: u32,
}

#[derive(Debug)]
enum Window {
    /// Last N calls; each byte: bit 0 failure, bit 1 slow, bit 2 present.
    Count {
        ring: Vec<u8>,
        pos: usize,
    },
    Time {
        buckets: Vec<Bucket>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed,
    Open { until_ms: u64 },
    HalfOpen { in_flight: u32, successes: u32 },
}

#[derive(Debug)]
struct Inner {
    params: BreakerParams,
    state: State,
    window: Window,
    calls: u64,
    failures: u64,
    slow: u64,
    consecutive: u32,
    trips: u32,
}

impl Inner {
    fn new(params: BreakerParams) -> Self {
        let window = match params.kind {
            WindowKind::Count => Window::Count {
                ring: vec![0; params.size as usize],
                pos: 0,
            },
            WindowKind::Time => Window::Time {
                buckets: vec![Bucket::default(); params.buckets as usize],
            },
        };
        Inner {
            params,
            state: State::Closed,
            window,
            calls: 0,
            failures: 0,
            slow: 0,
            consecutive: 0,
            trips: 0,
        }
    }

    fn reset_window(&mut self) {
        let params = self.params.clone();
        let (state, trips) = (self.state, self.trips);
        *self = Inner::new(params);
        self.state = state;
        self.trips = trips;
    }

    fn expire(&mut self, now_ms: u64) {
        if let Window::Time { buckets } = &mut self.window {
            let epoch = now_ms / self.params.bucket_ms;
            let n = buckets.len() as u64;
            let oldest = epoch.saturating_sub(n - 1);
            for b in buckets.iter_mut() {
                if b.calls != 0 && (b.epoch < oldest || b.epoch > epoch) {
                    self.calls -= b.calls as u64;
                    self.failures -= b.failures as u64;
                    self.slow -= b.slow as u64;
                    *b = Bucket::default();
                }
            }
        }
    }

    fn push(&mut self, now_ms: u64, failure: bool, slow: bool) {
        match &mut self.window {
            Window::Count { ring, pos } => {
                let old = ring[*pos];
                if old & 4 != 0 {
                    self.calls -= 1;
                    self.failures -= (old & 1) as u64;
                    self.slow -= ((old >> 1) & 1) as u64;
                }
                ring[*pos] = 4 | failure as u8 | ((slow as u8) << 1);
                *pos = (*pos + 1) % ring.len();
            }
            Window::Time { buckets } => {
                let epoch = now_ms / self.params.bucket_ms;
                let idx = (epoch % buckets.len() as u64) as usize;
                let b = &mut buckets[idx];
                if b.epoch != epoch {
                    self.calls -= b.calls as u64;
                    self.failures -= b.failures as u64;
                    self.slow -= b.slow as u64;
                    *b = Bucket {
                        epoch,
                        ..Bucket::default()
                    };
                }
                b.calls += 1;
                b.failures += failure as u32;
                b.slow += slow as u32;
            }
        }
        self.calls += 1;
        self.failures += failure as u64;
        self.slow += slow as u64;
    }

    fn trip_reason(&self) -> Option<&'static str> {
        let p = &self.params;
        if let Some(c) = p.consecutive {
            if self.consecutive >= c {
                return Some("consecutive_failures");
            }
        }
        if self.calls < p.min_calls as u64 || self.calls == 0 {
            return None;
        }
        let calls = self.calls as f64;
        if let Some(r) = p.failure_rate {
            if self.failures as f64 >= r * calls {
                return Some("failure_rate");
            }
        }
        if let Some(r) = p.slow_call_rate {
            if self.slow as f64 >= r * calls {
                return Some("slow_call_rate");
            }
        }
        None
    }

    fn open(&mut self, now_ms: u64, seed: u64, from: BreakerState, reason: &'static str) -> Transition {
        self.trips = self.trips.saturating_add(1);
        let p = &self.params;
        let grown = p.open_ms as f64 * p.open_factor.powi((self.trips - 1).min(64) as i32);
        let base = grown.min(p.open_max_ms as f64);
        let mut rng = Pcg64Mcg::seed_from_u64(seed ^ (self.trips as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let j = if p.open_jitter > 0.0 {
            rng.gen_range(-p.open_jitter..p.open_jitter)
        } else {
            0.0
        };
        let open_for = (base * (1.0 + j)).round().max(1.0) as u64;
        self.state = State::Open {
            until_ms: now_ms.saturating_add(open_for),
        };
        self.consecutive = 0;
        Transition {
            from,
            to: BreakerState::Open,
            reason,
            open_for_ms: open_for,
        }
    }

    fn close(&mut self) -> Transition {
        self.state = State::Closed;
        self.trips = 0;
        self.reset_window();
        self.consecutive = 0;
        Transition {
            from: BreakerState::HalfOpen,
            to: BreakerState::Closed,
            reason: "probes_succeeded",
            open_for_ms: 0,
        }
    }
}

/// One scope's breaker.
#[derive(Debug)]
pub struct BreakerCell {
    inner: Mutex<Inner>,
    /// Deterministic per-key seed for open-duration jitter.
    seed: u64,
}

impl BreakerCell {
    /// A closed breaker. `seed` should mix the engine seed and the key.
    pub fn new(params: BreakerParams, seed: u64) -> Self {
        BreakerCell {
            inner: Mutex::new(Inner::new(params)),
            seed,
        }
    }

    fn lock(&self, params: &BreakerParams) -> crate::sync::MutexGuardAlias<'_, Inner> {
        let mut g = self.inner.lock();
        if g.params != *params {
            let state = g.state;
            let trips = g.trips;
            *g = Inner::new(params.clone());
            g.state = state;
            g.trips = trips;
        }
        g
    }

    /// Asks to send an attempt at `now_ms`.
    pub fn acquire(
        &self,
        params: &BreakerParams,
        ovr: Option<BreakerOverride>,
        now_ms: u64,
    ) -> (Admit, Option<Transition>) {
        match ovr {
            Some(BreakerOverride::ForceOpen) => return (Admit::Rejected { retry_in_ms: 0 }, None),
            Some(BreakerOverride::Disabled | BreakerOverride::ForceClosed | BreakerOverride::MetricsOnly) => {
                return (Admit::Allowed { probe: false }, None)
            }
            None => {}
        }
        let mut g = self.lock(params);
        match g.state {
            State::Closed => (Admit::Allowed { probe: false }, None),
            State::Open { until_ms } if now_ms < until_ms => (
                Admit::Rejected {
                    retry_in_ms: until_ms - now_ms,
                },
                None,
            ),
            State::Open { .. } => {
                g.state = State::HalfOpen {
                    in_flight: 1,
                    successes: 0,
                };
                let t = Transition {
                    from: BreakerState::Open,
                    to: BreakerState::HalfOpen,
                    reason: "open_elapsed",
                    open_for_ms: 0,
                };
                (Admit::Allowed { probe: true }, Some(t))
            }
            State::HalfOpen { in_flight, successes } => {
                if in_flight < g.params.probes {
                    g.state = State::HalfOpen {
                        in_flight: in_flight + 1,
                        successes,
                    };
                    (Admit::Allowed { probe: true }, None)
                } else {
                    (Admit::Rejected { retry_in_ms: 0 }, None)
                }
            }
        }
    }

    /// Records an attempt's outcome. `probe` must be what `acquire` returned.
    pub fn record(
        &self,
        params: &BreakerParams,
        ovr: Option<BreakerOverride>,
        now_ms: u64,
        probe: bool,
        rec: Record,
        slow: bool,
    ) -> Option<Transition> {
        if matches!(ovr, Some(BreakerOverride::Disabled)) {
            return None;
        }
        let mut g = self.lock(params);
        if probe {
            if let State::HalfOpen { in_flight, successes } = g.state {
                let in_flight = in_flight.saturating_sub(1);
                return match rec {
                    Record::Success => {
                        let successes = successes + 1;
                        if successes >= g.params.close_after {
                            Some(g.close())
                        } else {
                            g.state = State::HalfOpen { in_flight, successes };
                            None
                        }
                    }
                    Record::Failure => Some(g.open(now_ms, self.seed, BreakerState::HalfOpen, "probe_failed")),
                    Record::Ignored => {
                        g.state = State::HalfOpen { in_flight, successes };
                        None
                    }
                };
            }
        }
        if g.state != State::Closed || rec == Record::Ignored {
            // Late results from before a trip do not steer an open or half-open breaker.
            return None;
        }
        g.expire(now_ms);
        let failure = rec == Record::Failure;
        g.push(now_ms, failure, slow);
        g.consecutive = if failure { g.consecutive + 1 } else { 0 };
        if matches!(ovr, Some(BreakerOverride::MetricsOnly | BreakerOverride::ForceClosed)) {
            return None;
        }
        let reason = g.trip_reason()?;
        Some(g.open(now_ms, self.seed, BreakerState::Closed, reason))
    }

    /// Returns a probe permit whose attempt was abandoned without an outcome.
    pub fn release(&self, params: &BreakerParams, probe: bool) {
        if !probe {
            return;
        }
        let mut g = self.lock(params);
        if let State::HalfOpen { in_flight, successes } = g.state {
            g.state = State::HalfOpen {
                in_flight: in_flight.saturating_sub(1),
                successes,
            };
        }
    }

    /// The state at `now_ms` (an elapsed open period reads as half-open).
    pub fn state(&self, params: &BreakerParams, ovr: Option<BreakerOverride>, now_ms: u64) -> BreakerState {
        if let Some(o) = ovr {
            return o.into();
        }
        let g = self.lock(params);
        match g.state {
            State::Closed => BreakerState::Closed,
            State::Open { until_ms } if now_ms < until_ms => BreakerState::Open,
            State::Open { .. } | State::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Probes in flight (half-open only).
    pub fn probes_in_flight(&self) -> u32 {
        match self.inner.lock().state {
            State::HalfOpen { in_flight, .. } => in_flight,
            _ => 0,
        }
    }

    /// `(calls, failures, slow)` in the window.
    pub fn window_counts(&self, params: &BreakerParams, now_ms: u64) -> (u64, u64, u64) {
        let mut g = self.lock(params);
        g.expire(now_ms);
        (g.calls, g.failures, g.slow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut BreakerPolicy)) -> BreakerParams {
        let mut p = BreakerPolicy {
            min_calls: 4,
            window_size: 10,
            open_jitter: 0.0,
            close_after: 2,
            ..BreakerPolicy::default()
        };
        f(&mut p);
        BreakerParams::new(&p)
    }

    fn fail(b: &BreakerCell, p: &BreakerParams, t: u64) -> Option<Transition> {
        let (a, _) = b.acquire(p, None, t);
        assert_eq!(a, Admit::Allowed { probe: false });
        b.record(p, None, t, false, Record::Failure, false)
    }

    #[test]
    fn closed_open_half_open_closed() {
        let p = params(|_| {});
        let b = BreakerCell::new(p.clone(), 1);
        assert!(fail(&b, &p, 0).is_none());
        assert!(fail(&b, &p, 0).is_none());
        assert!(fail(&b, &p, 0).is_none());
        let t = fail(&b, &p, 0).unwrap();
        assert_eq!(
            (t.from, t.to, t.reason, t.open_for_ms),
            (BreakerState::Closed, BreakerState::Open, "failure_rate", 5_000)
        );
        assert_eq!(b.acquire(&p, None, 4_999).0, Admit::Rejected { retry_in_ms: 1 });
        let (a, t) = b.acquire(&p, None, 5_000);
        assert_eq!(a, Admit::Allowed { probe: true });
        assert_eq!(t.unwrap().to, BreakerState::HalfOpen);
        // Only one probe in flight.
        assert_eq!(b.acquire(&p, None, 5_000).0, Admit::Rejected { retry_in_ms: 0 });
        assert!(b.record(&p, None, 5_001, true, Record::Success, false).is_none());
        assert_eq!(b.acquire(&p, None, 5_002).0, Admit::Allowed { probe: true });
        let t = b.record(&p, None, 5_003, true, Record::Success, false).unwrap();
        assert_eq!((t.from, t.to), (BreakerState::HalfOpen, BreakerState::Closed));
        assert_eq!(b.state(&p, None, 5_003), BreakerState::Closed);
        assert_eq!(b.window_counts(&p, 5_003), (0, 0, 0));
    }

    #[test]
    fn half_open_failure_reopens_with_growing_duration() {
        let p = params(|_| {});
        let b = BreakerCell::new(p.clone(), 1);
        for _ in 0..4 {
            fail(&b, &p, 0);
        }
        let (a, _) = b.acquire(&p, None, 5_000);
        assert_eq!(a, Admit::Allowed { probe: true });
        let t = b.record(&p, None, 5_000, true, Record::Failure, false).unwrap();
        assert_eq!(
            (t.from, t.to, t.reason, t.open_for_ms),
            (BreakerState::HalfOpen, BreakerState::Open, "probe_failed", 10_000)
        );
        b.acquire(&p, None, 15_000);
        let t = b.record(&p, None, 15_000, true, Record::Failure, false).unwrap();
        assert_eq!(t.open_for_ms, 20_000);
        for k in 0..5 {
            let now = 1_000_000 * (k + 1);
            b.acquire(&p, None, now);
            let t = b.record(&p, None, now, true, Record::Failure, false).unwrap();
            assert!(t.open_for_ms <= 60_000);
        }
    }

    #[test]
    fn ignored_outcomes_and_min_calls() {
        let p = params(|_| {});
        let b = BreakerCell::new(p.clone(), 1);
        for _ in 0..10 {
            b.acquire(&p, None, 0);
            assert!(b.record(&p, None, 0, false, Record::Ignored, false).is_none());
        }
        assert_eq!(b.state(&p, None, 0), BreakerState::Closed);
        // 3 failures < min_calls 4: no trip.
        for _ in 0..3 {
            assert!(fail(&b, &p, 0).is_none());
        }
        assert!(!p.counts(ErrorClass::InvalidRequest));
        assert!(!p.counts(ErrorClass::AuthOrPolicy));
        assert!(p.counts(ErrorClass::Transient));
        assert!(!p.counts(ErrorClass::RateLimit));
    }

    #[test]
    fn consecutive_and_slow_call_trips() {
        let p = params(|p| {
            p.failure_rate = None;
            p.consecutive_failures = Some(3);
        });
        let b = BreakerCell::new(p.clone(), 1);
        fail(&b, &p, 0);
        fail(&b, &p, 0);
        assert_eq!(fail(&b, &p, 0).unwrap().reason, "consecutive_failures");

        let p = params(|p| {
            p.failure_rate = None;
            p.slow_call_ms = Some(1_000);
            p.slow_call_rate = Some(0.5);
        });
        let b = BreakerCell::new(p.clone(), 1);
        assert!(p.is_slow(1_000) && !p.is_slow(999));
        let mut last = None;
        for _ in 0..4 {
            b.acquire(&p, None, 0);
            last = b.record(&p, None, 0, false, Record::Success, true);
        }
        assert_eq!(last.unwrap().reason, "slow_call_rate");
    }

    #[test]
    fn overrides() {
        let p = params(|_| {});
        let b = BreakerCell::new(p.clone(), 1);
        assert_eq!(
            b.acquire(&p, Some(BreakerOverride::ForceOpen), 0).0,
            Admit::Rejected { retry_in_ms: 0 }
        );
        for ovr in [BreakerOverride::MetricsOnly, BreakerOverride::ForceClosed] {
            for _ in 0..50 {
                assert_eq!(b.acquire(&p, Some(ovr), 0).0, Admit::Allowed { probe: false });
                assert!(b.record(&p, Some(ovr), 0, false, Record::Failure, false).is_none());
            }
        }
        assert!(b.window_counts(&p, 0).1 > 0, "metrics_only records");
        let d = BreakerCell::new(p.clone(), 1);
        for _ in 0..50 {
            d.record(&p, Some(BreakerOverride::Disabled), 0, false, Record::Failure, false);
        }
        assert_eq!(d.window_counts(&p, 0), (0, 0, 0));
        assert_eq!(
            b.state(&p, Some(BreakerOverride::MetricsOnly), 0),
            BreakerState::MetricsOnly
        );
    }

    #[test]
    fn time_window_expires() {
        let p = params(|p| {
            p.window = WindowKind::Time;
            p.window_size = 10_000;
            p.buckets = 10;
        });
        let b = BreakerCell::new(p.clone(), 1);
        for _ in 0..3 {
            fail(&b, &p, 0);
        }
        assert_eq!(b.window_counts(&p, 9_999), (3, 3, 0));
        assert_eq!(b.window_counts(&p, 10_000), (0, 0, 0));
        // The old failures no longer count towards a trip.
        assert!(fail(&b, &p, 10_000).is_none());
    }

    #[test]
    fn jitter_spreads_open_durations_deterministically() {
        let p = params(|p| p.open_jitter = 0.2);
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..20u64 {
            let b = BreakerCell::new(p.clone(), seed);
            let mut t = None;
            for _ in 0..4 {
                t = fail(&b, &p, 0);
            }
            let d = t.unwrap().open_for_ms;
            assert!((4_000..=6_000).contains(&d), "{d}");
            seen.insert(d);
            let again = BreakerCell::new(p.clone(), seed);
            let mut t2 = None;
            for _ in 0..4 {
                t2 = fail(&again, &p, 0);
            }
            assert_eq!(t2.unwrap().open_for_ms, d);
        }
        assert!(seen.len() > 10);
    }
}
