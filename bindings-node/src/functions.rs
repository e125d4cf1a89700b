//! The module-level functions of the native module: stateless helpers over
//! the core that need no engine (the vocabulary and scratch layout, timer
//! errors, the process clock, params digests, idempotency keys, vendor codes,
//! JSON media types, the policy schema and check).

use crate::clock::rt_now_ms;
use crate::convert::load_policy;
use crate::errors::{guard, throw_type};
use crate::scratch;
use napi::bindgen_prelude::*;
use napi_derive::napi;
use retrywise::idempotency::{derive_key, params_digest as core_params_digest};
use retrywise::{
    Action, ApiFamily, Continuation, EffectState, ErrorClass, ErrorKind, Idempotency, Phase, Policy, Reason, Timer,
    WaitSource,
};

/// Stable names of every vocabulary enum, indexed by code, plus the scratch
/// layout (`scratch`: length, slots by group and name, result codes, flag
/// bits; see the `scratch` module), as JSON (read once when the module loads).
#[napi]
pub fn vocab() -> String {
    serde_json::json!({
        "version": retrywise::VERSION,
        "errorClass": ErrorClass::NAMES,
        "phase": Phase::NAMES,
        "errorKind": ErrorKind::NAMES,
        "idempotency": Idempotency::NAMES,
        "effect": EffectState::NAMES,
        "action": Action::NAMES,
        "waitSource": WaitSource::NAMES,
        "reason": Reason::NAMES,
        "continuation": Continuation::NAMES,
        "apiFamily": ApiFamily::NAMES,
        "onFailure": ["fail", "manual_review"],
        "scratchLen": scratch::LEN,
        "scratch": scratch::vocab_json(),
    })
    .to_string()
}

/// The text of a finished call's id from the two numbers its last step left
/// in scratch (`finished.ID_HI`, `finished.ID_LO`): printed only when asked.
#[napi]
pub fn request_id_text(env: Env, hi: f64, lo: f64) -> Result<String> {
    crate::finished::id_text(hi, lo)
        .ok_or_else(|| throw_type(&env, &format!("({hi}, {lo}) are not the numbers of a request id")))
}

/// The error kind an expired attempt timer means (`Attempt::timer_error`,
/// one mapping for every binding): `timer` is `connect`, `first_byte`,
/// `first_token`, `idle` or `total`; `totalMs` / `remainingMs` are the attempt's; `bodyStarted`:
/// the response's headers had arrived.
#[napi]
pub fn timer_error(
    env: Env,
    timer: String,
    total_ms: f64,
    remaining_ms: f64,
    body_started: bool,
) -> Result<&'static str> {
    let t = match timer.as_str() {
        "connect" => Timer::Connect,
        "first_byte" => Timer::FirstByte,
        "first_token" => Timer::FirstToken,
        "idle" => Timer::Idle,
        "total" => Timer::Total,
        _ => {
            return Err(throw_type(
                &env,
                &format!("timer must be connect, first_byte, first_token, idle or total, got {timer}"),
            ))
        }
    };
    let ms = |v: f64| if v.is_finite() && v > 0.0 { v as u64 } else { 0 };
    Ok(retrywise::rules::deadline::timer_error(t, ms(total_ms), ms(remaining_ms), body_started).as_str())
}

/// Milliseconds on the process-wide monotonic clock that stamps attempts
/// admitted by the fast entry points (the `attempt.STAMP` slot); real time even for engines
/// on a manual clock.
#[napi]
pub fn now_ms() -> f64 {
    rt_now_ms()
}

/// SHA-256 (hex) of the canonical JSON of `paramsJson` (object keys sorted).
#[napi]
pub fn params_digest(env: Env, params_json: String) -> Result<String> {
    guard(&env, || {
        let v: serde_json::Value =
            serde_json::from_str(&params_json).map_err(|e| throw_type(&env, &format!("params: {e}")))?;
        Ok(core_params_digest(&v))
    })
}

/// Whether a `content-type` names JSON (`application/json`, `+json`): the
/// success bodies a report's `body` is checked against.
#[napi]
pub fn json_media_type(content_type: String) -> bool {
    retrywise::json_media_type(&content_type)
}

/// `rw1_` + 32 hex digits of SHA-256(tenant ␀ operation ␀ digest).
#[napi]
pub fn derive_idempotency_key(tenant: String, operation: String, digest: String) -> String {
    derive_key(&tenant, &operation, &digest)
}

/// Vendor error code of an OpenAI- or Anthropic-style error body.
#[napi]
pub fn vendor_code_from_body(body: Uint8Array) -> Option<String> {
    retrywise::vendor_code_from_body(&body)
}

/// The JSON Schema of the policy document.
#[napi]
pub fn policy_schema() -> String {
    Policy::json_schema().to_string()
}

/// Validates a policy without building an engine; throws like the constructor.
#[napi]
pub fn check_policy(env: Env, kind: u32, policy: Option<String>) -> Result<String> {
    guard(&env, || {
        let p = load_policy(&env, kind, policy)?;
        Ok(serde_json::to_string(&p).unwrap_or_default())
    })
}

/// `{ swap(value), get() }` over V8's continuation-preserved embedder data
/// (see the `continuation` module), or `null` when the host does not export
/// V8's functions for it. Read once by `lib/context.js`.
#[napi(ts_return_type = "{ swap(value: unknown): unknown; get(): unknown } | null")]
pub fn continuation_carrier(env: Env) -> Result<Option<Object<'static>>> {
    guard(&env, || crate::continuation::carrier(&env))
}
