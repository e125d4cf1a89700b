//! Where a request goes: `rw_engine_route_for_model` (the route that serves
//! a request's model, so one transport serves many models) and
//! `rw_engine_reach` (how to reach the upstream an attempt names: base URL,
//! API family, wire model, the name of the key's environment variable).
//! Both read the engine's policy; neither decides anything.

use crate::args;
use crate::engine::rw_engine;
use crate::error::{cstring, rw_error};
use crate::panic::{ffi_boundary, try_arg};
use crate::types::{rw_result, rw_str};
use crate::vocab::rw_api_family;
use std::os::raw::c_char;

/// How to reach one upstream, from the policy catalog (core `wire::Reach`):
/// what a transport rewrites an attempt's request with. Filled by
/// `rw_engine_reach`; every string is NUL-terminated and owned by the
/// struct until `rw_reach_free`. A NULL string (or `RW_API_FAMILY_NONE`)
/// means the request keeps what it has.
#[repr(C)]
#[derive(Debug)]
pub struct rw_reach {
    /// The upstream's catalog name (never NULL after `RW_OK`).
    pub upstream: *mut c_char,
    /// Where its API lives (`https://api.openai.com/v1`): the endpoint tail
    /// of the request's path goes after it. NULL: the caller's own URL.
    pub base_url: *mut c_char,
    /// Its wire family (URL shape, auth header); `RW_API_FAMILY_NONE`: the request's own.
    pub api: rw_api_family,
    /// The `model` to send (`request_model`, else `model`; the deployment on
    /// Azure). NULL: the request's own.
    pub model: *mut c_char,
    /// The NAME of the environment variable that holds its key (a policy
    /// never holds the key itself). NULL: auth headers as the request has them.
    pub api_key_env: *mut c_char,
    /// Azure OpenAI's `api-version` query parameter; NULL when none.
    pub api_version: *mut c_char,
    /// It declares `assistant_prefill` (a continuation may prefill).
    pub prefill: bool,
}

impl rw_reach {
    const EMPTY: rw_reach = rw_reach {
        upstream: std::ptr::null_mut(),
        base_url: std::ptr::null_mut(),
        api: rw_api_family::None,
        model: std::ptr::null_mut(),
        api_key_env: std::ptr::null_mut(),
        api_version: std::ptr::null_mut(),
        prefill: false,
    };
}

impl Default for rw_reach {
    fn default() -> Self {
        rw_reach::EMPTY
    }
}

fn owned(s: Option<&str>) -> *mut c_char {
    s.map_or(std::ptr::null_mut(), |s| cstring(s).into_raw())
}

/// The route (or upstream) that serves requests for `model` (a request
/// body's `model`): the policy's `models` map, then a route named like it,
/// then an upstream named like it or whose `model` / `request_model` it is.
/// Begin the call on it (`rw_call_spec.route`). On `RW_OK`, `*out` is a
/// NUL-terminated string the caller frees with `rw_string_free`; otherwise
/// `*out` is NULL (when `out` is not NULL).
///
/// Returns `RW_ERR_NULL` (`engine` or `out` NULL, or `model` NULL with a
/// length), `RW_ERR_INVALID_ARG` (`model` not UTF-8), `RW_ERR_POLICY` when
/// no route serves the model (never a silent shared breaker key): `*err`
/// (when `err` is not NULL; free it with `rw_error_free`) names the model
/// and the keys to add, with path `models.<model>`.
///
/// Thread safety: may be called on a shared engine from any thread.
///
/// # Safety
/// `engine` is NULL or live; `model` points to `len` readable bytes (or is
/// NULL with length 0); `out` and `err` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rw_engine_route_for_model(
    engine: *const rw_engine,
    model: rw_str,
    out: *mut *mut c_char,
    err: *mut *mut rw_error,
) -> rw_result {
    // SAFETY: `err` is NULL or writable, per the contract.
    unsafe { rw_error::clear(err) };
    ffi_boundary! {
        if out.is_null() {
            return rw_result::RwErrNull;
        }
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: NULL or a live engine, per the contract.
        let Some(h) = (unsafe { engine.as_ref() }) else { return rw_result::RwErrNull };
        // SAFETY: `model` is valid for its length, per the contract.
        let model = try_arg!(unsafe { args::req_str(model) });
        match h.engine.route_for_model(model) {
            Ok(route) => {
                // SAFETY: as above.
                unsafe { out.write(cstring(&route).into_raw()) };
                rw_result::RwOk
            }
            Err(e) => {
                // SAFETY: `err` is NULL or writable, per the contract.
                unsafe { rw_error::store(err, rw_error::new(rw_result::RwErrPolicy, &e.message, &e.path)) };
                rw_result::RwErrPolicy
            }
        }
    }
}

/// How to reach `upstream` (an attempt's `upstream`), read from the policy
/// in force: fills `*out`, whose strings the caller frees with
/// `rw_reach_free`. An upstream the catalog does not list is reached as the
/// request was built (every field NULL / NONE but `upstream`).
///
/// Returns `RW_ERR_NULL` (`engine` or `out` NULL, or `upstream` NULL with a length),
/// `RW_ERR_INVALID_ARG` (`upstream` not UTF-8). On any result but `RW_OK`,
/// `*out` (when `out` is not NULL) holds only NULL strings.
///
/// Thread safety: may be called on a shared engine from any thread.
///
/// # Safety
/// `engine` is NULL or live; `upstream` points to `len` readable bytes;
/// `out` is NULL or writable (what it held is overwritten, not freed).
#[no_mangle]
pub unsafe extern "C" fn rw_engine_reach(engine: *const rw_engine, upstream: rw_str, out: *mut rw_reach) -> rw_result {
    ffi_boundary! {
        if out.is_null() {
            return rw_result::RwErrNull;
        }
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out.write(rw_reach::EMPTY) };
        // SAFETY: NULL or a live engine, per the contract.
        let Some(h) = (unsafe { engine.as_ref() }) else { return rw_result::RwErrNull };
        // SAFETY: `upstream` is valid for its length, per the contract.
        let name = try_arg!(unsafe { args::req_str(upstream) });
        let r = h.engine.reach(name);
        let view = rw_reach {
            upstream: owned(Some(&r.upstream)),
            base_url: owned(r.base_url.as_deref()),
            api: rw_api_family::of(r.api),
            model: owned(r.model.as_deref()),
            api_key_env: owned(r.api_key_env.as_deref()),
            api_version: owned(r.api_version.as_deref()),
            prefill: r.prefill,
        };
        // SAFETY: as above.
        unsafe { out.write(view) };
        rw_result::RwOk
    }
}

/// Frees the strings of a reach filled by `rw_engine_reach` and sets them
/// to NULL (the struct itself is the caller's). NULL, or a reach already
/// freed, is a no-op.
///
/// # Safety
/// `reach` is NULL or a writable `rw_reach` whose strings came from
/// `rw_engine_reach` (or are NULL).
#[no_mangle]
pub unsafe extern "C" fn rw_reach_free(reach: *mut rw_reach) {
    ffi_boundary! {
        // SAFETY: NULL or writable, per the contract.
        let Some(r) = (unsafe { reach.as_mut() }) else { return };
        for s in [&mut r.upstream, &mut r.base_url, &mut r.model, &mut r.api_key_env, &mut r.api_version] {
            let p = std::mem::replace(s, std::ptr::null_mut());
            if !p.is_null() {
                // SAFETY: made by `CString::into_raw` in `rw_engine_reach` and not freed yet (freed ones are NULL).
                drop(unsafe { std::ffi::CString::from_raw(p) });
            }
        }
    }
}
