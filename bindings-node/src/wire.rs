//! The core's wire helpers for the JS fetch wrapper: how to reach an
//! upstream, and the request for it (`retrywise::wire`). Translation only.

use crate::throw;
use napi::bindgen_prelude::*;
use napi_derive::napi;
use retrywise::wire::{Reach, WireRequest};

/// A request as `fetch` would send it: headers as a flat `[name, value, ...]` list.
#[napi(object, js_name = "WireRequest")]
pub struct Request {
    pub method: String,
    pub url: String,
    pub headers: Vec<String>,
    pub body: Uint8Array,
}

pub(crate) fn reach_json(r: &Reach) -> serde_json::Value {
    serde_json::json!({
        "upstream": r.upstream,
        "baseUrl": r.base_url,
        "api": r.api.map(|a| a.as_str()),
        "model": r.model,
        "apiKeyEnv": r.api_key_env,
        "apiVersion": r.api_version,
        "prefill": r.prefill,
    })
}

/// `req` rewritten for `reach`; `None` when the reach changes nothing. A
/// failure (an unset key variable, a URL that names no endpoint) throws
/// `ERR_RETRYWISE_WIRE` with the core's code in the message.
pub(crate) fn rewrite(env: &Env, reach: &Reach, req: Request) -> Result<Option<Request>> {
    if !reach.rewrites() {
        return Ok(None);
    }
    let mut headers = Vec::with_capacity(req.headers.len() / 2);
    let mut it = req.headers.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        headers.push((k, v));
    }
    let wr = WireRequest {
        method: req.method,
        url: req.url,
        headers,
        body: req.body.to_vec(),
    };
    let env_var = |name: &str| std::env::var(name).ok();
    match retrywise::wire::rewrite(&wr, reach, &env_var) {
        Ok(out) => Ok(Some(Request {
            method: out.method,
            url: out.url,
            headers: out.headers.into_iter().flat_map(|(k, v)| [k, v]).collect(),
            body: Uint8Array::new(out.body),
        })),
        Err(e) => Err(throw(env, "ERR_RETRYWISE_WIRE", &format!("{}: {e}", e.code()))),
    }
}
