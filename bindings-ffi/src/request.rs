//! `rw_request`: what a request an SDK built needs from any upstream that
//! serves it (core `wire::RequestFacts`), read once from its URL, headers and
//! body. A relay reads the request it forwards, routes on its model and
//! begins the call with it (`rw_call_spec.request`), so a fallback keeps what
//! the request relies on: tools, structured output, images, its size, its
//! wire family. Every reading is the core's; this module only lends views.

use crate::args;
use crate::error::cstring;
use crate::panic::{ffi_boundary, try_arg};
use crate::types::{rw_result, rw_str};
use crate::vocab::rw_api_family;
use retrywise_core::wire::{Endpoint, RequestFacts};
use std::ffi::CString;
use std::os::raw::c_char;
use std::sync::OnceLock;

/// What a request needs from any upstream that serves it: its wire family,
/// endpoint, model, capabilities and sizes. Opaque.
///
/// Ownership: created by `rw_request_read`, freed by `rw_request_free`;
/// the views `rw_request_model` and `rw_request_capability` return are
/// borrowed from it and valid until `rw_request_free` (endpoint names are
/// static).
/// Thread safety: immutable once read, so any number of threads may read
/// it (and begin calls with it) at once; free it once no other thread uses it.
pub struct rw_request {
    pub(crate) facts: RequestFacts,
}

/// The stable name of an endpoint (`Endpoint::as_str`), NUL-terminated and static.
fn endpoint_name(e: Endpoint) -> *const c_char {
    static T: OnceLock<Vec<CString>> = OnceLock::new();
    let names = T.get_or_init(|| Endpoint::ALL.iter().map(|e| cstring(e.as_str())).collect());
    Endpoint::ALL
        .iter()
        .position(|&x| x == e)
        .map_or(std::ptr::null(), |i| names[i].as_ptr())
}

/// The request behind `req`, when it is not NULL.
///
/// # Safety
/// `req` is NULL or a live `rw_request`.
unsafe fn facts<'a>(req: *const rw_request) -> Option<&'a RequestFacts> {
    // SAFETY: NULL or live, per the caller's contract.
    unsafe { req.as_ref() }.map(|r| &r.facts)
}

/// Reads a request as the SDK built it (`url` absolute, as sent): its wire
/// family from `url` and `headers` (an Azure host or deployment path is
/// Azure OpenAI; a `/messages` path or an `anthropic-version` / `x-api-key`
/// header Anthropic; anything else OpenAI-compatible), its endpoint from
/// the URL's path, and its model and needs from `body` (`body_len` bytes,
/// the JSON the request sends; a body that is not a JSON object gives the
/// family's needs only). On `RW_OK`, `*out` is a new request the caller
/// frees with `rw_request_free`; on any other result `*out` is NULL (when
/// `out` is not NULL). `url`, `headers` and `body` are only read during the
/// call (header values are not kept: only which names are present counts).
///
/// Returns `RW_ERR_NULL` (`out` NULL, `headers` or `body` NULL with a
/// non-zero length, a string NULL with a length), `RW_ERR_INVALID_ARG`
/// (`url` not UTF-8) or `RW_ERR_PANIC`.
///
/// Thread safety: may be called from any thread.
///
/// # Safety
/// `url` is absent or valid for its length; `headers` is NULL with
/// `headers_len == 0` or points to `headers_len` readable `rw_header`s whose
/// strings are valid for their lengths; `body` is NULL with `body_len == 0`
/// or points to `body_len` readable bytes; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rw_request_read(
    url: rw_str,
    headers: *const crate::types::rw_header,
    headers_len: usize,
    body: *const u8,
    body_len: usize,
    out: *mut *mut rw_request,
) -> rw_result {
    ffi_boundary! {
        if out.is_null() {
            return rw_result::RwErrNull;
        }
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: each valid for its length, per the contract.
        let (url, headers, body) = unsafe {
            (
                try_arg!(args::req_str(url)),
                try_arg!(args::headers(headers, headers_len)),
                try_arg!(args::slice(body, body_len)),
            )
        };
        let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
        let facts = RequestFacts::read_with(url, &has, body);
        // SAFETY: as above.
        unsafe { out.write(Box::into_raw(Box::new(rw_request { facts }))) };
        rw_result::RwOk
    }
}

/// The wire family the request was built for (`RW_API_FAMILY_OPENAI`,
/// `_ANTHROPIC`, `_AZURE_OPENAI`); its needs carry it, so a candidate whose
/// `api` cannot take it is skipped. `RW_API_FAMILY_NONE` for NULL.
///
/// Thread safety: any thread.
///
/// # Safety
/// `req` is NULL or a live `rw_request`.
#[no_mangle]
pub unsafe extern "C" fn rw_request_family(req: *const rw_request) -> rw_api_family {
    ffi_boundary! {
        // SAFETY: NULL or live, per the contract.
        rw_api_family::of(unsafe { facts(req) }.map(|f| f.family))
    }
}

/// The endpoint the URL's path names, as a stable NUL-terminated name:
/// `"chat_completions"`, `"responses"`, `"completions"`, `"embeddings"` or
/// `"messages"`. Static: never free it. NULL when the path names none, or
/// for NULL.
///
/// Thread safety: any thread.
///
/// # Safety
/// `req` is NULL or a live `rw_request`.
#[no_mangle]
pub unsafe extern "C" fn rw_request_endpoint(req: *const rw_request) -> *const c_char {
    ffi_boundary! {
        // SAFETY: NULL or live, per the contract.
        match unsafe { facts(req) }.and_then(|f| f.endpoint) {
            Some(e) => endpoint_name(e),
            None => std::ptr::null(),
        }
    }
}

/// The body's `model` (what a relay routes on: `rw_engine_route_for_model`),
/// as a view borrowed from `req` and valid until `rw_request_free`. NULL
/// (`ptr` NULL, `len` 0) when the body names none, or for NULL.
///
/// Thread safety: any thread.
///
/// # Safety
/// `req` is NULL or a live `rw_request`.
#[no_mangle]
pub unsafe extern "C" fn rw_request_model(req: *const rw_request) -> rw_str {
    ffi_boundary! {
        // SAFETY: NULL or live, per the contract.
        rw_str::of_opt(unsafe { facts(req) }.and_then(|f| f.model.as_deref()))
    }
}

/// How many capabilities the request needs from any upstream (`streaming`,
/// `tool_calling`, `json_schema`, `json_mode`, `vision`, `audio`,
/// `file_input`, in that order). 0 for NULL.
///
/// Thread safety: any thread.
///
/// # Safety
/// `req` is NULL or a live `rw_request`.
#[no_mangle]
pub unsafe extern "C" fn rw_request_capability_count(req: *const rw_request) -> usize {
    ffi_boundary! {
        // SAFETY: NULL or live, per the contract.
        unsafe { facts(req) }.map_or(0, |f| f.needs.capabilities.len())
    }
}

/// The `i`-th capability the request needs (0-based, below
/// `rw_request_capability_count`), as a view borrowed from `req` and valid
/// until `rw_request_free`. NULL (`ptr` NULL, `len` 0) when `i` is out of
/// range, or for NULL.
///
/// Thread safety: any thread.
///
/// # Safety
/// `req` is NULL or a live `rw_request`.
#[no_mangle]
pub unsafe extern "C" fn rw_request_capability(req: *const rw_request, i: usize) -> rw_str {
    ffi_boundary! {
        // SAFETY: NULL or live, per the contract.
        rw_str::of_opt(unsafe { facts(req) }.and_then(|f| f.needs.capabilities.get(i)).map(String::as_str))
    }
}

/// Saturates a token count into the `-1 = none` convention.
fn count(n: Option<u64>) -> i64 {
    n.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX))
}

/// The request's input tokens, estimated low (the characters of the body's
/// strings outside media parts, divided by 4): it keeps the request off a
/// candidate whose `context_tokens` is surely too small. -1 when the body
/// has no text (or is not a JSON object), or for NULL.
///
/// Thread safety: any thread.
///
/// # Safety
/// `req` is NULL or a live `rw_request`.
#[no_mangle]
pub unsafe extern "C" fn rw_request_input_tokens(req: *const rw_request) -> i64 {
    ffi_boundary! {
        // SAFETY: NULL or live, per the contract.
        count(unsafe { facts(req) }.and_then(|f| f.needs.input_tokens))
    }
}

/// The output tokens the request asks for (`max_completion_tokens`, else
/// `max_tokens`; `max_output_tokens` for Responses; Anthropic's
/// `max_tokens`). -1 when it asks for none, or for NULL.
///
/// Thread safety: any thread.
///
/// # Safety
/// `req` is NULL or a live `rw_request`.
#[no_mangle]
pub unsafe extern "C" fn rw_request_max_output_tokens(req: *const rw_request) -> i64 {
    ffi_boundary! {
        // SAFETY: NULL or live, per the contract.
        count(unsafe { facts(req) }.and_then(|f| f.needs.max_output_tokens))
    }
}

/// Frees a request. Every view it lent out becomes invalid; calls begun
/// with it are unaffected (they copied its needs). NULL is a no-op.
///
/// Thread safety: once no other thread uses the request.
///
/// # Safety
/// `req` is NULL or a request from `rw_request_read` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn rw_request_free(req: *mut rw_request) {
    ffi_boundary! {
        if !req.is_null() {
            // SAFETY: from `Box::into_raw` in `rw_request_read`, freed once per the contract.
            drop(unsafe { Box::from_raw(req) });
        }
    }
}
