//! The policy: every knob with its documented default, loadable from JSON,
//! YAML or TOML, validated with errors that name the field path and the rule.
//!
//! A default [`Policy`] works with no file at all: 3 attempts, a 30 s deadline
//! when the caller gives none, 300 ms `min_attempt`, full jitter (base 250 ms,
//! cap 4 s), Retry-After capped at 60 s (`on_exceed: stop`), retries for
//! Transient, RateLimit and Overloaded only.

mod compiled;
mod mode;
mod parse;
mod validate;

pub(crate) use compiled::Compiled;
pub use mode::Mode;
pub use validate::to_milli;

use crate::types::{ErrorClass, ErrorKind};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// A policy that failed to load or validate. `path` names the field
/// (`breaker.failure_rate`), `message` the rule that was broken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyError {
    /// Dotted path of the offending field (empty when the document itself is unreadable).
    pub path: String,
    /// What is wrong, with the value that was given.
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for PolicyError {}

/// Every validation error of a policy, in field order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyErrors(pub Vec<PolicyError>);

impl fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyErrors {}

impl PolicyErrors {
    /// The first error (there is always at least one).
    pub fn first(&self) -> PolicyError {
        self.0.first().cloned().unwrap_or(PolicyError {
            path: String::new(),
            message: "invalid policy".into(),
        })
    }
}

fn d_version() -> String {
    "default".into()
}
fn d_max_attempts() -> u32 {
    3
}
fn d_deadline_ms() -> u64 {
    30_000
}
fn d_min_attempt_ms() -> u64 {
    300
}

/// The whole policy. Unknown fields are errors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// Version string written into every event and counter (`policy_version`). Default `"default"`.
    pub version: String,
    /// Attempts per logical request, the first included (never "retries"). Default 3.
    pub max_attempts: u32,
    /// End-to-end deadline used when the caller gives none, in ms. Default 30 000.
    pub deadline_ms: u64,
    /// No attempt starts with less than this left before the deadline, in ms. Default 300.
    pub min_attempt_ms: u64,
    /// Per-attempt timeouts.
    pub timeouts: Timeouts,
    /// Local backoff between attempts.
    pub backoff: Backoff,
    /// How server wait hints are honoured.
    pub retry_after: RetryAfter,
    /// Which failures are retryable (whitelist).
    pub retry: Retry,
    /// Classification tables.
    pub classify: Classify,
    /// Outbound propagation headers.
    pub propagation: Propagation,
    /// Retry budget (ratio over a sliding window, with a floor).
    pub budget: Budget,
    /// Circuit breakers per upstream scope.
    pub breaker: Breaker,
    /// Adaptive client-side throttling (Google SRE), opt-in.
    pub throttle: Throttle,
    /// In-flight limits and priority pools.
    pub concurrency: Concurrency,
    /// Bounds on tracked keys.
    pub limits: Limits,
    /// Events and counters.
    pub telemetry: Telemetry,
    /// Idempotency-key conflict tracking.
    pub idempotency: IdempotencyPolicy,
    /// Upstream catalog, by name.
    pub upstreams: BTreeMap<String, Upstream>,
    /// Routes by name (or task): candidates and fallback rules.
    pub routes: BTreeMap<String, Route>,
    /// Test-only hooks, only with the `test-hooks` cargo feature (never in production builds).
    #[cfg(feature = "test-hooks")]
    pub testing: Testing,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            version: d_version(),
            max_attempts: d_max_attempts(),
            deadline_ms: d_deadline_ms(),
            min_attempt_ms: d_min_attempt_ms(),
            timeouts: Timeouts::default(),
            backoff: Backoff::default(),
            retry_after: RetryAfter::default(),
            retry: Retry::default(),
            classify: Classify::default(),
            propagation: Propagation::default(),
            budget: Budget::default(),
            breaker: Breaker::default(),
            throttle: Throttle::default(),
            concurrency: Concurrency::default(),
            limits: Limits::default(),
            telemetry: Telemetry::default(),
            idempotency: IdempotencyPolicy::default(),
            upstreams: BTreeMap::new(),
            routes: BTreeMap::new(),
            #[cfg(feature = "test-hooks")]
            testing: Testing::default(),
        }
    }
}

/// Per-attempt timeouts; each is clamped to what is left of the deadline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// TCP + TLS connect, ms. Default 5 000.
    pub connect_ms: u64,
    /// From request sent to first response byte, ms. Default 60 000.
    pub first_byte_ms: u64,
    /// Longest silence between stream chunks, ms. Default 30 000.
    pub idle_ms: u64,
    /// Cap on one attempt's total time, ms; `null` = whatever the deadline leaves. Default null.
    pub attempt_ms: Option<u64>,
    /// Token-aware attempt timeout (seed 002 §3), used when the caller gives token counts.
    pub dynamic: Option<DynamicTimeout>,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect_ms: 5_000,
            first_byte_ms: 60_000,
            idle_ms: 30_000,
            attempt_ms: None,
            dynamic: None,
        }
    }
}

/// `total = base_ms + per_input_token_us * n_in / 1000 + per_output_token_us * max_out / 1000`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DynamicTimeout {
    /// Fixed part, ms.
    pub base_ms: u64,
    /// Per input token, microseconds.
    #[serde(default)]
    pub per_input_token_us: u64,
    /// Per requested output token, microseconds.
    #[serde(default)]
    pub per_output_token_us: u64,
}

/// Jitter algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BackoffKind {
    /// `U(0, min(cap, base * 2^n))` (AWS "full jitter").
    Full,
    /// `h + U(0, h)` with `h = min(cap, base * 2^n) / 2`.
    Equal,
    /// `min(cap, U(base, prev * 3))`.
    Decorrelated,
}

/// Local backoff between attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Backoff {
    /// Algorithm. Default `full`.
    pub kind: BackoffKind,
    /// Initial scale, ms. Default 250.
    pub base_ms: u64,
    /// Largest wait, ms. Default 4 000.
    pub cap_ms: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            kind: BackoffKind::Full,
            base_ms: 250,
            cap_ms: 4_000,
        }
    }
}

/// What to do with a Retry-After above `max_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnExceed {
    /// Stop with `retry_after_too_large`.
    Stop,
    /// Wait `max_ms` instead.
    Cap,
}

/// Server wait hints: `retry-after-ms`, then `retry-after` (seconds or HTTP-date).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RetryAfter {
    /// Honour server hints at all. Default true.
    pub enabled: bool,
    /// Largest acceptable hint, ms. Default 60 000.
    pub max_ms: u64,
    /// Above `max_ms`: `stop` (default) or `cap`.
    pub on_exceed: OnExceed,
    /// Additive jitter `U(0, jitter_ms)` on hinted waits: the hint is a
    /// minimum, and clients told the same second (or `0`, or a past date)
    /// spread out instead of waking at once. Default 250 (the backoff's base:
    /// a hint of 0 waits like a first retry without one). 0 = exact hints.
    pub jitter_ms: u64,
}

impl Default for RetryAfter {
    fn default() -> Self {
        RetryAfter {
            enabled: true,
            max_ms: 60_000,
            on_exceed: OnExceed::Stop,
            jitter_ms: 250,
        }
    }
}

/// The retryable whitelist: what is not listed is not retried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Retry {
    /// Classes that may be retried. Default `[transient, rate_limit, overloaded]`.
    pub classes: Vec<ErrorClass>,
    /// Honour `x-should-retry: true|false` from the server. Default true.
    pub honor_should_retry: bool,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            classes: vec![ErrorClass::Transient, ErrorClass::RateLimit, ErrorClass::Overloaded],
            honor_should_retry: true,
        }
    }
}

/// Status and code tables used by the classifier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Classify {
    /// InvalidRequest statuses. Default `[400, 404, 413, 422]`.
    pub invalid_request_statuses: Vec<u16>,
    /// AuthOrPolicy statuses. Default `[401, 403]`.
    pub auth_statuses: Vec<u16>,
    /// RateLimit statuses. Default `[429]`.
    pub rate_limit_statuses: Vec<u16>,
    /// Overloaded statuses. Default `[529]`.
    pub overloaded_statuses: Vec<u16>,
    /// Transient statuses. Default `[408, 500, 502, 503, 504]`.
    pub transient_statuses: Vec<u16>,
    /// Statuses that prove the request was not executed, so even an `unsafe`
    /// call may be retried after them. Default `[408, 429, 503, 529]`.
    pub unsafe_retryable_statuses: Vec<u16>,
    /// Retryable machine errors (when the phase allows). Default: dns, connect,
    /// tls, connect_timeout, connection_reset, write, first_byte_timeout,
    /// stream_idle_timeout, malformed_response.
    pub retryable_errors: Vec<ErrorKind>,
    /// Vendor codes meaning quota or billing exhaustion. Default
    /// `[insufficient_quota, billing_hard_limit_reached, billing_not_active, quota_exceeded]`.
    pub quota_codes: Vec<String>,
    /// Vendor codes meaning overload. Default `[overloaded_error, overloaded]`.
    pub overloaded_codes: Vec<String>,
    /// Vendor codes meaning the context window is too small. Default
    /// `[context_length_exceeded, string_above_max_length]`.
    pub context_length_codes: Vec<String>,
}

impl Default for Classify {
    fn default() -> Self {
        Classify {
            invalid_request_statuses: vec![400, 404, 413, 422],
            auth_statuses: vec![401, 403],
            rate_limit_statuses: vec![429],
            overloaded_statuses: vec![529],
            transient_statuses: vec![408, 500, 502, 503, 504],
            unsafe_retryable_statuses: vec![408, 429, 503, 529],
            retryable_errors: vec![
                ErrorKind::Dns,
                ErrorKind::Connect,
                ErrorKind::Tls,
                ErrorKind::ConnectTimeout,
                ErrorKind::ConnectionReset,
                ErrorKind::Write,
                ErrorKind::FirstByteTimeout,
                ErrorKind::StreamIdleTimeout,
                ErrorKind::MalformedResponse,
            ],
            quota_codes: vec![
                "insufficient_quota".into(),
                "billing_hard_limit_reached".into(),
                "billing_not_active".into(),
                "quota_exceeded".into(),
            ],
            overloaded_codes: vec!["overloaded_error".into(), "overloaded".into()],
            context_length_codes: vec!["context_length_exceeded".into(), "string_above_max_length".into()],
        }
    }
}

/// Outbound propagation headers (`retrywise-deadline-ms`, `retrywise-request-id`,
/// `retrywise-attempt`, `idempotency-key`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Propagation {
    /// Send the headers at all. Default true.
    pub enabled: bool,
    /// Subtracted from the remaining deadline sent downstream, ms (transit, clock skew). Default 50.
    pub safety_margin_ms: u64,
}

impl Default for Propagation {
    fn default() -> Self {
        Propagation {
            enabled: true,
            safety_margin_ms: 50,
        }
    }
}

/// A dimension a budget, breaker or gate is partitioned by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ScopeDim {
    /// One bucket for everything.
    Global,
    /// The upstream name.
    Upstream,
    /// The upstream's provider (from the catalog; the upstream name otherwise).
    Provider,
    /// The upstream's model (from the catalog; the upstream name otherwise).
    Model,
    /// The upstream's region (from the catalog; empty otherwise).
    Region,
    /// The call's tenant.
    Tenant,
    /// The call's priority.
    Priority,
    /// The call's operation (task).
    Operation,
}

/// One scope: a composite key of dimensions, e.g. `[upstream, tenant]`.
pub type ScopeSpec = Vec<ScopeDim>;

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
    /// Trip after this many consecutive counted failures; null = off. Default null.
    pub consecutive_failures: Option<u32>,
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
            consecutive_failures: None,
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

/// Bounds on keys derived from tenants and model names (attacker-influenced).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Tracked keys per kind (budgets, breakers, gates, tenants, ...). Default 10 000.
    pub max_keys: u32,
    /// A key untouched this long may be evicted first, ms. Default 600 000.
    pub idle_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_keys: 10_000,
            idle_ms: 600_000,
        }
    }
}

/// Events and counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Telemetry {
    /// Events kept in the ring buffer (drop-oldest); 0 = none. Default 1 024.
    pub ring_size: u32,
    /// Response headers copied into events (lower-case). Credentials are never copied, even if listed.
    /// Default `[retry-after, retry-after-ms, x-request-id, request-id, x-should-retry]`.
    pub header_allowlist: Vec<String>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            ring_size: 1024,
            header_allowlist: vec![
                "retry-after".into(),
                "retry-after-ms".into(),
                "x-request-id".into(),
                "request-id".into(),
                "x-should-retry".into(),
            ],
        }
    }
}

/// Idempotency keys seen recently, to report the same key with different parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyPolicy {
    /// How long a key's parameter digest is remembered, ms. Default 86 400 000 (24 h).
    pub ttl_ms: u64,
    /// Keys remembered at most (oldest evicted first). Default 100 000.
    pub max_keys: u32,
}

impl Default for IdempotencyPolicy {
    fn default() -> Self {
        IdempotencyPolicy {
            ttl_ms: 86_400_000,
            max_keys: 100_000,
        }
    }
}

/// One upstream in the catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Upstream {
    /// e.g. `openai`.
    pub provider: String,
    /// e.g. `gpt-4o`.
    pub model: String,
    /// e.g. `us-east`.
    pub region: String,
    /// Open set; well-known: `streaming`, `tool_calling`, `json_schema`, `json_mode`, `vision`, `audio`.
    pub capabilities: Vec<String>,
    /// Context window, tokens; null = unknown (never excluded for size).
    pub context_tokens: Option<u64>,
    /// Largest output, tokens; null = unknown.
    pub max_output_tokens: Option<u64>,
    /// Where data may be processed (e.g. `eu`, `us`); null = unknown.
    pub data_boundary: Option<String>,
    /// USD per million input tokens.
    pub cost_input_per_mtok: f64,
    /// USD per million output tokens.
    pub cost_output_per_mtok: f64,
    /// Eval scores by task.
    pub evals: BTreeMap<String, f64>,
}

/// Whether a route may move to another upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FallbackMode {
    /// Candidates after the first may be used.
    Allowed,
    /// Only the first eligible candidate; stops carry `on_failure`.
    Forbidden,
}

/// What the caller should do when a route gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// Surface the failure.
    Fail,
    /// Hand the request to a human queue.
    ManualReview,
}

impl OnFailure {
    /// Stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            OnFailure::Fail => "fail",
            OnFailure::ManualReview => "manual_review",
        }
    }

    /// Stable numeric code (0 fail, 1 manual_review), shared by the C ABI and Node.
    pub fn code(self) -> u8 {
        match self {
            OnFailure::Fail => 0,
            OnFailure::ManualReview => 1,
        }
    }

    /// Variant for a numeric code.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(OnFailure::Fail),
            1 => Some(OnFailure::ManualReview),
            _ => None,
        }
    }
}

/// A route: candidates in preference order and the rules for moving between them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Route {
    /// Upstream names in preference order.
    pub candidates: Vec<String>,
    /// `allowed` (default) or `forbidden`.
    pub fallback: FallbackMode,
    /// Capabilities every candidate must have.
    pub require: Vec<String>,
    /// No fallback once output was visible (default true).
    pub forbid_after_stream_started: bool,
    /// `fail` (default) or `manual_review`.
    pub on_failure: OnFailure,
    /// Distinct upstreams one logical request may use; null = all candidates.
    pub max_upstreams: Option<u32>,
    /// Attempts on one upstream before moving to the next candidate. Default 2.
    pub attempts_per_upstream: u32,
    /// Largest estimated cost of one call, USD; null = no cap.
    pub max_cost_per_call: Option<f64>,
    /// Required data boundary; null = any.
    pub data_boundary: Option<String>,
    /// Minimum eval score for the call's task; null = no minimum.
    pub min_eval: Option<f64>,
    /// Start a hedged attempt after this long without an answer, ms; null = no hedging.
    pub hedge_after_ms: Option<u64>,
    /// Overrides the policy's `max_attempts` for this route.
    pub max_attempts: Option<u32>,
}

impl Default for Route {
    fn default() -> Self {
        Route {
            candidates: Vec::new(),
            fallback: FallbackMode::Allowed,
            require: Vec::new(),
            forbid_after_stream_started: true,
            on_failure: OnFailure::Fail,
            max_upstreams: None,
            attempts_per_upstream: 2,
            max_cost_per_call: None,
            data_boundary: None,
            min_eval: None,
            hedge_after_ms: None,
            max_attempts: None,
        }
    }
}

/// Test-only hooks (the `test-hooks` cargo feature: the binding test suites
/// build with it to prove a panic never crosses a language boundary).
#[cfg(feature = "test-hooks")]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Testing {
    /// A report whose vendor code equals this panics inside the decision, to
    /// prove every binding turns a panic into a clean error. Never set it in production.
    pub panic_on_vendor_code: Option<String>,
}

/// Input format of a policy document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JSON.
    Json,
    /// YAML.
    Yaml,
    /// TOML.
    Toml,
}
