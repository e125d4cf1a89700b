//! `rw_error` (details of a failed engine construction or reload) and
//! `rw_string_free`.

use crate::panic::{ffi_boundary, EMPTY};
use crate::types::rw_result;
use retrywise_core::PolicyErrors;
use std::ffi::CString;
use std::os::raw::c_char;

/// Details of a failed `rw_engine_new*` or `rw_engine_reload`: a result code,
/// a message naming the offending field (`breaker.failure_rate: must be in
/// (0, 1], got 1.5`) and the field path alone. Owned by the caller: free with
/// `rw_error_free`. Immutable, so it may be read from any thread.
pub struct rw_error {
    result: rw_result,
    message: CString,
    path: CString,
}

/// A `CString` from text that may contain NUL bytes (they are escaped).
pub(crate) fn cstring(s: &str) -> CString {
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

impl rw_error {
    pub(crate) fn new(result: rw_result, message: &str, path: &str) -> rw_error {
        rw_error {
            result,
            message: cstring(message),
            path: cstring(path),
        }
    }

    pub(crate) fn result(&self) -> rw_result {
        self.result
    }

    pub(crate) fn policy(e: &PolicyErrors) -> rw_error {
        rw_error::new(rw_result::RwErrPolicy, &e.to_string(), &e.first().path)
    }

    /// Stores `e` in `*err` when `err` is not NULL (otherwise drops it).
    ///
    /// # Safety
    /// `err` is NULL or valid for writing one pointer.
    pub(crate) unsafe fn store(err: *mut *mut rw_error, e: rw_error) {
        if !err.is_null() {
            // SAFETY: non-NULL and writable per the caller's contract.
            unsafe { *err = Box::into_raw(Box::new(e)) };
        }
    }

    /// Sets `*err` to NULL when `err` is not NULL.
    ///
    /// # Safety
    /// As for [`rw_error::store`].
    pub(crate) unsafe fn clear(err: *mut *mut rw_error) {
        if !err.is_null() {
            // SAFETY: non-NULL and writable per the caller's contract.
            unsafe { *err = std::ptr::null_mut() };
        }
    }
}

/// The result code of an error (`RW_ERR_POLICY`, `RW_ERR_PANIC`, ...);
/// `RW_ERR_NULL` when `err` is NULL.
///
/// Thread safety: an error is immutable; read it from any thread.
///
/// # Safety
/// `err` is NULL or a live `rw_error`.
#[no_mangle]
pub unsafe extern "C" fn rw_error_result(err: *const rw_error) -> rw_result {
    ffi_boundary! {
        // SAFETY: NULL or a live rw_error, per the contract.
        match unsafe { err.as_ref() } {
            Some(e) => e.result,
            None => rw_result::RwErrNull,
        }
    }
}

/// The whole message, NUL-terminated; every validation error of a policy,
/// each prefixed with its field path and separated by `; `. Borrowed from
/// `err`: valid until `rw_error_free(err)`. `""` when `err` is NULL.
///
/// Thread safety: any thread.
///
/// # Safety
/// `err` is NULL or a live `rw_error`.
#[no_mangle]
pub unsafe extern "C" fn rw_error_message(err: *const rw_error) -> *const c_char {
    ffi_boundary! {
        // SAFETY: NULL or a live rw_error, per the contract.
        match unsafe { err.as_ref() } {
            Some(e) => e.message.as_ptr(),
            None => EMPTY,
        }
    }
}

/// Length in bytes of `rw_error_message(err)` (without the NUL); 0 when `err` is NULL.
///
/// Thread safety: any thread.
///
/// # Safety
/// `err` is NULL or a live `rw_error`.
#[no_mangle]
pub unsafe extern "C" fn rw_error_message_len(err: *const rw_error) -> usize {
    ffi_boundary! {
        // SAFETY: NULL or a live rw_error, per the contract.
        unsafe { err.as_ref() }.map_or(0, |e| e.message.as_bytes().len())
    }
}

/// Dotted path of the first offending field (`breaker.failure_rate`),
/// NUL-terminated; `""` when the document itself is unreadable, for non-policy
/// errors and when `err` is NULL. Borrowed from `err`: valid until `rw_error_free(err)`.
///
/// Thread safety: any thread.
///
/// # Safety
/// `err` is NULL or a live `rw_error`.
#[no_mangle]
pub unsafe extern "C" fn rw_error_path(err: *const rw_error) -> *const c_char {
    ffi_boundary! {
        // SAFETY: NULL or a live rw_error, per the contract.
        match unsafe { err.as_ref() } {
            Some(e) => e.path.as_ptr(),
            None => EMPTY,
        }
    }
}

/// Frees an error. NULL is a no-op.
///
/// Thread safety: any thread, once no other thread reads the error.
///
/// # Safety
/// `err` is NULL or an `rw_error` from this library not yet freed.
#[no_mangle]
pub unsafe extern "C" fn rw_error_free(err: *mut rw_error) {
    ffi_boundary! {
        if !err.is_null() {
            // SAFETY: allocated by Box::into_raw in rw_error::store and not freed yet.
            drop(unsafe { Box::from_raw(err) });
        }
    }
}

/// Frees a string returned by this library (`rw_engine_stats_json`). NULL is a no-op.
///
/// Thread safety: any thread, once no other thread reads the string.
///
/// # Safety
/// `s` is NULL or a string from this library not yet freed.
#[no_mangle]
pub unsafe extern "C" fn rw_string_free(s: *mut c_char) {
    ffi_boundary! {
        if !s.is_null() {
            // SAFETY: allocated by CString::into_raw in this library and not freed yet.
            drop(unsafe { CString::from_raw(s) });
        }
    }
}
