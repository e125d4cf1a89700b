//! Concurrency gates: in-flight attempts per scope, counted separately for
//! first attempts and retries, and per priority pool, so batch traffic cannot
//! take interactive capacity and retries cannot crowd out first attempts.

use std::sync::atomic::{AtomicU32, Ordering};

/// In-flight counters for one scope (or one priority pool).
#[derive(Debug, Default)]
pub(crate) struct GateCell {
    first: AtomicU32,
    retries: AtomicU32,
}

impl GateCell {
    /// Takes a slot if fewer than `limit` are held (`None` = unlimited, still counted).
    pub(crate) fn try_enter(&self, retry: bool, limit: Option<u32>) -> bool {
        let c = if retry { &self.retries } else { &self.first };
        match limit {
            None => {
                c.fetch_add(1, Ordering::AcqRel);
                true
            }
            Some(l) => c
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| (v < l).then_some(v + 1))
                .is_ok(),
        }
    }

    /// Returns a slot taken by `try_enter`.
    pub(crate) fn leave(&self, retry: bool) {
        let c = if retry { &self.retries } else { &self.first };
        let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1));
    }

    /// `(first attempts, retries)` in flight.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> (u32, u32) {
        (self.first.load(Ordering::Acquire), self.retries.load(Ordering::Acquire))
    }
}

/// A priority pool: one shared in-flight counter.
#[derive(Debug, Default)]
pub(crate) struct PoolCell {
    in_flight: AtomicU32,
}

impl PoolCell {
    /// Takes a slot if fewer than `limit` are held.
    pub(crate) fn try_enter(&self, limit: u32) -> bool {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| (v < limit).then_some(v + 1))
            .is_ok()
    }

    /// Returns a slot.
    pub(crate) fn leave(&self) {
        let _ = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1));
    }

    /// Slots held.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_and_retry_limits_are_separate() {
        let g = GateCell::default();
        assert!(g.try_enter(false, Some(1)));
        assert!(!g.try_enter(false, Some(1)));
        assert!(g.try_enter(true, Some(1)));
        assert!(!g.try_enter(true, Some(1)));
        g.leave(false);
        assert!(g.try_enter(false, Some(1)));
        assert_eq!(g.in_flight(), (1, 1));
        g.leave(true);
        g.leave(true);
        assert_eq!(g.in_flight(), (1, 0));
        let p = PoolCell::default();
        assert!(p.try_enter(2) && p.try_enter(2) && !p.try_enter(2));
        p.leave();
        assert_eq!(p.in_flight(), 1);
    }
}
