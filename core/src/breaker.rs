//! Circuit breaker per scope: closed → open → half-open → closed, with a
//! count- or time-based rolling window (O(1) updates), `min_calls` before any
//! rate is judged, failure-rate / slow-call-rate / consecutive-failure trips,
//! open durations that grow on repeated trips (with jitter so instances do not
//! probe in lockstep), bounded half-open probes and manual overrides.
//!
//! Every attempt passes through its breaker twice, so the closed state is
//! lock-free: admission is one atomic load, and recording an outcome into a
//! count window is one atomic increment plus a bit flip in a two-bit-per-call
//! bitmap (failure, slow) whose popcount is the window's count. The lock is
//! taken only to change state (trip, half-open, close), for half-open probes
//! and for time windows. The cell keeps no copy of its parameters, only their
//! fingerprint, so a tracked key costs about 100 bytes.

use crate::policy::{Breaker as BreakerPolicy, BreakerOverride, WindowKind};
use crate::sync::{AtomicU32, AtomicU64, AtomicU8, Mutex};
use crate::types::ErrorClass;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;
use smallvec::SmallVec;
use std::sync::atomic::Ordering;

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
    /// Fingerprint of the window-shaping and trip fields: a cell built for
    /// other parameters restarts its window (keeping its state) when it sees these.
    id: u64,
    /// `u64::MAX / size + 1`: reduces a call's position modulo `size` with two
    /// multiplications instead of a division (Lemire's fastmod).
    mod_m: u64,
}

impl BreakerParams {
    /// Compiles validated policy values.
    pub fn new(p: &BreakerPolicy) -> Self {
        let mut counted = [false; 9];
        for c in &p.count_classes {
            counted[c.code() as usize % 9] = true;
        }
        let buckets = p.buckets.max(1);
        let mut b = BreakerParams {
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
            id: 0,
            mod_m: 0,
        };
        b.mod_m = (u64::MAX / b.size).wrapping_add(1);
        b.id = b.fingerprint();
        b
    }

    fn fingerprint(&self) -> u64 {
        let opt = |v: Option<u64>| v.map_or(u64::MAX, |x| x);
        let words = [
            self.kind as u64,
            self.size,
            self.bucket_ms,
            self.buckets as u64,
            self.min_calls as u64,
            opt(self.failure_rate.map(f64::to_bits)),
            opt(self.slow_call_ms),
            opt(self.slow_call_rate.map(f64::to_bits)),
            opt(self.consecutive.map(u64::from)),
            self.counted.iter().fold(0, |a, c| a << 1 | *c as u64),
        ];
        words.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, w| {
            (h ^ w).wrapping_mul(0x0100_0000_01b3).rotate_left(29)
        })
    }

    /// How long the breaker stays open on its `trips`-th trip in a row:
    /// `open_ms × open_factor^(trips − 1)`, spread by ± `open_jitter`, and never
    /// longer than `open_max_ms` — the cap bounds how long a recovered upstream
    /// can stay unused, so jitter near the cap only shortens the period (the
    /// spread is squeezed into `[base × (1 − jitter), open_max_ms]`).
    fn open_for(&self, trips: u32, seed: u64) -> u64 {
        let max = self.open_max_ms as f64;
        let base = (self.open_ms as f64 * self.open_factor.powi(trips.saturating_sub(1).min(64) as i32)).min(max);
        if self.open_jitter <= 0.0 {
            return (base.round() as u64).max(1);
        }
        let mut rng = Pcg64Mcg::seed_from_u64(seed ^ (trips as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let j = rng.gen_range(-self.open_jitter..self.open_jitter);
        let (lo, top) = (base * (1.0 - self.open_jitter), base * (1.0 + self.open_jitter));
        let mut v = base * (1.0 + j);
        if top > max {
            v = lo + (v - lo) * (max - lo) / (top - lo);
        }
        (v.round() as u64).clamp(1, self.open_max_ms.max(1))
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

    /// `pos mod n` for the count window; positions wrap every 2^32 calls,
    /// which only moves where the window's ring restarts.
    #[inline]
    fn slot(&self, pos: u64, n: u64) -> usize {
        let a = pos as u32 as u64;
        if n == self.size {
            ((self.mod_m.wrapping_mul(a) as u128 * n as u128) >> 64) as usize
        } else {
            (a % n) as usize
        }
    }

    /// Bitmap words per flag for a count window of this size.
    fn words(&self) -> usize {
        match self.kind {
            WindowKind::Count => self.size.div_ceil(64) as usize,
            WindowKind::Time => 0,
        }
    }

    /// Why the window trips, if it does.
    #[inline]
    fn trip_reason(
        &self,
        consecutive: u32,
        calls: u64,
        failures: impl FnOnce() -> u64,
        slow: impl FnOnce() -> u64,
    ) -> Option<&'static str> {
        if let Some(c) = self.consecutive {
            if consecutive >= c {
                return Some("consecutive_failures");
            }
        }
        if calls < self.min_calls as u64 || calls == 0 {
            return None;
        }
        let n = calls as f64;
        if let Some(r) = self.failure_rate {
            if failures() as f64 >= r * n {
                return Some("failure_rate");
            }
        }
        if let Some(r) = self.slow_call_rate {
            if slow() as f64 >= r * n {
                return Some("slow_call_rate");
            }
        }
        None
    }
}

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    epoch: u64,
    calls: u32,
    failures: u32,
    slow: u32,
}

/// A time window: the last `size` ms in `buckets` buckets (lock held).
#[derive(Debug)]
struct TimeWindow {
    buckets: Vec<Bucket>,
    calls: u64,
    failures: u64,
    slow: u64,
}

impl TimeWindow {
    fn new(p: &BreakerParams) -> Self {
        TimeWindow {
            buckets: vec![Bucket::default(); p.buckets as usize],
            calls: 0,
            failures: 0,
            slow: 0,
        }
    }

    fn expire(&mut self, p: &BreakerParams, now_ms: u64) {
        let epoch = now_ms / p.bucket_ms;
        let n = self.buckets.len() as u64;
        let oldest = epoch.saturating_sub(n - 1);
        for b in self.buckets.iter_mut() {
            if b.calls != 0 && (b.epoch < oldest || b.epoch > epoch) {
                self.calls -= b.calls as u64;
                self.failures -= b.failures as u64;
                self.slow -= b.slow as u64;
                *b = Bucket::default();
            }
        }
    }

    fn push(&mut self, p: &BreakerParams, now_ms: u64, failure: bool, slow: bool) {
        let epoch = now_ms / p.bucket_ms;
        let idx = (epoch % self.buckets.len() as u64) as usize;
        let b = &mut self.buckets[idx];
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
        self.calls += 1;
        self.failures += failure as u64;
        self.slow += slow as u64;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed,
    Open { until_ms: u64 },
    HalfOpen { in_flight: u32, successes: u32 },
}

/// What only the lock-holder touches.
#[derive(Debug)]
struct Inner {
    state: State,
    trips: u32,
    time: Option<Box<TimeWindow>>,
}

/// One scope's breaker.
#[derive(Debug)]
pub struct BreakerCell {
    /// Mirror of `Inner::state`'s kind (CLOSED, OPEN, HALF_OPEN) for the lock-free paths.
    hint: AtomicU8,
    /// End of the open period while `hint` is OPEN, ms.
    open_until: AtomicU64,
    /// Outcomes recorded into the count window: the next outcome's position.
    calls: AtomicU64,
    consecutive: AtomicU32,
    /// Fingerprint of the parameters the window was built for.
    params_id: AtomicU64,
    /// Count window, two bits per call: `words` failure words, then `words` slow words.
    bits: SmallVec<[AtomicU64; 4]>,
    inner: Mutex<Inner>,
    /// Deterministic per-key seed for open-duration jitter.
    seed: u64,
}

#[inline]
fn set_bit(word: &AtomicU64, bit: u64, on: bool) {
    let cur = word.load(Ordering::Relaxed);
    if on && cur & bit == 0 {
        word.fetch_or(bit, Ordering::Relaxed);
    } else if !on && cur & bit != 0 {
        word.fetch_and(!bit, Ordering::Relaxed);
    }
}

#[inline]
fn popcount(words: &[AtomicU64]) -> u64 {
    words
        .iter()
        .map(|w| w.load(Ordering::Relaxed).count_ones() as u64)
        .sum()
}

impl BreakerCell {
    /// A closed breaker. `seed` should mix the engine seed and the key.
    pub fn new(params: BreakerParams, seed: u64) -> Self {
        let words = params.words();
        BreakerCell {
            hint: AtomicU8::new(CLOSED),
            open_until: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            consecutive: AtomicU32::new(0),
            params_id: AtomicU64::new(params.id),
            bits: (0..2 * words).map(|_| AtomicU64::new(0)).collect(),
            inner: Mutex::new(Inner {
                state: State::Closed,
                trips: 0,
                time: match params.kind {
                    WindowKind::Time => Some(Box::new(TimeWindow::new(&params))),
                    WindowKind::Count => None,
                },
            }),
            seed,
        }
    }

    /// Whether this cell's window storage can hold `params`' window (a reload
    /// that grows a count window or changes its kind needs a new cell: see [`BreakerCell::carry_over`]).
    pub fn fits(&self, params: &BreakerParams) -> bool {
        let words = params.words();
        match params.kind {
            WindowKind::Count => self.bits.len() == 2 * words,
            WindowKind::Time => self.bits.is_empty(),
        }
    }

    /// A cell for `params` that keeps this one's state and trip count (the
    /// window restarts empty), for a reload that reshaped the window.
    pub fn carry_over(&self, params: BreakerParams, now_ms: u64) -> Self {
        let cell = BreakerCell::new(params, self.seed);
        let old = self.inner.lock();
        let state = match old.state {
            State::Closed => State::Closed,
            State::Open { until_ms } => State::Open { until_ms },
            // Probes in flight belong to the old cell; the new one probes afresh.
            State::HalfOpen { .. } => State::Open { until_ms: now_ms },
        };
        {
            let mut g = cell.inner.lock();
            g.state = state;
            g.trips = old.trips;
        }
        if let State::Open { until_ms } = state {
            cell.open_until.store(until_ms, Ordering::Relaxed);
            cell.hint.store(OPEN, Ordering::Release);
        }
        cell
    }

    fn words(&self) -> usize {
        self.bits.len() / 2
    }

    /// Takes the lock; a window built for other parameters restarts empty
    /// (state and trip count are kept).
    fn lock(&self, params: &BreakerParams) -> crate::sync::MutexGuard<'_, Inner> {
        let mut g = self.inner.lock();
        if self.params_id.load(Ordering::Relaxed) != params.id {
            self.clear_window(&mut g, params);
            self.params_id.store(params.id, Ordering::Relaxed);
        }
        g
    }

    fn clear_window(&self, g: &mut Inner, params: &BreakerParams) {
        self.calls.store(0, Ordering::Relaxed);
        for w in self.bits.iter() {
            w.store(0, Ordering::Relaxed);
        }
        self.consecutive.store(0, Ordering::Relaxed);
        g.time = match params.kind {
            WindowKind::Time => Some(Box::new(TimeWindow::new(params))),
            WindowKind::Count => None,
        };
    }

    fn set_state(&self, g: &mut Inner, state: State) {
        g.state = state;
        let hint = match state {
            State::Closed => CLOSED,
            State::Open { until_ms } => {
                self.open_until.store(until_ms, Ordering::Relaxed);
                OPEN
            }
            State::HalfOpen { .. } => HALF_OPEN,
        };
        self.hint.store(hint, Ordering::Release);
    }

    fn open(
        &self,
        g: &mut Inner,
        p: &BreakerParams,
        now_ms: u64,
        from: BreakerState,
        reason: &'static str,
    ) -> Transition {
        g.trips = g.trips.saturating_add(1);
        let open_for = p.open_for(g.trips, self.seed);
        self.set_state(
            g,
            State::Open {
                until_ms: now_ms.saturating_add(open_for),
            },
        );
        self.consecutive.store(0, Ordering::Relaxed);
        Transition {
            from,
            to: BreakerState::Open,
            reason,
            open_for_ms: open_for,
        }
    }

    fn close(&self, g: &mut Inner, p: &BreakerParams) -> Transition {
        self.set_state(g, State::Closed);
        g.trips = 0;
        self.clear_window(g, p);
        Transition {
            from: BreakerState::HalfOpen,
            to: BreakerState::Closed,
            reason: "probes_succeeded",
            open_for_ms: 0,
        }
    }

    /// Asks to send an attempt at `now_ms`.
    #[inline]
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
        match self.hint.load(Ordering::Acquire) {
            CLOSED => return (Admit::Allowed { probe: false }, None),
            OPEN => {
                let until_ms = self.open_until.load(Ordering::Relaxed);
                if now_ms < until_ms {
                    return (
                        Admit::Rejected {
                            retry_in_ms: until_ms - now_ms,
                        },
                        None,
                    );
                }
            }
            _ => {}
        }
        self.acquire_locked(params, now_ms)
    }

    #[cold]
    #[inline(never)]
    fn acquire_locked(&self, params: &BreakerParams, now_ms: u64) -> (Admit, Option<Transition>) {
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
                self.set_state(
                    &mut g,
                    State::HalfOpen {
                        in_flight: 1,
                        successes: 0,
                    },
                );
                let t = Transition {
                    from: BreakerState::Open,
                    to: BreakerState::HalfOpen,
                    reason: "open_elapsed",
                    open_for_ms: 0,
                };
                (Admit::Allowed { probe: true }, Some(t))
            }
            State::HalfOpen { in_flight, successes } => {
                if in_flight < params.probes {
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
    #[inline]
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
        if !probe {
            // Late results from before a trip do not steer an open or half-open breaker.
            if rec == Record::Ignored || self.hint.load(Ordering::Acquire) != CLOSED {
                return None;
            }
            if params.kind == WindowKind::Count && self.params_id.load(Ordering::Relaxed) == params.id {
                return self.record_closed(params, ovr, now_ms, rec == Record::Failure, slow);
            }
        }
        self.record_locked(params, ovr, now_ms, probe, rec, slow)
    }

    #[cold]
    #[inline(never)]
    fn record_locked(
        &self,
        params: &BreakerParams,
        ovr: Option<BreakerOverride>,
        now_ms: u64,
        probe: bool,
        rec: Record,
        slow: bool,
    ) -> Option<Transition> {
        let mut g = self.lock(params);
        if probe {
            if let State::HalfOpen { in_flight, successes } = g.state {
                let in_flight = in_flight.saturating_sub(1);
                return match rec {
                    Record::Success => {
                        let successes = successes + 1;
                        if successes >= params.close_after {
                            Some(self.close(&mut g, params))
                        } else {
                            g.state = State::HalfOpen { in_flight, successes };
                            None
                        }
                    }
                    Record::Failure => Some(self.open(&mut g, params, now_ms, BreakerState::HalfOpen, "probe_failed")),
                    Record::Ignored => {
                        g.state = State::HalfOpen { in_flight, successes };
                        None
                    }
                };
            }
        }
        if g.state != State::Closed || rec == Record::Ignored {
            return None;
        }
        let failure = rec == Record::Failure;
        if let Some(tw) = g.time.as_mut() {
            tw.expire(params, now_ms);
            tw.push(params, now_ms, failure, slow);
            let consecutive = self.bump_consecutive(params, failure);
            if matches!(ovr, Some(BreakerOverride::MetricsOnly | BreakerOverride::ForceClosed)) {
                return None;
            }
            let (calls, failures, slow_n) = (tw.calls, tw.failures, tw.slow);
            let reason = params.trip_reason(consecutive, calls, || failures, || slow_n)?;
            return Some(self.open(&mut g, params, now_ms, BreakerState::Closed, reason));
        }
        drop(g);
        self.record_closed(params, ovr, now_ms, failure, slow)
    }

    #[inline]
    fn bump_consecutive(&self, params: &BreakerParams, failure: bool) -> u32 {
        if params.consecutive.is_none() {
            // Not a trip condition of this policy: not kept.
            return 0;
        }
        if failure {
            self.consecutive.fetch_add(1, Ordering::Relaxed).saturating_add(1)
        } else {
            if self.consecutive.load(Ordering::Relaxed) != 0 {
                self.consecutive.store(0, Ordering::Relaxed);
            }
            0
        }
    }

    /// Records into the count window without the lock; takes it only to trip.
    #[inline]
    fn record_closed(
        &self,
        params: &BreakerParams,
        ovr: Option<BreakerOverride>,
        now_ms: u64,
        failure: bool,
        slow: bool,
    ) -> Option<Transition> {
        let words = self.words();
        if words == 0 {
            return None;
        }
        let n = params.size.min(words as u64 * 64);
        let pos = self.calls.fetch_add(1, Ordering::Relaxed);
        let idx = params.slot(pos, n);
        let bit = 1u64 << (idx % 64);
        set_bit(&self.bits[idx / 64], bit, failure);
        set_bit(&self.bits[words + idx / 64], bit, slow);
        let consecutive = self.bump_consecutive(params, failure);
        if matches!(ovr, Some(BreakerOverride::MetricsOnly | BreakerOverride::ForceClosed)) {
            return None;
        }
        let calls = (pos + 1).min(n);
        // A success that is not slow lowers both rates (or keeps them, once the
        // window is full): only the call that reaches `min_calls` must judge them.
        if !failure && !slow && calls != params.min_calls as u64 {
            return None;
        }
        let reason = params.trip_reason(
            consecutive,
            calls,
            || popcount(&self.bits[..words]),
            || popcount(&self.bits[words..]),
        )?;
        self.trip(params, now_ms, reason)
    }

    #[cold]
    #[inline(never)]
    fn trip(&self, params: &BreakerParams, now_ms: u64, reason: &'static str) -> Option<Transition> {
        let mut g = self.inner.lock();
        if g.state != State::Closed {
            return None;
        }
        Some(self.open(&mut g, params, now_ms, BreakerState::Closed, reason))
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
        match self.hint.load(Ordering::Acquire) {
            CLOSED => return BreakerState::Closed,
            OPEN if now_ms < self.open_until.load(Ordering::Relaxed) => return BreakerState::Open,
            _ => {}
        }
        let g = self.lock(params);
        match g.state {
            State::Closed => BreakerState::Closed,
            State::Open { until_ms } if now_ms < until_ms => BreakerState::Open,
            State::Open { .. } | State::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// True while the breaker is closed: [`BreakerCell::acquire`] without an
    /// override then admits with one load, no probe and no transition.
    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.hint.load(Ordering::Acquire) == CLOSED
    }

    /// True when the breaker refuses every attempt at `now_ms` (open, its period not over).
    pub fn is_open(&self, now_ms: u64) -> bool {
        self.hint.load(Ordering::Acquire) == OPEN && now_ms < self.open_until.load(Ordering::Relaxed)
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
        if let Some(tw) = g.time.as_mut() {
            tw.expire(params, now_ms);
            return (tw.calls, tw.failures, tw.slow);
        }
        drop(g);
        let words = self.words();
        let n = params.size.min(words as u64 * 64);
        (
            self.calls.load(Ordering::Relaxed).min(n),
            popcount(&self.bits[..words]),
            popcount(&self.bits[words..]),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small breaker with one probe and doubling open periods up to 60 s,
    /// so the mechanics tests read in round numbers (the defaults have their own tests).
    fn params(f: impl FnOnce(&mut BreakerPolicy)) -> BreakerParams {
        let mut p = BreakerPolicy {
            min_calls: 4,
            window_size: 10,
            open_jitter: 0.0,
            close_after: 2,
            half_open_probes: 1,
            open_factor: 2.0,
            open_max_ms: 60_000,
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

    /// The lock-free count window trips at exactly the call, and for exactly
    /// the reason, a reference model (every outcome kept) says, over random
    /// sequences of failures, slow calls and successes.
    #[test]
    fn count_window_trips_when_the_reference_model_does() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(7);
        let mut trips = 0;
        for case in 0..3_000 {
            let size = [1u64, 5, 10, 64, 100][case % 5];
            let min_calls = [1u32, 4, 10, 20][case / 5 % 4];
            let failure_rate = [Some(0.5), Some(0.2), None][case / 20 % 3];
            let slow_call_rate = [None, Some(0.3)][case / 60 % 2];
            let consecutive = [None, Some(3)][case / 120 % 2];
            let p = params(|b| {
                b.window_size = size;
                b.min_calls = min_calls;
                b.failure_rate = failure_rate;
                b.slow_call_rate = slow_call_rate;
                b.consecutive_failures = consecutive;
            });
            let b = BreakerCell::new(p.clone(), 1);
            let (pf, ps) = (rng.gen_range(0.0..0.6), rng.gen_range(0.0..0.5));
            let mut seen: Vec<(bool, bool)> = Vec::new();
            let mut run = 0u32;
            for _ in 0..300 {
                let (failure, slow) = (rng.gen_bool(pf), rng.gen_bool(ps));
                seen.push((failure, slow));
                run = if failure { run + 1 } else { 0 };
                let last = &seen[seen.len().saturating_sub(size as usize)..];
                let n = last.len() as f64;
                let (f, sl) = (
                    last.iter().filter(|x| x.0).count() as f64,
                    last.iter().filter(|x| x.1).count() as f64,
                );
                let judged = last.len() >= min_calls as usize;
                let want = if consecutive.is_some_and(|c| run >= c) {
                    Some("consecutive_failures")
                } else if judged && failure_rate.is_some_and(|r| f >= r * n) {
                    Some("failure_rate")
                } else if judged && slow_call_rate.is_some_and(|r| sl >= r * n) {
                    Some("slow_call_rate")
                } else {
                    None
                };
                let rec = if failure { Record::Failure } else { Record::Success };
                let got = b.record(&p, None, 0, false, rec, slow).map(|t| t.reason);
                assert_eq!(got, want, "case {case} after {seen:?}");
                if got.is_some() {
                    trips += 1;
                    break;
                }
            }
        }
        assert!(trips > 1_000, "the sequences trip often enough to test: {trips}");
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

#[cfg(test)]
mod slot_tests {
    use super::*;

    #[test]
    fn fastmod_matches_the_remainder() {
        for size in [1u64, 2, 3, 7, 64, 100, 101, 1000, 65_537, 100_000] {
            let p = BreakerParams::new(&BreakerPolicy {
                window_size: size,
                ..BreakerPolicy::default()
            });
            for pos in (0..5_000u64).chain([u32::MAX as u64 - 3, u32::MAX as u64]) {
                assert_eq!(
                    p.slot(pos, size),
                    (pos as u32 as u64 % size) as usize,
                    "{pos} mod {size}"
                );
            }
        }
    }
}
