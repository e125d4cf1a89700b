//! Counters: logical requests vs physical attempts (amplification), first-
//! attempt and final success, retry recovery, stops by reason — overall and
//! per upstream, tenant and policy version. Engine-wide counters are striped
//! per thread so threads on distinct keys do not fight over one cache line.

use crate::types::Reason;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

const REASONS: usize = 36;
const STRIPES: usize = 8;

/// Which counter to bump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Ctr {
    /// Logical requests begun.
    Logical = 0,
    /// Physical attempts started.
    Attempts,
    /// Logical requests that ended in success.
    Successes,
    /// Successes on the first attempt.
    FirstSuccesses,
    /// Retries and fallbacks granted.
    Retries,
    /// Successes won by an attempt after the first.
    RetrySuccesses,
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

const NCTR: usize = 12;

/// A block of counters (one stripe, or one key).
#[derive(Debug)]
pub struct Counters {
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
    /// Adds one.
    #[inline]
    pub fn bump(&self, c: Ctr) {
        self.c[c as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a stop by reason.
    #[inline]
    pub fn stop(&self, r: Reason) {
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

    /// A snapshot of this block alone.
    pub fn snapshot(&self) -> KeyStats {
        let mut t = Totals::default();
        self.add_into(&mut t);
        t.key_stats()
    }
}

#[repr(align(128))]
#[derive(Debug, Default)]
struct Padded(Counters);

/// Engine-wide counters, striped per thread.
#[derive(Debug)]
pub struct Striped {
    stripes: Box<[Padded]>,
}

impl Default for Striped {
    fn default() -> Self {
        Striped {
            stripes: (0..STRIPES).map(|_| Padded::default()).collect(),
        }
    }
}

static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static SLOT: usize = NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % STRIPES;
}

impl Striped {
    /// This thread's stripe.
    #[inline]
    pub fn local(&self) -> &Counters {
        let i = SLOT.with(|s| *s);
        &self.stripes[i % self.stripes.len()].0
    }

    /// Sum of all stripes.
    pub fn snapshot(&self) -> KeyStats {
        let mut t = Totals::default();
        for s in self.stripes.iter() {
            s.0.add_into(&mut t);
        }
        t.key_stats()
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
    fn key_stats(&self) -> KeyStats {
        let g = |c: Ctr| self.c[c as usize];
        let logical = g(Ctr::Logical);
        let attempts = g(Ctr::Attempts);
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
            successes: g(Ctr::Successes),
            first_attempt_successes: g(Ctr::FirstSuccesses),
            first_attempt_success_rate: ratio(g(Ctr::FirstSuccesses), logical),
            final_success_rate: ratio(g(Ctr::Successes), logical),
            retries: g(Ctr::Retries),
            retry_successes: g(Ctr::RetrySuccesses),
            retry_recovery_rate: ratio(g(Ctr::RetrySuccesses), g(Ctr::Retries)),
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
    pub mode: crate::engine::Mode,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn striped_sums_and_rates() {
        let s = Striped::default();
        for _ in 0..4 {
            s.local().bump(Ctr::Logical);
        }
        for _ in 0..6 {
            s.local().bump(Ctr::Attempts);
        }
        s.local().bump(Ctr::Retries);
        s.local().bump(Ctr::Retries);
        s.local().bump(Ctr::RetrySuccesses);
        s.local().stop(Reason::BudgetExhausted);
        let k = s.snapshot();
        assert_eq!(k.amplification, 1.5);
        assert_eq!(k.retry_recovery_rate, 0.5);
        assert_eq!(k.stops.get("budget_exhausted"), Some(&1));
        std::thread::spawn(move || s.local().bump(Ctr::Logical)).join().unwrap();
    }
}
