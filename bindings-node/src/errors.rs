//! The errors this binding throws into JS, and the panic boundary every entry
//! point runs in (`guard`). `Fail` is a step's failure before it is thrown
//! (the fast entry points throw it through raw N-API). Separate because every
//! other module throws through it.

use napi::bindgen_prelude::*;
use retrywise::{PolicyError, PolicyErrors};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub(crate) fn throw(env: &Env, code: &str, msg: &str) -> Error {
    let _ = env.throw_error(msg, Some(code));
    Error::new(Status::PendingException, msg.to_string())
}

pub(crate) fn throw_type(env: &Env, msg: &str) -> Error {
    let _ = env.throw_type_error(msg, Some("ERR_INVALID_ARG_TYPE"));
    Error::new(Status::PendingException, msg.to_string())
}

pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Runs `f` inside a panic boundary: a Rust panic becomes a JS `Error` with
/// code `ERR_RETRYWISE_PANIC` instead of aborting the process.
pub(crate) fn guard<T>(env: &Env, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(throw(
            env,
            "ERR_RETRYWISE_PANIC",
            &format!("retrywise panicked: {}", panic_message(&*p)),
        )),
    }
}

/// The JSON list of problems a policy error carries as its message (the JS
/// layer's `translateNativeError` builds a `PolicyError` from it).
fn policy_json(errs: &[PolicyError]) -> String {
    let list: Vec<serde_json::Value> = errs
        .iter()
        .map(|e| serde_json::json!({ "path": e.path, "message": e.message }))
        .collect();
    serde_json::Value::Array(list).to_string()
}

const POLICY: &str = "ERR_RETRYWISE_POLICY";

pub(crate) fn policy_error(env: &Env, errs: &PolicyErrors) -> Error {
    throw(env, POLICY, &policy_json(&errs.0))
}

const RELEASED: (&str, &str) = ("ERR_RETRYWISE_RELEASED", "this call was released");

pub(crate) fn status_message(status: f64) -> String {
    format!("outcome.status must be an HTTP status (100-999), got {status}")
}

/// Why a step could not run: thrown into JS by the caller.
pub(crate) enum Fail {
    Type(String),
    Coded(&'static str, String),
}

impl Fail {
    pub(crate) fn released() -> Fail {
        Fail::Coded(RELEASED.0, RELEASED.1.to_string())
    }

    /// A call the policy refuses (`Engine::try_begin`: a route it does not
    /// know), thrown as the policy errors are.
    pub(crate) fn policy(e: PolicyError) -> Fail {
        Fail::Coded(POLICY, policy_json(std::slice::from_ref(&e)))
    }

    pub(crate) fn into_error(self, env: &Env) -> Error {
        match self {
            Fail::Type(m) => throw_type(env, &m),
            Fail::Coded(c, m) => throw(env, c, &m),
        }
    }
}
