//! Fast entry points: the steps of a governed call as raw N-API functions.
//!
//! A napi-rs method costs ~85 ns a call on this kind of machine, of which the
//! N-API crossing itself is ~13 ns: the rest is napi-rs unwrapping `this`
//! (a private-property lookup inside a `TryCatch`), checking and converting
//! each argument with its own N-API call, and creating the result value. These
//! functions do none of that. Each is created per engine with the engine's
//! state as its callback data (a strong `Rc`, dropped by a finalizer when the
//! function is collected), takes no JS argument, returns `undefined`, and
//! reads its inputs from / writes its results to the engine's scratch buffer:
//!
//! | function | inputs | results |
//! | --- | --- | --- |
//! | `begin()` | `[24]` route id, `[25]` deadline ms (< 0: policy default), `[26]` idempotency code, `[27]` tenant id (< 0: none) | `[13]` handle |
//! | `beginAttempt()` | as `begin` | `[13]` handle, `[12]` `0` attempt / `1` stopped, fields as `nextAttempt`, `[9]` stamp |
//! | `next()` | `[24]` handle, `[25]` `1`: stamp the attempt | `[12]` `0` attempt / `1` stopped, fields, `[9]` stamp |
//! | `reportStatus()` | `[24]` handle, `[25]` HTTP status, `[26]` `1`: release the call if it succeeded | `[12]` action code, `[13]` `1` when released, decision fields |
//! | `reportOk()` | `[24]` handle, `[26]` as `reportStatus` | as `reportStatus` |
//! | `release()` | `[24]` handle | — |
//!
//! Ids come from `NativeEngine.intern`. The stamp (`[9]`) is `nowMs()` when
//! the attempt was admitted. Errors are thrown as by the napi-rs methods
//! (`ERR_RETRYWISE_RELEASED`, `TypeError`s, `ERR_RETRYWISE_PANIC` for a panic,
//! after which the engine stays usable).

use crate::{http_status, panic_message, Fail, Inner, ATTEMPT};
use napi::bindgen_prelude::*;
use napi::sys;
use retrywise::Outcome;
use std::cell::RefCell;
use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::rc::Rc;

const IN0: usize = 24;
const IN1: usize = 25;
const IN2: usize = 26;
const IN3: usize = 27;
const OUT_RESULT: usize = 12;
const OUT_HANDLE: usize = 13;

type Step = fn(&mut Inner) -> std::result::Result<(), Fail>;

fn begin(st: &mut Inner) -> std::result::Result<(), Fail> {
    let s = &st.scratch;
    let (h, _) = st.start_fast(s.get(IN0), s.get(IN1), s.get(IN2), s.get(IN3), false)?;
    st.scratch.set(OUT_HANDLE, h);
    Ok(())
}

fn begin_attempt(st: &mut Inner) -> std::result::Result<(), Fail> {
    let s = &st.scratch;
    let (h, r) = st.start_fast(s.get(IN0), s.get(IN1), s.get(IN2), s.get(IN3), true)?;
    st.scratch.set(OUT_HANDLE, h);
    st.scratch.set(OUT_RESULT, r as f64);
    Ok(())
}

fn next(st: &mut Inner) -> std::result::Result<(), Fail> {
    let h = st.scratch.get(IN0);
    let stamp = st.scratch.get(IN1) == 1.0;
    let r = st.next_attempt(h, stamp)?;
    st.scratch.set(OUT_RESULT, r as f64);
    Ok(())
}

fn report_status(st: &mut Inner) -> std::result::Result<(), Fail> {
    let status = http_status(st.scratch.get(IN1))?;
    report_outcome(st, &Outcome::status(status))
}

fn report_ok(st: &mut Inner) -> std::result::Result<(), Fail> {
    report_outcome(st, &Outcome::success())
}

/// Reports `o` for the call in IN0 (released on a final decision when IN2 is 1).
#[inline(always)]
fn report_outcome(st: &mut Inner, o: &Outcome) -> std::result::Result<(), Fail> {
    let h = st.scratch.get(IN0);
    let rel = st.scratch.get(IN2) == 1.0;
    let (a, released) = st.report(h, o, 0, rel)?;
    st.scratch.set(OUT_RESULT, a as f64);
    st.scratch.set(OUT_HANDLE, released as u8 as f64);
    Ok(())
}

fn release(st: &mut Inner) -> std::result::Result<(), Fail> {
    let h = st.scratch.get(IN0);
    st.release(h);
    Ok(())
}

const _: () = assert!(ATTEMPT == 0);

unsafe fn throw_raw(env: sys::napi_env, f: Fail) {
    let (code, msg, type_error) = match f {
        Fail::Type(m) => ("ERR_INVALID_ARG_TYPE", m, true),
        Fail::Coded(c, m) => (c, m, false),
    };
    let code = CString::new(code).unwrap_or_default();
    let msg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    if type_error {
        sys::napi_throw_type_error(env, code.as_ptr(), msg.as_ptr());
    } else {
        sys::napi_throw_error(env, code.as_ptr(), msg.as_ptr());
    }
}

/// The trampoline every fast function runs: engine from the callback data,
/// the step inside a panic boundary, failures thrown as JS errors.
unsafe extern "C" fn trampoline<const OP: u8>(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    let mut argc = 0usize;
    let mut data: *mut c_void = ptr::null_mut();
    let status = sys::napi_get_cb_info(env, info, &mut argc, ptr::null_mut(), ptr::null_mut(), &mut data);
    if status != sys::Status::napi_ok || data.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: `data` is the `Rc<RefCell<Inner>>` leaked into this function by
    // `create`; the function's finalizer gives it back only when the function
    // itself is collected, so it outlives every call.
    let cell = &*(data as *const RefCell<Inner>);
    let step: Step = match OP {
        0 => begin,
        1 => begin_attempt,
        2 => next,
        3 => report_status,
        4 => report_ok,
        _ => release,
    };
    let r = match cell.try_borrow_mut() {
        Ok(mut st) => match catch_unwind(AssertUnwindSafe(|| step(&mut st))) {
            Ok(r) => r,
            Err(p) => Err(Fail::Coded(
                "ERR_RETRYWISE_PANIC",
                format!("retrywise panicked: {}", panic_message(&*p)),
            )),
        },
        Err(_) => Err(Fail::Coded(
            "ERR_RETRYWISE_BUSY",
            "the engine is in use (re-entered from a callback)".to_string(),
        )),
    };
    if let Err(f) = r {
        throw_raw(env, f);
    }
    ptr::null_mut()
}

unsafe extern "C" fn drop_state(_env: sys::napi_env, data: *mut c_void, _hint: *mut c_void) {
    // SAFETY: `data` came from `Rc::into_raw` in `create`, once per function.
    drop(Rc::from_raw(data as *const RefCell<Inner>));
}

fn check(status: sys::napi_status, what: &str) -> Result<()> {
    if status == sys::Status::napi_ok {
        Ok(())
    } else {
        Err(Error::new(
            Status::GenericFailure,
            format!("creating the fast entry points: {what}"),
        ))
    }
}

/// Creates the fast functions of one engine, as an object.
pub(crate) fn create(env: &Env, inner: &Rc<RefCell<Inner>>) -> Result<Object<'static>> {
    type Cb = unsafe extern "C" fn(sys::napi_env, sys::napi_callback_info) -> sys::napi_value;
    let fns: [(&str, Cb); 6] = [
        ("begin", trampoline::<0>),
        ("beginAttempt", trampoline::<1>),
        ("next", trampoline::<2>),
        ("reportStatus", trampoline::<3>),
        ("reportOk", trampoline::<4>),
        ("release", trampoline::<5>),
    ];
    let raw = env.raw();
    unsafe {
        let mut obj = ptr::null_mut();
        check(sys::napi_create_object(raw, &mut obj), "object")?;
        for (name, cb) in fns {
            let data = Rc::into_raw(inner.clone()) as *mut c_void;
            let mut f = ptr::null_mut();
            let made =
                sys::napi_create_function(raw, name.as_ptr().cast(), name.len() as isize, Some(cb), data, &mut f);
            if made != sys::Status::napi_ok {
                drop_state(raw, data, ptr::null_mut());
                return check(made, name).map(|_| unreachable!());
            }
            let fin = sys::napi_add_finalizer(raw, f, data, Some(drop_state), ptr::null_mut(), ptr::null_mut());
            if fin != sys::Status::napi_ok {
                drop_state(raw, data, ptr::null_mut());
                return check(fin, name).map(|_| unreachable!());
            }
            let cname = CString::new(name).unwrap_or_default();
            check(sys::napi_set_named_property(raw, obj, cname.as_ptr(), f), name)?;
        }
        Ok(Object::from_raw(raw, obj))
    }
}
