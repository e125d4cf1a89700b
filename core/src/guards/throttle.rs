//! Adaptive client-side throttling (Google SRE, "Handling Overload"): reject a
//! new attempt locally with probability `max(0, (requests − K·accepts) / (requests + 1))`
//! over a sliding window, so a struggling upstream sees less traffic before it
//! has to refuse it.

use crate::policy::Throttle as ThrottlePolicy;
use crate::sync::Mutex;

/// Throttle parameters compiled from the policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ThrottleParams {
    /// `K`.
    pub k: f64,
    /// Bucket width, ms.
    pub bucket_ms: u64,
    /// Buckets in the window.
    pub buckets: u32,
}

impl ThrottleParams {
    /// Compiles validated policy values.
    pub(crate) fn new(p: &ThrottlePolicy) -> Self {
        let buckets = p.buckets.max(1);
        ThrottleParams {
            k: p.k,
            bucket_ms: (p.window_ms / buckets as u64).max(1),
            buckets,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    epoch: u64,
    requests: u64,
    accepts: u64,
}

#[derive(Debug)]
struct Inner {
    params: ThrottleParams,
    buckets: Vec<Bucket>,
}

impl Inner {
    fn totals(&mut self, now_ms: u64) -> (u64, u64, usize) {
        let epoch = now_ms / self.params.bucket_ms;
        let n = self.buckets.len() as u64;
        let oldest = epoch.saturating_sub(n - 1);
        let idx = (epoch % n) as usize;
        if self.buckets[idx].epoch != epoch {
            self.buckets[idx] = Bucket {
                epoch,
                requests: 0,
                accepts: 0,
            };
        }
        let (mut r, mut a) = (0, 0);
        for b in &self.buckets {
            if b.epoch >= oldest && b.epoch <= epoch {
                r += b.requests;
                a += b.accepts;
            }
        }
        (r, a, idx)
    }
}

/// One scope's throttle.
#[derive(Debug)]
pub(crate) struct ThrottleCell {
    inner: Mutex<Inner>,
}

impl ThrottleCell {
    /// An empty window.
    pub(crate) fn new(params: ThrottleParams) -> Self {
        ThrottleCell {
            inner: Mutex::new(Inner {
                params,
                buckets: vec![Bucket::default(); params.buckets as usize],
            }),
        }
    }

    /// Counts a request and decides whether to reject it; `draw` is a uniform value in [0, 1).
    /// Returns the rejection probability when rejected.
    pub(crate) fn admit(&self, params: &ThrottleParams, now_ms: u64, draw: f64) -> Result<(), f64> {
        let mut g = self.inner.lock();
        if g.params != *params {
            *g = Inner {
                params: *params,
                buckets: vec![Bucket::default(); params.buckets as usize],
            };
        }
        let (r, a, idx) = g.totals(now_ms);
        let p = reject_probability(r, a, params.k);
        g.buckets[idx].requests += 1;
        if draw < p {
            Err(p)
        } else {
            Ok(())
        }
    }

    /// Counts an attempt the upstream accepted (anything but overload, rate limiting or transient failure).
    pub(crate) fn accepted(&self, now_ms: u64) {
        let mut g = self.inner.lock();
        let (_, _, idx) = g.totals(now_ms);
        g.buckets[idx].accepts += 1;
    }

    /// `(requests, accepts)` in the window.
    #[cfg(test)]
    pub(crate) fn counts(&self, now_ms: u64) -> (u64, u64) {
        let mut g = self.inner.lock();
        let (r, a, _) = g.totals(now_ms);
        (r, a)
    }
}

/// `max(0, (requests − k·accepts) / (requests + 1))`.
pub(crate) fn reject_probability(requests: u64, accepts: u64, k: f64) -> f64 {
    let r = requests as f64;
    ((r - k * accepts as f64) / (r + 1.0)).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formula() {
        assert_eq!(reject_probability(0, 0, 2.0), 0.0);
        assert_eq!(reject_probability(100, 50, 2.0), 0.0);
        assert!((reject_probability(100, 10, 2.0) - 80.0 / 101.0).abs() < 1e-12);
        assert!((reject_probability(99, 0, 2.0) - 0.99).abs() < 1e-12);
    }

    #[test]
    fn rejects_when_upstream_stops_accepting_and_recovers() {
        let p = ThrottleParams::new(&ThrottlePolicy {
            enabled: true,
            ..ThrottlePolicy::default()
        });
        let t = ThrottleCell::new(p);
        for _ in 0..100 {
            let _ = t.admit(&p, 0, 0.5);
        }
        // No accepts at all: probability approaches 1.
        assert!(t.admit(&p, 0, 0.9).is_err());
        // After the window passes, the history is gone.
        assert!(t.admit(&p, 200_000, 0.0).is_ok());
        for _ in 0..10 {
            t.admit(&p, 200_000, 0.99).ok();
            t.accepted(200_000);
        }
        assert!(t.admit(&p, 200_000, 0.0).is_ok());
        assert_eq!(t.counts(200_000), (12, 10));
    }
}
