//! How long a scope's answers take, so a paced wait leaves time for one.
//!
//! A caller told to wait for its slot is sent when the slot comes; if by then
//! its deadline leaves less than an answer takes, the attempt is cut before
//! its answer: a unit of the window spent for nothing, and a timeout the
//! breaker counts against a healthy upstream. The estimate is RFC 6298's
//! smoothed mean and mean deviation of the time from sending to the answer,
//! and a wait must leave its retransmission timeout, the mean plus four
//! deviations: the time after which RFC 6298 takes an answer for lost. The
//! mean plus one deviation would still leave one attempt in six cut (answer
//! times are skewed), enough to trip a breaker when every paced slot is
//! taken close to its caller's deadline.
//! Attempts that were never answered (timeouts, resets) give no sample: how
//! long they would have taken is unknown.

/// Smoothed answer time, ns (zero until the first answer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AnswerTime {
    mean: u64,
    dev: u64,
}

impl AnswerTime {
    /// Takes one answered attempt's time from sending to its answer.
    pub(crate) fn sample(&mut self, took: u64) {
        if self.mean == 0 {
            // RFC 6298 2.2: the first measurement sets the mean, half of it the deviation.
            self.mean = took.max(1);
            self.dev = took / 2;
            return;
        }
        // RFC 6298 2.3: deviation gain 1/4, mean gain 1/8 (deviation first, against the old mean).
        let diff = self.mean.abs_diff(took);
        self.dev = self.dev - self.dev / 4 + diff / 4;
        self.mean = (self.mean - self.mean / 8 + took / 8).max(1);
    }

    /// The time a paced wait must leave before the deadline (0: nothing measured yet).
    pub(crate) fn needed(&self) -> u64 {
        self.mean.saturating_add(self.dev.saturating_mul(4))
    }
}

#[cfg(test)]
mod tests {
    use super::AnswerTime;

    #[test]
    fn follows_rfc_6298_from_the_first_answer() {
        let mut a = AnswerTime::default();
        assert_eq!(a.needed(), 0);
        a.sample(800);
        assert_eq!((a.mean, a.dev, a.needed()), (800, 400, 2_400));
        // |800 - 1600| = 800: dev 400 - 100 + 200 = 500; mean 800 - 100 + 200 = 900.
        a.sample(1_600);
        assert_eq!((a.mean, a.dev), (900, 500));
        for _ in 0..200 {
            a.sample(1_000);
        }
        // Steady answers: the mean converges on them and the deviation decays.
        assert!((990..=1_000).contains(&a.mean), "{a:?}");
        assert!(a.dev <= 10, "{a:?}");
    }
}
