//! Retry budget: in a sliding window, retries granted ≤ `ratio` × requests +
//! `min_per_sec` × window seconds. Checked in exact ×1000 integer arithmetic,
//! so a ratio of 0.3 grants exactly 3 retries per 10 requests (tower's
//! `1/0.3 → 3` truncation would grant 33 %).

use crate::policy::{to_milli, Budget as BudgetPolicy};
use crate::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// Budget parameters compiled from the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetParams {
    /// Bucket width, ms.
    pub bucket_ms: u64,
    /// Buckets in the window.
    pub buckets: u32,
    /// `ratio × 1000`.
    pub ratio_milli: u64,
    /// Floor over the whole window, in thousandths of a retry.
    pub floor_milli: u64,
    /// Retries in flight per scope, when capped.
    pub max_in_flight: Option<u32>,
}

impl BudgetParams {
    /// Compiles validated policy values.
    pub fn new(p: &BudgetPolicy) -> Self {
        let buckets = p.buckets.max(1);
        let bucket_ms = (p.window_ms / buckets as u64).max(1);
        let window_ms = bucket_ms * buckets as u64;
        let per_sec_milli = to_milli(p.min_per_sec).unwrap_or(0);
        BudgetParams {
            bucket_ms,
            buckets,
            ratio_milli: to_milli(p.ratio).unwrap_or(0),
            floor_milli: per_sec_milli.saturating_mul(window_ms) / 1000,
            max_in_flight: p.max_concurrent_retries,
        }
    }
}

/// Why a retry was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The ratio-plus-floor allowance is used up.
    Exhausted,
    /// Too many retries in flight.
    Concurrency,
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    epoch: u64,
    requests: u64,
    retries: u64,
}

#[derive(Debug)]
struct Window {
    buckets: Vec<Bucket>,
    requests: u64,
    retries: u64,
    params: BudgetParams,
    last_epoch: u64,
}

impl Window {
    fn new(params: BudgetParams) -> Self {
        Window {
            buckets: vec![Bucket::default(); params.buckets as usize],
            requests: 0,
            retries: 0,
            params,
            last_epoch: u64::MAX,
        }
    }

    /// Drops buckets older than the window and returns the current bucket index.
    /// O(1) while time stays in the current bucket; a full sweep only when it moved.
    fn advance(&mut self, now_ms: u64) -> usize {
        let epoch = now_ms / self.params.bucket_ms;
        let n = self.buckets.len() as u64;
        let idx = (epoch % n) as usize;
        if self.buckets[idx].epoch == epoch && epoch == self.last_epoch {
            return idx;
        }
        self.last_epoch = epoch;
        // Expire every bucket whose epoch fell out of [epoch - n + 1, epoch].
        let oldest_valid = epoch.saturating_sub(n - 1);
        for b in self.buckets.iter_mut() {
            if (b.epoch < oldest_valid || b.epoch > epoch) && (b.requests | b.retries) != 0 {
                self.requests -= b.requests;
                self.retries -= b.retries;
                *b = Bucket::default();
            }
        }
        let b = &mut self.buckets[idx];
        if b.epoch != epoch {
            self.requests -= b.requests;
            self.retries -= b.retries;
            *b = Bucket {
                epoch,
                requests: 0,
                retries: 0,
            };
        }
        idx
    }
}

/// One scope's budget: window counts plus retries in flight.
#[derive(Debug)]
pub struct BudgetCell {
    window: Mutex<Window>,
    in_flight: AtomicU32,
}

impl BudgetCell {
    /// An empty budget.
    pub fn new(params: BudgetParams) -> Self {
        BudgetCell {
            window: Mutex::new(Window::new(params)),
            in_flight: AtomicU32::new(0),
        }
    }

    fn window(&self, params: &BudgetParams) -> crate::sync::MutexGuardAlias<'_, Window> {
        let mut w = self.window.lock();
        if w.params != *params {
            // A reload changed the shape: restart this scope fresh.
            *w = Window::new(*params);
        }
        w
    }

    /// Counts one request (a first attempt) at `now_ms`.
    pub fn deposit(&self, params: &BudgetParams, now_ms: u64) {
        let mut w = self.window(params);
        let i = w.advance(now_ms);
        w.buckets[i].requests += 1;
        w.requests += 1;
    }

    /// Grants one retry if `(retries + 1) × 1000 ≤ ratio_milli × requests + floor_milli`
    /// and the in-flight cap allows; a granted retry holds an in-flight slot until
    /// [`BudgetCell::release`].
    pub fn try_withdraw(&self, params: &BudgetParams, now_ms: u64) -> Result<(), Refusal> {
        if let Some(cap) = params.max_in_flight {
            let prev = self.in_flight.fetch_add(1, Ordering::AcqRel);
            if prev >= cap {
                self.in_flight.fetch_sub(1, Ordering::AcqRel);
                return Err(Refusal::Concurrency);
            }
        }
        let mut w = self.window(params);
        let i = w.advance(now_ms);
        let allowed = params
            .ratio_milli
            .saturating_mul(w.requests)
            .saturating_add(params.floor_milli);
        if (w.retries + 1).saturating_mul(1000) > allowed {
            drop(w);
            if params.max_in_flight.is_some() {
                self.in_flight.fetch_sub(1, Ordering::AcqRel);
            }
            return Err(Refusal::Exhausted);
        }
        w.buckets[i].retries += 1;
        w.retries += 1;
        Ok(())
    }

    /// Undoes a grant that was not used (e.g. the wait did not fit the deadline).
    pub fn refund(&self, params: &BudgetParams, now_ms: u64) {
        {
            let mut w = self.window(params);
            let i = w.advance(now_ms);
            if w.buckets[i].retries > 0 {
                w.buckets[i].retries -= 1;
                w.retries -= 1;
            }
        }
        self.release(params);
    }

    /// Frees the in-flight slot of a granted retry (its attempt was reported or abandoned).
    pub fn release(&self, params: &BudgetParams) {
        if params.max_in_flight.is_some() {
            let _ = self
                .in_flight
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1));
        }
    }

    /// `(requests, retries)` in the window at `now_ms`.
    pub fn counts(&self, params: &BudgetParams, now_ms: u64) -> (u64, u64) {
        let mut w = self.window(params);
        w.advance(now_ms);
        (w.requests, w.retries)
    }

    /// Retries in flight now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(ratio: f64, floor: f64) -> BudgetParams {
        BudgetParams::new(&BudgetPolicy {
            ratio,
            min_per_sec: floor,
            ..BudgetPolicy::default()
        })
    }

    fn grants(ratio: f64, requests: u64) -> u64 {
        let p = params(ratio, 0.0);
        let b = BudgetCell::new(p);
        for _ in 0..requests {
            b.deposit(&p, 0);
        }
        let mut n = 0;
        while b.try_withdraw(&p, 0).is_ok() {
            n += 1;
        }
        n
    }

    #[test]
    fn exact_grants_at_common_ratios() {
        assert_eq!(grants(0.1, 100), 10);
        assert_eq!(grants(0.1, 99), 9);
        assert_eq!(grants(0.2, 100), 20);
        assert_eq!(grants(0.2, 14), 2);
        assert_eq!(grants(0.3, 10), 3);
        assert_eq!(grants(0.3, 100), 30);
        assert_eq!(grants(0.3, 3), 0);
        assert_eq!(grants(0.3, 4), 1);
        assert_eq!(grants(1.0, 7), 7);
        assert_eq!(grants(1.0, 0), 0);
    }

    #[test]
    fn floor_allows_retries_without_traffic_and_refills() {
        let p = params(0.1, 1.0); // 10 s window → floor of 10
        let b = BudgetCell::new(p);
        let mut n = 0;
        while b.try_withdraw(&p, 0).is_ok() {
            n += 1;
        }
        assert_eq!(n, 10);
        assert_eq!(b.try_withdraw(&p, 9_999), Err(Refusal::Exhausted));
        // Once the bucket at t=0 leaves the window, the floor refills.
        assert!(b.try_withdraw(&p, 10_000).is_ok());
        assert_eq!(b.counts(&p, 10_000), (0, 1));
    }

    #[test]
    fn refund_and_in_flight_cap() {
        let mut p = params(1.0, 0.0);
        p.max_in_flight = Some(1);
        let b = BudgetCell::new(p);
        for _ in 0..10 {
            b.deposit(&p, 0);
        }
        assert!(b.try_withdraw(&p, 0).is_ok());
        assert_eq!(b.try_withdraw(&p, 0), Err(Refusal::Concurrency));
        b.release(&p);
        assert!(b.try_withdraw(&p, 0).is_ok());
        b.refund(&p, 0);
        assert_eq!(b.counts(&p, 0), (10, 1));
        assert_eq!(b.in_flight(), 0);
    }

    #[test]
    fn window_slides_bucket_by_bucket() {
        let p = params(0.5, 0.0);
        let b = BudgetCell::new(p);
        for t in 0..10u64 {
            b.deposit(&p, t * 1_000);
            b.deposit(&p, t * 1_000);
        }
        assert_eq!(b.counts(&p, 9_500), (20, 0));
        assert_eq!(b.counts(&p, 10_000), (18, 0));
        assert_eq!(b.counts(&p, 18_999), (2, 0));
        assert_eq!(b.counts(&p, 19_000), (0, 0));
        assert_eq!(b.counts(&p, 40_000), (0, 0));
    }
}
