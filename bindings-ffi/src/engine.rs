//! `rw_engine`: construction from a policy document, reload, kill switch,
//! stats, and the manual-clock testing hook.

use crate::args;
use crate::error::{cstring, rw_error};
use crate::panic::{ffi_boundary, try_arg};
use crate::types::{rw_engine_options, rw_result, rw_str};
use retrywise_core::{Engine, ManualClock, Mode, Policy};
use std::os::raw::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// The retry owner: one per process (or per policy), shared by every call.
///
/// Thread safety: every `rw_engine_*` function may be called on the same
/// engine from any number of threads at once.
/// Ownership: created by `rw_engine_new*`, freed by `rw_engine_free`. Calls
/// keep what they need of the engine alive, so a call may outlive its engine
/// handle (free both).
pub struct rw_engine {
    pub(crate) engine: Engine,
    clock: Option<ManualClock>,
}

/// Reads and parses a policy document (`NULL`/0 = the default policy).
///
/// # Safety
/// `policy` is NULL or points to `len` readable bytes.
unsafe fn parse_policy(policy: *const c_char, len: usize) -> Result<Policy, rw_error> {
    // SAFETY: forwarded from the caller.
    let text = match unsafe { args::opt_str(rw_str { ptr: policy, len }) } {
        Ok(t) => t.unwrap_or(""),
        Err(rw_result::RwErrNull) => {
            return Err(rw_error::new(
                rw_result::RwErrNull,
                "policy is NULL with a non-zero length",
                "",
            ))
        }
        Err(r) => return Err(rw_error::new(r, "policy is not valid UTF-8", "")),
    };
    Policy::from_str_any(text).map_err(|e| rw_error::policy(&e))
}

/// # Safety
/// As for [`rw_engine_new_with`].
unsafe fn build(policy: *const c_char, len: usize, opts: *const rw_engine_options) -> Result<rw_engine, rw_error> {
    // SAFETY: forwarded from the caller.
    let policy = unsafe { parse_policy(policy, len) }?;
    // SAFETY: NULL or a readable rw_engine_options, per the contract.
    let opts = unsafe { opts.as_ref() }.copied().unwrap_or_default();
    let mut b = Engine::builder(policy);
    if opts.has_seed {
        b = b.seed(opts.seed);
    }
    let clock = opts.manual_clock.then(ManualClock::new);
    if let Some(c) = &clock {
        b = b.clock(Arc::new(c.clone()));
    }
    let engine = b.build().map_err(|e| rw_error::policy(&e))?;
    Ok(rw_engine { engine, clock })
}

/// Creates an engine from a policy document: JSON, YAML or TOML (the format
/// is guessed; `policy == NULL && len == 0`, or an empty document, gives the
/// default policy). The environment's `RETRYWISE_DISABLE` is honoured.
///
/// Returns the engine, or NULL on failure with `*err` set (when `err` is not
/// NULL) to an `rw_error` the caller frees with `rw_error_free`:
/// `RW_ERR_POLICY` (the message names the field, e.g. `breaker.failure_rate`),
/// `RW_ERR_INVALID_ARG` (not UTF-8), `RW_ERR_NULL` (`policy` NULL with
/// `len > 0`) or `RW_ERR_PANIC`. On success `*err` is set to NULL.
/// The policy bytes are only read during the call.
///
/// Thread safety: may be called from any thread.
///
/// # Safety
/// `policy` is NULL or points to `len` readable bytes; `err` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn rw_engine_new(policy: *const c_char, len: usize, err: *mut *mut rw_error) -> *mut rw_engine {
    // SAFETY: same contract as rw_engine_new_with, with NULL options.
    unsafe { rw_engine_new_with(policy, len, std::ptr::null(), err) }
}

/// Like `rw_engine_new`, with testing options (NULL = defaults): a fixed
/// `seed` (when `has_seed`) and a manual clock (`manual_clock`) moved only by
/// `rw_engine_advance_clock`, so that decisions replay identically across
/// languages.
///
/// Thread safety: may be called from any thread.
///
/// # Safety
/// As for `rw_engine_new`; `opts` is NULL or points to a readable `rw_engine_options`.
#[no_mangle]
pub unsafe extern "C" fn rw_engine_new_with(
    policy: *const c_char,
    len: usize,
    opts: *const rw_engine_options,
    err: *mut *mut rw_error,
) -> *mut rw_engine {
    // SAFETY: `err` is NULL or writable, per the contract.
    unsafe { rw_error::clear(err) };
    // SAFETY: pointer contracts forwarded from the caller.
    let built = catch_unwind(AssertUnwindSafe(|| unsafe { build(policy, len, opts) }));
    let e = match built {
        Ok(Ok(engine)) => return Box::into_raw(Box::new(engine)),
        Ok(Err(e)) => e,
        Err(_) => rw_error::new(
            rw_result::RwErrPanic,
            "panic inside retrywise while building the engine",
            "",
        ),
    };
    // SAFETY: as above.
    unsafe { rw_error::store(err, e) };
    std::ptr::null_mut()
}

/// Frees an engine handle. Calls begun on it stay valid (free them with
/// `rw_call_free`). NULL is a no-op.
///
/// Thread safety: no other thread may use this handle during or after the call.
///
/// # Safety
/// `engine` is NULL or an engine from `rw_engine_new*` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn rw_engine_free(engine: *mut rw_engine) {
    ffi_boundary! {
        if !engine.is_null() {
            // SAFETY: allocated by Box::into_raw in rw_engine_new_with and not freed yet.
            drop(unsafe { Box::from_raw(engine) });
        }
    }
}

/// Swaps the policy atomically (JSON, YAML or TOML; NULL/0 = the default
/// policy). Calls already begun finish under the policy they started with.
/// An invalid policy leaves the old one in force and returns `RW_ERR_POLICY`
/// with `*err` set as for `rw_engine_new`. Returns `RW_ERR_NULL` when
/// `engine` is NULL.
///
/// Thread safety: may be called on a shared engine from any thread.
///
/// # Safety
/// `engine` is NULL or live; `policy` as for `rw_engine_new`; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rw_engine_reload(
    engine: *const rw_engine,
    policy: *const c_char,
    len: usize,
    err: *mut *mut rw_error,
) -> rw_result {
    // SAFETY: `err` is NULL or writable, per the contract.
    unsafe { rw_error::clear(err) };
    let r = ffi_boundary! {
        // SAFETY: NULL or a live engine, per the contract.
        let Some(h) = (unsafe { engine.as_ref() }) else {
            return Err(rw_error::new(rw_result::RwErrNull, "engine is NULL", ""));
        };
        // SAFETY: forwarded from the caller.
        let policy = unsafe { parse_policy(policy, len) }?;
        h.engine.reload(policy).map_err(|e| rw_error::policy(&e))
    };
    match r {
        Ok(()) => rw_result::RwOk,
        Err(e) => {
            let code = e.result();
            // SAFETY: as above.
            unsafe { rw_error::store(err, e) };
            code
        }
    }
}

impl crate::panic::OnPanic for Result<(), rw_error> {
    fn on_panic() -> Self {
        Err(rw_error::new(rw_result::RwErrPanic, "panic inside retrywise", ""))
    }
}

/// Flips the kill switch: whether retries (and fallbacks), fallbacks and
/// hedged attempts are allowed. Takes effect for every decision made after
/// it, in-flight calls included. Returns `RW_ERR_NULL` when `engine` is NULL.
///
/// Thread safety: may be called on a shared engine from any thread.
///
/// # Safety
/// `engine` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rw_engine_set_mode(
    engine: *const rw_engine,
    retries: bool,
    fallback: bool,
    hedging: bool,
) -> rw_result {
    ffi_boundary! {
        // SAFETY: NULL or a live engine, per the contract.
        let Some(h) = (unsafe { engine.as_ref() }) else { return rw_result::RwErrNull };
        h.engine.set_mode(Mode { retries, fallback, hedging });
        rw_result::RwOk
    }
}

/// Moves the engine's manual clock forward by `ms` milliseconds (testing
/// hook). Returns `RW_ERR_INVALID_STATE` when the engine was not created with
/// `manual_clock`, `RW_ERR_NULL` when `engine` is NULL.
///
/// Thread safety: may be called on a shared engine from any thread.
///
/// # Safety
/// `engine` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rw_engine_advance_clock(engine: *const rw_engine, ms: u64) -> rw_result {
    ffi_boundary! {
        // SAFETY: NULL or a live engine, per the contract.
        let Some(h) = (unsafe { engine.as_ref() }) else { return rw_result::RwErrNull };
        match &h.clock {
            Some(c) => {
                c.advance_ms(ms);
                rw_result::RwOk
            }
            None => rw_result::RwErrInvalidState,
        }
    }
}

/// A JSON snapshot of every counter (logical requests vs attempts, stops by
/// reason, per upstream / tenant / policy version, breaker states) and each
/// upstream's learned first-token limit (`first_token`: samples, quantile_ms,
/// limit_ms, from the `first_token_ms` its streamed successes reported). On
/// `RW_OK`, `*out` is a NUL-terminated string the caller frees with
/// `rw_string_free`; otherwise `*out` is NULL (when `out` is not NULL).
/// Returns `RW_ERR_NULL` when `engine` or `out` is NULL.
///
/// Thread safety: may be called on a shared engine from any thread.
///
/// # Safety
/// `engine` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rw_engine_stats_json(engine: *const rw_engine, out: *mut *mut c_char) -> rw_result {
    ffi_boundary! {
        if out.is_null() {
            return rw_result::RwErrNull;
        }
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: NULL or a live engine, per the contract.
        let Some(h) = (unsafe { engine.as_ref() }) else { return rw_result::RwErrNull };
        let json = try_arg!(serde_json::to_string(&h.engine.stats()).map_err(|_| rw_result::RwErrInvalidState));
        // SAFETY: as above.
        unsafe { out.write(cstring(&json).into_raw()) };
        rw_result::RwOk
    }
}
