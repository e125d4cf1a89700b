//! `rw_transcript`: the core's `wire::Transcript` for C. It reads the bytes a
//! streamed answer delivered to the caller, so that the end of the body can
//! be judged: an answer that showed output and never its finish was cut
//! (`rw_stream_gate_end_outcome`).

use crate::args::slice;
use crate::panic::{ffi_boundary, try_arg};
use crate::types::{rw_result, rw_str};
use crate::vocab::rw_api_family;
use retrywise_core::wire::Transcript;

/// What a streamed answer delivered to the caller so far. Opaque.
pub struct rw_transcript {
    pub(crate) t: Transcript,
}

/// A transcript of a stream in `api` (an `rw_api_family` value: the family
/// the request was sent in). NULL for `RW_API_FAMILY_NONE` or a value that is
/// not one. Free with `rw_transcript_free`.
///
/// Thread safety: a transcript moves between threads; one thread at a time.
#[no_mangle]
pub extern "C" fn rw_transcript_new(api: i32) -> *mut rw_transcript {
    ffi_boundary! {
        let Some(family) = rw_api_family::core_from_code(api) else { return std::ptr::null_mut() };
        Box::into_raw(Box::new(rw_transcript { t: Transcript::new(family) }))
    }
}

/// Reads `len` bytes the caller received (what `rw_stream_gate_feed` and
/// `rw_stream_gate_finish` gave out), in any chunking.
///
/// Thread safety: not concurrently with any other function on the same transcript.
///
/// # Safety
/// `t` is NULL or live; `data` is NULL with `len == 0` or points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rw_transcript_observe(t: *mut rw_transcript, data: *const u8, len: usize) -> rw_result {
    ffi_boundary! {
        // SAFETY: NULL or live, used by this thread only, per the contract.
        let Some(t) = (unsafe { t.as_mut() }) else { return rw_result::RwErrNull };
        // SAFETY: `data` points to `len` readable bytes per the contract.
        let bytes = try_arg!(unsafe { slice(data, len) });
        t.t.observe(bytes);
        rw_result::RwOk
    }
}

/// The visible text so far (reasoning is not part of it), as a view valid
/// until the next `rw_transcript_observe` or `rw_transcript_free`. Empty
/// (NULL, 0) for NULL.
///
/// # Safety
/// `t` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rw_transcript_text(t: *const rw_transcript) -> rw_str {
    ffi_boundary! {
        // SAFETY: NULL or live per the contract.
        match unsafe { t.as_ref() } {
            Some(t) if !t.t.text().is_empty() => rw_str::of(t.t.text()),
            _ => rw_str::NONE,
        }
    }
}

/// Whether another upstream can continue the answer: only text was shown,
/// and it did not finish. False for NULL.
///
/// # Safety
/// `t` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rw_transcript_resumable(t: *const rw_transcript) -> bool {
    ffi_boundary! {
        // SAFETY: NULL or live per the contract.
        unsafe { t.as_ref() }.is_some_and(|t| t.t.resumable())
    }
}

/// Whether the answer's finish arrived (a finish reason, `message_stop`,
/// `response.completed`). False for NULL.
///
/// # Safety
/// `t` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rw_transcript_finished(t: *const rw_transcript) -> bool {
    ffi_boundary! {
        // SAFETY: NULL or live per the contract.
        unsafe { t.as_ref() }.is_some_and(|t| t.t.finished())
    }
}

/// Frees a transcript. NULL is a no-op.
///
/// # Safety
/// `t` is NULL or a transcript from `rw_transcript_new` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn rw_transcript_free(t: *mut rw_transcript) {
    ffi_boundary! {
        if !t.is_null() {
            // SAFETY: from `Box::into_raw` in `rw_transcript_new`, freed once per the contract.
            drop(unsafe { Box::from_raw(t) });
        }
    }
}
