//! The policy: every knob with its documented default, loadable from JSON,
//! YAML or TOML, validated with errors that name the field path and the rule.
//!
//! A default [`Policy`] works with no file at all: 3 attempts, a 30 s deadline
//! when the caller gives none, 300 ms `min_attempt`, full jitter (base 250 ms,
//! cap 4 s), Retry-After capped at 60 s (`on_exceed: stop`), retries for
//! Transient, RateLimit and Overloaded only.

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
    /// Test-only hooks (never set in production).
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
    /// Additive jitter `U(0, jitter_ms)` on hinted waits so clients told the same second spread out. Default 0.
    pub jitter_ms: u64,
}

impl Default for RetryAfter {
    fn default() -> Self {
        RetryAfter {
            enabled: true,
            max_ms: 60_000,
            on_exceed: OnExceed::Stop,
            jitter_ms: 0,
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
    /// First open duration, ms. Default 5 000.
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
            open_ms: 5_000,
            open_factor: 1.5,
            open_max_ms: 20_000,
            open_jitter: 0.1,
            half_open_probes: 10,
            close_after: 2,
            overrides: BTreeMap::new(),
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
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle {
            enabled: false,
            k: 2.0,
            window_ms: 120_000,
            buckets: 12,
            scope: vec![ScopeDim::Upstream],
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

/// Test-only hooks.
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

impl Policy {
    /// Parses a policy in the given format and validates it.
    pub fn parse(text: &str, format: Format) -> Result<Policy, PolicyErrors> {
        let policy: Policy = match format {
            Format::Json => {
                let de = &mut serde_json::Deserializer::from_str(text);
                serde_path_to_error_json(de)?
            }
            Format::Yaml => serde_norway::from_str(text).map_err(|e| one_error(yaml_path(&e), e))?,
            Format::Toml => toml::from_str(text).map_err(|e| {
                PolicyErrors(vec![PolicyError {
                    path: String::new(),
                    message: e.to_string().trim().to_string(),
                }])
            })?,
        };
        policy.validate()?;
        Ok(policy)
    }

    /// Parses a policy, guessing the format: `{` starts JSON, a `key = value`
    /// or `[table]` line means TOML, anything else is YAML. An empty document is the default policy.
    pub fn from_str_any(text: &str) -> Result<Policy, PolicyErrors> {
        let t = text.trim_start();
        if t.is_empty() {
            return Ok(Policy::default());
        }
        Policy::parse(text, guess_format(t))
    }

    /// Reads and parses a file; the extension (`.json`, `.yaml`/`.yml`, `.toml`) picks the format.
    pub fn from_file(path: &std::path::Path) -> Result<Policy, PolicyErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            PolicyErrors(vec![PolicyError {
                path: String::new(),
                message: format!("cannot read {}: {e}", path.display()),
            }])
        })?;
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        match ext.as_str() {
            "json" => Policy::parse(&text, Format::Json),
            "yaml" | "yml" => Policy::parse(&text, Format::Yaml),
            "toml" => Policy::parse(&text, Format::Toml),
            _ => Policy::from_str_any(&text),
        }
    }

    /// Builds a policy from a JSON value (bindings pass dicts / objects this way).
    pub fn from_json_value(value: serde_json::Value) -> Result<Policy, PolicyErrors> {
        let policy: Policy = serde_json::from_value(value.clone())
            .map_err(|e| one_error(locate_json_error(&value, &e.to_string()), e))?;
        policy.validate()?;
        Ok(policy)
    }

    /// The JSON Schema of the policy document.
    pub fn json_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(Policy)).unwrap_or(serde_json::Value::Null)
    }

    /// Checks every rule; returns all violations with their field paths.
    pub fn validate(&self) -> Result<(), PolicyErrors> {
        let mut v = Validator::default();
        v.check(!self.version.trim().is_empty(), "version", "must not be empty", || {
            "\"\"".into()
        });
        v.range_u64("max_attempts", self.max_attempts as u64, 1, 100);
        v.range_u64("deadline_ms", self.deadline_ms, 1, 86_400_000);
        v.check(
            self.min_attempt_ms < self.deadline_ms,
            "min_attempt_ms",
            "must be less than deadline_ms",
            || self.min_attempt_ms.to_string(),
        );
        v.range_u64("timeouts.connect_ms", self.timeouts.connect_ms, 1, 86_400_000);
        v.range_u64("timeouts.first_byte_ms", self.timeouts.first_byte_ms, 1, 86_400_000);
        v.range_u64("timeouts.idle_ms", self.timeouts.idle_ms, 1, 86_400_000);
        if let Some(a) = self.timeouts.attempt_ms {
            v.range_u64("timeouts.attempt_ms", a, 1, 86_400_000);
        }
        if let Some(d) = &self.timeouts.dynamic {
            v.range_u64("timeouts.dynamic.base_ms", d.base_ms, 1, 86_400_000);
            v.range_u64(
                "timeouts.dynamic.per_input_token_us",
                d.per_input_token_us,
                0,
                1_000_000,
            );
            v.range_u64(
                "timeouts.dynamic.per_output_token_us",
                d.per_output_token_us,
                0,
                1_000_000,
            );
        }
        v.range_u64("backoff.base_ms", self.backoff.base_ms, 0, 3_600_000);
        v.range_u64("backoff.cap_ms", self.backoff.cap_ms, 0, 3_600_000);
        v.check(
            self.backoff.cap_ms >= self.backoff.base_ms,
            "backoff.cap_ms",
            "must be at least backoff.base_ms",
            || self.backoff.cap_ms.to_string(),
        );
        v.range_u64("retry_after.max_ms", self.retry_after.max_ms, 0, 86_400_000);
        v.range_u64("retry_after.jitter_ms", self.retry_after.jitter_ms, 0, 60_000);
        for (i, c) in self.retry.classes.iter().enumerate() {
            v.check(
                !matches!(c, ErrorClass::AuthOrPolicy | ErrorClass::InvalidRequest),
                &format!("retry.classes[{i}]"),
                "auth_or_policy and invalid_request are never retryable",
                || c.to_string(),
            );
        }
        let cl = &self.classify;
        for (name, list) in [
            ("classify.invalid_request_statuses", &cl.invalid_request_statuses),
            ("classify.auth_statuses", &cl.auth_statuses),
            ("classify.rate_limit_statuses", &cl.rate_limit_statuses),
            ("classify.overloaded_statuses", &cl.overloaded_statuses),
            ("classify.transient_statuses", &cl.transient_statuses),
            ("classify.unsafe_retryable_statuses", &cl.unsafe_retryable_statuses),
        ] {
            for (i, s) in list.iter().enumerate() {
                v.range_u64(&format!("{name}[{i}]"), *s as u64, 100, 599);
            }
        }
        v.range_u64(
            "propagation.safety_margin_ms",
            self.propagation.safety_margin_ms,
            0,
            60_000,
        );
        let b = &self.budget;
        v.range_u64("budget.window_ms", b.window_ms, 1, 86_400_000);
        v.range_u64("budget.buckets", b.buckets as u64, 1, 3_600);
        v.milli("budget.ratio", b.ratio, 0.0, 1000.0);
        v.milli("budget.min_per_sec", b.min_per_sec, 0.0, 1_000_000.0);
        v.check(
            !b.scopes.is_empty(),
            "budget.scopes",
            "must list at least one scope",
            || "[]".into(),
        );
        for (i, s) in b.scopes.iter().enumerate() {
            v.check(
                !s.is_empty(),
                &format!("budget.scopes[{i}]"),
                "must name at least one dimension",
                || "[]".into(),
            );
        }
        if let Some(m) = b.max_concurrent_retries {
            v.range_u64("budget.max_concurrent_retries", m as u64, 0, 10_000_000);
        }
        let br = &self.breaker;
        v.check(
            !br.scope.is_empty(),
            "breaker.scope",
            "must name at least one dimension",
            || "[]".into(),
        );
        match br.window {
            WindowKind::Count => v.range_u64("breaker.window_size", br.window_size, 1, 100_000),
            WindowKind::Time => v.range_u64("breaker.window_size", br.window_size, 1, 86_400_000),
        }
        v.range_u64("breaker.buckets", br.buckets as u64, 1, 3_600);
        v.range_u64("breaker.min_calls", br.min_calls as u64, 1, 10_000_000);
        if let Some(r) = br.failure_rate {
            v.unit_rate("breaker.failure_rate", r);
        }
        if let Some(r) = br.slow_call_rate {
            v.unit_rate("breaker.slow_call_rate", r);
            v.check(
                br.slow_call_ms.is_some(),
                "breaker.slow_call_ms",
                "is required when slow_call_rate is set",
                || "null".into(),
            );
        }
        if let Some(c) = br.consecutive_failures {
            v.range_u64("breaker.consecutive_failures", c as u64, 1, 10_000_000);
        }
        for (i, c) in br.count_classes.iter().enumerate() {
            v.check(
                !matches!(c, ErrorClass::AuthOrPolicy | ErrorClass::InvalidRequest),
                &format!("breaker.count_classes[{i}]"),
                "auth_or_policy and invalid_request never count as upstream failures",
                || c.to_string(),
            );
        }
        v.range_u64("breaker.open_ms", br.open_ms, 1, 86_400_000);
        v.check(
            br.open_factor.is_finite() && br.open_factor >= 1.0 && br.open_factor <= 100.0,
            "breaker.open_factor",
            "must be in [1, 100]",
            || br.open_factor.to_string(),
        );
        v.check(
            br.open_max_ms >= br.open_ms,
            "breaker.open_max_ms",
            "must be at least breaker.open_ms",
            || br.open_max_ms.to_string(),
        );
        v.check(
            br.open_jitter.is_finite() && (0.0..1.0).contains(&br.open_jitter),
            "breaker.open_jitter",
            "must be in [0, 1)",
            || br.open_jitter.to_string(),
        );
        v.range_u64("breaker.half_open_probes", br.half_open_probes as u64, 1, 10_000);
        v.range_u64("breaker.close_after", br.close_after as u64, 1, 10_000);
        let t = &self.throttle;
        v.check(
            t.k.is_finite() && t.k >= 1.0 && t.k <= 100.0,
            "throttle.k",
            "must be in [1, 100]",
            || t.k.to_string(),
        );
        v.range_u64("throttle.window_ms", t.window_ms, 1, 86_400_000);
        v.range_u64("throttle.buckets", t.buckets as u64, 1, 3_600);
        v.check(
            !t.scope.is_empty(),
            "throttle.scope",
            "must name at least one dimension",
            || "[]".into(),
        );
        v.check(
            !self.concurrency.scope.is_empty(),
            "concurrency.scope",
            "must name at least one dimension",
            || "[]".into(),
        );
        v.range_u64("limits.max_keys", self.limits.max_keys as u64, 16, 100_000_000);
        v.range_u64("limits.idle_ms", self.limits.idle_ms, 1, u64::MAX / 4);
        v.range_u64("telemetry.ring_size", self.telemetry.ring_size as u64, 0, 10_000_000);
        v.range_u64("idempotency.ttl_ms", self.idempotency.ttl_ms, 1, u64::MAX / 4);
        v.range_u64(
            "idempotency.max_keys",
            self.idempotency.max_keys as u64,
            16,
            100_000_000,
        );
        for (name, u) in &self.upstreams {
            let p = format!("upstreams.{name}");
            v.check(!name.is_empty(), &p, "upstream name must not be empty", || {
                "\"\"".into()
            });
            v.check(
                u.cost_input_per_mtok.is_finite() && u.cost_input_per_mtok >= 0.0,
                &format!("{p}.cost_input_per_mtok"),
                "must be ≥ 0",
                || u.cost_input_per_mtok.to_string(),
            );
            v.check(
                u.cost_output_per_mtok.is_finite() && u.cost_output_per_mtok >= 0.0,
                &format!("{p}.cost_output_per_mtok"),
                "must be ≥ 0",
                || u.cost_output_per_mtok.to_string(),
            );
            for (task, score) in &u.evals {
                v.check(
                    score.is_finite(),
                    &format!("{p}.evals.{task}"),
                    "must be a finite number",
                    || score.to_string(),
                );
            }
        }
        for (name, r) in &self.routes {
            let p = format!("routes.{name}");
            v.check(
                !r.candidates.is_empty(),
                &format!("{p}.candidates"),
                "must list at least one upstream",
                || "[]".into(),
            );
            for (i, c) in r.candidates.iter().enumerate() {
                v.check(
                    self.upstreams.contains_key(c),
                    &format!("{p}.candidates[{i}]"),
                    "names no upstream in `upstreams`",
                    || format!("{c:?}"),
                );
            }
            if let Some(m) = r.max_upstreams {
                v.range_u64(&format!("{p}.max_upstreams"), m as u64, 1, 1_000);
            }
            v.range_u64(
                &format!("{p}.attempts_per_upstream"),
                r.attempts_per_upstream as u64,
                1,
                100,
            );
            if let Some(c) = r.max_cost_per_call {
                v.check(
                    c.is_finite() && c >= 0.0,
                    &format!("{p}.max_cost_per_call"),
                    "must be ≥ 0",
                    || c.to_string(),
                );
            }
            if let Some(m) = r.min_eval {
                v.check(
                    m.is_finite(),
                    &format!("{p}.min_eval"),
                    "must be a finite number",
                    || m.to_string(),
                );
            }
            if let Some(h) = r.hedge_after_ms {
                v.range_u64(&format!("{p}.hedge_after_ms"), h, 1, 86_400_000);
            }
            if let Some(m) = r.max_attempts {
                v.range_u64(&format!("{p}.max_attempts"), m as u64, 1, 100);
            }
        }
        v.finish()
    }
}

/// Returns `value * 1000` when it has at most three decimals (the exact
/// fixed-point scale used by the budget), `None` otherwise.
pub fn to_milli(value: f64) -> Option<u64> {
    if !value.is_finite() || !(0.0..=1.0e12).contains(&value) {
        return None;
    }
    let scaled = value * 1000.0;
    let rounded = scaled.round();
    if (scaled - rounded).abs() > 1e-6 {
        return None;
    }
    Some(rounded as u64)
}

fn guess_format(t: &str) -> Format {
    if t.starts_with('{') {
        return Format::Json;
    }
    for line in t.lines() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        if l.starts_with('[') && l.ends_with(']') && !l.contains(':') {
            return Format::Toml;
        }
        if let (Some(eq), colon) = (l.find('='), l.find(':')) {
            if colon.is_none_or(|c| eq < c) {
                return Format::Toml;
            }
        }
        return Format::Yaml;
    }
    Format::Yaml
}

fn one_error(path: String, e: impl fmt::Display) -> PolicyErrors {
    PolicyErrors(vec![PolicyError {
        path,
        message: e.to_string(),
    }])
}

fn yaml_path(e: &serde_norway::Error) -> String {
    // serde_norway reports "path.to.field: message at line..."; the path is
    // already in the message, so keep the message whole.
    let _ = e;
    String::new()
}

/// JSON deserialization that tracks the field path, so `{"breaker": {"failure_rat": 1}}`
/// reports `breaker` as the path of the unknown field.
fn serde_path_to_error_json<'de, R: serde_json::de::Read<'de>>(
    de: &mut serde_json::Deserializer<R>,
) -> Result<Policy, PolicyErrors> {
    let value: serde_json::Value =
        serde::Deserialize::deserialize(&mut *de).map_err(|e| one_error(String::new(), e))?;
    let policy = serde_json::from_value::<Policy>(value.clone())
        .map_err(|e| one_error(locate_json_error(&value, &e.to_string()), e))?;
    Ok(policy)
}

/// Best-effort field path for a serde error on a JSON value: finds the
/// unknown or bad field named in the message.
fn locate_json_error(value: &serde_json::Value, message: &str) -> String {
    let field = message.split('`').nth(1).map(str::to_string).unwrap_or_default();
    if field.is_empty() {
        return String::new();
    }
    fn walk(v: &serde_json::Value, field: &str, prefix: &str) -> Option<String> {
        if let serde_json::Value::Object(map) = v {
            for (k, child) in map {
                let here = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                if k == field {
                    return Some(here);
                }
                if let Some(found) = walk(child, field, &here) {
                    return Some(found);
                }
            }
        }
        None
    }
    walk(value, &field, "").unwrap_or_default()
}

#[derive(Default)]
struct Validator {
    errors: Vec<PolicyError>,
}

impl Validator {
    fn check(&mut self, ok: bool, path: &str, rule: &str, got: impl FnOnce() -> String) {
        if !ok {
            self.errors.push(PolicyError {
                path: path.to_string(),
                message: format!("{rule}, got {}", got()),
            });
        }
    }

    fn range_u64(&mut self, path: &str, value: u64, lo: u64, hi: u64) {
        self.check(
            (lo..=hi).contains(&value),
            path,
            &format!("must be in [{lo}, {hi}]"),
            || value.to_string(),
        );
    }

    fn unit_rate(&mut self, path: &str, value: f64) {
        self.check(
            value.is_finite() && value > 0.0 && value <= 1.0,
            path,
            "must be in (0, 1]",
            || value.to_string(),
        );
    }

    fn milli(&mut self, path: &str, value: f64, lo: f64, hi: f64) {
        if !(value.is_finite() && value >= lo && value <= hi) {
            self.check(false, path, &format!("must be in [{lo}, {hi}]"), || value.to_string());
        } else {
            self.check(
                to_milli(value).is_some(),
                path,
                "must have at most 3 decimal places (exact ×1000 arithmetic)",
                || value.to_string(),
            );
        }
    }

    fn finish(self) -> Result<(), PolicyErrors> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(PolicyErrors(self.errors))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy_is_valid_and_documented_defaults_hold() {
        let p = Policy::default();
        p.validate().unwrap();
        assert_eq!(p.max_attempts, 3);
        assert_eq!(p.deadline_ms, 30_000);
        assert_eq!(p.min_attempt_ms, 300);
        assert_eq!(p.backoff.kind, BackoffKind::Full);
        assert_eq!((p.backoff.base_ms, p.backoff.cap_ms), (250, 4_000));
        assert_eq!(p.retry_after.max_ms, 60_000);
        assert_eq!(p.retry_after.on_exceed, OnExceed::Stop);
        assert_eq!(
            p.retry.classes,
            vec![ErrorClass::Transient, ErrorClass::RateLimit, ErrorClass::Overloaded]
        );
    }

    #[test]
    fn loads_json_yaml_and_toml() {
        let j = Policy::from_str_any(r#"{"version":"v7","max_attempts":5}"#).unwrap();
        let y = Policy::from_str_any("version: v7\nmax_attempts: 5\n").unwrap();
        let t = Policy::from_str_any("version = \"v7\"\nmax_attempts = 5\n").unwrap();
        assert_eq!(j, y);
        assert_eq!(y, t);
        assert_eq!(j.max_attempts, 5);
        assert_eq!(Policy::from_str_any("").unwrap(), Policy::default());
        let t2 = Policy::from_str_any("[breaker]\nmin_calls = 5\n").unwrap();
        assert_eq!(t2.breaker.min_calls, 5);
    }

    #[test]
    fn validation_names_field_and_rule() {
        let err = Policy::from_str_any(r#"{"breaker":{"failure_rate":1.5}}"#).unwrap_err();
        assert_eq!(err.first().path, "breaker.failure_rate");
        assert_eq!(err.to_string(), "breaker.failure_rate: must be in (0, 1], got 1.5");
        let err = Policy::from_str_any("budget:\n  ratio: 0.1234\n").unwrap_err();
        assert_eq!(err.first().path, "budget.ratio");
        let err = Policy::from_str_any(r#"{"max_attempts":0,"deadline_ms":0}"#).unwrap_err();
        assert!(err.0.len() >= 2, "{err}");
    }

    #[test]
    fn json_values_keep_field_paths() {
        let err = Policy::from_json_value(serde_json::json!({"breaker": {"failure_rat": 0.5}})).unwrap_err();
        assert_eq!(err.first().path, "breaker.failure_rat");
        assert_eq!(
            OnFailure::from_code(OnFailure::ManualReview.code()),
            Some(OnFailure::ManualReview)
        );
    }

    #[test]
    fn unknown_fields_are_errors_with_paths() {
        let err = Policy::from_str_any(r#"{"breaker":{"failure_rat":0.5}}"#).unwrap_err();
        assert!(err.to_string().contains("failure_rat"), "{err}");
        let err = Policy::from_str_any("retries: 3\n").unwrap_err();
        assert!(err.to_string().contains("retries"), "{err}");
        let err = Policy::from_str_any("max_attempt = 3\n").unwrap_err();
        assert!(err.to_string().contains("max_attempt"), "{err}");
    }

    #[test]
    fn routes_must_name_catalog_upstreams() {
        let err = Policy::from_str_any("routes:\n  chat:\n    candidates: [ghost]\n").unwrap_err();
        assert_eq!(err.first().path, "routes.chat.candidates[0]");
    }

    #[test]
    fn milli_is_exact() {
        assert_eq!(to_milli(0.1), Some(100));
        assert_eq!(to_milli(0.3), Some(300));
        assert_eq!(to_milli(1.0), Some(1000));
        assert_eq!(to_milli(0.0005), None);
    }

    #[test]
    fn schema_mentions_every_section() {
        let s = Policy::json_schema().to_string();
        for f in [
            "max_attempts",
            "retry_after",
            "breaker",
            "budget",
            "routes",
            "upstreams",
        ] {
            assert!(s.contains(f), "{f}");
        }
    }
}
