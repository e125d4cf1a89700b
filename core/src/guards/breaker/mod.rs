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

mod fleet;
mod params;

pub use params::BreakerParams;

use crate::policy::{BreakerOverride, WindowKind};
use crate::sync::{AtomicU32, AtomicU64, AtomicU8, Mutex};
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

/// `retry_in_ms` of a breaker that admits nothing until an operator says so (forced open).
pub(crate) const NEVER: u64 = u64::MAX;

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
        /// Time until the open period ends, ms (0 when only probe slots are
        /// full; `u64::MAX` when forced open: no probe will come).
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
    /// When the current run of consecutive failures began, ms.
    run_since: AtomicU64,
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
            run_since: AtomicU64::new(0),
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
            Some(BreakerOverride::ForceOpen) => return (Admit::Rejected { retry_in_ms: NEVER }, None),
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
            let consecutive = self.bump_consecutive(params, failure, now_ms);
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

    /// The run of consecutive failures with this outcome: its length and how
    /// long ago it began, ms.
    #[inline]
    fn bump_consecutive(&self, params: &BreakerParams, failure: bool, now_ms: u64) -> (u32, u64) {
        if params.consecutive.is_none() {
            // Not a trip condition of this policy: not kept.
            return (0, 0);
        }
        if failure {
            let n = self.consecutive.fetch_add(1, Ordering::Relaxed).saturating_add(1);
            if n == 1 {
                self.run_since.store(now_ms, Ordering::Relaxed);
                return (1, 0);
            }
            (n, now_ms.saturating_sub(self.run_since.load(Ordering::Relaxed)))
        } else {
            if self.consecutive.load(Ordering::Relaxed) != 0 {
                self.consecutive.store(0, Ordering::Relaxed);
            }
            (0, 0)
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
        let consecutive = self.bump_consecutive(params, failure, now_ms);
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
mod tests;
