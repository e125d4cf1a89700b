//! A rate-limit scope's adaptive concurrency gate in the call path
//! (`rate_limits.concurrency`): the scope's [`AdaptiveConcurrency`], how long
//! its attempts hold their places, and the place an attempt in flight holds.
//!
//! The gate belongs to the rate-limit scope (account × provider × model),
//! not to an upstream name: a provider's 429 is about what the key may send
//! to the model, so two upstreams that share a key and a model share its
//! limit, and two models of one key do not.

use super::admission::Cell;
use super::concurrency::{AdaptiveConcurrency, AimdConfig, Feedback, Permit};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// No attempt ended yet.
const NO_SAMPLE: u64 = u64::MAX;

/// One scope's gate.
#[derive(Debug)]
pub(crate) struct ScopeGate {
    pub(crate) aimd: AdaptiveConcurrency,
    /// Mean time an attempt held its place, ns (moving average, weight 1/8 to
    /// the newest); [`NO_SAMPLE`] before the first attempt ended.
    mean_hold_ns: AtomicU64,
}

impl ScopeGate {
    pub(crate) fn new(cfg: AimdConfig) -> Self {
        ScopeGate {
            aimd: AdaptiveConcurrency::new(cfg),
            mean_hold_ns: AtomicU64::new(NO_SAMPLE),
        }
    }

    /// How long a caller refused a place waits before asking again: the
    /// mean hold divided by the limit (when the next of the attempts in
    /// flight is expected to end), rounded up to whole ms, within
    /// `[1 ms, max_ms]`; `max_ms` before any attempt ended.
    pub(crate) fn poll(&self, max_ms: u64) -> Duration {
        let max_ms = max_ms.max(1);
        let ms = match self.mean_hold_ns.load(Ordering::Relaxed) {
            NO_SAMPLE => max_ms,
            mean => (mean / u64::from(self.aimd.limit().max(1)))
                .div_ceil(1_000_000)
                .clamp(1, max_ms),
        };
        Duration::from_millis(ms)
    }

    /// Gives a place back with the attempt's feedback and how long it was
    /// held; true when it cut the limit.
    fn release(&self, permit: Permit, feedback: Feedback, held_ns: Option<u64>) -> bool {
        let cut = self.aimd.release(permit, feedback);
        if let Some(x) = held_ns {
            let _ = self
                .mean_hold_ns
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                    Some(match m {
                        NO_SAMPLE => x,
                        m => (m - m / 8).saturating_add(x / 8),
                    })
                });
        }
        cut
    }

    /// Mean time an attempt held its place, when any ended.
    pub(crate) fn mean_hold(&self) -> Option<Duration> {
        match self.mean_hold_ns.load(Ordering::Relaxed) {
            NO_SAMPLE => None,
            m => Some(Duration::from_nanos(m)),
        }
    }
}

/// The place an attempt in flight holds in its scope's gate. Given back
/// with feedback when the attempt is reported ([`GatePermit::release`]); an
/// attempt that vanished (its call dropped unreported) gives it back when
/// the permit is dropped, saying nothing about capacity.
#[must_use = "a place not given back stays in flight until dropped"]
pub(crate) struct GatePermit {
    cell: Option<Cell>,
    permit: Permit,
    /// When the place was taken, monotonic ns.
    taken_at: u64,
}

impl GatePermit {
    /// A place taken in `cell`'s gate at `now`.
    pub(crate) fn new(cell: Cell, permit: Permit, now: u64) -> Self {
        GatePermit {
            cell: Some(cell),
            permit,
            taken_at: now,
        }
    }

    /// Gives the place back at `now` with how the attempt ended; true when
    /// it cut the scope's limit.
    pub(crate) fn release(mut self, feedback: Feedback, now: u64) -> bool {
        let Some(cell) = self.cell.take() else { return false };
        cell.value
            .gate_if_any()
            .is_some_and(|g| g.release(self.permit, feedback, Some(now.saturating_sub(self.taken_at))))
    }
}

impl Drop for GatePermit {
    fn drop(&mut self) {
        if let Some(cell) = self.cell.take() {
            if let Some(g) = cell.value.gate_if_any() {
                g.release(self.permit, Feedback::Neutral, None);
            }
        }
    }
}

impl std::fmt::Debug for GatePermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatePermit")
            .field("scope", &self.cell.as_ref().map(|c| c.key.as_str()))
            .field("taken_at", &self.taken_at)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(initial: u32) -> AimdConfig {
        AimdConfig {
            initial,
            floor: 1,
            ceiling: 100,
            grow_after: None,
        }
    }

    #[test]
    fn the_poll_is_the_mean_hold_over_the_limit_within_bounds() {
        let g = ScopeGate::new(cfg(4));
        assert_eq!(g.poll(100), Duration::from_millis(100), "no attempt ended yet");
        assert_eq!(g.mean_hold(), None);
        let p = g.aimd.try_acquire().unwrap();
        g.release(p, Feedback::Neutral, Some(400_000_000));
        assert_eq!(g.poll(1_000), Duration::from_millis(100), "400 ms / 4");
        assert_eq!(g.poll(50), Duration::from_millis(50), "at most the bound");
        // The average moves by an eighth of the difference.
        let p = g.aimd.try_acquire().unwrap();
        g.release(p, Feedback::Neutral, Some(0));
        assert_eq!(g.mean_hold(), Some(Duration::from_millis(350)));
        assert_eq!(g.poll(1_000), Duration::from_millis(88), "87.5 ms, rounded up");
        let g = ScopeGate::new(cfg(4));
        let p = g.aimd.try_acquire().unwrap();
        g.release(p, Feedback::Neutral, Some(1));
        assert_eq!(g.poll(100), Duration::from_millis(1), "at least 1 ms");
    }
}
