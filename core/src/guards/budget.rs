//! Retry budget: in a sliding window, retries granted ≤ `ratio` × requests +
//! `min_per_sec` × window seconds. Checked in exact ×1000 integer arithmetic,
//! so a ratio of 0.3 grants exactly 3 retries per 10 requests (tower's
//! `1/0.3 → 3` truncation would grant 33 %).
//!
//! Every first attempt deposits a request, so deposits are lock-free: each
//! bucket is one word holding its epoch and its count, bumped with a
//! compare-and-swap. A thread that calls an upstream often deposits into a
//! [`DepositShard`] of its own instead: the same bucket words, written by that
//! thread alone with a plain load and store (no locked instruction), which
//! every check of the cell adds to its own. Withdrawals are lock-free too and still exact: a retry is
//! counted by a compare-and-swap on the current bucket's word, so two threads
//! can never both take the last retry. A bucket counts at
//! most 16 777 215 requests or retries (more saturates, which only makes the
//! budget stricter); the window totals are summed from the buckets.

use crate::policy::{to_milli, Budget as BudgetPolicy};
use crate::sync::{AtomicU32, AtomicU64, Mutex};
use arc_swap::ArcSwapOption;
use smallvec::SmallVec;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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
    /// `u64::MAX / bucket_ms + 1`: the bucket of a time without a division.
    div_m: u64,
    /// Times below this divide exactly by `div_m`.
    div_below: u64,
    /// Fingerprint of the fields above, computed once.
    fp: u64,
}

impl BudgetParams {
    /// Compiles validated policy values.
    pub fn new(p: &BudgetPolicy) -> Self {
        let buckets = p.buckets.max(1);
        let bucket_ms = (p.window_ms / buckets as u64).max(1);
        let window_ms = bucket_ms * buckets as u64;
        let per_sec_milli = to_milli(p.min_per_sec).unwrap_or(0);
        let mut b = BudgetParams {
            bucket_ms,
            buckets,
            ratio_milli: to_milli(p.ratio).unwrap_or(0),
            floor_milli: per_sec_milli.saturating_mul(window_ms) / 1000,
            max_in_flight: p.max_concurrent_retries,
            div_m: (u64::MAX / bucket_ms).wrapping_add(1),
            div_below: (u64::MAX / 2) / bucket_ms,
            fp: 0,
        };
        b.fp = b.fingerprint();
        b
    }

    /// `now_ms / bucket_ms`, by multiplication (exact while `now_ms × bucket_ms < 2^64`,
    /// i.e. for any monotonic time of a running process; the division covers the rest).
    #[inline]
    fn epoch(&self, now_ms: u64) -> u64 {
        let e = if self.div_m != 0 && now_ms < self.div_below {
            ((now_ms as u128 * self.div_m as u128) >> 64) as u64
        } else {
            now_ms / self.bucket_ms.max(1)
        };
        // With bucket_ms = 1 the multiplier wraps to 0 and the division above is used.
        e & EPOCH_MAX
    }

    /// The fingerprint of these parameters: a cell built for others restarts fresh.
    #[inline]
    fn id(&self) -> u64 {
        self.fp
    }

    fn fingerprint(&self) -> u64 {
        [
            self.bucket_ms,
            self.buckets as u64,
            self.ratio_milli,
            self.floor_milli,
            self.max_in_flight.map_or(u64::MAX, u64::from),
        ]
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, w| {
            (h ^ w).wrapping_mul(0x0100_0000_01b3).rotate_left(29)
        })
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

const COUNT_BITS: u32 = 24;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const EPOCH_MAX: u64 = (1 << (64 - COUNT_BITS)) - 1;

fn pack(epoch: u64, count: u64) -> u64 {
    (epoch & EPOCH_MAX) << COUNT_BITS | count.min(COUNT_MAX)
}

fn unpack(w: u64) -> (u64, u64) {
    (w >> COUNT_BITS, w & COUNT_MAX)
}

/// The request word of the `n` buckets (`n` > 0) that `epoch` counts in.
#[inline(always)]
fn bucket(epoch: u64, n: u64) -> usize {
    (if epoch < n { epoch } else { epoch % n }) as usize
}

/// Request word `w` with one more request at `epoch`: a bucket of this
/// epoch (or, from a thread that read the clock a little later, a newer
/// one) counts one more; an older one restarts.
#[inline(always)]
fn one_more(w: u64, epoch: u64) -> u64 {
    let (e, c) = unpack(w);
    if e >= epoch {
        pack(e, c + 1)
    } else {
        pack(epoch, 1)
    }
}

/// One thread's request counts in one budget scope: bucket words laid out
/// as the cell's, written only by the thread it was made for, with a plain
/// load and store. Its cell adds them to its own in every check; when the
/// thread stops using it ([`BudgetCell::retire_shard`]) they are folded
/// into the cell's (see the `shard_in_short` test).
#[derive(Debug)]
pub(crate) struct DepositShard {
    words: Box<[AtomicU64]>,
    /// The parameters it counts under.
    params_id: u64,
    /// Whether its cell counts it: a reset for new parameters, or its
    /// retirement, stops that for good.
    counted: AtomicBool,
}

impl DepositShard {
    /// Counts one request at `now_ms` (see [`BudgetCell::deposit_via`]).
    #[inline]
    fn deposit(&self, params: &BudgetParams, now_ms: u64) {
        let n = self.words.len() as u64;
        if n == 0 {
            return;
        }
        let epoch = params.epoch(now_ms);
        let slot = &self.words[bucket(epoch, n)];
        slot.store(one_more(slot.load(Ordering::Relaxed), epoch), Ordering::Relaxed);
    }
}

/// One scope's budget: per-bucket request and retry counts plus retries in flight.
#[derive(Debug)]
pub struct BudgetCell {
    /// `buckets` request words, then `buckets + 1` retry words; each `epoch << 24 | count`.
    /// Retries are summed over one bucket more than requests: the buckets
    /// that overlap the window ending now, however far into its bucket now
    /// is, so no window of the configured length ever holds more grants than
    /// the promise allows (requests are summed only over buckets inside it).
    slots: SmallVec<[AtomicU64; 21]>,
    /// Fingerprint of the parameters the counts were made under.
    params_id: AtomicU64,
    in_flight: AtomicU32,
    /// The threads' deposit shards counted with the cell, when it has any
    /// (most cells, scoped by tenant, never do): one pointer, as a key's
    /// bytes count. Read and changed only under `lock`.
    shards: ArcSwapOption<Vec<Arc<DepositShard>>>,
    /// Serializes resets after a reload changed the parameters and changes
    /// to `shards`, and makes folding a retired shard one step for whoever
    /// sums the requests.
    lock: Mutex<()>,
}

impl BudgetCell {
    /// An empty budget.
    pub fn new(params: BudgetParams) -> Self {
        BudgetCell {
            slots: (0..2 * params.buckets as usize + 1)
                .map(|_| AtomicU64::new(0))
                .collect(),
            params_id: AtomicU64::new(params.id()),
            in_flight: AtomicU32::new(0),
            shards: ArcSwapOption::empty(),
            lock: Mutex::new(()),
        }
    }

    /// Whether this cell has room for `params`' buckets (a reload that changes
    /// the bucket count needs a new cell).
    pub fn fits(&self, params: &BudgetParams) -> bool {
        self.slots.len() == 2 * params.buckets as usize + 1
    }

    fn n(&self) -> usize {
        self.slots.len() / 2
    }

    /// The retry words (`n + 1`, see `slots`).
    fn retry_words(&self) -> &[AtomicU64] {
        &self.slots[self.n()..]
    }

    #[cold]
    #[inline(never)]
    fn resync(&self, params: &BudgetParams) {
        let _g = self.lock.lock();
        self.sync_params(params);
    }

    /// A reload changed the parameters: this scope restarts fresh, and the
    /// shards made under the old ones are no longer counted (their threads
    /// make new ones with the new policy). Caller holds the lock.
    fn sync_params(&self, params: &BudgetParams) {
        let id = params.id();
        if self.params_id.load(Ordering::Acquire) != id {
            for s in self.slots.iter() {
                s.store(0, Ordering::Relaxed);
            }
            for s in self.shards.swap(None).iter().flat_map(|v| v.iter()) {
                s.counted.store(false, Ordering::Relaxed);
            }
            self.params_id.store(id, Ordering::Release);
        }
    }

    /// A deposit shard for one thread, counted with this cell from now on.
    pub(crate) fn new_shard(&self, params: &BudgetParams) -> Arc<DepositShard> {
        let _g = self.lock.lock();
        self.sync_params(params);
        let shard = Arc::new(DepositShard {
            words: (0..self.n()).map(|_| AtomicU64::new(0)).collect(),
            params_id: params.id(),
            counted: AtomicBool::new(true),
        });
        let mut v = self.shards.load().as_deref().cloned().unwrap_or_default();
        v.push(shard.clone());
        self.shards.store(Some(Arc::new(v)));
        shard
    }

    /// Counts one request at `now_ms` into `shard` (no locked instruction)
    /// while this cell counts it under `params`, else into the cell itself.
    /// Only the thread `shard` was made for may pass it.
    #[inline]
    pub(crate) fn deposit_via(&self, shard: &DepositShard, params: &BudgetParams, now_ms: u64) {
        if shard.params_id == params.id() && shard.counted.load(Ordering::Relaxed) {
            shard.deposit(params, now_ms);
        } else {
            self.deposit(params, now_ms);
        }
    }

    /// Folds `shard`'s requests into the cell's own once its thread no
    /// longer writes it (one step under the lock: a check counts them once).
    pub(crate) fn retire_shard(&self, shard: &Arc<DepositShard>) {
        let _g = self.lock.lock();
        let Some(mut v) = self.shards.load().as_deref().cloned() else {
            return;
        };
        let Some(i) = v.iter().position(|s| Arc::ptr_eq(s, shard)) else {
            return;
        };
        v.swap_remove(i);
        self.shards.store((!v.is_empty()).then(|| Arc::new(v)));
        shard.counted.store(false, Ordering::Relaxed);
        for (slot, w) in self.slots[..self.n()].iter().zip(shard.words.iter()) {
            let (e, c) = unpack(w.load(Ordering::Relaxed));
            if c == 0 {
                continue;
            }
            let mut cur = slot.load(Ordering::Relaxed);
            loop {
                let (se, sc) = unpack(cur);
                // Same bucket: add; the cell's is older: the shard's replaces it; newer: the shard's expired.
                let next = match se.cmp(&e) {
                    std::cmp::Ordering::Equal => pack(e, sc + c),
                    std::cmp::Ordering::Less => pack(e, c),
                    std::cmp::Ordering::Greater => break,
                };
                match slot.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => break,
                    Err(seen) => cur = seen,
                }
            }
        }
    }

    /// Requests in the window ending at `epoch`: the cell's and its shards'.
    /// Caller holds the lock: a retired shard is folded under it, so its
    /// requests are counted once, never missed (reading the cell's words
    /// outside it could see them neither there nor in the shard, and refuse
    /// a retry the budget has room for).
    fn requests_locked(&self, epoch: u64) -> u64 {
        let shards = self.shards.load();
        let in_shards: u64 = shards
            .iter()
            .flat_map(|v| v.iter())
            .map(|s| Self::window_sum(&s.words, epoch))
            .sum();
        Self::window_sum(&self.slots[..self.n()], epoch) + in_shards
    }

    /// Counts one request (a first attempt) at `now_ms`.
    #[inline]
    pub fn deposit(&self, params: &BudgetParams, now_ms: u64) {
        if self.params_id.load(Ordering::Acquire) != params.id() {
            self.resync(params);
        }
        let n = self.n() as u64;
        if n == 0 {
            return;
        }
        let epoch = params.epoch(now_ms);
        let slot = &self.slots[bucket(epoch, n)];
        let mut cur = slot.load(Ordering::Relaxed);
        loop {
            let next = one_more(cur, epoch);
            // A saturated bucket stays as it is.
            if next == cur {
                return;
            }
            match slot.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Sum of the words in `words` whose epoch lies in the window ending at `epoch`.
    fn window_sum(words: &[AtomicU64], epoch: u64) -> u64 {
        let oldest = epoch.saturating_sub(words.len() as u64 - 1);
        // `oldest ≤ e ≤ epoch` as one unsigned comparison, without branches.
        let span = epoch - oldest;
        words
            .iter()
            .map(|w| {
                let (e, c) = unpack(w.load(Ordering::Relaxed));
                c * (e.wrapping_sub(oldest) <= span) as u64
            })
            .sum()
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
        if self.params_id.load(Ordering::Acquire) != params.id() {
            self.resync(params);
        }
        let granted = self.take_retry(params, now_ms);
        if granted {
            return Ok(());
        }
        if params.max_in_flight.is_some() {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        Err(Refusal::Exhausted)
    }

    /// Counts one more retry in the current bucket if the allowance has room.
    /// Exact without holding anything across the check: retries only grow in
    /// the current bucket, so a compare-and-swap on that bucket's word fails
    /// (and the check is made again) whenever another thread took or
    /// refunded a retry meanwhile. The retries are read before the requests,
    /// which only grow: a refusal then holds at the instant the requests were
    /// read. Read the other way round, a thread descheduled between the two
    /// reads compared the retries others took meanwhile with requests that
    /// did not include theirs, and refused a retry the budget had room for.
    #[inline]
    fn take_retry(&self, params: &BudgetParams, now_ms: u64) -> bool {
        self.take_retry_reading(params, now_ms, |epoch| {
            let _g = self.lock.lock();
            self.requests_locked(epoch)
        })
    }

    /// [`BudgetCell::take_retry`], reading the requests in the window ending
    /// at an epoch with `requests` (a test interleaves other threads' work there).
    #[inline(always)]
    fn take_retry_reading(&self, params: &BudgetParams, now_ms: u64, mut requests: impl FnMut(u64) -> u64) -> bool {
        let n = self.n();
        if n == 0 {
            return false;
        }
        let epoch = params.epoch(now_ms);
        let retries = self.retry_words();
        let slot = &retries[(epoch % retries.len() as u64) as usize];
        loop {
            let cur = slot.load(Ordering::Acquire);
            let taken = Self::window_sum(retries, epoch);
            let allowed = params
                .ratio_milli
                .saturating_mul(requests(epoch))
                .saturating_add(params.floor_milli);
            if (taken + 1).saturating_mul(1000) > allowed {
                return false;
            }
            let (e, c) = unpack(cur);
            let next = if e == epoch { pack(e, c + 1) } else { pack(epoch, 1) };
            if slot
                .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return true;
            }
        }
    }

    /// Undoes a grant that was not used (e.g. the wait did not fit the deadline).
    pub fn refund(&self, params: &BudgetParams, now_ms: u64) {
        let n = self.n();
        if n > 0 && self.params_id.load(Ordering::Acquire) == params.id() {
            let epoch = params.epoch(now_ms);
            let retries = self.retry_words();
            let slot = &retries[(epoch % retries.len() as u64) as usize];
            let mut cur = slot.load(Ordering::Relaxed);
            loop {
                let (e, c) = unpack(cur);
                if e != epoch || c == 0 {
                    break;
                }
                match slot.compare_exchange_weak(cur, pack(e, c - 1), Ordering::AcqRel, Ordering::Relaxed) {
                    Ok(_) => break,
                    Err(seen) => cur = seen,
                }
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

    /// `(requests, retries)` the allowance is judged on at `now_ms` (see `slots`).
    pub fn counts(&self, params: &BudgetParams, now_ms: u64) -> (u64, u64) {
        let _g = self.lock.lock();
        self.sync_params(params);
        let epoch = params.epoch(now_ms);
        (self.requests_locked(epoch), Self::window_sum(self.retry_words(), epoch))
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
        // Retries are judged over the buckets that overlap the window: the
        // bucket [0, 1 s) still does at 10.5 s (grants at 0.9 s would be
        // inside the 10 s before it); once it no longer can, the floor refills.
        assert_eq!(b.try_withdraw(&p, 10_500), Err(Refusal::Exhausted));
        assert!(b.try_withdraw(&p, 11_000).is_ok());
        assert_eq!(b.counts(&p, 11_000), (0, 1));
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

    /// Requests deposited into threads' shards count exactly as the cell's
    /// own, while the shards are live and once they are folded in; a fold
    /// keeps each bucket's time; new parameters stop counting old shards,
    /// whose deposits then go to the cell.
    #[test]
    fn shards_count_with_the_cell_and_fold_into_it() {
        let p = params(0.3, 0.0);
        let b = BudgetCell::new(p);
        let (s1, s2) = (b.new_shard(&p), b.new_shard(&p));
        for _ in 0..4 {
            b.deposit_via(&s1, &p, 0);
        }
        for _ in 0..3 {
            b.deposit_via(&s2, &p, 5_000);
        }
        for _ in 0..3 {
            b.deposit(&p, 5_000);
        }
        assert_eq!(b.counts(&p, 5_000), (10, 0));
        // The sum decides: 10 requests at 0.3 grant exactly 3 retries.
        assert!(b.try_withdraw(&p, 5_000).is_ok());
        b.retire_shard(&s2);
        assert_eq!(b.counts(&p, 5_000), (10, 1));
        b.retire_shard(&s1);
        b.retire_shard(&s1); // a second retire changes nothing
        assert_eq!(b.counts(&p, 5_000), (10, 1));
        assert!(b.try_withdraw(&p, 5_000).is_ok());
        assert!(b.try_withdraw(&p, 5_000).is_ok());
        assert_eq!(b.try_withdraw(&p, 5_000), Err(Refusal::Exhausted));
        // s1's bucket (t = 0) leaves the window before s2's and the cell's (t = 5 s).
        assert_eq!(b.counts(&p, 10_000), (6, 3));
        // A shard folded later than its bucket's time is not counted again.
        let s3 = b.new_shard(&p);
        b.deposit_via(&s3, &p, 0);
        assert_eq!(b.counts(&p, 10_000), (6, 3));
        b.retire_shard(&s3);
        assert_eq!(b.counts(&p, 10_000), (6, 3));
        // New parameters restart the scope and stop counting old shards; a
        // deposit through one (even back under its own parameters) reaches the cell.
        let q = params(0.5, 0.0);
        let s4 = b.new_shard(&p);
        b.deposit_via(&s4, &p, 10_000);
        assert_eq!(b.counts(&q, 10_000), (0, 0));
        b.deposit_via(&s4, &q, 10_000);
        assert_eq!(b.counts(&q, 10_000), (1, 0));
        b.deposit_via(&s4, &p, 10_000);
        assert_eq!(b.counts(&p, 10_000), (1, 0));
        b.retire_shard(&s4);
        assert_eq!(b.counts(&p, 10_000), (1, 0));
    }

    /// A shard in short: one per thread, counted with its cell, folded in when retired.
    #[test]
    fn shard_in_short() {
        let p = BudgetParams::new(&BudgetPolicy {
            ratio: 0.5,
            min_per_sec: 0.0,
            ..BudgetPolicy::default()
        });
        let cell = BudgetCell::new(p);
        let shard = cell.new_shard(&p); // one per thread
        cell.deposit_via(&shard, &p, 0); // only on that thread
        cell.deposit(&p, 0); // on any thread
        assert_eq!(cell.counts(&p, 0), (2, 0));
        assert!(cell.try_withdraw(&p, 0).is_ok()); // 2 requests at 0.5: one retry
        cell.retire_shard(&shard); // its thread is done: its request stays counted
        assert_eq!(cell.counts(&p, 0), (2, 1));
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

    /// Other threads that deposit requests and take retries between this
    /// check's reads never make it refuse a retry the budget has room for.
    #[test]
    fn work_of_other_threads_between_the_reads_never_refuses_a_retry_with_room() {
        let p = params(0.1, 0.0);
        let b = BudgetCell::new(p);
        for _ in 0..100 {
            b.deposit(&p, 5_000);
        }
        for _ in 0..9 {
            assert_eq!(b.try_withdraw(&p, 5_000), Ok(()));
        }
        // Read the requests (100), then others deposit 100 more and take 10
        // retries: 20 of 200 allowed, 19 taken, so this one fits.
        let mut others = Some(());
        let granted = b.take_retry_reading(&p, 5_000, |epoch| {
            let seen = {
                let _g = b.lock.lock();
                b.requests_locked(epoch)
            };
            if others.take().is_some() {
                for _ in 0..100 {
                    b.deposit(&p, 5_000);
                }
                for _ in 0..10 {
                    assert_eq!(b.try_withdraw(&p, 5_000), Ok(()));
                }
            }
            seen
        });
        assert!(granted, "refused with room: {:?}", b.counts(&p, 5_000));
        assert_eq!(b.counts(&p, 5_000), (200, 20));
        // The allowance is now spent.
        assert_eq!(b.try_withdraw(&p, 5_000), Err(Refusal::Exhausted));
    }
}

#[cfg(test)]
mod epoch_tests {
    use super::*;

    #[test]
    fn multiplicative_epoch_matches_division() {
        for window_ms in [1u64, 7, 10, 1_000, 10_000, 60_000, 3_600_000] {
            for buckets in [1u32, 3, 10] {
                let p = BudgetParams::new(&BudgetPolicy {
                    window_ms,
                    buckets,
                    ..BudgetPolicy::default()
                });
                for now in (0..20_000u64).chain([86_400_000 * 365, u32::MAX as u64, 1 << 40]) {
                    assert_eq!(p.epoch(now), (now / p.bucket_ms) & EPOCH_MAX, "{now} / {}", p.bucket_ms);
                }
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod race_tests {
    use super::*;

    #[test]
    fn racing_threads_take_exactly_the_allowance() {
        for ratio in [0.1, 0.3, 1.0] {
            let p = BudgetParams::new(&BudgetPolicy {
                ratio,
                min_per_sec: 0.0,
                ..BudgetPolicy::default()
            });
            let cell = std::sync::Arc::new(BudgetCell::new(p));
            for _ in 0..1_000 {
                cell.deposit(&p, 5);
            }
            let granted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let (cell, granted) = (cell.clone(), granted.clone());
                    std::thread::spawn(move || {
                        for _ in 0..1_000 {
                            if cell.try_withdraw(&p, 5).is_ok() {
                                granted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            let want = (ratio * 1_000.0).round() as u64;
            assert_eq!(granted.load(Ordering::Relaxed), want, "ratio {ratio}");
            assert_eq!(cell.counts(&p, 5), (1_000, want));
        }
    }
}
