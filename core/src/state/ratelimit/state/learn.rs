//! A limit no header states, learned from the provider's refusals.
//!
//! Gemini sends no rate-limit headers, Azure only `remaining`, and many
//! OpenAI-compatible hosts nothing: the first word of their limit is a 429
//! with a wait (`Retry-After`, `retry-after-ms`, `RetryInfo.retryDelay`).
//! Its end, `until`, is when the provider has room again; the next refusal
//! of an attempt sent after it ends a stretch in which the provider took
//! `taken` attempts, and its own `until` is when room comes back. That is
//! the rate: `taken` per `until − from`. For a fixed window it is the limit
//! per window, aligned on the provider's resets; for a token bucket drained
//! by the burst after a hold it is the units the refill gave over that time.
//! From then on the kind is paced as a window of `taken` units that length,
//! beginning at the refusal's `until`, and each later refusal learns again
//! from the stretch that ended in it (a rate taken too high costs a refusal
//! or two and is corrected).
//!
//! A rate taken too low (the stretch's demand was below the limit, or other
//! clients shared it) would never be corrected, since pacing below it draws
//! no refusal: a learned limit is forgotten [`LEARNED_WINDOWS`] windows (at
//! least [`LEARNED_AT_LEAST`]) after it was learned, and the kind is
//! unconstrained again until the next refusal learns it anew from the
//! stretch that began there.
//!
//! A limit the headers state always wins over a learned one.

use super::{KindState, Params};

/// Windows a learned limit is kept for without a refusal.
pub(crate) const LEARNED_WINDOWS: u64 = 8;

/// The least time a learned limit is kept for, ns: a minute (the window most
/// providers count in), so a short learned window is not relearned by a
/// burst every few seconds.
pub(crate) const LEARNED_AT_LEAST: u64 = 60_000_000_000;

impl KindState {
    /// Counts a response that was no refusal of an attempt sent at `sent`:
    /// the provider took it within the stretch being measured.
    pub(crate) fn count_taken(&mut self, sent: u64) {
        if self.learn_from.is_some_and(|from| sent >= from) {
            self.taken = self.taken.saturating_add(1);
        }
    }

    /// A refusal of an attempt sent at `sent` says room comes back at
    /// `until`: learns the rate from the stretch it ends when the kind's
    /// limit is not stated, before [`KindState::hold`] takes the hold.
    ///
    /// A refusal of an attempt sent before the stretch began is the burst
    /// that ended the one before: it only moves the stretch's start to the
    /// latest end of a hold while nothing was taken yet.
    pub(crate) fn learn(&mut self, sent: u64, until: u64) {
        if self.limit.is_some() && self.learned.is_none() {
            return;
        }
        match self.learn_from {
            Some(from) if self.taken > 0 && sent >= from && until > from => {
                let w = until - from;
                self.limit = Some(self.taken);
                self.window = Some(w);
                let keep = w.saturating_mul(LEARNED_WINDOWS).max(LEARNED_AT_LEAST);
                self.learned = Some(until.saturating_add(keep));
                // The learned window begins at `until`, not at a reset held before.
                self.remaining = None;
                self.learn_from = Some(until);
                self.taken = 0;
            }
            Some(from) if self.taken == 0 => self.learn_from = Some(from.max(until)),
            Some(_) => {}
            None => self.learn_from = Some(until),
        }
    }

    /// A stated limit replaces a learned one, and the learned window with it
    /// (a family that states no window measures it by its resets).
    pub(crate) fn forget_learned(&mut self) {
        if self.learned.take().is_some() {
            self.window = None;
        }
    }

    /// Where a reading that states no reset puts it: a learned window keeps
    /// its own; otherwise a recheck `default_reset` from now (Azure's
    /// remaining alone).
    pub(super) fn assumed_reset(&self, now: u64, p: &Params) -> u64 {
        if self.learned.is_some() && self.remaining.is_some() && self.reset_at > now {
            self.reset_at
        } else {
            now.saturating_add(p.default_reset)
        }
    }

    /// Forgets a learned limit whose time has come (see the module doc).
    pub(super) fn expire_learned(&mut self, now: u64) {
        if self.learned.is_some_and(|until| now >= until) {
            self.unlearn(now);
        }
    }

    /// A learned limit kept its time without a refusal: the kind is
    /// unconstrained again, and the next refusal learns from `now` on.
    fn unlearn(&mut self, now: u64) {
        self.learned = None;
        self.limit = None;
        self.window = None;
        self.remaining = None;
        self.read_remaining = None;
        self.reset_lo = None;
        self.rolled_at = None;
        self.learn_from = Some(now);
        self.taken = 0;
    }
}
