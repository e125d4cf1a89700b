//! The core's wire helpers for the JS fetch wrapper: how to reach an
//! upstream, and the request for it (`retrywise::wire`). Translation only.

use crate::errors::{guard, throw, throw_type};
use napi::bindgen_prelude::*;
use napi_derive::napi;
use retrywise::wire::{Reach, WireRequest};
use retrywise::{ApiFamily, Continuation};

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

/// What a rewrite changes in a request the JS side already holds
/// (`rewriteEdits`): the new URL, the new body (null: unchanged), the header
/// names to delete and the headers to set (flat `[name, value, ...]`), so
/// the headers cross once as one string and come back as their difference.
#[napi(object)]
pub struct WireEdit {
    pub url: String,
    pub body: Option<Uint8Array>,
    pub drop: Vec<String>,
    pub set: Vec<String>,
}

/// `headers` (names and values in turn, each followed by a line feed, as a
/// `Headers` gives them: a header value holds no line break) rewritten for `reach` (`wire::rewrite`), as the edits
/// that turn the request into the rewritten one; `None` when the reach
/// changes nothing. Failures throw as `rewrite`'s.
pub(crate) fn rewrite_edits(
    env: &Env,
    reach: &Reach,
    method: String,
    url: String,
    headers: &str,
    body: &[u8],
) -> Result<Option<WireEdit>> {
    if !reach.rewrites() {
        return Ok(None);
    }
    let mut pairs = Vec::new();
    let mut it = headers.split('\n');
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        pairs.push((k.to_string(), v.to_string()));
    }
    let wr = WireRequest {
        method,
        url,
        headers: pairs,
        body: body.to_vec(),
    };
    let env_var = |name: &str| std::env::var(name).ok();
    let out = retrywise::wire::rewrite(&wr, reach, &env_var)
        .map_err(|e| throw(env, "ERR_RETRYWISE_WIRE", &format!("{}: {e}", e.code())))?;
    let drop = wr
        .headers
        .iter()
        .filter(|(k, _)| !out.headers.iter().any(|(o, _)| o.eq_ignore_ascii_case(k)))
        .map(|(k, _)| k.clone())
        .collect();
    let set = out
        .headers
        .iter()
        .filter(|(k, v)| !wr.headers.iter().any(|(i, w)| i.eq_ignore_ascii_case(k) && w == v))
        .flat_map(|(k, v)| [k.clone(), v.clone()])
        .collect();
    Ok(Some(WireEdit {
        url: out.url,
        body: (out.body != wr.body).then(|| Uint8Array::new(out.body)),
        drop,
        set,
    }))
}

fn family(env: &Env, api: &str) -> Result<ApiFamily> {
    api.parse::<ApiFamily>().map_err(|e| throw_type(env, &e.to_string()))
}

/// The API family a request speaks, from its URL and headers (`ApiFamily::of_request`).
#[napi]
pub fn api_family_of(url: String, headers: Vec<String>) -> &'static str {
    let mut pairs = Vec::with_capacity(headers.len() / 2);
    let mut it = headers.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        pairs.push((k, v));
    }
    ApiFamily::of_request(&url, &pairs).as_str()
}

/// What a request an SDK built says about itself, read once
/// (`retrywise::wire::RequestFacts`): its wire family, endpoint and model,
/// and what any upstream serving it needs. `beginEx` takes it by reference
/// (its needs under the caller's), so a wrapped fetch reads each request's
/// body once and passes nothing back as JSON.
#[napi]
pub struct RequestFacts {
    inner: retrywise::wire::RequestFacts,
}

impl RequestFacts {
    /// The needs read from the request (the base a call's own needs go over).
    pub(crate) fn needs_ref(&self) -> &retrywise::Needs {
        &self.inner.needs
    }
}

#[napi]
impl RequestFacts {
    /// `openai`, `anthropic` or `azure_openai` (`ApiFamily::of_request`).
    #[napi(getter, ts_return_type = "'openai' | 'anthropic' | 'azure_openai'")]
    pub fn family(&self) -> &'static str {
        self.inner.family.as_str()
    }

    /// `chat_completions`, `responses`, `completions`, `embeddings`,
    /// `messages`, or null when the path names none.
    #[napi(getter)]
    pub fn endpoint(&self) -> Option<&'static str> {
        self.inner.endpoint.map(|e| e.as_str())
    }

    /// The body's `model`, or null.
    #[napi(getter)]
    pub fn model(&self) -> Option<String> {
        self.inner.model.clone()
    }

    /// What any upstream serving the request needs (absent fields null).
    #[napi(getter)]
    pub fn needs(&self) -> RequestNeeds {
        let n = &self.inner.needs;
        RequestNeeds {
            capabilities: n.capabilities.clone(),
            api: n.api.map(|a| a.as_str().to_string()),
            input_tokens: n.input_tokens.map(|t| t as f64),
            max_output_tokens: n.max_output_tokens.map(|t| t as f64),
            data_boundary: n.data_boundary.clone(),
            max_cost: n.max_cost,
        }
    }
}

/// A request's needs (`retrywise::Needs`), in the binding's camelCase.
#[napi(object)]
pub struct RequestNeeds {
    pub capabilities: Vec<String>,
    pub api: Option<String>,
    pub input_tokens: Option<f64>,
    pub max_output_tokens: Option<f64>,
    pub data_boundary: Option<String>,
    pub max_cost: Option<f64>,
}

/// Reads a request (`RequestFacts::read_with`): `headerNames` is the names
/// of its headers joined by `\n` (one string crosses, however many there
/// are: only their presence is read), `body` its bytes (none: empty).
#[napi]
pub fn read_request(
    env: Env,
    url: String,
    header_names: Option<String>,
    body: Option<Uint8Array>,
) -> Result<RequestFacts> {
    guard(&env, || {
        Ok(RequestFacts {
            inner: read_facts(&url, header_names.as_deref(), body.as_deref()),
        })
    })
}

/// A request's facts from its URL, its header names joined by `\n` and its body.
pub(crate) fn read_facts(url: &str, header_names: Option<&str>, body: Option<&[u8]>) -> retrywise::wire::RequestFacts {
    let names = header_names.unwrap_or_default();
    let has = |name: &str| names.split('\n').any(|k| k.trim().eq_ignore_ascii_case(name));
    retrywise::wire::RequestFacts::read_with(url, &has, body.unwrap_or(&[]))
}

/// What a streamed answer delivered so far (`retrywise::wire::Transcript`),
/// fed with exactly the bytes the caller received.
#[napi]
pub struct Transcript {
    inner: retrywise::wire::Transcript,
}

impl Transcript {
    /// The core's transcript (for the stream gate's end outcome).
    pub(crate) fn core(&self) -> &retrywise::wire::Transcript {
        &self.inner
    }

    /// Reads bytes the caller received (the stream gate's `relay`).
    pub(crate) fn observe_bytes(&mut self, delivered: &[u8]) {
        self.inner.observe(delivered);
    }
}

#[napi]
impl Transcript {
    /// A transcript of a stream in `api` (`openai`, `anthropic`, `azure_openai`).
    #[napi(constructor)]
    pub fn new(env: Env, api: String) -> Result<Self> {
        Ok(Transcript {
            inner: retrywise::wire::Transcript::new(family(&env, &api)?),
        })
    }

    /// Bytes the caller received.
    #[napi]
    pub fn observe(&mut self, delivered: Uint8ArraySlice) {
        self.inner.observe(&delivered);
    }

    /// The visible text so far.
    #[napi(getter)]
    pub fn text(&self) -> String {
        self.inner.text().to_string()
    }

    /// Text only (no tool-call delta) and not finished: another upstream may continue it.
    #[napi(getter)]
    pub fn resumable(&self) -> bool {
        self.inner.resumable()
    }

    /// Its finish (finish_reason, message_stop, response.completed) was seen.
    #[napi(getter)]
    pub fn finished(&self) -> bool {
        self.inner.finished()
    }

    /// The family given at creation.
    #[napi(getter)]
    pub fn api(&self) -> &'static str {
        self.inner.api().as_str()
    }

    /// The usage the stream reported, or null.
    #[napi(getter)]
    pub fn usage(&self) -> Option<TranscriptUsage> {
        self.inner.usage().map(|u| TranscriptUsage {
            input_tokens: u.input_tokens.map(|n| n as f64),
            output_tokens: u.output_tokens.map(|n| n as f64),
        })
    }

    /// The model the stream named last, or null.
    #[napi(getter)]
    pub fn model(&self) -> Option<String> {
        self.inner.model().map(str::to_string)
    }
}

/// Token counts a stream reported (either may be missing).
#[napi(object)]
pub struct TranscriptUsage {
    pub input_tokens: Option<f64>,
    pub output_tokens: Option<f64>,
}

/// The body of the continuation request (`retrywise::wire::continuation_body`):
/// the original conversation plus the delivered text as a prefill or an
/// instruction (`how`). Throws `ERR_RETRYWISE_WIRE` when it cannot be built.
#[napi]
pub fn continuation_body(
    env: Env,
    api: String,
    original: Uint8Array,
    transcript: &Transcript,
    how: String,
) -> Result<Uint8Array> {
    let how = how
        .parse::<Continuation>()
        .map_err(|e| throw_type(&env, &e.to_string()))?;
    retrywise::wire::continuation_body(family(&env, &api)?, &original, &transcript.inner, how)
        .map(Uint8Array::new)
        .map_err(|e| throw(&env, "ERR_RETRYWISE_WIRE", &format!("{}: {e}", e.code())))
}

/// Turns a fallback's stream into the rest of the caller's (`retrywise::wire::Splicer`):
/// its opening dropped, restated text dropped once, block indexes continued.
#[napi]
pub struct Splicer {
    inner: retrywise::wire::Splicer,
}

#[napi]
impl Splicer {
    /// A splicer continuing what `transcript` delivered, in `api`.
    #[napi(constructor)]
    pub fn new(env: Env, api: String, transcript: &Transcript) -> Result<Self> {
        Ok(Splicer {
            inner: retrywise::wire::Splicer::new(family(&env, &api)?, &transcript.inner),
        })
    }

    /// The fallback's bytes in; the bytes for the caller's stream out.
    #[napi]
    pub fn feed(&mut self, chunk: Uint8Array) -> Uint8Array {
        Uint8Array::new(self.inner.feed(&chunk))
    }

    /// The fallback's stream ended: what is still held.
    #[napi]
    pub fn finish(&mut self) -> Uint8Array {
        Uint8Array::new(self.inner.finish())
    }
}
