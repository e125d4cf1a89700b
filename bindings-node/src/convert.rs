//! Conversions between what the JS layer passes (numbers, codes, flat lists,
//! JSON and policy text) and the core's values: milliseconds, vocabulary
//! codes, a call's deadline and idempotency, an HTTP status, inbound headers,
//! a reported outcome, a policy argument. Nothing here decides anything.

use crate::errors::{policy_error, status_message, throw_type, Fail};
use napi::bindgen_prelude::*;
use retrywise::{EffectState, ErrorClass, ErrorKind, Headers, Idempotency, Needs, OnFailure, Outcome, Phase, Policy};
use std::time::Duration;

/// Milliseconds with their fraction, as the timers compare them.
#[inline]
pub(crate) fn ms_exact(d: Duration) -> f64 {
    d.as_secs() as f64 * 1000.0 + d.subsec_nanos() as f64 * 1e-6
}

pub(crate) fn class_code(c: Option<ErrorClass>) -> f64 {
    c.map_or(-1.0, |c| c.code() as f64)
}

pub(crate) fn on_failure_code(o: Option<OnFailure>) -> f64 {
    match o {
        None => -1.0,
        Some(OnFailure::Fail) => 0.0,
        Some(OnFailure::ManualReview) => 1.0,
    }
}

/// Whole milliseconds (truncated, as `Duration::as_millis`) as an f64, without
/// the u128 → f64 conversion `as_millis() as f64` costs.
#[inline]
pub(crate) fn ms_f64(d: Duration) -> f64 {
    let s = d.as_secs();
    if s < (1 << 40) {
        (s * 1000 + d.subsec_millis() as u64) as f64
    } else {
        d.as_millis() as f64
    }
}

pub(crate) fn deadline(ms: f64) -> Option<Duration> {
    (ms >= 0.0).then(|| Duration::from_micros((ms * 1000.0) as u64))
}

pub(crate) fn idempotency_of(code: f64) -> std::result::Result<Idempotency, Fail> {
    if (0.0..256.0).contains(&code) {
        if let Some(i) = Idempotency::from_code(code as u8) {
            return Ok(i);
        }
    }
    Err(Fail::Type("bad idempotency code".to_string()))
}

pub(crate) fn http_status(status: f64) -> std::result::Result<u16, Fail> {
    if (100.0..=999.0).contains(&status) && (status as u16) as f64 == status {
        Ok(status as u16)
    } else {
        Err(Fail::Type(status_message(status)))
    }
}

pub(crate) fn pairs_to_headers(h: &[serde_json::Value]) -> Headers {
    let mut out = Headers::new();
    for p in h {
        if let Some(a) = p.as_array() {
            if let (Some(k), Some(v)) = (a.first().and_then(|v| v.as_str()), a.get(1).and_then(|v| v.as_str())) {
                out.insert(k, v);
            }
        }
    }
    out
}

/// A `needs` object as the JS layer passes it (camelCase: `capabilities`,
/// `api`, `inputTokens`, `maxOutputTokens`, `dataBoundary`, `maxCost`);
/// `path` names it in a TypeError.
pub(crate) fn needs_of(env: &Env, n: &serde_json::Value, path: &str) -> Result<Needs> {
    let u = |k: &str| n.get(k).and_then(|v| v.as_f64()).map(|f| f.max(0.0) as u64);
    Ok(Needs {
        capabilities: n
            .get("capabilities")
            .and_then(|c| c.as_array())
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default(),
        api: match n.get("api").filter(|v| !v.is_null()) {
            Some(v) => Some(v.as_str().and_then(|a| a.parse().ok()).ok_or_else(|| {
                throw_type(
                    env,
                    &format!("{path}.api: expected openai, anthropic or azure_openai; got {v}"),
                )
            })?),
            None => None,
        },
        input_tokens: u("inputTokens"),
        max_output_tokens: u("maxOutputTokens"),
        data_boundary: n.get("dataBoundary").and_then(|v| v.as_str()).map(str::to_string),
        max_cost: n.get("maxCost").and_then(|v| v.as_f64()),
    })
}

/// A call's needs: `read` (what its request says, `readRequest`) with each of
/// `given`'s layers laid over the one before (`Needs::merged`): an object, or
/// a list of them (a wrapped fetch's own needs, then the request's
/// `init.retrywise.needs`). `None` when there is neither.
pub(crate) fn call_needs(env: &Env, read: Option<Needs>, given: Option<&serde_json::Value>) -> Result<Option<Needs>> {
    let layers: &[serde_json::Value] = match given {
        Some(serde_json::Value::Array(a)) => a,
        Some(v) if v.is_object() => std::slice::from_ref(v),
        _ => &[],
    };
    let mut needs = read;
    for (i, l) in layers.iter().enumerate() {
        if !l.is_object() {
            continue;
        }
        let path = if layers.len() > 1 {
            format!("spec.needs[{i}]")
        } else {
            "spec.needs".to_string()
        };
        let n = needs_of(env, l, &path)?;
        needs = Some(match needs {
            Some(under) => under.merged(&n),
            None => n,
        });
    }
    Ok(needs)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn outcome(
    env: &Env,
    status: f64,
    error: i32,
    phase: i32,
    effect: i32,
    vendor_code: Option<String>,
    headers: Option<Vec<String>>,
    input_tokens: f64,
    body: Option<Uint8Array>,
    ok: bool,
) -> Result<Outcome> {
    let mut o = Outcome::default();
    if status >= 0.0 {
        if !(100.0..=999.0).contains(&status) {
            return Err(throw_type(env, &status_message(status)));
        }
        o.status = Some(status as u16);
    }
    if error >= 0 {
        o.error = Some(ErrorKind::from_code(error as u8).ok_or_else(|| throw_type(env, "bad error code"))?);
    }
    if phase >= 0 {
        o.phase = Some(Phase::from_code(phase as u8).ok_or_else(|| throw_type(env, "bad phase code"))?);
    }
    if effect >= 0 {
        o.effect = Some(EffectState::from_code(effect as u8).ok_or_else(|| throw_type(env, "bad effect code"))?);
    }
    if let Some(h) = headers {
        let mut it = h.iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            o.headers.insert(k, v);
        }
    }
    o.vendor_code = vendor_code;
    if let Some(b) = body {
        // The bytes as received: a JSON body that is not UTF-8 is malformed,
        // as in every binding.
        o.read_body(&b);
    }
    if input_tokens >= 0.0 {
        o.input_tokens = Some(input_tokens as u64);
    }
    o.ok = ok;
    Ok(o)
}

/// `kind` values for the constructor's `policy` argument.
const POLICY_NONE: u32 = 0;
const POLICY_JSON: u32 = 1;
const POLICY_TEXT: u32 = 2;
const POLICY_FILE: u32 = 3;

pub(crate) fn load_policy(env: &Env, kind: u32, text: Option<String>) -> Result<Policy> {
    let text = text.unwrap_or_default();
    let r = match kind {
        POLICY_NONE => Ok(Policy::default()),
        // A JS object arrives as JSON text: parsing text (rather than a serde
        // Value) lets the core name the field of an unknown-field error.
        POLICY_JSON => Policy::parse(&text, retrywise::Format::Json),
        POLICY_TEXT => Policy::from_str_any(&text),
        POLICY_FILE => Policy::from_file(std::path::Path::new(&text)),
        _ => return Err(throw_type(env, "policy kind must be 0..3")),
    };
    r.map_err(|e| policy_error(env, &e))
}
