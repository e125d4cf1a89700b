//! Request handling: routes control endpoints, chooses the fault (from the path's
//! `/s/<spec>` prefix, else from a fault model name), records the request and
//! produces (or withholds) the response.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::http::request::Parts;
use hyper::{Request, Response};
use serde_json::Value;

use crate::answer::{self, Continuation};
use crate::body::{full, json_response, End, ResBody, ScriptBody, Step};
use crate::conn::ConnControl;
use crate::control::control;
use crate::model::{self, ModelFault};
use crate::plan::{ApiError, Break, Plan, Script};
use crate::request::{header_int, header_text, split_fault_path, BodyFields};
use crate::shapes::{self, Ctx, Shape, Usage};
use crate::spec::{Fault, MAX_WAIT_MS, STREAM_DELTAS};
use crate::state::{Arrival, Ending, State, Tracker};

/// Largest request body read; bigger ones get a 413 (the SDK tests never come close).
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// Model name used when the request names none.
const DEFAULT_MODEL: &str = "retrywise-fault-model";

/// A service error that makes hyper close the connection without writing a
/// response: the "result unknown" outcome of `drop`, `reset` and the end of `hang`.
#[derive(Debug)]
pub struct Abort(&'static str);

impl fmt::Display for Abort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Abort {}

/// Entry point for every request on a connection.
pub async fn handle(
    state: Arc<State>,
    conn: Arc<ConnControl>,
    req: Request<Incoming>,
) -> Result<Response<ResBody>, Abort> {
    if let Some(endpoint) = req.uri().path().strip_prefix("/control/") {
        return Ok(control(&state, req.method(), endpoint, req.uri().query()));
    }
    handle_api(state, conn, req).await
}

fn arrival(parts: &Parts, path: &str, api_path: &str, spec: Option<&String>) -> Arrival {
    Arrival {
        method: parts.method.to_string(),
        path: path.to_owned(),
        api_path: api_path.to_owned(),
        spec: spec.cloned().unwrap_or_else(|| "ok".to_owned()),
        logical_id: header_text(parts, "retrywise-request-id"),
        attempt: header_int(parts, "retrywise-attempt"),
        deadline_ms: header_int(parts, "retrywise-deadline-ms"),
        idempotency_key: header_text(parts, "idempotency-key"),
        x_stainless_retry_count: header_text(parts, "x-stainless-retry-count"),
        retrywise_headers: parts
            .headers
            .iter()
            .filter(|(name, _)| name.as_str().starts_with("retrywise-"))
            .map(|(name, value)| {
                (
                    name.as_str().to_owned(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect(),
        stream: false,
        model: None,
        fault: None,
        continuation: None,
    }
}

/// What an answer says: the whole text of a JSON answer and the deltas of a stream.
struct Content {
    text: String,
    deltas: Vec<String>,
    input_words: u64,
}

impl Content {
    /// Path specs answer `ok`, or stream `"c1 "`, `"c2 "`, … (as many as a break
    /// after `frames` frames needs, at least three).
    fn for_spec(script: &Script) -> Self {
        let n = match script {
            Script::Break { frames, .. } => (*frames).saturating_sub(1).max(STREAM_DELTAS as usize),
            _ => STREAM_DELTAS as usize,
        };
        Content {
            text: "ok".into(),
            deltas: (1..=n).map(|k| format!("c{k} ")).collect(),
            input_words: 1,
        }
    }

    /// A fault model answers its own deterministic answer, or the rest of the
    /// answer a continuation quotes (after the quoted prefix again with `resend=1`).
    fn for_model(model: &str, fault: &ModelFault, continuation: Option<&Continuation>, input_words: u64) -> Self {
        let deltas = match continuation {
            Some(c) if fault.resend => {
                let mut all = vec![c.prefix.clone()];
                all.extend(c.rest.iter().cloned());
                all
            }
            Some(c) => c.rest.clone(),
            None => answer::deltas(model, fault.words),
        };
        Content {
            text: deltas.concat(),
            deltas,
            input_words,
        }
    }
}

/// The fault chosen for one request, resolved to a plan.
struct Decision {
    plan: Plan,
    content: Content,
    /// `x-fault-spec` and error messages: the path spec or the model name.
    label: String,
    /// Sent with whatever the plan answers (`fb-ratelimit`'s rate-limit headers).
    headers: Vec<(&'static str, String)>,
}

/// A request whose fault could not be chosen: a typo in a spec or model name.
fn invalid(state: &Arc<State>, shape: Shape, arrival: Arrival, message: &str) -> Response<ResBody> {
    let at = state.record(arrival, Some(400));
    Tracker::new(Arc::clone(state), at).finish(Ending::Complete);
    // A typo in a test's spec must fail loudly and must not look retryable.
    json_response(
        400,
        &shapes::error_body(shape, 400, Some("invalid_fault_spec"), message),
    )
}

async fn handle_api(
    state: Arc<State>,
    conn: Arc<ConnControl>,
    req: Request<Incoming>,
) -> Result<Response<ResBody>, Abort> {
    let _in_flight = state.in_flight_guard();
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let (path_spec, api_path) = split_fault_path(&path);
    let shape = Shape::for_api_path(&api_path);
    let mut arrival = arrival(&parts, &path, &api_path, path_spec.as_ref());
    let logical_id = arrival.logical_id.clone();
    let spec_fault = path_spec.as_ref().map(|s| s.parse::<Fault>());

    // A write cut closes the connection while the request body is still arriving
    // (a `seq` step may be one: peek at the count, then count it).
    if let (Some(spec), Some(Ok(fault))) = (&path_spec, &spec_fault) {
        if let Plan::WriteCut(after) = Plan::decide(fault, state.prior(spec, logical_id.as_deref())) {
            state.admit(spec, logical_id.as_deref());
            let mut body = body;
            let mut got = 0;
            while got < after {
                match body.frame().await {
                    Some(Ok(frame)) => got += frame.data_ref().map_or(0, |d| d.len()),
                    _ => break,
                }
            }
            let at = state.record(arrival, None);
            Tracker::new(Arc::clone(&state), at).finish(Ending::WriteCut);
            return Err(Abort("write-cut: closing while the request body arrives"));
        }
    }

    // Every other fault acts after the full request was received, so "the upstream
    // got the request" holds for all of them (`drop` and `reset` in particular).
    let body = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            let msg = format!("request body exceeds {MAX_BODY_BYTES} bytes");
            return Ok(json_response(413, &shapes::error_body(shape, 413, None, &msg)));
        }
        Err(_) => return Err(Abort("request body was not fully received")),
    };
    let fields = BodyFields::parse(&body);
    arrival.stream = fields.stream;
    arrival.model.clone_from(&fields.model);
    let model = fields.model.clone().unwrap_or_else(|| DEFAULT_MODEL.to_owned());

    let decision = match (path_spec, spec_fault) {
        (Some(_), Some(Err(e))) => return Ok(invalid(&state, shape, arrival, &e.0)),
        (Some(spec), Some(Ok(fault))) => {
            // Counted once fully received: a request whose body never arrived takes no step.
            let plan = Plan::decide(&fault, state.admit(&spec, logical_id.as_deref()));
            let content = match &plan {
                Plan::Answer { script, .. } => Content::for_spec(script),
                _ => Content::for_spec(&Script::Healthy),
            };
            Decision {
                plan,
                content,
                label: spec,
                headers: Vec::new(),
            }
        }
        _ if model::is_fault_model(&model) => {
            arrival.spec.clone_from(&model);
            match decide_model(&state, shape, &fields.json, &model, &mut arrival) {
                Ok(decision) => decision,
                Err(message) => return Ok(invalid(&state, shape, arrival, &message)),
            }
        }
        _ => Decision {
            plan: Plan::decide(&Fault::Ok, 0),
            content: Content::for_spec(&Script::Healthy),
            label: "ok".to_owned(),
            headers: Vec::new(),
        },
    };

    let Decision {
        plan,
        content,
        label,
        headers,
    } = decision;
    let sse = match &plan {
        Plan::Answer { always_sse, .. } => *always_sse || fields.stream,
        _ => false,
    };
    let sent_text = if sse {
        content.deltas.concat()
    } else {
        content.text.clone()
    };
    let at = state.record(arrival, plan.status());
    let tracker = Tracker::new(Arc::clone(&state), at);
    let ctx = Ctx {
        shape,
        model,
        seq: at.seq(),
        include_usage: fields.include_usage,
        usage: Usage {
            input: content.input_words,
            output: sent_text.split_whitespace().count() as u64,
        },
    };

    let mut res = match plan {
        Plan::Answer { delay, script, .. } => {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if sse {
                sse_response(&ctx, &content.deltas, &script, tracker)
            } else {
                json_answer(&ctx, &content.text, &script, tracker).await
            }
        }
        Plan::Error { status, error, header } => {
            let mut res = json_response(status, &error_body(shape, status, &error, &label));
            if let Some((name, value)) = header {
                if let Ok(value) = HeaderValue::from_str(&value) {
                    res.headers_mut().insert(HeaderName::from_static(name), value);
                }
            }
            tracker.finish(Ending::Complete);
            res
        }
        Plan::Hang => {
            // Hyper drops this future as soon as the client closes the connection
            // (the tracker then logs `client_closed`); the cap only bounds clients
            // that never give up.
            tokio::time::sleep(Duration::from_millis(MAX_WAIT_MS)).await;
            tracker.finish(Ending::Closed);
            return Err(Abort("hang reached its cap"));
        }
        Plan::Drop => {
            tracker.finish(Ending::Closed);
            return Err(Abort("drop: closing without a response"));
        }
        Plan::Reset => {
            conn.reset_on_close();
            tracker.finish(Ending::Reset);
            return Err(Abort("reset: closing with a TCP reset"));
        }
        Plan::WriteCut(_) => {
            tracker.finish(Ending::WriteCut);
            return Err(Abort("write-cut: closing while the request body arrives"));
        }
        Plan::Malformed => {
            let mut res = Response::new(full(shapes::malformed_body(&ctx, &content.text)));
            res.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            tracker.finish(Ending::Complete);
            res
        }
    };

    if let Ok(value) = HeaderValue::from_str(&format!("rw-{}", ctx.seq)) {
        res.headers_mut()
            .insert(HeaderName::from_static(shape.request_id_header()), value);
    }
    if let Ok(value) = HeaderValue::from_str(&label) {
        res.headers_mut().insert(HeaderName::from_static("x-fault-spec"), value);
    }
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            res.headers_mut().insert(HeaderName::from_static(name), value);
        }
    }
    Ok(res)
}

/// Chooses the plan and content of a request whose model names a fault, and notes
/// the fault and any continuation in its arrival; `Err` is a typo's message.
fn decide_model(
    state: &State,
    shape: Shape,
    request: &Value,
    model: &str,
    arrival: &mut Arrival,
) -> Result<Decision, String> {
    let fault = ModelFault::parse(model).map_err(|e| e.0)?;
    arrival.fault = Some(fault.kind.to_string());
    let turns = answer::conversation(shape, request);
    let prefill = turns.last().is_some_and(|t| t.role == "assistant");
    let fires = fault.fires(state.admit(model, arrival.logical_id.as_deref()));
    // `after=N`: the model name's first N requests are answered at once.
    let early = fault.after > 0 && !fault.past_after(state.admit_model(model));
    let fires = fires && !early;
    let down = fault.kind == model::Kind::Flap && state.since_first(model) < Duration::from_millis(fault.down_ms);
    let mut plan = Plan::for_model(&fault, fires, down, prefill);
    let mut headers = Vec::new();
    if fault.kind == model::Kind::RateLimitWindow {
        let window = Duration::from_millis(fault.window_ms);
        let slot = state.rate_slot(model, fault.limit, window, fault.mode);
        headers = slot.headers(fault.family, SystemTime::now());
        plan = Plan::for_rate_limit(&slot, fault.family).unwrap_or(plan);
    }
    let found = match answer::continuation(&turns) {
        Ok(found) => found,
        // Only an answer continues anything; a mismatch under an error plan
        // keeps the error the fault asked for.
        Err(mismatch) if matches!(plan, Plan::Answer { .. }) => {
            plan = Plan::Error {
                status: 400,
                error: ApiError::ContinuationMismatch(mismatch.0),
                header: None,
            };
            None
        }
        Err(_) => None,
    };
    let content = Content::for_model(model, &fault, found.as_ref(), answer::input_words(&turns));
    arrival.continuation = found;
    Ok(Decision {
        plan,
        content,
        label: model.to_owned(),
        headers,
    })
}

fn error_body(shape: Shape, status: u16, error: &ApiError, label: &str) -> Value {
    match error {
        ApiError::Injected { vendor_code } => {
            let what = if model::is_fault_model(label) { "model" } else { "spec" };
            let msg = format!("retrywise-fault-server: injected {status} ({what} {label})");
            shapes::error_body(shape, status, vendor_code.as_deref(), &msg)
        }
        ApiError::ContextLength => shapes::context_length_body(shape),
        ApiError::ContentFilter { code, reason } => shapes::content_filter_body(shape, *code, reason),
        ApiError::PrefillRejected => shapes::prefill_rejected_body(shape),
        ApiError::RateLimited {
            limit,
            retry_after_s,
            family,
        } => shapes::rate_limit_body(shape, *limit, *retry_after_s, *family),
        ApiError::ContinuationMismatch(prefix) => {
            let msg = format!(
                "retrywise-fault-server: the assistant prefill {prefix:?} is not a delta-aligned prefix \
                 of any fault model's answer"
            );
            shapes::error_body(shape, status, Some("continuation_mismatch"), &msg)
        }
    }
}

/// A non-streamed answer; stream faults become their body-level equivalents.
async fn json_answer(ctx: &Ctx, text: &str, script: &Script, tracker: Tracker) -> Response<ResBody> {
    let body = match script {
        Script::Break { how, .. } => {
            // Half the body under the full `content-length`, then a cut or a stall.
            let bytes = shapes::success_body(ctx, text).to_string();
            let len = bytes.len() as u64;
            let half = (0..=bytes.len() / 2)
                .rev()
                .find(|&i| bytes.is_char_boundary(i))
                .unwrap_or(0);
            let frame = shapes::Frame {
                bytes: Bytes::from(bytes[..half].to_owned()),
                delta: None,
            };
            let end = if *how == Break::Stall { End::Hold } else { End::Cut };
            ScriptBody::new(vec![Step::now(frame)], end, Some(len), tracker).boxed()
        }
        Script::Malformed { .. } => {
            tracker.finish(Ending::Complete);
            full(shapes::malformed_body(ctx, text))
        }
        Script::FirstToken(wait) => {
            // Dropped with this future if the client gives up: logged as client_closed.
            tokio::time::sleep(*wait).await;
            return finished_json(ctx, text, tracker);
        }
        Script::Healthy | Script::Gaps { .. } | Script::NoTerminator => return finished_json(ctx, text, tracker),
    };
    let mut res = Response::new(body);
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

fn finished_json(ctx: &Ctx, text: &str, tracker: Tracker) -> Response<ResBody> {
    tracker.text(text);
    tracker.finish(Ending::Complete);
    json_response(200, &shapes::success_body(ctx, text))
}

/// A streamed answer: the healthy stream with the script's pauses, break or bad event.
fn sse_response(ctx: &Ctx, deltas: &[String], script: &Script, tracker: Tracker) -> Response<ResBody> {
    let frames = shapes::stream(ctx, deltas, *script != Script::NoTerminator);
    let mut steps: Vec<Step> = frames.into_iter().map(Step::now).collect();
    // A break or a bad event never goes past the last delta (the finish stays unsent).
    let last_delta = steps.len().saturating_sub(1);
    let mut end = End::Clean;
    match script {
        Script::Healthy | Script::NoTerminator => {}
        Script::Gaps { gap, fast } => {
            for step in steps.iter_mut().skip(*fast as usize) {
                step.pause = *gap;
            }
        }
        Script::FirstToken(wait) => {
            if let Some(first_delta) = steps.get_mut(1) {
                first_delta.pause = *wait;
            }
        }
        Script::Break { frames, how } => {
            let frames = (*frames).min(last_delta);
            steps.truncate(frames);
            match how {
                Break::Cut => end = End::Cut,
                Break::Stall => end = End::Hold,
                Break::Close => {}
                // The Responses API numbers events: 3 in the preamble, one per delta.
                Break::ErrorEvent => steps.push(Step::now(shapes::Frame {
                    bytes: shapes::error_event(ctx, frames + 2),
                    delta: None,
                })),
            }
        }
        Script::Malformed { frames } => {
            let at = (*frames).min(last_delta);
            steps.insert(
                at,
                Step::now(shapes::Frame {
                    bytes: shapes::malformed_event(ctx),
                    delta: None,
                }),
            );
        }
    }
    let mut res = Response::new(ScriptBody::new(steps, end, None, tracker).boxed());
    let headers = res.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}
