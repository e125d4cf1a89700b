//! Plain C types: the result enum, strings as pointer + length, headers as
//! arrays of name/value pairs, and the structs that cross the boundary (the
//! vocabulary enums they carry are in `vocab`).
//!
//! Input structs carry enum values as `int32_t` so that a bad value from C is
//! rejected (`RW_ERR_INVALID_ARG`) instead of being undefined behaviour in
//! Rust; output structs use the enum types, which Rust only ever fills with
//! valid values.

use crate::request::rw_request;
use crate::vocab::*;
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
    /// The policy document did not parse or validate, or the call named a
    /// route the policy does not know (`rw_call_begin`); see the `rw_error`.
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
    /// empty when `task` names a route). When the policy declares routes, a
    /// name that is neither one of them nor an upstream of its catalog is
    /// `RW_ERR_POLICY` (a misspelt route never becomes a bare upstream).
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
    /// The request the call carries, read by `rw_request_read`; NULL = none.
    /// Its needs (capabilities, wire family, input and output tokens) are the
    /// call's, under this spec's own: the capabilities of both, and
    /// `input_tokens`, `max_output_tokens`, `data_boundary` and `max_cost`
    /// where this spec sets them. A candidate that cannot serve them is
    /// skipped (the decision's `excluded` says why). Read during
    /// `rw_call_begin` only: the request may be freed right after.
    pub request: *const rw_request,
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
    /// Request sent -> first visible output of a streamed answer, ms
    /// (keep-alive pings and an opening preamble do not count). Its expiry is
    /// `rw_attempt_timer_error(.., RW_TIMER_FIRST_TOKEN, ..)`, reported with
    /// `RW_PHASE_STREAM_OPEN`.
    pub first_token_timeout_ms: u64,
    /// With `RW_STOPPED`: -1 for a stop. Otherwise not a stop but "not yet":
    /// no attempt may start now and one may after this many ms, within the
    /// deadline (the upstream's breaker lets probes through then). The call
    /// is not over: sleep it and call `rw_call_next_attempt` again.
    pub wait_ms: i64,
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
            first_token_timeout_ms: 0,
            wait_ms: -1,
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
    /// A stream that broke after visible output showed only text (no
    /// tool-call delta) and had not finished: another upstream may continue
    /// it (routes with `stream_recovery: continue`).
    pub resumable: bool,
    /// An `rw_continuation` value: this attempt continued a broken stream
    /// that way (what the previous decision's `continuation` asked for);
    /// `RW_CONTINUATION_NONE` (-1) = a plain attempt.
    pub continuation: i32,
    /// A streamed success: ms from sending the request to its first visible
    /// output (the stream gate's first release; pings and the preamble do
    /// not count). 0 = not measured.
    pub first_token_ms: u64,
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
    /// With Retry / Fallback: the next attempt continues a streamed answer
    /// that already showed text, and how. Build its request as a
    /// continuation (`RW_CONTINUATION_PREFILL`: the delivered text as a
    /// trailing assistant message; `RW_CONTINUATION_INSTRUCTION`: a user
    /// message asking to continue), splice its stream after what the caller
    /// already has, and report its outcome with this `continuation`.
    /// `RW_CONTINUATION_NONE`: the next attempt sends the request as it is.
    pub continuation: rw_continuation,
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
            continuation: rw_continuation::None,
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
            request: std::ptr::null(),
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
            resumable: false,
            continuation: rw_continuation::None as i32,
            first_token_ms: 0,
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
