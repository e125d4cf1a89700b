//! The vocabulary enums: values equal to the core's stable `code()`, with
//! -1 for "none" where a type has such a value. Output structs carry them as
//! these types; input structs carry them as `int32_t`, read back through the
//! core's own `from_code` (`core_from_code`).

use retrywise_core::policy::OnFailure;
use retrywise_core::{
    Action, ApiFamily, Continuation, EffectState, ErrorClass, ErrorKind, Idempotency, Phase, Reason, Timer, WaitSource,
};

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

/// How the next attempt continues a streamed answer that already showed
/// text (core `Continuation`): carried by a decision, and by the outcome of
/// the attempt that continued.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rw_continuation {
    /// No continuation: the request goes as it was built.
    None = -1,
    /// The delivered text goes as a trailing assistant message for the
    /// upstream to extend (only where it declares `assistant_prefill`).
    Prefill = 0,
    /// A user message quotes the delivered text and asks to continue right after it.
    Instruction = 1,
}

/// One of an attempt's timers (core `Timer`), for `rw_attempt_timer_error`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rw_timer {
    /// Connecting took longer than `connect_timeout_ms`.
    Connect = 0,
    /// No response byte in time (`first_byte_timeout_ms`).
    FirstByte = 1,
    /// The body went silent for `idle_timeout_ms`.
    Idle = 2,
    /// The attempt as a whole ran `total_timeout_ms`.
    Total = 3,
    /// A stream showed no output in time (`first_token_timeout_ms`): the core
    /// reads it as a first-byte timeout, reported in `RW_PHASE_STREAM_OPEN`.
    FirstToken = 4,
}

impl rw_timer {
    /// C code → core timer (`None` for a code C may not pass).
    pub(crate) fn core_from_code(code: i32) -> Option<Timer> {
        [
            Timer::Connect,
            Timer::FirstByte,
            Timer::Idle,
            Timer::Total,
            Timer::FirstToken,
        ]
        .into_iter()
        .find(|t| rw_timer::from(*t) as i32 == code)
    }
}

/// The wire protocol an upstream speaks (core `ApiFamily`): which URL shape
/// and auth header a request for it takes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rw_api_family {
    /// Not set: the request's own family.
    None = -1,
    /// OpenAI and OpenAI-compatible APIs (`Authorization: Bearer`).
    Openai = 0,
    /// Anthropic messages (`x-api-key`).
    Anthropic = 1,
    /// Azure OpenAI (`/openai/deployments/{model}/...?api-version=`, `api-key`).
    AzureOpenai = 2,
}

impl rw_api_family {
    pub(crate) fn of(a: Option<ApiFamily>) -> rw_api_family {
        match a {
            None => rw_api_family::None,
            Some(ApiFamily::OpenAi) => rw_api_family::Openai,
            Some(ApiFamily::Anthropic) => rw_api_family::Anthropic,
            Some(ApiFamily::AzureOpenAi) => rw_api_family::AzureOpenai,
        }
    }

    /// The family an `rw_api_family` code C passes in names; `None` for
    /// `RW_API_FAMILY_NONE` or a code that is not one (the reverse of [`rw_api_family::of`]).
    pub(crate) fn core_from_code(code: i32) -> Option<ApiFamily> {
        [ApiFamily::OpenAi, ApiFamily::Anthropic, ApiFamily::AzureOpenAi]
            .into_iter()
            .find(|&a| rw_api_family::of(Some(a)) as i32 == code)
    }
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

parse_enum!(
    rw_phase => Phase,
    rw_error_kind => ErrorKind,
    rw_idempotency => Idempotency,
    rw_effect => EffectState,
    rw_continuation => Continuation,
);

map_enum!(rw_continuation, Continuation, [Prefill, Instruction]);
map_enum!(rw_timer, Timer, [Connect, FirstByte, Idle, Total, FirstToken]);

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

impl rw_continuation {
    pub(crate) fn of(c: Option<Continuation>) -> rw_continuation {
        c.map_or(rw_continuation::None, rw_continuation::from)
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
        for v in Continuation::ALL {
            assert_eq!(rw_continuation::from(*v) as i32, v.code() as i32);
            assert_eq!(rw_continuation::core_from_code(v.code() as i32), Some(*v));
        }
        assert_eq!(rw_continuation::core_from_code(rw_continuation::None as i32), None);
        for v in ApiFamily::ALL {
            assert_eq!(rw_api_family::of(Some(*v)) as i32, v.code() as i32);
        }
        assert_eq!(rw_api_family::of(None) as i32, -1);
        for (c, t) in [
            (0, Timer::Connect),
            (1, Timer::FirstByte),
            (2, Timer::Idle),
            (3, Timer::Total),
            (4, Timer::FirstToken),
        ] {
            assert_eq!(rw_timer::core_from_code(c), Some(t));
        }
        assert_eq!(rw_timer::core_from_code(5), None);
        assert_eq!(rw_timer::core_from_code(-1), None);
        assert_eq!(rw_error_kind::core_from_code(-1), None);
        assert_eq!(rw_error_kind::core_from_code(12), None);
        assert_eq!(rw_error_kind::core_from_code(300), None);
    }
}
