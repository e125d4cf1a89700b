//! Telemetry of the rate-limit table: per scope and kind the provider's
//! limit and remaining allowance (Prometheus gauges, stats), and counters of
//! readings, refusals, paced waits and malformed headers.

use super::reading::Kind;
use serde::{Serialize, Serializer};
use std::fmt::Write;
use std::time::Duration;

/// One kind's state in a scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KindSnapshot {
    /// The kind.
    pub kind: Kind,
    /// The provider's limit per window, when known.
    pub limit: Option<u64>,
    /// The provider's remaining allowance as last read (the limit again after a reset).
    pub remaining: Option<u64>,
    /// What this process may still send: `remaining` less attempts in flight,
    /// unconfirmed usage and slots promised to paced callers.
    pub available: Option<u64>,
    /// Time until the window resets, when `remaining` is known (serialized as `reset_in_ms`).
    #[serde(rename = "reset_in_ms", serialize_with = "as_ms")]
    pub reset_in: Option<Duration>,
    /// Units reserved by attempts in flight.
    pub in_flight: u64,
}

/// One scope's adaptive concurrency gate (`rate_limits.concurrency`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ConcurrencySnapshot {
    /// Attempts allowed in flight now.
    pub limit: u32,
    /// Attempts in flight now.
    pub in_flight: u32,
    /// Times the limit was cut (a 429 without quota exhaustion, an overload).
    pub cuts: u64,
    /// Mean time an attempt held its place, when any ended (serialized as `mean_hold_ms`).
    #[serde(rename = "mean_hold_ms", serialize_with = "as_ms")]
    pub mean_hold: Option<Duration>,
}

/// One scope's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScopeSnapshot {
    /// The scope key.
    pub scope: String,
    /// Kinds with anything known, in [`Kind::ALL`] order.
    pub kinds: Vec<KindSnapshot>,
    /// A quota hold is in force.
    pub quota_exhausted: bool,
    /// The adaptive concurrency gate, once an attempt was gated in the scope.
    pub concurrency: Option<ConcurrencySnapshot>,
}

/// Counts since the table was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct RateLimitCounters {
    /// Readings observed.
    pub observed: u64,
    /// Readings that were rate-limit refusals (429 without quota exhaustion).
    pub rate_limited: u64,
    /// Readings that said a quota was exhausted.
    pub quota_exhausted: u64,
    /// Malformed rate-limit header values ignored.
    pub malformed_headers: u64,
    /// Attempts admitted in scopes with state.
    pub admitted: u64,
    /// Admissions that paced the caller (a wait until its slot).
    pub paced_waits: u64,
    /// Admissions stopped because the wait did not fit the time left.
    pub stops_rate_limited: u64,
    /// Admissions stopped by an exhausted quota.
    pub stops_quota: u64,
    /// Attempts held because their scope's adaptive concurrency limit was in flight.
    pub concurrency_holds: u64,
    /// Cuts of a scope's adaptive concurrency limit.
    pub concurrency_cuts: u64,
}

impl RateLimitCounters {
    /// Every counter with its name (the name of its Prometheus series, less
    /// `retrywise_ratelimit_` and `_total`).
    pub fn named(&self) -> [(String, u64); 10] {
        [
            ("observed", self.observed),
            ("rate_limited", self.rate_limited),
            ("quota_exhausted", self.quota_exhausted),
            ("malformed_headers", self.malformed_headers),
            ("admitted", self.admitted),
            ("paced_waits", self.paced_waits),
            ("stops_rate_limited", self.stops_rate_limited),
            ("stops_quota", self.stops_quota),
            ("concurrency_holds", self.concurrency_holds),
            ("concurrency_cuts", self.concurrency_cuts),
        ]
        .map(|(n, v)| (n.to_string(), v))
    }
}

/// Every tracked scope plus the counters.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct RateLimitSnapshot {
    /// Scopes with anything known, sorted by key.
    pub scopes: Vec<ScopeSnapshot>,
    /// The counters.
    pub counters: RateLimitCounters,
}

fn as_ms<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    d.map(|d| d.as_millis() as u64).serialize(s)
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl RateLimitSnapshot {
    /// Prometheus text exposition (0.0.4): `retrywise_ratelimit_{limit,remaining,available}`
    /// gauges labelled by scope and kind, `retrywise_ratelimit_concurrency_{limit,in_flight}`
    /// gauges labelled by scope, and the counters as `*_total`.
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        type Gauge = (&'static str, fn(&KindSnapshot) -> Option<u64>);
        let gauges: [Gauge; 3] = [
            ("retrywise_ratelimit_limit", |k| k.limit),
            ("retrywise_ratelimit_remaining", |k| k.remaining),
            ("retrywise_ratelimit_available", |k| k.available),
        ];
        for (name, get) in gauges {
            let _ = writeln!(out, "# TYPE {name} gauge");
            for s in &self.scopes {
                for k in &s.kinds {
                    if let Some(v) = get(k) {
                        let (scope, kind) = (esc(&s.scope), k.kind.as_str());
                        let _ = writeln!(out, "{name}{{scope=\"{scope}\",kind=\"{kind}\"}} {v}");
                    }
                }
            }
        }
        type ScopeGauge = (&'static str, fn(&ConcurrencySnapshot) -> u32);
        let gauges: [ScopeGauge; 2] = [
            ("retrywise_ratelimit_concurrency_limit", |c| c.limit),
            ("retrywise_ratelimit_concurrency_in_flight", |c| c.in_flight),
        ];
        for (name, get) in gauges {
            let _ = writeln!(out, "# TYPE {name} gauge");
            for s in &self.scopes {
                if let Some(c) = &s.concurrency {
                    let _ = writeln!(out, "{name}{{scope=\"{}\"}} {}", esc(&s.scope), get(c));
                }
            }
        }
        for (name, v) in self.counters.named() {
            let _ = writeln!(out, "# TYPE retrywise_ratelimit_{name}_total counter");
            let _ = writeln!(out, "retrywise_ratelimit_{name}_total {v}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_labels_every_known_value() {
        let snap = RateLimitSnapshot {
            scopes: vec![ScopeSnapshot {
                scope: "key\"a/openai/gpt-4o".into(),
                kinds: vec![
                    KindSnapshot {
                        kind: Kind::Requests,
                        limit: Some(60),
                        remaining: Some(59),
                        available: Some(57),
                        reset_in: Some(Duration::from_secs(1)),
                        in_flight: 2,
                    },
                    KindSnapshot {
                        kind: Kind::Tokens,
                        limit: None,
                        remaining: Some(100),
                        available: Some(100),
                        reset_in: None,
                        in_flight: 0,
                    },
                ],
                quota_exhausted: false,
                concurrency: Some(ConcurrencySnapshot {
                    limit: 5,
                    in_flight: 2,
                    cuts: 1,
                    mean_hold: None,
                }),
            }],
            counters: RateLimitCounters {
                paced_waits: 3,
                malformed_headers: 1,
                ..RateLimitCounters::default()
            },
        };
        let text = snap.prometheus();
        for line in [
            "# TYPE retrywise_ratelimit_limit gauge",
            "retrywise_ratelimit_limit{scope=\"key\\\"a/openai/gpt-4o\",kind=\"requests\"} 60",
            "retrywise_ratelimit_remaining{scope=\"key\\\"a/openai/gpt-4o\",kind=\"requests\"} 59",
            "retrywise_ratelimit_available{scope=\"key\\\"a/openai/gpt-4o\",kind=\"requests\"} 57",
            "retrywise_ratelimit_remaining{scope=\"key\\\"a/openai/gpt-4o\",kind=\"tokens\"} 100",
            "retrywise_ratelimit_paced_waits_total 3",
            "retrywise_ratelimit_malformed_headers_total 1",
            "retrywise_ratelimit_stops_quota_total 0",
            "# TYPE retrywise_ratelimit_concurrency_limit gauge",
            "retrywise_ratelimit_concurrency_limit{scope=\"key\\\"a/openai/gpt-4o\"} 5",
            "retrywise_ratelimit_concurrency_in_flight{scope=\"key\\\"a/openai/gpt-4o\"} 2",
            "retrywise_ratelimit_concurrency_holds_total 0",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("retrywise_ratelimit_limit{scope=\"key\\\"a/openai/gpt-4o\",kind=\"tokens\"}"));
    }
}
