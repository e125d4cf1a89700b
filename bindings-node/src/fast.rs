//! Fast entry points: the steps of a governed call as raw N-API functions.
//!
//! A napi-rs method costs ~85 ns a call on this kind of machine, of which the
//! N-API crossing itself is ~13 ns: the rest is napi-rs unwrapping `this`
//! (a private-property lookup inside a `TryCatch`), checking and converting
//! each argument with its own N-API call, and creating the result value. These
//! functions do none of that. Each is created per engine with the engine's
//! state as its callback data (a strong `Rc`, dropped by a finalizer when the
//! function is collected), takes no JS argument, returns `undefined`, and
//! reads its inputs from / writes its results to the engine's scratch buffer
//! (slots named as in the `scratch` module):
//!
//! | function | inputs | results |
//! | --- | --- | --- |
//! | `begin()` | `begin::{ROUTE, DEADLINE_MS, IDEMPOTENCY, TENANT}` | `step::HANDLE` |
//! | `beginAttempt()` | as `begin` | `step::HANDLE`, `step::RESULT` (`ATTEMPT` / `STOPPED`), fields as `nextAttempt`, `attempt::STAMP` |
//! | `next()` | `next::{HANDLE, STAMP}` | `step::RESULT`, fields, `attempt::STAMP` when asked |
//! | `reportStatus()` | `report::{HANDLE, STATUS, RELEASE}` | `step::RESULT` (action code), `step::HANDLE` (`1` when released), `step::IDLE`, decision fields |
//! | `reportOk()` | `report::{HANDLE, RELEASE}` | as `reportStatus` |
//! | `release()` | `release::HANDLE` | — |
//! | `finish()` | `release::HANDLE` | final decision and `finished` fields of a finished call that holds nothing |
//!
//! Ids come from `NativeEngine.intern`. The stamp is `nowMs()` when the
//! attempt was admitted. With `report::RELEASE` 2, a report whose decision
//! finished the call (final, nothing held) also writes the `finished` fields
//! and returns `true` (the id in `finished::ID_HI`/`ID_LO`; for an id
//! inherited from an upstream owner, its text); `finish()` does the same for a call finished
//! otherwise (by a stop), without freeing it. Every other step returns `undefined`. Errors are thrown as by the napi-rs methods
//! (`ERR_RETRYWISE_RELEASED`, `ERR_RETRYWISE_SCRATCH_DETACHED`, `TypeError`s,
//! `ERR_RETRYWISE_PANIC` for a panic, after which the engine stays usable).

use crate::convert::http_status;
use crate::errors::{panic_message, Fail};
use crate::finished::Done;
use crate::scratch::{self, step, Slots};
use crate::state::Inner;
use napi::bindgen_prelude::*;
use napi::sys;
use retrywise::Outcome;
use std::cell::RefCell;
use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::rc::Rc;

/// A step's result besides scratch: a call it finished, whose id it returns.
type Ret = std::result::Result<Option<Done>, Fail>;
type Step = fn(&mut Inner, &Slots) -> Ret;

fn begin(st: &mut Inner, s: &Slots) -> Ret {
    let (h, _) = st.start_fast(s, false)?;
    s.set(step::HANDLE, h);
    Ok(None)
}

fn begin_attempt(st: &mut Inner, s: &Slots) -> Ret {
    let (h, r) = st.start_fast(s, true)?;
    s.set(step::HANDLE, h);
    s.set(step::RESULT, r as f64);
    Ok(None)
}

fn next(st: &mut Inner, s: &Slots) -> Ret {
    use scratch::next::*;
    let r = st.next_attempt(s, s.get(HANDLE), s.get(STAMP) == 1.0)?;
    s.set(step::RESULT, r as f64);
    Ok(None)
}

fn report_status(st: &mut Inner, s: &Slots) -> Ret {
    let status = http_status(s.get(scratch::report::STATUS))?;
    report_outcome(st, s, &Outcome::status(status))
}

fn report_ok(st: &mut Inner, s: &Slots) -> Ret {
    report_outcome(st, s, &Outcome::success())
}

/// Reports `o` for the call in `report::HANDLE` (`report::RELEASE`: see [`Inner::report`]).
#[inline(always)]
fn report_outcome(st: &mut Inner, s: &Slots, o: &Outcome) -> Ret {
    use scratch::report::*;
    let (a, released, id) = st.report(s, s.get(HANDLE), o, 0, s.get(RELEASE) as u8)?;
    s.set(step::RESULT, a as f64);
    s.set(step::HANDLE, released as u8 as f64);
    Ok(id)
}

fn release(st: &mut Inner, s: &Slots) -> Ret {
    st.release(s.get(scratch::release::HANDLE));
    Ok(None)
}

fn finish(st: &mut Inner, s: &Slots) -> Ret {
    st.finish(s, s.get(scratch::release::HANDLE))
}

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
    let run: Step = match OP {
        0 => begin,
        1 => begin_attempt,
        2 => next,
        3 => report_status,
        4 => report_ok,
        5 => release,
        _ => finish,
    };
    let env = Env::from_raw(env);
    let r = match cell.try_borrow_mut() {
        Ok(mut st) => match catch_unwind(AssertUnwindSafe(|| {
            let s = st.scratch.slots(&env)?;
            Ok(match run(&mut st, &s)? {
                None => ptr::null_mut(),
                Some(done) => hand_over(&env, &mut st, done),
            })
        })) {
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
    match r {
        Ok(v) => v,
        Err(f) => {
            throw_raw(env.raw(), f);
            ptr::null_mut()
        }
    }
}

/// A call a step finished: `true` when its id went into scratch as numbers
/// (`finished::ID_HI`), else its id's text read off the call (no copy); then
/// the call freed when the step said so.
fn hand_over(env: &Env, st: &mut Inner, done: Done) -> sys::napi_value {
    let mut v = ptr::null_mut();
    // Either fails only on a broken env, leaving `v` null (undefined): JS then sees no finished call.
    if done.numbered {
        // SAFETY: `env` is this step's env.
        unsafe { sys::napi_get_boolean(env.raw(), true, &mut v) };
    } else if let Some(call) = st.entry(done.h).ok().and_then(|e| e.call.as_ref()) {
        let b = call.id().as_bytes();
        // SAFETY: `env` is this step's env and `b` outlives the call that copies it.
        unsafe {
            sys::napi_create_string_utf8(env.raw(), b.as_ptr().cast(), b.len() as isize, &mut v);
        }
    }
    if done.free {
        st.release(done.h);
    }
    v
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
    let fns: [(&str, Cb); 7] = [
        ("begin", trampoline::<0>),
        ("beginAttempt", trampoline::<1>),
        ("next", trampoline::<2>),
        ("reportStatus", trampoline::<3>),
        ("reportOk", trampoline::<4>),
        ("release", trampoline::<5>),
        ("finish", trampoline::<6>),
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
