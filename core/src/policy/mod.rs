//! The policy: every knob with its documented default, loadable from JSON,
//! YAML or TOML, validated with errors that name the field path and the rule.
//!
//! A default [`Policy`] works with no file at all: 3 attempts, a 30 s deadline
//! when the caller gives none, 300 ms `min_attempt`, full jitter (base 250 ms,
//! cap 4 s), Retry-After capped at 60 s (`on_exceed: stop`), retries for
//! Transient, RateLimit and Overloaded only.

mod catalog;
mod compiled;
mod guards;
mod mode;
mod parse;
mod validate;

pub use catalog::{
    known_capability, FallbackMode, OnFailure, OnSilence, Route, StreamRecovery, Upstream, CAPABILITIES,
};
pub(crate) use compiled::{Compiled, HALF};
pub use guards::{
    AdaptiveConcurrencyPolicy, Breaker, BreakerOverride, Budget, Concurrency, RateLimitsPolicy, Throttle, WindowKind,
};
pub use mode::Mode;
pub use validate::to_milli;

use crate::types::{ErrorClass, ErrorKind, MalformedEvent};
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
    /// Provider rate limits read from responses, paced before the 429.
    pub rate_limits: RateLimitsPolicy,
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
    /// A request's `model` → the route (or upstream) that serves it, so one
    /// transport serves many models (see `Engine::route_for_model`).
    pub models: BTreeMap<String, String>,
    /// How streamed answers are read.
    pub streams: Streams,
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
            rate_limits: RateLimitsPolicy::default(),
            concurrency: Concurrency::default(),
            limits: Limits::default(),
            telemetry: Telemetry::default(),
            idempotency: IdempotencyPolicy::default(),
            upstreams: BTreeMap::new(),
            routes: BTreeMap::new(),
            models: BTreeMap::new(),
            streams: Streams::default(),
            #[cfg(feature = "test-hooks")]
            testing: Testing::default(),
        }
    }
}

/// How streamed answers are read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Streams {
    /// An SSE event whose data is neither JSON nor `[DONE]` (an SDK's parser
    /// would raise on it mid-answer): `skip` it (default) or end the stream
    /// with a clean `malformed_event` error.
    pub malformed_event: MalformedEvent,
}

/// Per-attempt timeouts; each is clamped to what is left of the deadline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// TCP + TLS connect, ms. Default 5 000.
    pub connect_ms: u64,
    /// From request sent to the first response byte, ms; null = half of the
    /// time left when the attempt starts (default), so a silent upstream
    /// leaves the other half for another attempt. A non-streamed answer's
    /// first byte comes only once it is generated: set this to the longest
    /// such an answer may take.
    pub first_byte_ms: Option<u64>,
    /// From request sent to a streamed answer's first visible output, ms
    /// (keep-alive pings and an opening preamble do not count); null = half
    /// of the time left when the attempt starts (default).
    pub first_token_ms: Option<u64>,
    /// Longest silence between stream chunks, ms. Default 15 000.
    pub idle_ms: u64,
    /// Cap on one attempt's total time, ms; `null` = whatever the deadline leaves. Default null.
    pub attempt_ms: Option<u64>,
    /// Token-aware attempt timeout (seed 002 §3), used when the caller gives token counts.
    pub dynamic: Option<DynamicTimeout>,
    /// First-token limits learned per upstream (on by default): see [`LearnFirstToken`].
    pub learn: LearnFirstToken,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect_ms: 5_000,
            first_byte_ms: None,
            first_token_ms: None,
            idle_ms: 15_000,
            attempt_ms: None,
            dynamic: None,
            learn: LearnFirstToken::default(),
        }
    }
}

/// Each upstream's first-token limit, learned from the streamed successes
/// that report their time to first token (`Outcome::first_token`): the
/// `quantile` of its last 128 such times, times `factor`, at least
/// `floor_ms`, once `min_samples` were seen. While `first_token_ms` is null
/// an attempt there waits for its first token at most that long (never
/// longer than the half-of-the-time-left rule, which stays the cold-start
/// limit), and a streamed request (`streaming` among its needs) waits as
/// long for its first byte while `first_byte_ms` is null: an upstream whose
/// first token comes in 0.1 s is left for a fallback after `floor_ms`, not
/// after half the deadline. A non-streamed answer's first byte comes only
/// once it is generated, so its limit is never learned. `Engine::stats`
/// shows each upstream's samples, quantile and limit (`first_token`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LearnFirstToken {
    /// Learn and apply the limits. Default true.
    pub enabled: bool,
    /// Which quantile of the samples, in (0, 1]. Default 0.99.
    pub quantile: f64,
    /// The limit is the quantile times this, ≥ 1. Default 3.
    pub factor: f64,
    /// The limit is never below this, ms. Default 1 000.
    pub floor_ms: u64,
    /// Samples needed before a limit applies, 1 to 128. Default 20.
    pub min_samples: u32,
}

impl LearnFirstToken {
    /// Samples kept per upstream: the quantile is of the last this many.
    pub const SAMPLES: usize = 128;
}

impl Default for LearnFirstToken {
    fn default() -> Self {
        LearnFirstToken {
            enabled: true,
            quantile: 0.99,
            factor: 3.0,
            floor_ms: 1_000,
            min_samples: 20,
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
