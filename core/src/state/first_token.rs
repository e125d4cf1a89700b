//! Each upstream's usual time to first token, learned from the streamed
//! successes that report it (`Outcome::first_token`), and the first-token
//! limit that follows from it (`timeouts.learn`): a silent attempt is left
//! for a fallback soon after the upstream would normally have answered,
//! instead of after half of the time left.
//!
//! The last [`SAMPLES`] times are kept per upstream (outliving policy
//! reloads, as the breakers do). The limit is worked out again when a
//! sample arrives, at most every [`EVERY`] samples, and read with one
//! atomic load when an attempt starts.

use crate::policy::LearnFirstToken;
use crate::stats::FirstTokenStats;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// Samples kept per upstream.
pub(crate) const SAMPLES: usize = LearnFirstToken::SAMPLES;

/// The limit is worked out again every this many samples (and at the first
/// one that reaches `min_samples`), so recording stays cheap.
const EVERY: u64 = 8;

/// One upstream's samples and its learned limit.
#[derive(Debug, Default)]
pub(crate) struct FirstTokenCell {
    samples: Mutex<Ring>,
    /// The learned limit, ms; 0 while too few samples were seen.
    limit_ms: AtomicU32,
    /// The quantile the limit came from, ms (for stats).
    quantile_ms: AtomicU32,
}

#[derive(Debug)]
struct Ring {
    ms: [u32; SAMPLES],
    /// Samples ever recorded.
    seen: u64,
}

impl Default for Ring {
    fn default() -> Self {
        Ring {
            ms: [0; SAMPLES],
            seen: 0,
        }
    }
}

impl FirstTokenCell {
    /// Records one success's time to first token, ms.
    pub(crate) fn record(&self, ms: u64, learn: &LearnFirstToken) {
        let mut r = self.samples.lock();
        let at = (r.seen % SAMPLES as u64) as usize;
        r.ms[at] = ms.min(u32::MAX as u64) as u32;
        r.seen += 1;
        let min = u64::from(learn.min_samples.max(1));
        if r.seen < min || (r.seen != min && r.seen % EVERY != 0) {
            return;
        }
        let n = (r.seen as usize).min(SAMPLES);
        let mut sorted = r.ms;
        drop(r);
        let sorted = &mut sorted[..n];
        sorted.sort_unstable();
        let (q, limit) = limit_of(sorted, learn);
        self.quantile_ms.store(q, Ordering::Relaxed);
        self.limit_ms.store(limit, Ordering::Relaxed);
    }

    /// The learned limit, ms, once enough samples were seen.
    #[inline]
    pub(crate) fn limit_ms(&self) -> Option<u32> {
        match self.limit_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(ms),
        }
    }

    /// For stats.
    pub(crate) fn stats(&self) -> FirstTokenStats {
        let seen = self.samples.lock().seen;
        let limit = self.limit_ms();
        FirstTokenStats {
            samples: seen,
            quantile_ms: limit.map(|_| u64::from(self.quantile_ms.load(Ordering::Relaxed))),
            limit_ms: limit.map(u64::from),
        }
    }
}

/// The `quantile` of `sorted` (nearest rank) and the limit it gives: times
/// `factor`, rounded up, at least `floor_ms` (and at least 1 ms).
fn limit_of(sorted: &[u32], learn: &LearnFirstToken) -> (u32, u32) {
    let rank = ((learn.quantile * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    let q = sorted[rank - 1];
    let scaled = (f64::from(q) * learn.factor).ceil().min(u32::MAX as f64) as u64;
    let limit = scaled.max(learn.floor_ms).clamp(1, u32::MAX as u64) as u32;
    (q, limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learn(min_samples: u32) -> LearnFirstToken {
        LearnFirstToken {
            min_samples,
            ..LearnFirstToken::default()
        }
    }

    #[test]
    fn cold_until_min_samples_then_quantile_times_factor_above_the_floor() {
        let c = FirstTokenCell::default();
        let l = learn(20);
        for _ in 0..19 {
            c.record(100, &l);
        }
        assert_eq!(c.limit_ms(), None);
        assert_eq!(c.stats().quantile_ms, None);
        c.record(100, &l);
        // p99 of twenty 100 ms samples is 100 ms; × 3 = 300 ms, below the 1 s floor.
        assert_eq!(c.limit_ms(), Some(1_000));
        assert_eq!(
            c.stats(),
            FirstTokenStats {
                samples: 20,
                quantile_ms: Some(100),
                limit_ms: Some(1_000)
            }
        );
        // Slow samples move the quantile once the next recomputation comes (every 8th sample).
        for _ in 0..3 {
            c.record(2_000, &l);
        }
        assert_eq!(c.limit_ms(), Some(1_000));
        c.record(2_000, &l);
        // 24 samples, rank ceil(0.99 × 24) = 24: 2 000 ms × 3.
        assert_eq!(c.limit_ms(), Some(6_000));
    }

    #[test]
    fn the_ring_forgets_all_but_the_last_128() {
        let c = FirstTokenCell::default();
        let l = learn(1);
        for _ in 0..SAMPLES {
            c.record(5_000, &l);
        }
        assert_eq!(c.limit_ms(), Some(15_000));
        for _ in 0..SAMPLES {
            c.record(200, &l);
        }
        assert_eq!(c.stats().quantile_ms, Some(200));
        assert_eq!(c.limit_ms(), Some(1_000));
        assert_eq!(c.stats().samples, 2 * SAMPLES as u64);
    }

    #[test]
    fn nearest_rank_quantiles() {
        let l = LearnFirstToken {
            quantile: 0.5,
            factor: 1.0,
            floor_ms: 1,
            ..LearnFirstToken::default()
        };
        assert_eq!(limit_of(&[10, 20, 30, 40], &l), (20, 20));
        assert_eq!(limit_of(&[10, 20, 30, 40, 50], &l), (30, 30));
        assert_eq!(limit_of(&[0], &l), (0, 1));
        let l = LearnFirstToken {
            quantile: 1.0,
            factor: 2.5,
            floor_ms: 1,
            ..l
        };
        assert_eq!(limit_of(&[7, 9, 11], &l), (11, 28));
    }
}
