//! `rw_attempt_timer_error`: the error kind an expired attempt timer means,
//! decided once in the core so that every binding reports the same.

use crate::panic::ffi_boundary;
use crate::types::rw_attempt;
use crate::vocab::{rw_error_kind, rw_timer};
use retrywise_core::rules::deadline::timer_error;

/// The `rw_error_kind` to report (with `rw_call_report`) when one of
/// `attempt`'s timers (an `rw_timer` value) expired. The total timer is the
/// deadline's own (`RW_ERROR_KIND_DEADLINE_EXCEEDED`) when the attempt was
/// given all the time left (`total_timeout_ms >= remaining_ms`); otherwise a
/// hang before the response (`body_started` false: no headers yet) is a
/// first-byte timeout and one inside the body an idle stream; a stream with
/// no output by its first-token timer is a first-byte timeout. `RW_ERROR_KIND_NONE` when
/// `attempt` is NULL or `timer` is not an `rw_timer` value.
///
/// Thread safety: may be called from any thread; reads only `*attempt`.
///
/// # Safety
/// `attempt` is NULL or a readable `rw_attempt`.
#[no_mangle]
pub unsafe extern "C" fn rw_attempt_timer_error(
    attempt: *const rw_attempt,
    timer: i32,
    body_started: bool,
) -> rw_error_kind {
    ffi_boundary! {
        // SAFETY: NULL or readable, per the contract.
        let (Some(a), Some(t)) = (unsafe { attempt.as_ref() }, rw_timer::core_from_code(timer)) else {
            return rw_error_kind::None;
        };
        timer_error(t, a.total_timeout_ms, a.remaining_ms, body_started).into()
    }
}
