//! Plain C types: the result enum, the vocabulary enums (values equal to the
//! core's stable `code()`), strings as pointer + length, headers as arrays of
//! name/value pairs, and the structs that cross the boundary.
//!
//! Input structs carry enum values as `int32_t` so that a bad value from C is
//! rejected (`RW_ERR_INVALID_ARG`) instead of being undefined behaviour in
//! Rust; output structs use the enum types, which Rust only ever fills with
//! valid values.

use retrywise_core::policy::OnFailure;
use retrywise_core::{Action, EffectState, ErrorClass, ErrorKind, Idempotency, Phase, Reason, WaitSource};
use std::os::raw::c_char;

/// What every fallible `rw_` function returns.
/// cbindgen:rename-all=ScreamingSnakeCase
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rw_result {
    /// Success.
    RwOk = 0,
    /// `rw_call_next_attempt`: no attempt may start; the `stop_*` fields of
    /// the `rw_attempt` say why. Not an error: surface the stop to the user.
    RwStopped = 1,
    /// A required pointer argument was NULL (or a string/array pointer was
    /// NULL with a non-zero length). Nothing was changed.
    RwErrNull = 2,
    /// A panic was caught inside retrywise; nothing unwound into C. A call on
    /// which this happened is unusable (free it); its engine stays usable.
    RwErrPanic = 3,
    /// The policy document did not parse or validate; see the `rw_error`.
    RwErrPolicy = 4,
    /// An argument was invalid: an enum value out of range or a string that
    /// is not UTF-8. Nothing was changed.
    RwErrInvalidArg = 5,
    /// A propagation header in `rw_call_spec.inbound_headers` was malformed
    /// (e.g. a non-numeric `retrywise-deadline-ms`). No call was begun.
    RwErrInbound = 6,
    /// The operation does not apply to this object (e.g.
    /// `rw_engine_advance_clock` on an engine without a manual clock).
    RwErrInvalidState = 7,
}

/// A string: pointer + length in bytes, UTF-8, not NUL-terminated.
///
/// As input, `ptr == NULL && len == 0` means "absent" where a field is
/// optional; `ptr == NULL && len > 0` is `RW_ERR_NULL`. As output, `ptr` is
/// NULL when the value is absent. Print with `printf("%.*s", (int)s.len, s.ptr)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rw_str {
    /// First byte (need not be NUL-terminated).
    pub ptr: *const c_char,
    /// Length in bytes.
    pub len: usize,
}

impl rw_str {
    pub(crate) const NONE: rw_str = rw_str {
        ptr: std::ptr::null(),
        len: 0,
    };

    /// A view of `s`; valid as long as `s` is.
    pub(crate) fn of(s: &str) -> rw_str {
        rw_str {
            ptr: s.as_ptr().cast(),
            len: s.len(),
        }
    }

    pub(crate) fn of_opt(s: Option<&str>) -> rw_str {
        s.map_or(rw_str::NONE, rw_str::of)
    }
}

/// One header: a name/value pair of strings.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rw_header {
    /// Header name (case-insensitive).
    pub name: rw_str,
    /// Header value.
    pub value: rw_str,
}

/// Kind of failure an attempt met (core `ErrorClass`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rw_error_class {
    /// No failure (success, or nothing reported yet).
    None = -1,
    /// 429 / rate limiting.
    RateLimit = 0,
    /// Connection failures, 408/500/502/503/504.
    Transient = 1,
    /// 529 or an `overloaded_error`.
    Overloaded = 2,
    /// The request itself is wrong: never retried.
    InvalidRequest = 3,
    /// Authentication or policy refusal: never retried, never bypassed by fallback.
    AuthOrPolicy = 4,
    /// A stream broke after visible output: never silently replayed.
    PartialStream = 5,
    /// The upstream may have executed the request: reconcile.
    ResultUnknown = 6,
    /// The end-to-end deadline ran out.
    DeadlineExceeded = 7,
    /// The caller cancelled.
    Cancelled = 8,
}

/// How far an attempt got before it failed (core `Phase`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rw_phase {
    /// Not given: the core infers it from the status and error kind.
    None = -1,
    /// Provably not received by the upstream.
    BeforeSend = 0,
    /// Request written, no response yet.
    Sent = 1,
    /// Status and headers received.
    Headers = 2,
    /// Stream open, no meaningful event delivered yet.
    StreamOpen = 3,
    /// Output or a tool call was already delivered to the consumer.
    StreamVisible = 4,
}

/// Machine-level error of an attempt (core `ErrorKind`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rw_error_kind {
    /// No machine error (an HTTP status, or success).
    None = -1,
    /// Name resolution failed.
    Dns = 0,
    /// TCP connect refused or unreachable.
    Connect = 1,
    /// TLS handshake failed.
    Tls = 2,
    /// Writing the request failed part-way.
    Write = 3,
    /// Connect did not finish in time.
    ConnectTimeout = 4,
    /// Request sent, no first byte in time.
    FirstByteTimeout = 5,
    /// Stream went silent for too long.
    StreamIdleTimeout = 6,
    /// The end-to-end deadline ran out during the attempt.
    DeadlineExceeded = 7,
    /// Connection reset or closed by the peer.
    ConnectionReset = 8,
    /// The caller cancelled the attempt.
    Cancelled = 9,
    /// The response could not be parsed.
    MalformedResponse = 10,
    /// Anything else.
    Other = 11,
}

/// Whether repeating the request is safe (core `Idempotency`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rw_idempotency {
    /// Pure generation (the default: a zeroed spec is `SAFE`).
    Safe = 0,
    /// Side effects deduplicated by a business idempotency key.
    Keyed = 1,
    /// Side effects and no key: never replayed once it may have been received.
    Unsafe = 2,
}

/// What the caller knows about the side effect (core `EffectState`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rw_effect {
    /// Not given (the caller knows nothing beyond the status / error).
    Unset = -1,
    /// No effect started.
    None = 0,
    /// Effect in progress.
    Pending = 1,
    /// Effect completed.
    Confirmed = 2,
    /// Nobody knows: reconcile before anything else.
    Unknown = 3,
}

/// What the caller must do next (core `Action`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rw_action {
    /// The call succeeded; stop.
    Succeeded = 0,
    /// Sleep `delay_ms`, then make the next attempt on the same upstream.
    Retry = 1,
    /// Sleep `delay_ms`, then make the next attempt on `upstream` (another one).
    Fallback = 2,
    /// Give up and surface the failure with its reason.
    Stop = 3,
    /// The effect is unknown: check its state before anything else.
    Reconcile = 4,
    /// A sibling (hedged) attempt is still in flight: start nothing; report
    /// the sibling's outcome when it comes, which decides.
    Wait = 5,
}

/// Where a planned wait came from (core `WaitSource`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rw_wait_source {
    /// No wait planned.
    None = 0,
    /// The server's Retry-After (or retry-after-ms) hint.
    RetryAfter = 1,
    /// Local jittered backoff.
    Jitter = 2,
}

/// The route's instruction for failures, carried by stops.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rw_on_failure {
    /// Not a stop (or no instruction).
    None = -1,
    /// Surface the failure.
    Fail = 0,
    /// Hand the request to a human queue.
    ManualReview = 1,
}

/// Stable machine-readable reason carried by every decision and stop (core `Reason`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rw_reason {
    /// The attempt succeeded.
    Success = 0,
    /// A retryable HTTP status.
    RetryableStatus = 1,
    /// A retryable network error.
    RetryableError = 2,
    /// 429: rate limited.
    RateLimited = 3,
    /// 529 / overloaded_error.
    Overloaded = 4,
    /// The server said `x-should-retry: true`.
    ServerSaysRetry = 5,
    /// A stream opened but delivered nothing meaningful before failing.
    StreamNotStarted = 6,
    /// 400/404/413/422 or a similar request error.
    InvalidRequest = 7,
    /// The prompt does not fit the upstream's context window.
    ContextLengthExceeded = 8,
    /// 401/403: authentication or policy refusal.
    AuthError = 9,
    /// 429 naming quota or billing: waiting does not help.
    QuotaExhausted = 10,
    /// The failure is not on the retryable whitelist.
    NotRetryable = 11,
    /// The server said `x-should-retry: false`.
    ServerSaysNoRetry = 12,
    /// Output was already visible to the consumer: never silently replayed.
    StreamVisibleOutput = 13,
    /// The side effect may have happened: reconcile.
    EffectUnknown = 14,
    /// The side effect is known to have happened.
    EffectConfirmed = 15,
    /// All `max_attempts` attempts were used.
    MaxAttempts = 16,
    /// Less than `min_attempt` left before the deadline.
    DeadlineExceeded = 17,
    /// Retry-After would end after the deadline (minus `min_attempt`).
    RetryAfterExceedsDeadline = 18,
    /// Retry-After above `retry_after.max_ms` with `on_exceed: stop`.
    RetryAfterTooLarge = 19,
    /// The retry budget refused the retry.
    BudgetExhausted = 20,
    /// Too many retries in flight.
    RetryConcurrency = 21,
    /// The upstream's circuit breaker is open and no fallback is eligible.
    BreakerOpen = 22,
    /// Adaptive client-side throttling rejected the attempt.
    Throttled = 23,
    /// An in-flight concurrency gate refused the attempt.
    ConcurrencyLimit = 24,
    /// The caller cancelled.
    Cancelled = 25,
    /// Retries are switched off (kill switch).
    RetriesDisabled = 26,
    /// Another retrywise layer above owns retries.
    NotOwner = 27,
    /// The route forbids fallback; see `on_failure`.
    FallbackForbidden = 28,
    /// No candidate upstream satisfies the call's needs.
    NoEligibleUpstream = 29,
    /// The route's `max_upstreams` was reached.
    MaxUpstreams = 30,
    /// The same idempotency key was used with different parameters.
    IdempotencyConflict = 31,
    /// The call already finished; no further attempt.
    CallFinished = 32,
    /// API misuse (e.g. report with no attempt in flight), or an error
    /// result from this ABI (see `rw_call_report`).
    InvalidState = 33,
    /// The effect is in progress elsewhere.
    EffectPending = 34,
    /// Hedging is off, not configured, or not allowed for this call.
    HedgeNotAllowed = 35,
    /// An attempt failed while a sibling is still in flight: wait for the sibling.
    SiblingInFlight = 36,
    /// A continuation sent with assistant prefill was refused: it goes again at once as an instruction.
    PrefillRejected = 37,
}

/// Exhaustive core → C mapping (a new core variant is a compile error here).
macro_rules! map_enum {
    ($c:ident, $core:ident, [$($v:ident),+ $(,)?]) => {
        impl From<$core> for $c {
            #[inline]
            fn from(v: $core) -> $c {
                match v {
                    $($core::$v => $c::$v),+
                }
            }
        }
    };
}

/// C code → core value for the enums C passes in, through the core's own
/// `from_code` (`None` for a code the core does not know).
macro_rules! parse_enum {
    ($($c:ident => $core:ident),+ $(,)?) => {
        $(impl $c {
            #[inline]
            pub(crate) fn core_from_code(code: i32) -> Option<$core> {
                u8::try_from(code).ok().and_then($core::from_code)
            }
        })+
    };
}

parse_enum!(rw_phase => Phase, rw_error_kind => ErrorKind, rw_idempotency => Idempotency, rw_effect => EffectState);

map_enum!(
    rw_error_class,
    ErrorClass,
    [
        RateLimit,
        Transient,
        Overloaded,
        InvalidRequest,
        AuthOrPolicy,
        PartialStream,
        ResultUnknown,
        DeadlineExceeded,
        Cancelled,
    ]
);
map_enum!(rw_phase, Phase, [BeforeSend, Sent, Headers, StreamOpen, StreamVisible]);
map_enum!(
    rw_error_kind,
    ErrorKind,
    [
        Dns,
        Connect,
        Tls,
        Write,
        ConnectTimeout,
        FirstByteTimeout,
        StreamIdleTimeout,
        DeadlineExceeded,
        ConnectionReset,
        Cancelled,
        MalformedResponse,
        Other,
    ]
);
map_enum!(rw_idempotency, Idempotency, [Safe, Keyed, Unsafe]);
map_enum!(rw_effect, EffectState, [None, Pending, Confirmed, Unknown]);
map_enum!(rw_action, Action, [Succeeded, Retry, Fallback, Stop, Reconcile, Wait]);
map_enum!(rw_wait_source, WaitSource, [None, RetryAfter, Jitter]);
map_enum!(
    rw_reason,
    Reason,
    [
        Success,
        RetryableStatus,
        RetryableError,
        RateLimited,
        Overloaded,
        ServerSaysRetry,
        StreamNotStarted,
        InvalidRequest,
        ContextLengthExceeded,
        AuthError,
        QuotaExhausted,
        NotRetryable,
        ServerSaysNoRetry,
        StreamVisibleOutput,
        EffectUnknown,
        EffectConfirmed,
        MaxAttempts,
        DeadlineExceeded,
        RetryAfterExceedsDeadline,
        RetryAfterTooLarge,
        BudgetExhausted,
        RetryConcurrency,
        BreakerOpen,
        Throttled,
        ConcurrencyLimit,
        Cancelled,
        RetriesDisabled,
        NotOwner,
        FallbackForbidden,
        NoEligibleUpstream,
        MaxUpstreams,
        IdempotencyConflict,
        CallFinished,
        InvalidState,
        EffectPending,
        HedgeNotAllowed,
        SiblingInFlight,
        PrefillRejected,
    ]
);

impl rw_error_class {
    pub(crate) fn of(c: Option<ErrorClass>) -> rw_error_class {
        c.map_or(rw_error_class::None, rw_error_class::from)
    }
}

impl rw_on_failure {
    pub(crate) fn of(o: Option<OnFailure>) -> rw_on_failure {
        match o {
            None => rw_on_failure::None,
            Some(OnFailure::Fail) => rw_on_failure::Fail,
            Some(OnFailure::ManualReview) => rw_on_failure::ManualReview,
        }
    }
}

/// Options for `rw_engine_new_with`: testing hooks shared with the Python and
/// Node bindings so that conformance vectors replay identically.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rw_engine_options {
    /// Seed for every random choice (jitter, breaker open jitter, ids); used when `has_seed`.
    pub seed: u64,
    /// Use `seed` instead of a random seed.
    pub has_seed: bool,
    /// Use a manual clock (monotonic 0, wall 2025-01-01T00:00:00Z) that moves
    /// only with `rw_engine_advance_clock`.
    pub manual_clock: bool,
}

/// One logical request, as given to `rw_call_begin`. A zeroed struct plus a
/// `route` is a valid spec: default deadline, `RW_IDEMPOTENCY_SAFE`, no tenant.
/// Every string and array is read during `rw_call_begin` only (copied).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rw_call_spec {
    /// A route name from the policy, or an upstream name (required; may be
    /// empty when `task` names a route).
    pub route: rw_str,
    /// End-to-end deadline from now, ms; 0 = the policy's `deadline_ms`.
    pub deadline_ms: u64,
    /// An `rw_idempotency` value.
    pub idempotency: i32,
    /// Tenant (budgets, gates, counters); NULL = none.
    pub tenant: rw_str,
    /// Task (route lookup when `route` is empty, eval scores); NULL = none.
    pub task: rw_str,
    /// Priority pool (e.g. `interactive`, `batch`); NULL = none.
    pub priority: rw_str,
    /// Business idempotency key, carried unchanged on every attempt; NULL = none.
    pub idempotency_key: rw_str,
    /// Digest of the normalized parameters; a key reused with another digest is a conflict. NULL = none.
    pub params_digest: rw_str,
    /// Headers of the inbound request (only the `retrywise-*` propagation
    /// headers and `idempotency-key` are read); when present, an upstream
    /// retrywise layer owns retries and this call makes one attempt.
    pub inbound_headers: *const rw_header,
    /// Number of entries in `inbound_headers`.
    pub inbound_headers_len: usize,
    /// Capabilities any upstream must offer for this request (e.g. `vision`).
    pub capabilities: *const rw_str,
    /// Number of entries in `capabilities`.
    pub capabilities_len: usize,
    /// Input tokens (estimated); 0 = unknown.
    pub input_tokens: u64,
    /// Requested output tokens; 0 = unknown.
    pub max_output_tokens: u64,
    /// Required data boundary on top of the route's; NULL = none.
    pub data_boundary: rw_str,
    /// Cost cap for this call in USD on top of the route's; <= 0 = none.
    pub max_cost: f64,
}

/// The attempt to make now, or why none may start (from `rw_call_next_attempt`).
///
/// Strings and `headers` are owned by the call and stay valid until the next
/// `rw_call_next_attempt` or `rw_call_free` on that call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rw_attempt {
    /// 1-based attempt number (fallbacks included); 0 when stopped.
    pub number: u32,
    /// Upstream to call.
    pub upstream: rw_str,
    /// Logical request id (the same for every attempt of the call).
    pub request_id: rw_str,
    /// TCP + TLS connect timeout, ms.
    pub connect_timeout_ms: u64,
    /// Request sent -> first response byte, ms.
    pub first_byte_timeout_ms: u64,
    /// Longest gap between stream chunks, ms.
    pub idle_timeout_ms: u64,
    /// The whole attempt, ms (never beyond the deadline).
    pub total_timeout_ms: u64,
    /// Time left before the deadline when the attempt started, ms.
    pub remaining_ms: u64,
    /// Outbound headers to send with this attempt (`retrywise-deadline-ms`,
    /// `retrywise-request-id`, `retrywise-attempt`, `idempotency-key`);
    /// NULL when there are none.
    pub headers: *const rw_header,
    /// Number of entries in `headers`.
    pub headers_len: usize,
    /// A hedged (parallel) attempt.
    pub hedge: bool,
    /// The attempt goes to another upstream than the first one.
    pub fallback: bool,
    /// With `RW_STOPPED`: why no attempt may start (`RW_REASON_SUCCESS` otherwise).
    pub stop_reason: rw_reason,
    /// With `RW_STOPPED`: class of the last failure, or `RW_ERROR_CLASS_NONE`.
    pub stop_class: rw_error_class,
    /// With `RW_STOPPED`: the route's instruction (`fail`, `manual_review`), or NONE.
    pub on_failure: rw_on_failure,
    /// With `RW_STOPPED`: extra detail (the refusing scope, ...); NULL when none.
    pub detail: rw_str,
}

impl rw_attempt {
    pub(crate) fn stopped(reason: rw_reason) -> rw_attempt {
        rw_attempt {
            number: 0,
            upstream: rw_str::NONE,
            request_id: rw_str::NONE,
            connect_timeout_ms: 0,
            first_byte_timeout_ms: 0,
            idle_timeout_ms: 0,
            total_timeout_ms: 0,
            remaining_ms: 0,
            headers: std::ptr::null(),
            headers_len: 0,
            hedge: false,
            fallback: false,
            stop_reason: reason,
            stop_class: rw_error_class::None,
            on_failure: rw_on_failure::None,
            detail: rw_str::NONE,
        }
    }
}

/// What `rw_call_next_hedge` says (core `HedgePlan`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rw_hedge_action {
    /// Start `attempt` now, in parallel with the attempt in flight.
    Start = 0,
    /// Too early: ask again after `after_ms`.
    After = 1,
    /// No hedge now; `reason` says why (`RW_REASON_HEDGE_NOT_ALLOWED`,
    /// `RW_REASON_MAX_ATTEMPTS`, `RW_REASON_BUDGET_EXHAUSTED`, ...). The call goes on.
    No = 2,
}

/// Whether a hedged (parallel) attempt may start (from `rw_call_next_hedge`).
///
/// Strings and `headers` of `attempt` are owned by the call and stay valid
/// until the next `rw_call_next_hedge` or `rw_call_free` on that call (an
/// attempt from `rw_call_next_attempt` keeps its own strings).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rw_hedge_plan {
    /// Start, after or no.
    pub action: rw_hedge_action,
    /// With `RW_HEDGE_ACTION_AFTER`: ms until a hedge may start; 0 otherwise.
    pub after_ms: u64,
    /// With `RW_HEDGE_ACTION_NO`: why; `RW_REASON_SUCCESS` otherwise.
    pub reason: rw_reason,
    /// With `RW_HEDGE_ACTION_START`: the hedged attempt to make now
    /// (`attempt.hedge` is true; report it with `rw_call_report_attempt` and
    /// `attempt.number`). Otherwise a stop whose `stop_reason` equals `reason`.
    pub attempt: rw_attempt,
}

impl rw_hedge_plan {
    /// A "no hedge" plan; also the fail-safe plan written on an error result.
    pub(crate) fn no(reason: rw_reason, detail: rw_str) -> rw_hedge_plan {
        let mut attempt = rw_attempt::stopped(reason);
        attempt.detail = detail;
        rw_hedge_plan {
            action: rw_hedge_action::No,
            after_ms: 0,
            reason,
            attempt,
        }
    }
}

impl Default for rw_hedge_plan {
    fn default() -> Self {
        rw_hedge_plan::no(rw_reason::HedgeNotAllowed, rw_str::NONE)
    }
}

/// What an attempt met, as given to `rw_call_report`. Start from
/// `RW_OUTCOME_INIT` (a zeroed struct means "DNS error", since
/// `RW_ERROR_KIND_DNS` is 0). Read during `rw_call_report` only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rw_outcome {
    /// HTTP status; 0 = no response.
    pub status: u16,
    /// An `rw_error_kind` value; `RW_ERROR_KIND_NONE` (-1) = no machine error.
    pub error_kind: i32,
    /// An `rw_phase` value; `RW_PHASE_NONE` (-1) = infer from the evidence.
    pub phase: i32,
    /// Response headers (`retry-after`, `retry-after-ms`, `x-should-retry`, ...).
    /// Names and values that are not UTF-8 are read lossily.
    pub headers: *const rw_header,
    /// Number of entries in `headers`.
    pub headers_len: usize,
    /// Vendor error code or type (`insufficient_quota`, `overloaded_error`); NULL = none.
    pub vendor_code: rw_str,
    /// An `rw_effect` value; `RW_EFFECT_UNSET` (-1) = nothing known.
    pub effect: i32,
    /// Real input token count reported by the upstream; 0 = unknown.
    pub input_tokens: u64,
    /// Explicit success regardless of status (e.g. a transport with no status).
    pub ok: bool,
    /// The response body read whole and decoded, when there is one (NULL =
    /// none): an error body gives its vendor code when `vendor_code` is NULL;
    /// a 2xx whose `content-type` header is JSON and whose body does not parse
    /// is reported as `RW_ERROR_KIND_MALFORMED_RESPONSE`.
    pub body: rw_str,
}

/// What the caller must do after reporting an attempt (from `rw_call_report`).
///
/// Strings are owned by the call and stay valid until the next
/// `rw_call_report`, `rw_call_cancel` or `rw_call_free` on that call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rw_decision {
    /// The action.
    pub action: rw_action,
    /// Wait before the next attempt, ms (Retry / Fallback only).
    pub delay_ms: u64,
    /// Error class of the reported outcome; `RW_ERROR_CLASS_NONE` on success.
    pub error_class: rw_error_class,
    /// Stable reason code.
    pub reason: rw_reason,
    /// Upstream of the next attempt (Retry / Fallback), or of the reported attempt otherwise.
    pub upstream: rw_str,
    /// Where the wait came from.
    pub wait_source: rw_wait_source,
    /// The server's wait hint in ms, as evidence; -1 when there was none.
    pub retry_after_ms: i64,
    /// Route's instruction on stops (`fail`, `manual_review`); NONE otherwise.
    pub on_failure: rw_on_failure,
    /// The reported attempt's number.
    pub attempt: u32,
    /// The reported attempt was a hedge.
    pub hedge: bool,
    /// Extra detail (the refusing budget scope, an ignored Retry-After, ...); NULL when none.
    pub detail: rw_str,
    /// Candidates the fallback matcher excluded, with why: `name` is the
    /// upstream, `value` the stable reason (`missing_capability:vision`,
    /// `breaker_open`, ...). Usually empty (NULL).
    pub excluded: *const rw_header,
    /// Number of entries in `excluded`.
    pub excluded_len: usize,
}

impl rw_decision {
    /// The fail-safe decision written on an error result: a Stop, so that a
    /// caller that ignores the result code still stops.
    pub(crate) fn error(detail: rw_str) -> rw_decision {
        rw_decision {
            action: rw_action::Stop,
            delay_ms: 0,
            error_class: rw_error_class::None,
            reason: rw_reason::InvalidState,
            upstream: rw_str::NONE,
            wait_source: rw_wait_source::None,
            retry_after_ms: -1,
            on_failure: rw_on_failure::None,
            attempt: 0,
            hedge: false,
            detail,
            excluded: std::ptr::null(),
            excluded_len: 0,
        }
    }
}

// Defaults for Rust users of the rlib (C callers zero the structs or use
// RW_OUTCOME_INIT).

impl Default for rw_str {
    fn default() -> Self {
        rw_str::NONE
    }
}

impl Default for rw_call_spec {
    /// Every field zero / absent (an empty route).
    fn default() -> Self {
        rw_call_spec {
            route: rw_str::NONE,
            deadline_ms: 0,
            idempotency: rw_idempotency::Safe as i32,
            tenant: rw_str::NONE,
            task: rw_str::NONE,
            priority: rw_str::NONE,
            idempotency_key: rw_str::NONE,
            params_digest: rw_str::NONE,
            inbound_headers: std::ptr::null(),
            inbound_headers_len: 0,
            capabilities: std::ptr::null(),
            capabilities_len: 0,
            input_tokens: 0,
            max_output_tokens: 0,
            data_boundary: rw_str::NONE,
            max_cost: 0.0,
        }
    }
}

impl Default for rw_outcome {
    /// Nothing set, like `RW_OUTCOME_INIT`.
    fn default() -> Self {
        rw_outcome {
            status: 0,
            error_kind: rw_error_kind::None as i32,
            phase: rw_phase::None as i32,
            headers: std::ptr::null(),
            headers_len: 0,
            vendor_code: rw_str::NONE,
            effect: rw_effect::Unset as i32,
            input_tokens: 0,
            ok: false,
            body: rw_str::NONE,
        }
    }
}

impl Default for rw_attempt {
    fn default() -> Self {
        rw_attempt::stopped(rw_reason::Success)
    }
}

impl Default for rw_decision {
    fn default() -> Self {
        rw_decision::error(rw_str::NONE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_values_equal_core_codes() {
        for v in ErrorClass::ALL {
            assert_eq!(rw_error_class::from(*v) as i32, v.code() as i32);
        }
        for v in Phase::ALL {
            assert_eq!(rw_phase::from(*v) as i32, v.code() as i32);
            assert_eq!(rw_phase::core_from_code(v.code() as i32), Some(*v));
        }
        for v in ErrorKind::ALL {
            assert_eq!(rw_error_kind::from(*v) as i32, v.code() as i32);
            assert_eq!(rw_error_kind::core_from_code(v.code() as i32), Some(*v));
        }
        for v in Idempotency::ALL {
            assert_eq!(rw_idempotency::from(*v) as i32, v.code() as i32);
            assert_eq!(rw_idempotency::core_from_code(v.code() as i32), Some(*v));
        }
        for v in EffectState::ALL {
            assert_eq!(rw_effect::from(*v) as i32, v.code() as i32);
            assert_eq!(rw_effect::core_from_code(v.code() as i32), Some(*v));
        }
        for v in Action::ALL {
            assert_eq!(rw_action::from(*v) as i32, v.code() as i32);
        }
        for v in WaitSource::ALL {
            assert_eq!(rw_wait_source::from(*v) as i32, v.code() as i32);
        }
        for v in Reason::ALL {
            assert_eq!(rw_reason::from(*v) as i32, v.code() as i32);
        }
        assert_eq!(rw_error_kind::core_from_code(-1), None);
        assert_eq!(rw_error_kind::core_from_code(12), None);
        assert_eq!(rw_error_kind::core_from_code(300), None);
    }
}
