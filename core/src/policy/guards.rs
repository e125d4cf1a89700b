//! The policy sections of the shared guards: the retry budget, the circuit
//! breaker, adaptive throttling and concurrency limits.

use super::{ScopeDim, ScopeSpec};
use crate::types::ErrorClass;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Retry budget: granted retries in the window ≤ `ratio` × requests in the
/// window + `min_per_sec` × window seconds, checked in exact ×1000 integer math.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Budget {
    /// Default true.
    pub enabled: bool,
    /// Sliding window, ms. Default 10 000.
    pub window_ms: u64,
    /// Buckets the window is cut into. Default 10.
    pub buckets: u32,
    /// Retries allowed per request, at most 3 decimals. Default 0.1.
    pub ratio: f64,
    /// Floor of retries per second even with no traffic, at most 3 decimals. Default 1.
    pub min_per_sec: f64,
    /// Independent budgets a retry must all pass; each is a composite key. Default `[[upstream]]`.
    pub scopes: Vec<ScopeSpec>,
    /// Retries in flight (granted, not yet reported) per scope; null = no cap. Default null.
    pub max_concurrent_retries: Option<u32>,
    /// A retry of a rate-limit 429 (not a quota, not an overload) that waits
    /// out the provider's valid Retry-After on the same upstream draws nothing
    /// from the budget: the provider said when to come back, and the attempts,
    /// the deadline and (with `rate_limits`) pacing bound it. The budget is for
    /// failures that say nothing of when the upstream can take more (503, 529,
    /// timeouts). Default true.
    pub exempt_rate_limited: bool,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            enabled: true,
            window_ms: 10_000,
            buckets: 10,
            ratio: 0.1,
            min_per_sec: 1.0,
            scopes: vec![vec![ScopeDim::Upstream]],
            max_concurrent_retries: None,
            exempt_rate_limited: true,
        }
    }
}

/// Rolling-window shape for breakers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WindowKind {
    /// The last `size` calls.
    Count,
    /// The last `size` milliseconds, in `buckets` buckets.
    Time,
}

/// Manual override of a breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BreakerOverride {
    /// Always open: every call is refused (or falls back).
    ForceOpen,
    /// Always closed, still recording.
    ForceClosed,
    /// No breaker at all.
    Disabled,
    /// Records and reports, never trips.
    MetricsOnly,
}

/// Circuit breaker per scope (default `provider/model/region`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Breaker {
    /// Default true.
    pub enabled: bool,
    /// Scope key. Default `[provider, model, region]`.
    pub scope: ScopeSpec,
    /// `count` (default) or `time`.
    pub window: WindowKind,
    /// Calls (count window) or ms (time window). Default 100.
    pub window_size: u64,
    /// Buckets of a time window. Default 10.
    pub buckets: u32,
    /// Calls in the window before any rate is judged. Default 20.
    pub min_calls: u32,
    /// Trip when counted failures / calls ≥ this, in (0, 1]; null = off. Default 0.5.
    pub failure_rate: Option<f64>,
    /// A call slower than this is "slow", ms; null = off. Default null.
    pub slow_call_ms: Option<u64>,
    /// Trip when slow calls / calls ≥ this, in (0, 1]; null = off. Default null.
    pub slow_call_rate: Option<f64>,
    /// Trip after this many consecutive counted failures spanning at least
    /// `consecutive_min_ms`, whatever the window holds; null = off. Default
    /// 5 (Envoy's `consecutive_5xx`): the rate needs `min_calls` in its
    /// window and then half of them failed, so under light traffic (one
    /// request every few seconds) an upstream that fails every call would
    /// otherwise be tried by 20 calls or more before any was diverted.
    pub consecutive_failures: Option<u32>,
    /// How long a run of consecutive failures must last (its first failure
    /// this long before the one that trips), ms. Default 1 000: under heavy
    /// traffic a few failures in a row within milliseconds are noise the
    /// failure rate judges (a 5 % blip at 12 000 requests a second has such
    /// runs every few seconds); a run with no success for a second is an
    /// upstream that stopped answering. 0: the count alone trips.
    pub consecutive_min_ms: u64,
    /// Classes that count as failures. Default `[transient, overloaded]`
    /// (timeouts classify as transient). InvalidRequest and AuthOrPolicy never count.
    pub count_classes: Vec<ErrorClass>,
    /// First open duration, ms. Default 1 000: probes are cheap (ten calls
    /// at most) and a provider that fails briefly is back in use within a
    /// second; a provider that keeps failing is probed less and less often
    /// (`open_factor`, up to `open_max_ms`).
    pub open_ms: u64,
    /// Growth factor of the open duration on each trip in a row (a failed
    /// probe reopens for longer), ≥ 1. Default 1.5: with 2 every open period
    /// is as long as the upstream has already been failing, so a recovered
    /// upstream can stay unused for as long again; 1.5 keeps that to about half.
    pub open_factor: f64,
    /// Longest open duration, ms, jitter included: after the upstream
    /// recovers, the next probe comes within this. Default 20 000, under the
    /// default 30 s deadline, so a model call that starts when the provider
    /// recovers can still be served by it.
    pub open_max_ms: u64,
    /// Random ± fraction applied to each open duration so instances do not probe in lockstep, in [0, 1). Default 0.1.
    pub open_jitter: f64,
    /// Probes allowed in flight while half-open. Default 10 (resilience4j's
    /// `permittedNumberOfCallsInHalfOpenState`): a model response takes
    /// seconds, and with one probe at a time closing waits for `close_after`
    /// responses in a row while every other call is refused or diverted.
    pub half_open_probes: u32,
    /// Probe successes that close the breaker (any probe failure reopens it). Default 2.
    pub close_after: u32,
    /// Manual overrides by breaker key (e.g. `"openai/gpt-4o/us"`).
    pub overrides: BTreeMap<String, BreakerOverride>,
    /// A call whose upstream's breaker refuses it, with no fallback to take,
    /// waits for the breaker's next probe window when that comes before its
    /// deadline (`next_attempt` says "not yet", with the wait) instead of
    /// failing: an outage shorter than the deadline costs latency, not the
    /// call. Off: such calls fail fast with `breaker_open`. Default true.
    pub hold: bool,
    /// Held calls wake spread over this long after the breaker's probe window
    /// opens (and re-ask this often while its probes run), so they do not
    /// reach a recovering upstream at one instant, ms. Default 1 000.
    pub hold_jitter_ms: u64,
    /// The longest a call is held for one probe window, ms: only a breaker
    /// that admits probes within this holds calls, so the calls waiting when
    /// an upstream recovers are about this long's worth of traffic, not the
    /// whole outage's arriving at once. Default 1 000.
    pub hold_max_ms: u64,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            enabled: true,
            scope: vec![ScopeDim::Provider, ScopeDim::Model, ScopeDim::Region],
            window: WindowKind::Count,
            window_size: 100,
            buckets: 10,
            min_calls: 20,
            failure_rate: Some(0.5),
            slow_call_ms: None,
            slow_call_rate: None,
            consecutive_failures: Some(5),
            consecutive_min_ms: 1_000,
            count_classes: vec![ErrorClass::Transient, ErrorClass::Overloaded],
            open_ms: 1_000,
            open_factor: 1.5,
            open_max_ms: 20_000,
            open_jitter: 0.1,
            half_open_probes: 10,
            close_after: 2,
            overrides: BTreeMap::new(),
            hold: true,
            hold_jitter_ms: 1_000,
            hold_max_ms: 1_000,
        }
    }
}

/// Google SRE adaptive throttling: reject with `max(0, (requests − k·accepts) / (requests + 1))`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Throttle {
    /// Opt-in. Default false.
    pub enabled: bool,
    /// Multiplier `K` (≥ 1). Default 2.
    pub k: f64,
    /// Window, ms. Default 120 000.
    pub window_ms: u64,
    /// Buckets. Default 12.
    pub buckets: u32,
    /// Scope. Default `[upstream]`.
    pub scope: ScopeSpec,
    /// Requests with a known outcome in the window before anything is
    /// refused: a few failures on a quiet upstream are no evidence. Default 10.
    pub min_requests: u32,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle {
            enabled: false,
            k: 2.0,
            window_ms: 120_000,
            buckets: 12,
            scope: vec![ScopeDim::Upstream],
            min_requests: 10,
        }
    }
}

/// Provider rate limits as state ([`crate::ratelimit`]): every response's
/// rate-limit headers (and error-body evidence) update its scope's limits,
/// and an attempt is admitted against them before it is sent: paced when
/// the window has no room, stopped when the room comes after the deadline or
/// a per-day quota is out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitsPolicy {
    /// Default true: calls on one engine share what each learns of its
    /// upstream's limits (a 429 paces the calls after it). Nothing is held
    /// before a response says something of a limit: a scope no response has
    /// spoken of costs one branch per attempt. `false` turns pacing off.
    pub enabled: bool,
    /// A bare 429 — no rate-limit header, no body hint such as Gemini's
    /// `RetryInfo` — holds the scope's later calls until its Retry-After (at
    /// least a second). Default false: such a 429 says when its own request
    /// may come back, not that the scope's allowance is gone (a provider
    /// shedding a share of the traffic sends them by the thousand), and a
    /// hold after each would starve the scope; the call's own retry still
    /// waits the hint.
    pub hold_on_bare_429: bool,
    /// Adaptive concurrency per rate-limit scope (in force with `enabled`).
    pub concurrency: AdaptiveConcurrencyPolicy,
}

impl Default for RateLimitsPolicy {
    fn default() -> Self {
        RateLimitsPolicy {
            enabled: true,
            hold_on_bare_429: false,
            concurrency: AdaptiveConcurrencyPolicy::default(),
        }
    }
}

/// Adaptive concurrency (AIMD) per rate-limit scope (account × provider ×
/// model, what a provider's 429 is about): every attempt takes a place in its
/// scope's in-flight limit before it is sent. A 429 without quota exhaustion,
/// or an overload (529, `overloaded_error`), halves the attempts in flight it
/// came with (once per congestion event, not below `min`); a window's worth
/// of successes (as many as the limit, or `grow_after`) while the limit is in
/// use raises it by one, up to `max`; other outcomes (a per-day quota, client
/// errors, timeouts, cancellations) change nothing. An attempt with no place
/// free is held: `next_attempt` answers `rate_limited` with a short `wait`
/// (detail `concurrency: N in flight of limit M in SCOPE`) and the caller asks
/// again; a hedge is refused instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AdaptiveConcurrencyPolicy {
    /// The adaptive gate (with `rate_limits.enabled`). Default false: where
    /// the provider's answers state its window, pacing alone keeps within it;
    /// the gate is for providers whose 429s say nothing of their limit, and a
    /// call it holds asks again every `hold_max_ms` at most.
    pub enabled: bool,
    /// The limit a scope starts with; null = `max`, so nothing is held before
    /// the provider's first refusal. Default null.
    pub initial: Option<u32>,
    /// Lowest limit: a refused scope still gets this many attempts at once. Default 1.
    pub min: u32,
    /// Highest limit. Default 10 000 (above the in-flight count of any one
    /// process's calls to one model; growth stops there).
    pub max: u32,
    /// Successes per +1; null = the current limit (one window's worth, as
    /// TCP's congestion avoidance). Default null.
    pub grow_after: Option<u32>,
    /// Longest a held attempt waits before asking again, ms. The wait is the
    /// scope's mean attempt duration divided by its limit (when the next
    /// place is expected to free), in whole ms, at least 1, at most this; this
    /// before the scope's first attempt ended. Default 100.
    pub hold_max_ms: u64,
}

impl Default for AdaptiveConcurrencyPolicy {
    fn default() -> Self {
        AdaptiveConcurrencyPolicy {
            enabled: false,
            initial: None,
            min: 1,
            max: 10_000,
            grow_after: None,
            hold_max_ms: 100,
        }
    }
}

/// In-flight limits, separately for first attempts and retries, plus priority pools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Concurrency {
    /// Scope of the limits below. Default `[upstream]`.
    pub scope: ScopeSpec,
    /// First attempts in flight per scope; null = unlimited. Default null.
    pub max_first_attempts: Option<u32>,
    /// Retries in flight per scope; null = unlimited. Default null.
    pub max_retries: Option<u32>,
    /// In-flight attempts per priority (e.g. `interactive: 100`, `batch: 20`), engine-wide.
    pub pools: BTreeMap<String, u32>,
}

impl Default for Concurrency {
    fn default() -> Self {
        Concurrency {
            scope: vec![ScopeDim::Upstream],
            max_first_attempts: None,
            max_retries: None,
            pools: BTreeMap::new(),
        }
    }
}
