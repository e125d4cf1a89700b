//! The vocabulary shared by every module and binding: error classes, phases,
//! machine error kinds, idempotency, effect state, actions and reason codes.
//!
//! Every enum has a stable snake_case name (`as_str` / `FromStr`) and a stable
//! numeric code (`code`) so that Python, Node and C see the same values.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Error returned when a name does not match any variant of a vocabulary enum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName {
    /// Which vocabulary was parsed (`phase`, `error`, ...).
    pub kind: &'static str,
    /// The rejected input.
    pub value: String,
    /// Accepted names, for the error message.
    pub expected: &'static [&'static str],
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown {} {:?}; expected one of: {}",
            self.kind,
            self.value,
            self.expected.join(", ")
        )
    }
}

impl std::error::Error for UnknownName {}

macro_rules! vocab {
    (
        $(#[$meta:meta])*
        $name:ident, $kind:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $code:literal => $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
        #[serde(rename_all = "snake_case")]
        #[repr(u8)]
        pub enum $name {
            $( $(#[$vmeta])* $variant = $code ),+
        }

        impl $name {
            /// Every variant, in code order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// Every accepted name, in code order.
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            /// Stable snake_case name.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            /// Stable numeric code (used by the C ABI and Node).
            pub fn code(self) -> u8 {
                self as u8
            }

            /// Variant for a numeric code.
            pub fn from_code(code: u8) -> Option<Self> {
                match code { $($code => Some($name::$variant),)+ _ => None }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownName;
            /// Accepts the snake_case name, case-insensitively, with `-` for `_`.
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let norm: String = s.trim().chars().map(|c| if c == '-' { '_' } else { c.to_ascii_lowercase() }).collect();
                match norm.as_str() {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownName { kind: $kind, value: s.to_string(), expected: Self::NAMES }),
                }
            }
        }
    };
}

vocab! {
    /// What kind of failure an attempt met; decides the default action.
    ErrorClass, "error class" {
        /// 429 / rate limiting: wait as told, within the deadline and budget.
        RateLimit = 0 => "rate_limit",
        /// Connection failures, 408/500/502/503/504: bounded backoff.
        Transient = 1 => "transient",
        /// 529 or an `overloaded_error`: retryable, counted by breakers.
        Overloaded = 2 => "overloaded",
        /// The request itself is wrong: never retried.
        InvalidRequest = 3 => "invalid_request",
        /// Authentication or policy refusal: never retried, never bypassed by fallback.
        AuthOrPolicy = 4 => "auth_or_policy",
        /// A stream broke after visible output: never silently replayed.
        PartialStream = 5 => "partial_stream",
        /// The upstream may have executed the request: reconcile, do not replay.
        ResultUnknown = 6 => "result_unknown",
        /// The end-to-end deadline ran out.
        DeadlineExceeded = 7 => "deadline_exceeded",
        /// The caller cancelled.
        Cancelled = 8 => "cancelled",
    }
}

vocab! {
    /// How far an attempt got before it failed.
    Phase, "phase" {
        /// Provably not received by the upstream (e.g. connect failed).
        BeforeSend = 0 => "before_send",
        /// Request written (maybe partially), no response yet.
        Sent = 1 => "sent",
        /// Response status and headers received.
        Headers = 2 => "headers",
        /// Stream open, no meaningful event delivered yet.
        StreamOpen = 3 => "stream_open",
        /// Output or a tool call was already delivered to the consumer.
        StreamVisible = 4 => "stream_visible",
    }
}

vocab! {
    /// Machine-level error of an attempt (no HTTP status).
    ErrorKind, "error kind" {
        /// Name resolution failed.
        Dns = 0 => "dns",
        /// TCP connect refused or unreachable.
        Connect = 1 => "connect",
        /// TLS handshake failed.
        Tls = 2 => "tls",
        /// Writing the request failed part-way.
        Write = 3 => "write",
        /// Connect did not finish in time.
        ConnectTimeout = 4 => "connect_timeout",
        /// Request sent, no first byte in time.
        FirstByteTimeout = 5 => "first_byte_timeout",
        /// Stream went silent for too long.
        StreamIdleTimeout = 6 => "stream_idle_timeout",
        /// The end-to-end deadline ran out during the attempt.
        DeadlineExceeded = 7 => "deadline_exceeded",
        /// Connection reset or closed by the peer.
        ConnectionReset = 8 => "connection_reset",
        /// The caller cancelled the attempt.
        Cancelled = 9 => "cancelled",
        /// The response could not be parsed.
        MalformedResponse = 10 => "malformed_response",
        /// Anything else: not retried unless the policy says so.
        Other = 11 => "other",
    }
}

vocab! {
    /// Whether repeating the request is safe. Default `Safe` (pure generation).
    Idempotency, "idempotency" {
        /// Pure generation: repeating costs money but changes nothing.
        Safe = 0 => "safe",
        /// Side effects deduplicated by a business idempotency key at the writer.
        Keyed = 1 => "keyed",
        /// Side effects and no key: never replay once it may have been received.
        Unsafe = 2 => "unsafe",
    }
}

vocab! {
    /// What the caller knows about the request's side effect.
    EffectState, "effect state" {
        /// No effect started.
        None = 0 => "none",
        /// Effect in progress.
        Pending = 1 => "pending",
        /// Effect completed.
        Confirmed = 2 => "confirmed",
        /// Nobody knows: reconcile before anything else.
        Unknown = 3 => "unknown",
    }
}

vocab! {
    /// What the caller must do next.
    Action, "action" {
        /// The call succeeded; stop.
        Succeeded = 0 => "succeeded",
        /// Sleep `delay`, then make the next attempt on the same upstream.
        Retry = 1 => "retry",
        /// Sleep `delay`, then make the next attempt on `upstream` (another one).
        Fallback = 2 => "fallback",
        /// Give up and surface the failure with its reason.
        Stop = 3 => "stop",
        /// The effect is unknown: check its state (idempotency key, ledger) before anything else.
        Reconcile = 4 => "reconcile",
        /// A sibling (hedged) attempt is still in flight: no new attempt now;
        /// await the sibling and report its outcome, which decides.
        Wait = 5 => "wait",
    }
}

vocab! {
    /// Where a planned wait came from.
    WaitSource, "wait source" {
        /// No wait planned.
        None = 0 => "none",
        /// The server's Retry-After (or retry-after-ms) hint.
        RetryAfter = 1 => "retry_after",
        /// Local jittered backoff.
        Jitter = 2 => "jitter",
    }
}

vocab! {
    /// Stable machine-readable reason carried by every decision and stop.
    Reason, "reason" {
        /// The attempt succeeded.
        Success = 0 => "success",
        /// A retryable HTTP status (408, 5xx from the transient list).
        RetryableStatus = 1 => "retryable_status",
        /// A retryable network error (connect, reset before send, timeouts on safe calls).
        RetryableError = 2 => "retryable_error",
        /// 429: rate limited.
        RateLimited = 3 => "rate_limited",
        /// 529 / overloaded_error.
        Overloaded = 4 => "overloaded",
        /// The server said `x-should-retry: true`.
        ServerSaysRetry = 5 => "server_says_retry",
        /// A stream opened but delivered nothing meaningful before failing.
        StreamNotStarted = 6 => "stream_not_started",
        /// 400/404/413/422 or a similar request error.
        InvalidRequest = 7 => "invalid_request",
        /// The prompt does not fit the upstream's context window.
        ContextLengthExceeded = 8 => "context_length_exceeded",
        /// 401/403: authentication or policy refusal.
        AuthError = 9 => "auth_error",
        /// 429 naming quota or billing: waiting does not help.
        QuotaExhausted = 10 => "quota_exhausted",
        /// The failure is not on the retryable whitelist.
        NotRetryable = 11 => "not_retryable",
        /// The server said `x-should-retry: false`.
        ServerSaysNoRetry = 12 => "server_says_no_retry",
        /// Output was already visible to the consumer: never silently replayed.
        StreamVisibleOutput = 13 => "stream_visible_output",
        /// The side effect may have happened: reconcile.
        EffectUnknown = 14 => "effect_unknown",
        /// The side effect is known to have happened: a replay would duplicate it.
        EffectConfirmed = 15 => "effect_confirmed",
        /// All `max_attempts` attempts were used.
        MaxAttempts = 16 => "max_attempts",
        /// Less than `min_attempt` left before the deadline.
        DeadlineExceeded = 17 => "deadline_exceeded",
        /// Retry-After would end after the deadline (minus `min_attempt`).
        RetryAfterExceedsDeadline = 18 => "retry_after_exceeds_deadline",
        /// Retry-After above `retry_after.max_ms` with `on_exceed: stop`.
        RetryAfterTooLarge = 19 => "retry_after_too_large",
        /// The retry budget refused the retry.
        BudgetExhausted = 20 => "budget_exhausted",
        /// Too many retries in flight (`max_concurrent_retries`).
        RetryConcurrency = 21 => "retry_concurrency",
        /// The upstream's circuit breaker is open and no fallback is eligible.
        BreakerOpen = 22 => "breaker_open",
        /// Adaptive client-side throttling rejected the attempt.
        Throttled = 23 => "throttled",
        /// An in-flight concurrency gate refused the attempt.
        ConcurrencyLimit = 24 => "concurrency_limit",
        /// The caller cancelled.
        Cancelled = 25 => "cancelled",
        /// Retries are switched off (kill switch).
        RetriesDisabled = 26 => "retries_disabled",
        /// Another retrywise layer above owns retries: one attempt per inbound attempt.
        NotOwner = 27 => "not_owner",
        /// The route forbids fallback; see `on_failure`.
        FallbackForbidden = 28 => "fallback_forbidden",
        /// No candidate upstream satisfies the call's needs.
        NoEligibleUpstream = 29 => "no_eligible_upstream",
        /// The route's `max_upstreams` was reached.
        MaxUpstreams = 30 => "max_upstreams",
        /// The same idempotency key was used with different parameters.
        IdempotencyConflict = 31 => "idempotency_conflict",
        /// The call already finished; no further attempt.
        CallFinished = 32 => "call_finished",
        /// API misuse: e.g. `report` with no attempt in flight.
        InvalidState = 33 => "invalid_state",
        /// The effect is in progress elsewhere: wait for it or reconcile.
        EffectPending = 34 => "effect_pending",
        /// Hedging is off, not configured, or not allowed for this call.
        HedgeNotAllowed = 35 => "hedge_not_allowed",
        /// An attempt failed while a sibling is still in flight: wait for the sibling.
        SiblingInFlight = 36 => "sibling_in_flight",
        /// A continuation sent with assistant prefill was refused as a bad
        /// request: it is sent again at once as an instruction.
        PrefillRejected = 37 => "prefill_rejected",
    }
}

vocab! {
    /// How a fallback continues a streamed answer that already showed text.
    Continuation, "continuation" {
        /// The delivered text goes as a trailing assistant message, for the
        /// fallback to extend (only where the upstream declares `assistant_prefill`).
        Prefill = 0 => "prefill",
        /// A user message quotes the delivered text and asks to continue right after it.
        Instruction = 1 => "instruction",
    }
}

vocab! {
    /// The wire protocol an upstream speaks: which URL shape and auth header it takes.
    ApiFamily, "api family" {
        /// OpenAI and OpenAI-compatible APIs: `Authorization: Bearer`.
        #[serde(rename = "openai")]
        OpenAi = 0 => "openai",
        /// Anthropic messages: `x-api-key`.
        Anthropic = 1 => "anthropic",
        /// Azure OpenAI: `/openai/deployments/{model}/...?api-version=`, `api-key`.
        #[serde(rename = "azure_openai")]
        AzureOpenAi = 2 => "azure_openai",
    }
}

vocab! {
    /// What a stream gate does with an SSE event whose data is neither JSON
    /// nor `[DONE]` (an SDK's parser would raise on it mid-answer).
    MalformedEvent, "malformed event" {
        /// Drop the event and go on (counted in `StreamGate::skipped`).
        Skip = 0 => "skip",
        /// End the stream with a `malformed_event` stream error.
        Error = 1 => "error",
    }
}

// The vocabulary macro derives no `Default`; only this enum needs one.
#[allow(clippy::derivable_impls)]
impl Default for Idempotency {
    fn default() -> Self {
        Idempotency::Safe
    }
}

#[allow(clippy::derivable_impls)]
impl Default for MalformedEvent {
    fn default() -> Self {
        MalformedEvent::Skip
    }
}

impl Reason {
    /// True for reasons that end the call without success.
    pub fn is_stop_reason(self) -> bool {
        !matches!(
            self,
            Reason::Success
                | Reason::RetryableStatus
                | Reason::RetryableError
                | Reason::RateLimited
                | Reason::Overloaded
                | Reason::ServerSaysRetry
                | Reason::StreamNotStarted
                | Reason::SiblingInFlight
                | Reason::PrefillRejected
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_codes_are_stable() {
        for r in Reason::ALL {
            assert_eq!(r.as_str().parse::<Reason>().unwrap(), *r);
            assert_eq!(Reason::from_code(r.code()), Some(*r));
        }
        assert_eq!(Reason::BudgetExhausted.code(), 20);
        assert_eq!("Stream-Visible".parse::<Phase>().unwrap(), Phase::StreamVisible);
        let err = "nope".parse::<Phase>().unwrap_err();
        assert!(err.to_string().contains("before_send"));
        assert_eq!(serde_json::to_string(&ErrorClass::RateLimit).unwrap(), "\"rate_limit\"");
        // Serde names are the stable names, also where snake_case would split "OpenAi".
        for f in ApiFamily::ALL {
            assert_eq!(serde_json::to_string(f).unwrap(), format!("\"{}\"", f.as_str()));
            assert_eq!(serde_json::from_str::<ApiFamily>(&format!("\"{f}\"")).unwrap(), *f);
        }
        assert_eq!(Continuation::Instruction.as_str(), "instruction");
        assert_eq!(MalformedEvent::default(), MalformedEvent::Skip);
    }
}
