//! Adaptive client-side throttling (Google SRE, "Handling Overload"): reject a
//! new attempt locally with probability `max(0, (requests − K·accepts) / (requests + 1))`
//! over a sliding window, so a struggling upstream sees less traffic before it
//! has to refuse it.
//!
//! `requests` are attempts whose outcome is known (plus the ones refused
//! here): an attempt still in flight is neither a request nor an accept yet,
//! so a burst of concurrent calls to a fresh upstream is not throttled for
//! having no answers so far. Below `min_requests` in the window nothing is
//! refused: a handful of outcomes is no evidence. [`verdict`] says which
//! outcomes are accepts.

use crate::policy::Throttle as ThrottlePolicy;
use crate::sync::Mutex;
use crate::types::ErrorClass;

/// Throttle parameters compiled from the policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ThrottleParams {
    /// `K`.
    pub k: f64,
    /// Bucket width, ms.
    pub bucket_ms: u64,
    /// Buckets in the window.
    pub buckets: u32,
    /// Requests in the window before anything is refused.
    pub min_requests: u64,
}

impl ThrottleParams {
    /// Compiles validated policy values.
    pub(crate) fn new(p: &ThrottlePolicy) -> Self {
        let buckets = p.buckets.max(1);
        ThrottleParams {
            k: p.k,
            bucket_ms: (p.window_ms / buckets as u64).max(1),
            buckets,
            min_requests: u64::from(p.min_requests),
        }
    }
}

/// What an attempt's outcome counts as: `Some(true)` an accept (the upstream
/// answered: a success, or a refusal of the request itself), `Some(false)` a
/// request it did not accept (overload, rate limit, transient failures, and
/// attempts that never finished: out of time, effect unknown, a broken
/// stream), `None` nothing (the caller cancelled: no evidence either way).
pub(crate) fn verdict(class: Option<ErrorClass>) -> Option<bool> {
    match class {
        None => Some(true),
        Some(ErrorClass::Cancelled) => None,
        Some(ErrorClass::InvalidRequest | ErrorClass::AuthOrPolicy) => Some(true),
        Some(
            ErrorClass::RateLimit
            | ErrorClass::Overloaded
            | ErrorClass::Transient
            | ErrorClass::DeadlineExceeded
            | ErrorClass::ResultUnknown
            | ErrorClass::PartialStream,
        ) => Some(false),
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

    /// Decides whether to refuse an attempt now; `draw` is a uniform value in
    /// [0, 1). A refusal counts as a request; an admitted attempt counts when
    /// it is settled ([`ThrottleCell::settle`]). Returns the rejection
    /// probability when refused.
    pub(crate) fn admit(&self, params: &ThrottleParams, now_ms: u64, draw: f64) -> Result<(), f64> {
        let mut g = self.inner.lock();
        if g.params != *params {
            *g = Inner {
                params: *params,
                buckets: vec![Bucket::default(); params.buckets as usize],
            };
        }
        let (r, a, idx) = g.totals(now_ms);
        if r < params.min_requests {
            return Ok(());
        }
        let p = reject_probability(r, a, params.k);
        if draw < p {
            g.buckets[idx].requests += 1;
            Err(p)
        } else {
            Ok(())
        }
    }

    /// Counts an admitted attempt's outcome (see [`verdict`]).
    pub(crate) fn settle(&self, now_ms: u64, accepted: Option<bool>) {
        let Some(accepted) = accepted else { return };
        let mut g = self.inner.lock();
        let (_, _, idx) = g.totals(now_ms);
        let b = &mut g.buckets[idx];
        b.requests += 1;
        b.accepts += u64::from(accepted);
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
            min_requests: 0,
            ..ThrottlePolicy::default()
        });
        let t = ThrottleCell::new(p);
        for _ in 0..100 {
            assert!(t.admit(&p, 0, 0.999).is_ok());
            t.settle(0, Some(false));
        }
        // No accepts at all: probability approaches 1, and a refusal counts as a request.
        assert_eq!(t.admit(&p, 0, 0.9), Err(100.0 / 101.0));
        assert_eq!(t.counts(0), (101, 0));
        // After the window passes, the history is gone.
        assert!(t.admit(&p, 200_000, 0.0).is_ok());
        for _ in 0..10 {
            t.admit(&p, 200_000, 0.99).ok();
            t.settle(200_000, Some(true));
        }
        assert!(t.admit(&p, 200_000, 0.0).is_ok());
        assert_eq!(t.counts(200_000), (10, 10));
    }

    #[test]
    fn attempts_in_flight_and_few_requests_are_never_refused() {
        let p = ThrottleParams::new(&ThrottlePolicy {
            enabled: true,
            min_requests: 5,
            ..ThrottlePolicy::default()
        });
        let t = ThrottleCell::new(p);
        // Twenty admitted, none answered yet: nothing is known, nothing refused.
        for _ in 0..20 {
            assert!(t.admit(&p, 0, 0.0).is_ok());
        }
        assert_eq!(t.counts(0), (0, 0));
        // Four failures: below min_requests, still nothing refused.
        for _ in 0..4 {
            t.settle(0, Some(false));
        }
        assert!(t.admit(&p, 0, 0.0).is_ok());
        t.settle(0, Some(false));
        assert_eq!(t.admit(&p, 0, 0.0), Err(5.0 / 6.0));
        // A cancellation counts for nothing.
        t.settle(0, None);
        assert_eq!(t.counts(0), (6, 0));
    }

    #[test]
    fn what_counts_as_an_accept() {
        assert_eq!(verdict(None), Some(true));
        assert_eq!(verdict(Some(ErrorClass::InvalidRequest)), Some(true));
        assert_eq!(verdict(Some(ErrorClass::AuthOrPolicy)), Some(true));
        for c in [
            ErrorClass::RateLimit,
            ErrorClass::Overloaded,
            ErrorClass::Transient,
            ErrorClass::DeadlineExceeded,
            ErrorClass::ResultUnknown,
            ErrorClass::PartialStream,
        ] {
            assert_eq!(verdict(Some(c)), Some(false), "{c}");
        }
        assert_eq!(verdict(Some(ErrorClass::Cancelled)), None);
    }
}
