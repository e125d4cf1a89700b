//! A breaker's parameters, compiled once per policy version: the window's
//! shape, the trip thresholds and the open durations, and the arithmetic on
//! them that every recorded outcome uses.

use crate::policy::{Breaker as BreakerPolicy, WindowKind};
use crate::types::ErrorClass;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

/// Breaker parameters compiled from the policy.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerParams {
    pub(super) kind: WindowKind,
    pub(super) size: u64,
    pub(super) bucket_ms: u64,
    pub(super) buckets: u32,
    pub(super) min_calls: u32,
    pub(super) failure_rate: Option<f64>,
    pub(super) slow_call_ms: Option<u64>,
    pub(super) slow_call_rate: Option<f64>,
    pub(super) consecutive: Option<u32>,
    pub(super) consecutive_min_ms: u64,
    pub(super) counted: [bool; 9],
    pub(super) open_ms: u64,
    pub(super) open_factor: f64,
    pub(super) open_max_ms: u64,
    pub(super) open_jitter: f64,
    pub(super) probes: u32,
    pub(super) close_after: u32,
    /// Fingerprint of the window-shaping and trip fields: a cell built for
    /// other parameters restarts its window (keeping its state) when it sees these.
    pub(super) id: u64,
    /// `u64::MAX / size + 1`: reduces a call's position modulo `size` with two
    /// multiplications instead of a division (Lemire's fastmod).
    pub(super) mod_m: u64,
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
            consecutive_min_ms: p.consecutive_min_ms,
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

    pub(super) fn fingerprint(&self) -> u64 {
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
            self.consecutive_min_ms,
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
    pub(crate) fn open_for(&self, trips: u32, seed: u64) -> u64 {
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
    pub(super) fn slot(&self, pos: u64, n: u64) -> usize {
        let a = pos as u32 as u64;
        if n == self.size {
            ((self.mod_m.wrapping_mul(a) as u128 * n as u128) >> 64) as usize
        } else {
            (a % n) as usize
        }
    }

    /// Bitmap words per flag for a count window of this size.
    pub(super) fn words(&self) -> usize {
        match self.kind {
            WindowKind::Count => self.size.div_ceil(64) as usize,
            WindowKind::Time => 0,
        }
    }

    /// Why the window trips, if it does.
    #[inline]
    pub(super) fn trip_reason(
        &self,
        (consecutive, run_ms): (u32, u64),
        calls: u64,
        failures: impl FnOnce() -> u64,
        slow: impl FnOnce() -> u64,
    ) -> Option<&'static str> {
        if let Some(c) = self.consecutive {
            if consecutive >= c && run_ms >= self.consecutive_min_ms {
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

#[cfg(test)]
mod tests {
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
