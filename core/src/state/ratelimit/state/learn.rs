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
//! or two and is corrected; one taken too low is kept until the next).
//!
//! A limit the headers state always wins over a learned one.

use super::KindState;

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
        if self.limit.is_some() && !self.learned {
            return;
        }
        match self.learn_from {
            Some(from) if self.taken > 0 && sent >= from && until > from => {
                self.limit = Some(self.taken);
                self.window = Some(until - from);
                self.learned = true;
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
        if self.learned {
            self.learned = false;
            self.window = None;
        }
    }
}
