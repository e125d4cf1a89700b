//! Token buckets.
//!
//! A token bucket (Anthropic's, OpenAI's) states as its reset the time until
//! it is full again, and refills continuously before that. Two readings tell
//! it from a fixed window: the newer one (its attempt sent after the older
//! arrived, both before the older one's reset could have come) shows more
//! remaining, or a reset instant later than the older one's bounds — neither
//! happens in a fixed window, where the allowance only falls and every
//! reading names the same reset. From then on the kind is a bucket: each
//! reading `(limit L, remaining r, reset d)` bounds the time one unit takes
//! to come back from above, `d / (L − r − 1)` (`r` is whole, the bucket's
//! level less than `r + 1`, and `d` rounded up), and the smallest bound seen
//! is the refill interval; `remaining` grows by one unit per interval after
//! the reading, up to the limit, and waiters queue on that refill (one slot
//! per unit, in order) instead of on window resets. Until a kind is known
//! to be a bucket its refill before the reset is left unused (safe: a fixed
//! window would refuse it). Headers held back by a long non-streamed
//! generation move the reset later by as long.

use super::{ns, KindState, Sched, Window, RING};

/// Readings that must show a bucket before a kind is taken for one: a single
/// odd reading (a provider whose servers keep windows of their own) is not enough.
pub(super) const BUCKET_SIGNS: u8 = 2;

/// How far past the held reset's upper bound a reading's lower bound must
/// lie to show the reset moved, ns.
const BUCKET_MOVE_SLACK: u64 = 5_000_000;

impl KindState {
    /// Takes the kind for a bucket refilled one unit every `tau` ns: the
    /// window's queue and its promises are dropped (a waiter's ticket of a
    /// window no longer redeems a promise; it is a holder at its slot).
    pub(super) fn become_bucket(&mut self, tau: u64) {
        self.refill = Some(tau);
        self.epoch += 1;
        self.promised = [0; RING];
        self.queue_end = 0;
        self.gaps.clear();
    }

    /// A bucket's refill since `accrued_at`: whole units, up to the limit.
    pub(super) fn accrue(&mut self, now: u64, tau: u64, r: u64, limit: u64) {
        if now <= self.accrued_at {
            return;
        }
        let n = (now - self.accrued_at) / tau.max(1);
        if r.saturating_add(n) >= limit {
            self.remaining = Some(limit);
            self.accrued_at = now;
        } else {
            self.remaining = Some(r + n);
            self.accrued_at += n * tau.max(1);
        }
    }

    /// True when reading `(r, bounds)`, newer than every merged one and
    /// produced before the held reset could have come, shows a bucket: more
    /// remaining than the merged readings left, or a reset instant past the
    /// held one's bounds. In a fixed window neither can happen.
    pub(super) fn shows_bucket(&self, r: u64, bounds: Option<(u64, u64)>, now: u64) -> bool {
        let Some(held_lo) = self.reset_lo else { return false };
        if self.rolled_at.is_some() || now >= held_lo || self.limit.is_none() {
            return false;
        }
        // The bounds already allow for the reading's rounding: a few ms more
        // for the clocks that turned an instant into a duration.
        self.read_remaining.is_some_and(|prev| r > prev)
            || bounds.is_some_and(|(lo, _)| lo > self.reset_at.saturating_add(BUCKET_MOVE_SLACK))
    }

    /// A reading of a kind known to be a bucket: the refill interval
    /// tightens to the reading's bound, a newer reading replaces the level
    /// (from its arrival on, the refill counts again), an older one only
    /// lowers it; the reset (when full) is kept for the snapshot.
    pub(super) fn observe_bucket(&mut self, w: Window, r: u64, sent: u64, now: u64) {
        self.older = false;
        if let Some(tau) = bucket_interval(w, self.limit) {
            self.refill = self.refill.map_or(Some(tau), |t| Some(t.min(tau)));
        }
        let newer = sent > self.observed_at || self.remaining.is_none();
        if newer {
            // The level when it was produced, at the latest now: the refill counts from now.
            self.remaining = Some(r);
            self.accrued_at = now;
            self.observed_at = now;
            if sent > self.unconfirmed_at {
                self.unconfirmed = 0;
            }
            if let Some(d) = w.reset {
                self.reset_at = now.saturating_add(ns(d));
            }
        } else {
            // Possibly older: it only lowers the level, taken as now's (the
            // refill it already holds is not counted twice). Whether the
            // level held counts its attempt is unknown: the attempt's units
            // stay counted (`older`, see `ScopeState::settle`) until a
            // reading of an attempt sent after now.
            if self.remaining.is_none_or(|have| r <= have) {
                self.remaining = Some(r);
                self.accrued_at = self.accrued_at.max(now);
            }
            self.observed_at = self.observed_at.max(now);
            self.older = true;
        }
        self.reset_lo = None;
        self.rolled_at = None;
        self.read_remaining = self.remaining;
    }

    /// As [`KindState::fits`], for a ticket holder back at its slot: of a
    /// bucket, the units promised to the waiters behind it are the refill
    /// still to come, not what is there now, so they do not count against it.
    pub(crate) fn fits_holder(&self, cost: u64) -> bool {
        if self.refill.is_none() {
            return self.fits(cost);
        }
        self.remaining
            .is_none_or(|r| r.saturating_sub(self.in_flight).saturating_sub(self.unconfirmed) >= self.need(cost))
    }

    /// A refused caller needing `c` units of a bucket refilled one every
    /// `tau` ns: its units come after what is promised to those ahead.
    pub(super) fn schedule_bucket(&self, c: u64, tau: u64, now: u64) -> Sched {
        let have = self
            .remaining
            .unwrap_or(0)
            .saturating_sub(self.in_flight)
            .saturating_sub(self.unconfirmed);
        let ahead = self.promised[Self::slot(self.epoch)];
        let short = ahead.saturating_add(c).saturating_sub(have);
        let due = self
            .accrued_at
            .max(now)
            .saturating_add(short.saturating_mul(tau.max(1)));
        Sched {
            due: due - now,
            spread: tau.max(1),
            promise: Some((self.epoch, c)),
            slot: None,
        }
    }
}

/// The upper bound one reading of a bucket gives on its refill interval,
/// ns per unit: `reset / (limit − remaining − 1)` (the level is below
/// `remaining + 1`; a reset rounded up only lengthens it). `None` when the
/// reading cannot bound it (a full or nearly full bucket, no reset).
pub(super) fn bucket_interval(w: Window, limit: Option<u64>) -> Option<u64> {
    let (l, r, d) = (limit?, w.remaining?, w.reset?);
    let units = l.checked_sub(r)?.checked_sub(1).filter(|&u| u > 0)?;
    Some((ns(d) / units).max(1))
}
