//! The attempt an async continuation runs in, carried by V8 itself.
//!
//! Nesting needs the current retrywise attempt to follow `await` and `then`.
//! Node 20's `AsyncLocalStorage` does that with async_hooks: while one is
//! enabled, every promise in the process runs three JS hooks, which made an
//! awaited call through `engine.run` cost twice what it costs without them.
//! V8 already carries one value along every promise continuation at no cost
//! to promises: the *continuation-preserved embedder data* (CPED), captured
//! when a reaction is registered (`await`, `then`) and restored while it runs.
//! Node 22.7+ builds `AsyncLocalStorage` on it (`AsyncContextFrame`); Node 20
//! leaves it unused, so retrywise keeps its attempt there.
//!
//! `carrier()` returns `{ swap, get }` as raw N-API functions (no napi-rs
//! argument handling: each is one V8 call), or `null` when the host does not
//! export the V8 functions. The JS layer (`lib/context.js`) decides when to
//! use it: only on Node 20, where nothing else in the process writes the slot.
//!
//! The V8 functions are found in the host process with `dlsym` (Node exports
//! V8's C++ API for addons) and called through the Itanium C++ ABI: `this`
//! first, and a `v8::Local<T>` (one pointer, trivially copyable) passed and
//! returned as that pointer. A `napi_value` is, in Node, the same pointer as
//! the `Local<Value>` it stands for.
//!
//! This is the only place the binding reaches past N-API, so it is confined:
//!
//! - `carrier()` is asked for by `lib/context.js` only on Node 20 (V8 11.3,
//!   whose ABI and promise jobs the test suite checks), with Node's
//!   `AsyncLocalStorage` on async_hooks (so nothing else writes the slot), and
//!   unless `RETRYWISE_NESTING=async-local-storage`. Node 22 and 24 never ask.
//! - All four symbols must resolve; when any is absent (a Node built without
//!   exporting V8's C++ API, a libnode whose symbols are hidden, a V8 that
//!   renamed them) `carrier()` is `null` and nesting falls back to the
//!   `AsyncLocalStorage` carrier: slower for promises while a call is in
//!   flight, never wrong.
//! - `lib/context.js` then checks that a `swap`/`get` round trip gives back
//!   what was set before it uses the carrier, and falls back the same way if not.
//!
//! A build with the `test-hooks` feature (the test build) also reports the
//! symbols absent when `RETRYWISE_TEST_HIDE_V8` is set, so the tests exercise
//! the fallback on Node 20 as well.

use napi::bindgen_prelude::*;
use napi::sys;
use std::ffi::{c_void, CStr};
use std::ptr;
use std::sync::OnceLock;

/// `v8::Isolate* v8::Isolate::GetCurrent()`.
type IsolateGetCurrent = unsafe extern "C" fn() -> *mut c_void;
/// `v8::Local<v8::Context> v8::Isolate::GetCurrentContext()`.
type IsolateGetCurrentContext = unsafe extern "C" fn(isolate: *mut c_void) -> *mut c_void;
/// `v8::Local<v8::Value> v8::Context::GetContinuationPreservedEmbedderData() const`.
type ContextGetData = unsafe extern "C" fn(context: *mut c_void) -> sys::napi_value;
/// `void v8::Context::SetContinuationPreservedEmbedderData(v8::Local<v8::Value>)`.
type ContextSetData = unsafe extern "C" fn(context: *mut c_void, value: sys::napi_value);

struct V8 {
    isolate: IsolateGetCurrent,
    context: IsolateGetCurrentContext,
    get: ContextGetData,
    set: ContextSetData,
}

fn lookup(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: dlsym with RTLD_DEFAULT searches the process's global symbols; `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// The host's V8 functions, looked up once; `None` when any is missing.
fn v8() -> Option<&'static V8> {
    static V8: OnceLock<Option<V8>> = OnceLock::new();
    V8.get_or_init(|| {
        #[cfg(feature = "test-hooks")]
        if std::env::var_os("RETRYWISE_TEST_HIDE_V8").is_some() {
            return None;
        }
        let isolate = lookup(c"_ZN2v87Isolate10GetCurrentEv")?;
        let context = lookup(c"_ZN2v87Isolate17GetCurrentContextEv")?;
        let get = lookup(c"_ZNK2v87Context36GetContinuationPreservedEmbedderDataEv")?;
        let set = lookup(c"_ZN2v87Context36SetContinuationPreservedEmbedderDataENS_5LocalINS_5ValueEEE")?;
        // SAFETY: each symbol is the V8 function its mangled name spells, whose
        // Itanium ABI signature is the type it is cast to (see the module docs).
        unsafe {
            Some(V8 {
                isolate: std::mem::transmute::<*mut c_void, IsolateGetCurrent>(isolate),
                context: std::mem::transmute::<*mut c_void, IsolateGetCurrentContext>(context),
                get: std::mem::transmute::<*mut c_void, ContextGetData>(get),
                set: std::mem::transmute::<*mut c_void, ContextSetData>(set),
            })
        }
    })
    .as_ref()
}

/// The current context: a handle in the HandleScope N-API opened for the callback.
unsafe fn current_context(v8: &V8) -> *mut c_void {
    (v8.context)((v8.isolate)())
}

/// `swap(value)`: makes `value` the data the current continuation carries and
/// returns what it carried before (`undefined` if nothing).
unsafe extern "C" fn swap(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    let Some(v8) = v8() else { return ptr::null_mut() };
    let mut argc = 1usize;
    let mut arg: sys::napi_value = ptr::null_mut();
    if sys::napi_get_cb_info(env, info, &mut argc, &mut arg, ptr::null_mut(), ptr::null_mut()) != sys::Status::napi_ok {
        return ptr::null_mut();
    }
    if argc < 1 || arg.is_null() {
        sys::napi_get_undefined(env, &mut arg);
    }
    let cx = current_context(v8);
    let prev = (v8.get)(cx);
    (v8.set)(cx, arg);
    prev
}

/// `get()`: the data the current continuation carries (`undefined` if nothing).
unsafe extern "C" fn get(_env: sys::napi_env, _info: sys::napi_callback_info) -> sys::napi_value {
    match v8() {
        Some(v8) => (v8.get)(current_context(v8)),
        None => ptr::null_mut(),
    }
}

/// `{ swap, get }` over V8's continuation-preserved embedder data, or `null`
/// when the host process does not export V8's functions for it.
pub(crate) fn carrier(env: &Env) -> Result<Option<Object<'static>>> {
    if v8().is_none() {
        return Ok(None);
    }
    type Cb = unsafe extern "C" fn(sys::napi_env, sys::napi_callback_info) -> sys::napi_value;
    let fns: [(&CStr, Cb); 2] = [(c"swap", swap), (c"get", get)];
    let raw = env.raw();
    let fail = |what: &str| {
        Error::new(
            Status::GenericFailure,
            format!("creating the continuation carrier: {what}"),
        )
    };
    // SAFETY: plain N-API calls on this callback's env; every out-pointer is a local.
    unsafe {
        let mut obj = ptr::null_mut();
        if sys::napi_create_object(raw, &mut obj) != sys::Status::napi_ok {
            return Err(fail("object"));
        }
        for (name, cb) in fns {
            let mut f = ptr::null_mut();
            let len = name.to_bytes().len() as isize;
            if sys::napi_create_function(raw, name.as_ptr(), len, Some(cb), ptr::null_mut(), &mut f)
                != sys::Status::napi_ok
                || sys::napi_set_named_property(raw, obj, name.as_ptr(), f) != sys::Status::napi_ok
            {
                return Err(fail(&name.to_string_lossy()));
            }
        }
        Ok(Some(Object::from_raw(raw, obj)))
    }
}
