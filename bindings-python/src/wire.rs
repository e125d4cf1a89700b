//! The core's wire helpers and stream gate for Python (`retrywise.wire`,
//! `retrywise.StreamGate`): what a request needs (`read_request`), how to
//! reach an upstream, a request rewritten for it, what a stream delivered, the
//! body that continues it and the splice of the continuation's stream.
//! Translation only: every rule is the core's.

use crate::convert::{body_bytes, body_view, name_arg, parse_name, req_str, type_name};
use crate::errors::{err_class, guarded, held};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyType};
use retrywise::wire::{self, Reach, RequestFacts, WireError, WireRequest};
use retrywise::{ApiFamily, Continuation, MalformedEvent, Needs};
use std::cell::RefCell;

static WIRE_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// `retrywise.WireError(message, code=...)`.
fn wire_error(py: Python<'_>, e: &WireError) -> PyErr {
    let build = || -> PyResult<Bound<'_, PyAny>> {
        let kw = PyDict::new(py);
        kw.set_item("code", e.code())?;
        err_class(py, &WIRE_ERROR, "WireError")?.call((e.to_string(),), Some(&kw))
    };
    match build() {
        Ok(e) => PyErr::from_value(e),
        Err(e) => e,
    }
}

fn api_arg(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<ApiFamily> {
    parse_name(name, &req_str(name, obj)?)
}

/// Headers as `(name, value)` pairs in order, from a mapping (`httpx.Headers`:
/// every value of a repeated header) or pairs.
fn header_pairs(obj: &Bound<'_, PyAny>) -> PyResult<Vec<(String, String)>> {
    let py = obj.py();
    let pairs = if obj.hasattr(pyo3::intern!(py, "multi_items"))? {
        obj.call_method0(pyo3::intern!(py, "multi_items"))?
    } else if obj.hasattr(pyo3::intern!(py, "items"))? {
        obj.call_method0(pyo3::intern!(py, "items"))?
    } else {
        obj.clone()
    };
    let mut out = Vec::new();
    for item in pairs.try_iter()? {
        let (k, v): (String, String) = item?.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "argument 'headers': expected str (name, value) pairs, got {}",
                type_name(obj)
            ))
        })?;
        out.push((k, v));
    }
    Ok(out)
}

// ----------------------------------------------------------------- reach --

/// How to reach one upstream, from the policy catalog (`engine.reach(name)`).
#[pyclass(module = "retrywise._retrywise", name = "Reach", frozen)]
pub struct PyReach {
    pub(crate) reach: Reach,
}

#[pymethods]
impl PyReach {
    /// The upstream's name in the catalog.
    #[getter]
    fn upstream(&self) -> &str {
        &self.reach.upstream
    }
    /// Where its API lives (`https://api.openai.com/v1`); None keeps the caller's URL.
    #[getter]
    fn base_url(&self) -> Option<&str> {
        self.reach.base_url.as_deref()
    }
    /// "openai" | "anthropic" | "azure_openai"; None: the request's own family.
    #[getter]
    fn api(&self) -> Option<&'static str> {
        self.reach.api.map(ApiFamily::as_str)
    }
    /// The `model` to send (`request_model`, else `model`).
    #[getter]
    fn model(&self) -> Option<&str> {
        self.reach.model.as_deref()
    }
    /// The NAME of the environment variable holding its key.
    #[getter]
    fn api_key_env(&self) -> Option<&str> {
        self.reach.api_key_env.as_deref()
    }
    /// Azure OpenAI's `api-version`.
    #[getter]
    fn api_version(&self) -> Option<&str> {
        self.reach.api_version.as_deref()
    }
    /// It accepts an assistant message last (declares `assistant_prefill`).
    #[getter]
    fn prefill(&self) -> bool {
        self.reach.prefill
    }
    /// Whether a request for it is rewritten at all (a base URL, model, key or family of its own).
    #[getter]
    fn rewrites(&self) -> bool {
        self.reach.rewrites()
    }
    /// The key, read now from `os.environ[api_key_env]`; None when it names
    /// no variable or the variable is unset or empty.
    #[getter]
    fn api_key(&self, py: Python<'_>) -> PyResult<Option<String>> {
        match &self.reach.api_key_env {
            None => Ok(None),
            Some(var) => Ok(env_lookup(&environ(py)?, var)?.filter(|k| !k.is_empty())),
        }
    }
    fn __repr__(&self) -> String {
        format!(
            "<retrywise.Reach upstream={:?} base_url={:?} model={:?} api={:?} api_key_env={:?}>",
            self.reach.upstream,
            self.reach.base_url,
            self.reach.model,
            self.reach.api.map(ApiFamily::as_str),
            self.reach.api_key_env
        )
    }
}

fn environ(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    py.import("os")?.getattr("environ")
}

fn env_lookup(env: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<String>> {
    let v = env.call_method1(pyo3::intern!(env.py(), "get"), (name,))?;
    if v.is_none() {
        Ok(None)
    } else {
        Ok(Some(v.extract::<String>()?))
    }
}

// --------------------------------------------------------------- rewrite --

/// A request as an SDK built it, or as `rewrite` made it.
#[pyclass(module = "retrywise._retrywise", name = "WireRequest", frozen)]
pub struct PyWireRequest {
    req: WireRequest,
}

#[pymethods]
impl PyWireRequest {
    #[getter]
    fn method(&self) -> &str {
        &self.req.method
    }
    #[getter]
    fn url(&self) -> &str {
        &self.req.url
    }
    /// Headers in order, `[(name, value), ...]`.
    #[getter]
    fn headers(&self) -> Vec<(String, String)> {
        self.req.headers.clone()
    }
    #[getter]
    fn body<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.req.body)
    }
    /// Credentials redacted.
    fn __repr__(&self) -> String {
        format!("{:?}", self.req)
    }
}

/// The request for `reach`: URL (its base URL + the endpoint tail), the body's
/// `model`, the family's auth header from the variable `api_key_env` names,
/// read through `env` (default `os.environ`). The caller's credentials never
/// go to another origin. Raises `retrywise.WireError`.
#[pyfunction]
#[pyo3(signature = (reach, method, url, headers, body, *, env=None))]
pub fn rewrite(
    py: Python<'_>,
    reach: &Bound<'_, PyReach>,
    method: &Bound<'_, PyAny>,
    url: &Bound<'_, PyAny>,
    headers: &Bound<'_, PyAny>,
    body: &Bound<'_, PyAny>,
    env: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyWireRequest> {
    let req = WireRequest {
        method: req_str("method", method)?,
        url: req_str("url", url)?,
        headers: header_pairs(headers)?,
        body: body_bytes(body)?,
    };
    let env = match env.filter(|e| !e.is_none()) {
        Some(e) => e.clone(),
        None => environ(py)?,
    };
    // The lookup runs Python (a mapping's `get`); an error in it is kept and raised.
    let mut failed: Option<PyErr> = None;
    let lookup = |name: &str| match env_lookup(&env, name) {
        Ok(v) => v,
        Err(e) => {
            failed.get_or_insert(e);
            None
        }
    };
    let reach = &reach.get().reach;
    let out = {
        let lookup = std::cell::RefCell::new(lookup);
        held(py, || wire::rewrite(&req, reach, &|n| (lookup.borrow_mut())(n)))?
    };
    if let Some(e) = failed {
        return Err(e);
    }
    out.map(|req| PyWireRequest { req }).map_err(|e| wire_error(py, &e))
}

/// The family a request was built for, from its URL and headers:
/// "openai" | "anthropic" | "azure_openai".
#[pyfunction]
pub fn api_family(url: &Bound<'_, PyAny>, headers: &Bound<'_, PyAny>) -> PyResult<&'static str> {
    Ok(ApiFamily::of_request(&req_str("url", url)?, &header_pairs(headers)?).as_str())
}

// --------------------------------------------------------------- request --

/// Bodies at least this long are read with the GIL released: parsing one
/// (base64 images, long contexts) takes longer than letting the GIL go.
const DETACH_BODY_BYTES: usize = 64 * 1024;

/// What a request an SDK built says about itself (`retrywise.read_request`):
/// its wire family, endpoint, model and what any upstream serving it needs.
#[pyclass(module = "retrywise._retrywise", name = "RequestFacts", frozen)]
pub struct PyRequestFacts {
    pub(crate) facts: RequestFacts,
}

#[pymethods]
impl PyRequestFacts {
    /// "openai" | "anthropic" | "azure_openai": the family it was built for.
    #[getter]
    fn family(&self) -> &'static str {
        self.facts.family.as_str()
    }
    /// "chat_completions" | "responses" | "completions" | "embeddings" | "messages", or None.
    #[getter]
    fn endpoint(&self) -> Option<&'static str> {
        self.facts.endpoint.map(|e| e.as_str())
    }
    /// The body's `model`, when it names one.
    #[getter]
    fn model(&self) -> Option<&str> {
        self.facts.model.as_deref()
    }
    /// What any upstream serving it must offer, as `begin(needs=...)` takes it:
    /// `capabilities` and `api` always, the token counts when read.
    #[getter]
    fn needs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        needs_dict(py, &self.facts.needs)
    }
    fn __repr__(&self) -> String {
        let f = &self.facts;
        let opt = |v: Option<u64>| v.map_or_else(|| "None".to_string(), |n| n.to_string());
        format!(
            "<retrywise.RequestFacts family={} endpoint={} model={} capabilities={:?} input_tokens={} max_output_tokens={}>",
            f.family.as_str(),
            f.endpoint.map_or("None", |e| e.as_str()),
            f.model.as_deref().map_or_else(|| "None".to_string(), |m| format!("{m:?}")),
            f.needs.capabilities,
            opt(f.needs.input_tokens),
            opt(f.needs.max_output_tokens),
        )
    }
}

/// Needs as a dict of the keys `begin(needs=...)` takes; unset ones are left out.
fn needs_dict<'py>(py: Python<'py>, n: &Needs) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("capabilities", &n.capabilities)?;
    if let Some(a) = n.api {
        d.set_item("api", a.as_str())?;
    }
    if let Some(t) = n.input_tokens {
        d.set_item("input_tokens", t)?;
    }
    if let Some(t) = n.max_output_tokens {
        d.set_item("max_output_tokens", t)?;
    }
    if let Some(b) = &n.data_boundary {
        d.set_item("data_boundary", b)?;
    }
    if let Some(c) = n.max_cost {
        d.set_item("max_cost", c)?;
    }
    Ok(d)
}

/// Whether a header name (str, or bytes as httpx keeps them) is `name`, in any case.
fn name_matches(key: &Bound<'_, PyAny>, name: &str) -> bool {
    if let Ok(s) = key.cast::<PyString>() {
        return s.to_str().is_ok_and(|k| k.eq_ignore_ascii_case(name));
    }
    if let Ok(b) = key.cast::<PyBytes>() {
        return b.as_bytes().eq_ignore_ascii_case(name.as_bytes());
    }
    false
}

/// Whether `headers` carries a header `name` (any case), asked without copying
/// them: an `httpx` / `httpx2` `Headers` answers `in` itself (case-insensitive);
/// a dict's keys and a list's pairs are walked in place; another mapping's keys
/// are iterated. `None` carries none.
fn has_header(headers: &Bound<'_, PyAny>, name: &str) -> PyResult<bool> {
    let py = headers.py();
    if headers.is_none() {
        return Ok(false);
    }
    if let Ok(d) = headers.cast::<PyDict>() {
        return Ok(d.iter().any(|(k, _)| name_matches(&k, name)));
    }
    if headers.hasattr(pyo3::intern!(py, "multi_items"))? {
        return headers.contains(name);
    }
    if let Ok(l) = headers.cast::<PyList>() {
        for item in l.iter() {
            if name_matches(&pair_name(&item)?, name) {
                return Ok(true);
            }
        }
        return Ok(false);
    }
    if headers.is_instance_of::<PyString>() || headers.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err(format!(
            "argument 'headers': expected a mapping or (name, value) pairs, got {}",
            type_name(headers)
        )));
    }
    let mapping = headers.hasattr(pyo3::intern!(py, "keys"))?;
    let iter = headers.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "argument 'headers': expected a mapping or (name, value) pairs, got {}",
            type_name(headers)
        ))
    })?;
    for item in iter {
        let item = item?;
        let key = if mapping { item } else { pair_name(&item)? };
        if name_matches(&key, name) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The name of a `(name, value)` pair.
fn pair_name<'py>(item: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    item.get_item(0)
        .map_err(|_| PyTypeError::new_err("argument 'headers': expected (name, value) pairs"))
}

/// Reads a request as an SDK built it, once, the way every binding's transport
/// does (the core's `RequestFacts`): its family from the URL and headers, its
/// endpoint, its `model` and its needs from the body (streaming, tools,
/// structured output, media parts, output and input token counts).
/// `headers`: an `httpx` / `httpx2` `Headers`, a mapping or `(name, value)`
/// pairs (asked by name, never copied); `body`: bytes (or str), read in place.
#[pyfunction]
#[pyo3(signature = (url, headers=None, body=None))]
pub fn read_request(
    py: Python<'_>,
    url: &Bound<'_, PyAny>,
    headers: Option<&Bound<'_, PyAny>>,
    body: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyRequestFacts> {
    let url = url
        .cast::<PyString>()
        .map_err(|_| PyTypeError::new_err(format!("argument 'url': expected str, got {}", type_name(url))))?
        .to_str()?;
    let body = match body.filter(|b| !b.is_none()) {
        Some(b) => body_view(b)?,
        None => std::borrow::Cow::Borrowed(&b""[..]),
    };
    // The header questions run Python (a mapping's `in`); the first error is kept and raised.
    let failed: RefCell<Option<PyErr>> = RefCell::new(None);
    let detach = body.len() >= DETACH_BODY_BYTES;
    let asked: RefCell<Vec<(String, bool)>> = RefCell::new(Vec::new());
    let has = |name: &str| {
        let answer = match headers {
            None => false,
            Some(h) => has_header(h, name).unwrap_or_else(|e| {
                failed.borrow_mut().get_or_insert(e);
                false
            }),
        };
        if detach {
            asked.borrow_mut().push((name.to_owned(), answer));
        }
        answer
    };
    let facts = if !detach {
        held(py, || RequestFacts::read_with(url, &has, &body))?
    } else {
        // The family (the only thing the headers decide) is read first with the
        // GIL; the body is parsed without it, the same questions answered as before.
        held(py, || RequestFacts::read_with(url, &has, b""))?;
        let asked = asked.take();
        let again = |name: &str| asked.iter().any(|(n, a)| *a && n == name);
        let body: &[u8] = &body;
        guarded(py, move || RequestFacts::read_with(url, &again, body))?
    };
    if let Some(e) = failed.into_inner() {
        return Err(e);
    }
    Ok(PyRequestFacts { facts })
}

// ------------------------------------------------------------ transcript --

/// What a streamed answer delivered to the caller so far: feed it exactly the
/// bytes the caller received.
#[pyclass(module = "retrywise._retrywise", name = "Transcript")]
pub struct PyTranscript {
    t: wire::Transcript,
}

#[pymethods]
impl PyTranscript {
    #[new]
    fn new(api: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(PyTranscript {
            t: wire::Transcript::new(api_arg("api", api)?),
        })
    }
    /// Reads bytes the caller received, in any chunking.
    fn observe(&mut self, py: Python<'_>, delivered: &Bound<'_, PyAny>) -> PyResult<()> {
        let t = &mut self.t;
        if let Ok(b) = delivered.cast::<PyBytes>() {
            return held(py, || t.observe(b.as_bytes()));
        }
        let data = body_bytes(delivered)?;
        held(py, || t.observe(&data))
    }
    #[getter]
    fn api(&self) -> &'static str {
        self.t.api().as_str()
    }
    /// The visible text so far.
    #[getter]
    fn text(&self) -> &str {
        self.t.text()
    }
    /// Another upstream can continue it: text only, not finished.
    #[getter]
    fn resumable(&self) -> bool {
        self.t.resumable()
    }
    /// The answer's finish arrived (a finish reason, `message_stop`, `response.completed`).
    #[getter]
    fn finished(&self) -> bool {
        self.t.finished()
    }
    /// `{"input_tokens": n | None, "output_tokens": n | None}` when the stream reported usage.
    #[getter]
    fn usage<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.t
            .usage()
            .map(|u| {
                let d = PyDict::new(py);
                d.set_item("input_tokens", u.input_tokens)?;
                d.set_item("output_tokens", u.output_tokens)?;
                Ok(d)
            })
            .transpose()
    }
    /// The model the stream named last.
    #[getter]
    fn model(&self) -> Option<&str> {
        self.t.model()
    }
    fn __repr__(&self) -> String {
        format!(
            "<retrywise.Transcript api={} chars={} finished={} resumable={}>",
            self.t.api(),
            self.t.text().chars().count(),
            self.t.finished(),
            self.t.resumable()
        )
    }
}

/// The body of the request that asks a fallback to continue what `transcript`
/// delivered, by `how` ("prefill" | "instruction"). Rewrite it for the fallback afterwards.
#[pyfunction]
pub fn continuation_body<'py>(
    py: Python<'py>,
    api: &Bound<'py, PyAny>,
    original_body: &Bound<'py, PyAny>,
    transcript: &Bound<'py, PyTranscript>,
    how: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let api = api_arg("api", api)?;
    let how: Continuation = parse_name("how", &req_str("how", how)?)?;
    let body = body_bytes(original_body)?;
    let t = transcript.borrow();
    let out = held(py, || wire::continuation_body(api, &body, &t.t, how))?;
    out.map(|b| PyBytes::new(py, &b)).map_err(|e| wire_error(py, &e))
}

/// Turns a fallback's stream into the rest of the caller's stream (no second
/// opening, no restated text, indexes that continue). One per continuation attempt.
#[pyclass(module = "retrywise._retrywise", name = "Splicer")]
pub struct PySplicer {
    s: wire::Splicer,
}

#[pymethods]
impl PySplicer {
    #[new]
    fn new(api: &Bound<'_, PyAny>, transcript: &Bound<'_, PyTranscript>) -> PyResult<Self> {
        let api = api_arg("api", api)?;
        Ok(PySplicer {
            s: wire::Splicer::new(api, &transcript.borrow().t),
        })
    }
    /// Bytes of the fallback's stream in; the bytes for the caller now out.
    fn feed<'py>(&mut self, py: Python<'py>, chunk: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let data = body_bytes(chunk)?;
        let s = &mut self.s;
        let out = held(py, || s.feed(&data))?;
        Ok(PyBytes::new(py, &out))
    }
    /// The fallback's stream ended: what is still held.
    fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let s = &mut self.s;
        let out = held(py, || s.finish())?;
        Ok(PyBytes::new(py, &out))
    }
    /// Bytes of the fallback's text dropped as restating the caller's.
    #[getter]
    fn deduplicated(&self) -> usize {
        self.s.deduplicated()
    }
}

// ---------------------------------------------------------------- stream --

/// Holds a streamed body's preamble (role-only deltas, `message_start`, pings)
/// until its first meaningful event, so a cut before it is `stream_open` and
/// may be retried; watches for error events and malformed events to the end.
#[pyclass(module = "retrywise._retrywise", name = "StreamGate")]
pub struct PyStreamGate {
    pub(crate) gate: retrywise::StreamGate,
}

#[pymethods]
impl PyStreamGate {
    /// A gate for a body of `content_type`; only `text/event-stream` is held
    /// back. `malformed_event`: "skip" (default) | "error". `end_at_error`:
    /// an error event after output ends the stream before it (not passed on).
    #[new]
    #[pyo3(signature = (content_type=None, *, malformed_event=None, end_at_error=false))]
    fn new(
        content_type: Option<&Bound<'_, PyAny>>,
        malformed_event: Option<&Bound<'_, PyAny>>,
        end_at_error: bool,
    ) -> PyResult<Self> {
        let ct = match content_type.filter(|c| !c.is_none()) {
            None => None,
            Some(c) => Some(req_str("content_type", c)?),
        };
        let mode: MalformedEvent = name_arg("malformed_event", malformed_event)?.unwrap_or_default();
        let gate = retrywise::StreamGate::new(ct.as_deref()).on_malformed(mode);
        Ok(PyStreamGate {
            gate: if end_at_error { gate.end_at_error() } else { gate },
        })
    }
    /// Bytes received from upstream in; what the consumer may see now out
    /// (empty while only preamble arrived).
    fn feed<'py>(&mut self, py: Python<'py>, chunk: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let gate = &mut self.gate;
        if let Ok(b) = chunk.cast::<PyBytes>() {
            let out = held(py, || gate.feed_pass(b.as_bytes()))?;
            return Ok(out.map_or_else(|| b.clone(), |v| PyBytes::new(py, &v)));
        }
        let data = body_bytes(chunk)
            .map_err(|_| PyTypeError::new_err(format!("argument 'chunk': expected bytes, got {}", type_name(chunk))))?;
        let out = held(py, || gate.feed(&data).into_owned())?;
        Ok(PyBytes::new(py, &out))
    }
    /// The body ended: everything still held, to deliver before the end.
    fn finish<'py>(&mut self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.gate.finish())
    }
    /// Whether bytes were released: a failure from now on is `stream_visible`.
    #[getter]
    fn visible(&self) -> bool {
        self.gate.is_visible()
    }
    /// Whether feeding may still hold bytes back (an event stream before its first meaningful event).
    #[getter]
    fn may_hold(&self) -> bool {
        self.gate.may_hold()
    }
    /// Whether the gate still reads what it is fed (an event stream to its
    /// end, for error and malformed events); a transport keeps feeding while true.
    #[getter]
    fn watching(&self) -> bool {
        self.gate.watching()
    }
    /// Malformed events dropped so far.
    #[getter]
    fn skipped(&self) -> u64 {
        self.gate.skipped()
    }
    /// The error event the stream carried: `{"code", "message", "after_output",
    /// "status"}` (`code` "malformed_event" when a malformed event ended it), or None.
    #[getter]
    fn stream_error<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        stream_error_dict(py, &self.gate)
    }
    /// `call.report(**gate.outcome(status))` for an attempt whose body ended
    /// (or broke) now: the plain status, or the failure an error event named.
    fn outcome<'py>(&self, py: Python<'py>, status: u16) -> PyResult<Bound<'py, PyDict>> {
        report_kwargs(py, self.gate.outcome(status))
    }
    /// `call.report(**gate.end_outcome(status, transcript))` for an attempt
    /// whose body ended cleanly now, `transcript` being what the caller
    /// received: `outcome(status)`, except that output (text, a tool call)
    /// shown without its finish was cut (`connection_reset`, never a
    /// success); `resumable` says whether another upstream may continue it.
    fn end_outcome<'py>(
        &self,
        py: Python<'py>,
        status: u16,
        transcript: &Bound<'py, PyTranscript>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let o = self.gate.end_outcome(status, &transcript.borrow().t);
        let resumable = o.resumable;
        let d = report_kwargs(py, o)?;
        d.set_item("resumable", resumable)?;
        Ok(d)
    }
    /// The phase a failure of the body would have now.
    #[getter]
    fn phase(&self) -> &'static str {
        self.gate.phase().as_str()
    }
    /// Bytes held back so far.
    #[getter]
    fn held(&self) -> usize {
        self.gate.held()
    }
    fn __repr__(&self) -> String {
        format!(
            "<retrywise.StreamGate phase={} held={}>",
            self.gate.phase().as_str(),
            self.gate.held()
        )
    }
}

// ----------------------------------------------------------------- relay --

/// A streamed answer on its way to the caller, leg by leg (the core's
/// `stream::Relay`): each chunk through the leg's gate, a continuation's
/// splicer and the transcript of what the caller received, in one call.
#[pyclass(module = "retrywise._retrywise", name = "Relay")]
pub struct PyRelay {
    r: retrywise::stream::Relay,
}

#[pymethods]
impl PyRelay {
    /// The first leg: `gate` (its state taken over, as far as it read) over
    /// the body of the attempt that answered, for a stream of `api`'s family.
    #[new]
    fn new(api: &Bound<'_, PyAny>, gate: &Bound<'_, PyStreamGate>) -> PyResult<Self> {
        let t = wire::Transcript::new(api_arg("api", api)?);
        Ok(PyRelay {
            r: retrywise::stream::Relay::new(t, gate.borrow().gate.clone()),
        })
    }
    /// The next leg, a continuation: its gate, spliced into what the caller has.
    fn continue_with(&mut self, gate: &Bound<'_, PyStreamGate>) {
        self.r.continue_with(gate.borrow().gate.clone());
    }
    /// Bytes of the leg's body in; the bytes for the caller now out (`chunk`
    /// itself when it goes on as it came).
    fn feed<'py>(&mut self, py: Python<'py>, chunk: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let r = &mut self.r;
        if let Ok(b) = chunk.cast::<PyBytes>() {
            let input = b.as_bytes();
            let out = held(py, || match r.feed(input) {
                std::borrow::Cow::Borrowed(o) if o.len() == input.len() => None,
                other => Some(other.into_owned()),
            })?;
            return Ok(out.map_or_else(|| b.clone(), |v| PyBytes::new(py, &v)));
        }
        let data = body_bytes(chunk)
            .map_err(|_| PyTypeError::new_err(format!("argument 'chunk': expected bytes, got {}", type_name(chunk))))?;
        let out = held(py, || r.feed(&data).into_owned())?;
        Ok(PyBytes::new(py, &out))
    }
    /// The leg's body ended: what is still held, for the caller before the end.
    fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let r = &mut self.r;
        let out = held(py, || r.finish())?;
        Ok(PyBytes::new(py, &out))
    }
    /// The gate ended the leg (a malformed event under `error`, an error
    /// event after output): nothing after it goes to the caller.
    #[getter]
    fn cut_short(&self) -> bool {
        self.r.cut_short()
    }
    /// The phase a failure of the leg would have now.
    #[getter]
    fn phase(&self) -> &'static str {
        self.r.gate().phase().as_str()
    }
    /// `call.report(**relay.end_outcome(status))` for a leg whose body ended
    /// cleanly now: output shown without its finish was cut.
    fn end_outcome<'py>(&self, py: Python<'py>, status: u16) -> PyResult<Bound<'py, PyDict>> {
        let o = self.r.end_outcome(status);
        let resumable = o.resumable;
        let d = report_kwargs(py, o)?;
        d.set_item("resumable", resumable)?;
        Ok(d)
    }
    /// `call.report(**relay.outcome(status))`: the plain status, or the failure an error event named.
    fn outcome<'py>(&self, py: Python<'py>, status: u16) -> PyResult<Bound<'py, PyDict>> {
        report_kwargs(py, self.r.outcome(status))
    }
    /// The error event the leg carried (as `StreamGate.stream_error`), or None.
    #[getter]
    fn stream_error<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        stream_error_dict(py, self.r.gate())
    }
    /// What the caller received so far (a copy).
    #[getter]
    fn transcript(&self) -> PyTranscript {
        PyTranscript {
            t: self.r.transcript().clone(),
        }
    }
    /// The visible text so far.
    #[getter]
    fn text(&self) -> &str {
        self.r.transcript().text()
    }
    /// Another upstream can continue it: text only, not finished.
    #[getter]
    fn resumable(&self) -> bool {
        self.r.transcript().resumable()
    }
    #[getter]
    fn api(&self) -> &'static str {
        self.r.transcript().api().as_str()
    }
    fn __repr__(&self) -> String {
        format!(
            "<retrywise.Relay phase={} continuing={} text={}B>",
            self.r.gate().phase().as_str(),
            self.r.continuing(),
            self.r.transcript().text().len()
        )
    }
}

/// A gate's error event as a dict: `code`, `message`, `after_output`, `status`.
fn stream_error_dict<'py>(py: Python<'py>, gate: &retrywise::StreamGate) -> PyResult<Option<Bound<'py, PyDict>>> {
    gate.stream_error()
        .map(|e| {
            let d = PyDict::new(py);
            d.set_item("code", e.code.as_deref())?;
            d.set_item("message", e.message.as_deref())?;
            d.set_item("after_output", e.after_output)?;
            d.set_item("status", e.status())?;
            Ok(d)
        })
        .transpose()
}

/// A gate's outcome as `call.report` keyword arguments: status, error, phase, vendor code.
fn report_kwargs(py: Python<'_>, o: retrywise::Outcome) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("status", o.status)?;
    d.set_item("error", o.error.map(|k| k.as_str()))?;
    d.set_item("phase", o.phase.map(|p| p.as_str()))?;
    d.set_item("vendor_code", o.vendor_code)?;
    Ok(d)
}

/// Registers the classes and functions of this module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyReach>()?;
    m.add_class::<PyWireRequest>()?;
    m.add_class::<PyTranscript>()?;
    m.add_class::<PySplicer>()?;
    m.add_class::<PyStreamGate>()?;
    m.add_class::<PyRelay>()?;
    m.add_class::<PyRequestFacts>()?;
    m.add_function(wrap_pyfunction!(rewrite, m)?)?;
    m.add_function(wrap_pyfunction!(api_family, m)?)?;
    m.add_function(wrap_pyfunction!(continuation_body, m)?)?;
    m.add_function(wrap_pyfunction!(read_request, m)?)?;
    Ok(())
}
