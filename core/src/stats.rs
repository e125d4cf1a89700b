//! Counters: logical requests vs physical attempts (amplification), first-
//! attempt and final success, retry recovery, stops by reason — overall and
//! per upstream, tenant and policy version.
//!
//! What is stored is one count per event shape (a first attempt, a later
//! attempt, a success on the first try, a later success, ...): a successful
//! call bumps two counters per scope, and the published statistics are sums of
//! them. Per-version counters (and the overall ones, their sum) live in blocks
//! owned by one thread each, bumped with a plain load and store: threads on
//! distinct keys never write the same cache line.

use crate::types::Reason;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const REASONS: usize = 36;

/// Which counter to bump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum Ctr {
    /// Logical requests begun (overall, tenant, version).
    Begun = 0,
    /// First attempts started (an upstream's logical requests).
    FirstAttempts,
    /// Attempts after the first started.
    LaterAttempts,
    /// Calls won by their first attempt.
    FirstTrySuccesses,
    /// Calls won by a later attempt (a retry, fallback or hedge).
    LaterSuccesses,
    /// Retries and fallbacks granted.
    Retries,
    /// Logical requests that ended in reconcile.
    Reconciles,
    /// Breakers that opened.
    BreakerOpens,
    /// Fallbacks chosen.
    Fallbacks,
    /// Hedged attempts started.
    Hedges,
    /// Budget refusals.
    BudgetRefusals,
    /// Throttle rejections.
    Throttled,
}

impl Ctr {
    /// The attempt counter for attempt `number`.
    #[inline]
    pub(crate) fn attempt(number: u32) -> Ctr {
        if number == 1 {
            Ctr::FirstAttempts
        } else {
            Ctr::LaterAttempts
        }
    }

    /// The success counter for a call won by attempt `number`.
    #[inline]
    pub(crate) fn success(number: u32) -> Ctr {
        if number == 1 {
            Ctr::FirstTrySuccesses
        } else {
            Ctr::LaterSuccesses
        }
    }
}

const NCTR: usize = 12;

/// A block of counters (one key, or one thread's share of a policy version).
#[derive(Debug)]
pub(crate) struct Counters {
    c: [AtomicU64; NCTR],
    stops: [AtomicU64; REASONS],
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            c: std::array::from_fn(|_| AtomicU64::new(0)),
            stops: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Counters {
    /// Adds one (any thread).
    #[inline]
    pub(crate) fn bump(&self, c: Ctr) {
        self.c[c as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a stop by reason (any thread).
    #[inline]
    pub(crate) fn stop(&self, r: Reason) {
        if let Some(s) = self.stops.get(r.code() as usize) {
            s.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn add_into(&self, acc: &mut Totals) {
        for i in 0..NCTR {
            acc.c[i] += self.c[i].load(Ordering::Relaxed);
        }
        for i in 0..REASONS {
            acc.stops[i] += self.stops[i].load(Ordering::Relaxed);
        }
    }

    fn add_from(&self, t: &Totals) {
        for i in 0..NCTR {
            if t.c[i] != 0 {
                self.c[i].fetch_add(t.c[i], Ordering::Relaxed);
            }
        }
        for i in 0..REASONS {
            if t.stops[i] != 0 {
                self.stops[i].fetch_add(t.stops[i], Ordering::Relaxed);
            }
        }
    }

    /// A snapshot of a scope that counts logical requests when they begin.
    pub(crate) fn snapshot(&self) -> KeyStats {
        let mut t = Totals::default();
        self.add_into(&mut t);
        t.key_stats(false)
    }
}

/// One thread's counters: written by that thread only, with a plain load and
/// store (no locked instruction), read by anyone.
#[derive(Debug, Default)]
pub(crate) struct OwnedCounters(Counters);

impl OwnedCounters {
    /// Adds one. Only the owning thread may call this (see [`CounterSink`]).
    #[inline]
    pub(crate) fn bump(&self, c: Ctr) {
        let a = &self.0.c[c as usize];
        a.store(a.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    #[inline]
    fn stop(&self, r: Reason) {
        if let Some(a) = self.0.stops.get(r.code() as usize) {
            a.store(a.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    }
}

/// Where a call's per-version counts go: its thread's own block, or (for a
/// call used on a thread other than the one that began it, or across a
/// reload) the version's shared atomic block.
#[derive(Clone, Copy)]
pub(crate) enum CounterSink<'a> {
    /// The calling thread owns this block.
    Owned(&'a OwnedCounters),
    /// Any thread.
    Shared(&'a Counters),
}

impl CounterSink<'_> {
    /// Adds one.
    #[inline]
    pub(crate) fn bump(self, c: Ctr) {
        match self {
            CounterSink::Owned(o) => o.bump(c),
            CounterSink::Shared(s) => s.bump(c),
        }
    }

    /// Counts a stop by reason.
    #[inline]
    pub(crate) fn stop(self, r: Reason) {
        match self {
            CounterSink::Owned(o) => o.stop(r),
            CounterSink::Shared(s) => s.stop(r),
        }
    }
}

/// Counters of one scope written by many threads: one owned block per thread
/// that counts here often (its calls' thread), plus a shared block for
/// everyone else and for the blocks of threads that stopped counting here.
#[derive(Debug, Default)]
pub(crate) struct CounterSet {
    blocks: Mutex<Vec<Arc<OwnedCounters>>>,
    shared: Counters,
}

impl CounterSet {
    /// The shared block (any thread).
    #[inline]
    pub(crate) fn shared(&self) -> &Counters {
        &self.shared
    }

    /// A new block for one thread.
    pub(crate) fn new_block(&self) -> Arc<OwnedCounters> {
        let b = Arc::new(OwnedCounters::default());
        self.blocks.lock().push(b.clone());
        b
    }

    /// Folds a thread's block into the shared one once its thread no longer writes it.
    pub(crate) fn retire_block(&self, block: &Arc<OwnedCounters>) {
        let mut blocks = self.blocks.lock();
        if let Some(i) = blocks.iter().position(|b| Arc::ptr_eq(b, block)) {
            let b = blocks.swap_remove(i);
            let mut t = Totals::default();
            b.0.add_into(&mut t);
            self.shared.add_from(&t);
        }
    }

    fn add_into(&self, t: &mut Totals) {
        for b in self.blocks.lock().iter() {
            b.0.add_into(t);
        }
        self.shared.add_into(t);
    }

    /// A snapshot of a scope that counts logical requests when they begin.
    pub(crate) fn snapshot(&self) -> KeyStats {
        let mut t = Totals::default();
        self.add_into(&mut t);
        t.key_stats(false)
    }

    /// A snapshot of an upstream: its logical requests are the calls whose first attempt it served.
    pub(crate) fn upstream_snapshot(&self) -> KeyStats {
        let mut t = Totals::default();
        self.add_into(&mut t);
        t.key_stats(true)
    }
}

/// Counters of one policy version.
#[derive(Debug)]
pub(crate) struct VersionStats {
    /// The version string.
    pub(crate) version: Arc<str>,
    /// Its counters.
    pub(crate) set: CounterSet,
}

impl VersionStats {
    /// Empty counters for `version`.
    pub(crate) fn new(version: Arc<str>) -> Self {
        VersionStats {
            version,
            set: CounterSet::default(),
        }
    }
}

/// Every policy version's counters; the overall counters are their sum.
/// At most `MAX_VERSIONS` versions are kept apart; older ones no call runs
/// under any more are folded into one block, so the overall sum stays exact.
#[derive(Debug, Default)]
pub(crate) struct VersionTable {
    versions: Mutex<Vec<Arc<VersionStats>>>,
    folded: Counters,
}

const MAX_VERSIONS: usize = 64;

impl VersionTable {
    /// The counters of `version`, created on first use.
    pub(crate) fn get(&self, version: &str) -> Arc<VersionStats> {
        let mut v = self.versions.lock();
        if let Some(s) = v.iter().find(|s| &*s.version == version) {
            return s.clone();
        }
        if v.len() >= MAX_VERSIONS {
            if let Some(i) = v.iter().position(|s| Arc::strong_count(s) == 1) {
                let old = v.remove(i);
                let mut t = Totals::default();
                old.set.add_into(&mut t);
                self.folded.add_from(&t);
            }
        }
        let s = Arc::new(VersionStats::new(Arc::from(version)));
        v.push(s.clone());
        s
    }

    /// Per-version snapshots.
    pub(crate) fn per_version(&self) -> BTreeMap<String, KeyStats> {
        self.versions
            .lock()
            .iter()
            .map(|s| (s.version.to_string(), s.set.snapshot()))
            .collect()
    }

    /// The overall counters: every version's, plus the folded ones.
    pub(crate) fn overall(&self) -> KeyStats {
        let mut t = Totals::default();
        for s in self.versions.lock().iter() {
            s.set.add_into(&mut t);
        }
        self.folded.add_into(&mut t);
        t.key_stats(false)
    }
}

struct Totals {
    c: [u64; NCTR],
    stops: [u64; REASONS],
}

impl Default for Totals {
    fn default() -> Self {
        Totals {
            c: [0; NCTR],
            stops: [0; REASONS],
        }
    }
}

impl Totals {
    fn key_stats(&self, logical_from_first_attempts: bool) -> KeyStats {
        let g = |c: Ctr| self.c[c as usize];
        let logical = if logical_from_first_attempts {
            g(Ctr::FirstAttempts)
        } else {
            g(Ctr::Begun)
        };
        let attempts = g(Ctr::FirstAttempts) + g(Ctr::LaterAttempts);
        let successes = g(Ctr::FirstTrySuccesses) + g(Ctr::LaterSuccesses);
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let mut stops = BTreeMap::new();
        for (i, n) in self.stops.iter().enumerate() {
            if *n > 0 {
                if let Some(r) = Reason::from_code(i as u8) {
                    stops.insert(r.as_str().to_string(), *n);
                }
            }
        }
        KeyStats {
            logical_requests: logical,
            attempts,
            amplification: ratio(attempts, logical),
            successes,
            first_attempt_successes: g(Ctr::FirstTrySuccesses),
            first_attempt_success_rate: ratio(g(Ctr::FirstTrySuccesses), logical),
            final_success_rate: ratio(successes, logical),
            retries: g(Ctr::Retries),
            retry_successes: g(Ctr::LaterSuccesses),
            retry_recovery_rate: ratio(g(Ctr::LaterSuccesses), g(Ctr::Retries)),
            reconciles: g(Ctr::Reconciles),
            breaker_opens: g(Ctr::BreakerOpens),
            fallbacks: g(Ctr::Fallbacks),
            hedges: g(Ctr::Hedges),
            budget_refusals: g(Ctr::BudgetRefusals),
            throttled: g(Ctr::Throttled),
            stops,
        }
    }
}

/// Counters of one scope (overall, an upstream, a tenant, a policy version).
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct KeyStats {
    /// Logical requests begun.
    pub logical_requests: u64,
    /// Physical attempts started.
    pub attempts: u64,
    /// attempts / logical requests.
    pub amplification: f64,
    /// Logical requests that succeeded.
    pub successes: u64,
    /// Successes on the first attempt.
    pub first_attempt_successes: u64,
    /// first-attempt successes / logical requests.
    pub first_attempt_success_rate: f64,
    /// successes / logical requests.
    pub final_success_rate: f64,
    /// Retries and fallbacks granted.
    pub retries: u64,
    /// Successes won by a retry.
    pub retry_successes: u64,
    /// retry successes / retries.
    pub retry_recovery_rate: f64,
    /// Calls that ended in reconcile.
    pub reconciles: u64,
    /// Breaker opens.
    pub breaker_opens: u64,
    /// Fallbacks chosen.
    pub fallbacks: u64,
    /// Hedged attempts.
    pub hedges: u64,
    /// Budget refusals.
    pub budget_refusals: u64,
    /// Throttle rejections.
    pub throttled: u64,
    /// Stops by reason.
    pub stops: BTreeMap<String, u64>,
}

/// A snapshot of the engine's counters and tracked state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats {
    /// Policy version in force.
    pub policy_version: String,
    /// Overall counters.
    #[serde(flatten)]
    pub overall: KeyStats,
    /// Per upstream.
    pub per_upstream: BTreeMap<String, KeyStats>,
    /// Per tenant.
    pub per_tenant: BTreeMap<String, KeyStats>,
    /// Per policy version.
    pub per_policy_version: BTreeMap<String, KeyStats>,
    /// Kill-switch state.
    pub mode: crate::policy::Mode,
    /// Events dropped from the ring.
    pub events_dropped: u64,
    /// Sink calls that panicked.
    pub sink_panics: u64,
    /// Keys tracked per kind.
    pub tracked_keys: BTreeMap<String, u64>,
    /// Keys evicted per kind.
    pub evicted_keys: BTreeMap<String, u64>,
    /// Calls waiting in the reconcile list.
    pub reconcile_pending: u64,
    /// Reconcile items dropped because the list was full.
    pub reconcile_dropped: u64,
    /// Breaker states by key (non-closed only).
    pub breakers: BTreeMap<String, String>,
    /// Provider rate-limit counters by name (`observed`, `paced_waits`,
    /// `stops_rate_limited`, `stops_quota`, `malformed_headers`, ...); every
    /// scope's gauges are in [`crate::Engine::rate_limits`].
    pub rate_limits: BTreeMap<String, u64>,
    /// Each upstream's learned first-token limit (`timeouts.learn`), for
    /// upstreams whose streamed successes reported their time to first token.
    pub first_token: BTreeMap<String, FirstTokenStats>,
}

/// One Prometheus series: name, type, and how to read it from a scope's counters.
type Series = (&'static str, &'static str, fn(&KeyStats) -> f64);

impl Stats {
    /// Prometheus text exposition (version 0.0.4).
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let series: [Series; 10] = [
            ("retrywise_logical_requests_total", "counter", |k| {
                k.logical_requests as f64
            }),
            ("retrywise_attempts_total", "counter", |k| k.attempts as f64),
            ("retrywise_successes_total", "counter", |k| k.successes as f64),
            ("retrywise_first_attempt_successes_total", "counter", |k| {
                k.first_attempt_successes as f64
            }),
            ("retrywise_retries_total", "counter", |k| k.retries as f64),
            ("retrywise_retry_successes_total", "counter", |k| {
                k.retry_successes as f64
            }),
            ("retrywise_reconciles_total", "counter", |k| k.reconciles as f64),
            ("retrywise_fallbacks_total", "counter", |k| k.fallbacks as f64),
            ("retrywise_hedges_total", "counter", |k| k.hedges as f64),
            ("retrywise_amplification", "gauge", |k| k.amplification),
        ];
        let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
        for (name, kind, f) in series {
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            out.push_str(&format!("{name} {}\n", f(&self.overall)));
            for (label, map) in [
                ("upstream", &self.per_upstream),
                ("tenant", &self.per_tenant),
                ("policy_version", &self.per_policy_version),
            ] {
                for (k, v) in map {
                    out.push_str(&format!("{name}{{{label}=\"{}\"}} {}\n", esc(k), f(v)));
                }
            }
        }
        out.push_str("# TYPE retrywise_stops_total counter\n");
        for (reason, n) in &self.overall.stops {
            out.push_str(&format!("retrywise_stops_total{{reason=\"{}\"}} {n}\n", esc(reason)));
        }
        out.push_str("# TYPE retrywise_breaker_opens_total counter\n");
        out.push_str(&format!(
            "retrywise_breaker_opens_total {}\n",
            self.overall.breaker_opens
        ));
        out.push_str("# TYPE retrywise_budget_refusals_total counter\n");
        out.push_str(&format!(
            "retrywise_budget_refusals_total {}\n",
            self.overall.budget_refusals
        ));
        out.push_str("# TYPE retrywise_events_dropped_total counter\n");
        out.push_str(&format!("retrywise_events_dropped_total {}\n", self.events_dropped));
        out.push_str("# TYPE retrywise_tracked_keys gauge\n");
        for (kind, n) in &self.tracked_keys {
            out.push_str(&format!("retrywise_tracked_keys{{kind=\"{}\"}} {n}\n", esc(kind)));
        }
        out
    }
}

/// What [`crate::Engine::stats`] shows of one upstream's learned limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FirstTokenStats {
    /// Streamed successes that reported their time to first token.
    pub samples: u64,
    /// The policy's quantile of the last 128 of them, ms; null while fewer than `min_samples`.
    pub quantile_ms: Option<u64>,
    /// The first-token limit an attempt there gets, ms (never above the
    /// half-of-the-time-left rule); null while fewer than `min_samples`.
    pub limit_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_sum_to_the_published_counters() {
        let table = VersionTable::default();
        let v = table.get("v1");
        let mine = v.set.new_block();
        let sink = CounterSink::Owned(&mine);
        for _ in 0..4 {
            sink.bump(Ctr::Begun);
        }
        for n in [1, 2, 1, 1, 2, 3] {
            sink.bump(Ctr::attempt(n));
        }
        sink.bump(Ctr::Retries);
        CounterSink::Shared(v.set.shared()).bump(Ctr::Retries);
        sink.bump(Ctr::success(2));
        sink.stop(Reason::BudgetExhausted);
        let k = table.overall();
        assert_eq!((k.logical_requests, k.attempts, k.retries), (4, 6, 2));
        assert_eq!(k.amplification, 1.5);
        assert_eq!(k.retry_recovery_rate, 0.5);
        assert_eq!(k.stops.get("budget_exhausted"), Some(&1));
        // A retired block's counts stay in the version's totals.
        v.set.retire_block(&mine);
        assert_eq!(table.per_version()["v1"], k);
        let up = CounterSet::default();
        up.shared().bump(Ctr::attempt(1));
        CounterSink::Owned(&up.new_block()).bump(Ctr::attempt(2));
        up.shared().bump(Ctr::success(1));
        let s = up.upstream_snapshot();
        assert_eq!(
            (s.logical_requests, s.attempts, s.successes, s.first_attempt_successes),
            (1, 2, 1, 1)
        );
    }

    #[test]
    fn old_versions_fold_into_the_overall_counters() {
        let table = VersionTable::default();
        for i in 0..(MAX_VERSIONS + 10) {
            table.get(&format!("v{i}")).set.shared().bump(Ctr::Begun);
        }
        assert!(table.per_version().len() <= MAX_VERSIONS);
        assert_eq!(table.overall().logical_requests, (MAX_VERSIONS + 10) as u64);
    }
}
