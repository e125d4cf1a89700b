//! Request handling: routes control endpoints, parses the fault spec from the path,
//! records the request and produces (or withholds) the response.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use hyper::http::request::Parts;
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use serde_json::{json, Value};

use crate::body::{full, End, ResBody, ScriptBody};
use crate::shapes::{self, Chunk, Ctx, Shape, STREAM_CHUNKS};
use crate::spec::{Fault, RetryAfterHint, MAX_WAIT_MS};
use crate::state::{Arrival, State};

/// Largest request body read; bigger ones get a 413 (the SDK tests never come close).
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// Model name used when the request names none.
const DEFAULT_MODEL: &str = "retrywise-fault-model";

/// A service error that makes hyper close the connection without writing a
/// response: the "result unknown" outcome of `drop` and the end of `hang`.
#[derive(Debug)]
pub struct Abort(&'static str);

impl fmt::Display for Abort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Abort {}

/// What one request is answered with, decided before any waiting so the record
/// can say what the client was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Plan {
    Success {
        delay: Duration,
    },
    Error {
        status: u16,
        vendor_code: Option<String>,
        header: Option<(&'static str, String)>,
    },
    Hang,
    Drop,
    /// Close the connection once this many request-body bytes arrived.
    WriteCut(usize),
    Malformed,
    Stream {
        chunks: u32,
        gap: Duration,
        /// Chunks sent before the first gap.
        fast: u32,
        end: End,
    },
}

impl Plan {
    /// `prior` is how many requests with the same (spec, logical id) came before.
    fn decide(fault: &Fault, prior: u32) -> Plan {
        let success = Plan::Success { delay: Duration::ZERO };
        match fault {
            Fault::Ok => success,
            Fault::Delay { ms } => Plan::Success {
                delay: Duration::from_millis(*ms),
            },
            Fault::Status { code, vendor_code } => Plan::Error {
                status: *code,
                vendor_code: vendor_code.clone(),
                header: None,
            },
            Fault::Flaky {
                failures,
                code,
                vendor_code,
            } => {
                if prior < *failures {
                    Plan::Error {
                        status: *code,
                        vendor_code: vendor_code.clone(),
                        header: None,
                    }
                } else {
                    success
                }
            }
            Fault::RetryAfter { hint, then_ok, status } => {
                if *then_ok && prior > 0 {
                    return success;
                }
                let header = match hint {
                    RetryAfterHint::Secs(v) => ("retry-after", v.clone()),
                    RetryAfterHint::Ms(v) => ("retry-after-ms", v.clone()),
                    RetryAfterHint::Date(secs) => ("retry-after", http_date_in(*secs)),
                };
                Plan::Error {
                    status: *status,
                    vendor_code: None,
                    header: Some(header),
                }
            }
            Fault::Seq(steps) => match usize::try_from(prior).ok().and_then(|i| steps.get(i)) {
                Some(step) => Plan::decide(step, 0),
                None => success,
            },
            Fault::Hang => Plan::Hang,
            Fault::Drop => Plan::Drop,
            Fault::WriteCut { kib } => Plan::WriteCut(*kib as usize * 1024),
            Fault::Malformed => Plan::Malformed,
            Fault::SseCut { chunks } => Plan::Stream {
                chunks: *chunks,
                gap: Duration::ZERO,
                fast: 0,
                end: End::Cut,
            },
            Fault::SlowSse { gap_ms, fast } => Plan::Stream {
                chunks: STREAM_CHUNKS,
                gap: Duration::from_millis(*gap_ms),
                fast: *fast,
                end: End::Clean,
            },
        }
    }

    /// The status the client receives; `None` when it receives no response.
    fn status(&self) -> Option<u16> {
        match self {
            Plan::Error { status, .. } => Some(*status),
            Plan::Hang | Plan::Drop | Plan::WriteCut(_) => None,
            Plan::Success { .. } | Plan::Malformed | Plan::Stream { .. } => Some(200),
        }
    }
}

/// IMF-fixdate `secs` seconds from now (in the past when negative). The format has
/// one-second resolution, so the effective wait is up to a second shorter.
fn http_date_in(secs: i64) -> String {
    let now = SystemTime::now();
    let offset = Duration::from_secs(secs.unsigned_abs());
    let at = if secs >= 0 {
        now.checked_add(offset)
    } else {
        now.checked_sub(offset)
    };
    httpdate::fmt_http_date(at.unwrap_or(now))
}

/// Decodes `%XX` escapes (and `+` as space in query strings). Malformed escapes are
/// kept literally rather than rejected: the decoded text is only matched, never
/// trusted.
fn percent_decode(raw: &str, plus_as_space: bool) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let hex = |j: usize| bytes.get(j).and_then(|c| (*c as char).to_digit(16));
        match b {
            b'%' => match (hex(i + 1), hex(i + 2)) {
                (Some(hi), Some(lo)) => {
                    // Two hex digits fit a byte by construction.
                    out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'?'));
                    i += 3;
                    continue;
                }
                _ => out.push(b),
            },
            b'+' if plus_as_space => out.push(b' '),
            _ => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Splits `/s/<spec>/<api path>` into the decoded spec and the API path. Paths
/// without the prefix are plain API calls and behave as `ok`.
fn split_fault_path(path: &str) -> (String, String) {
    match path.strip_prefix("/s/") {
        Some(rest) => match rest.split_once('/') {
            Some((raw, api)) => (percent_decode(raw, false), format!("/{api}")),
            None => (percent_decode(rest, false), "/".to_owned()),
        },
        None => ("ok".to_owned(), path.to_owned()),
    }
}

fn query_params(query: Option<&str>) -> BTreeMap<String, String> {
    query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect()
}

fn header_text(parts: &Parts, name: &str) -> Option<String> {
    parts
        .headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

fn header_int(parts: &Parts, name: &str) -> Option<i64> {
    header_text(parts, name).and_then(|v| v.trim().parse().ok())
}

fn json_response(status: u16, value: &impl Serialize) -> Response<ResBody> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut res = Response::new(full(body));
    *res.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

/// Entry point for every request on a connection.
pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<ResBody>, Abort> {
    if let Some(endpoint) = req.uri().path().strip_prefix("/control/") {
        return Ok(control(&state, req.method(), endpoint, req.uri().query()));
    }
    handle_api(state, req).await
}

fn control(state: &State, method: &Method, endpoint: &str, query: Option<&str>) -> Response<ResBody> {
    let expected = match endpoint {
        "reset" => Method::POST,
        "health" | "requests" | "counts" | "closed-port" => Method::GET,
        _ => {
            return json_response(
                404,
                &json!({"error": format!("unknown control endpoint /control/{endpoint}")}),
            )
        }
    };
    if method != expected {
        let mut res = json_response(405, &json!({"error": format!("/control/{endpoint} takes {expected}")}));
        if let Ok(allow) = HeaderValue::from_str(expected.as_str()) {
            res.headers_mut().insert(ALLOW, allow);
        }
        return res;
    }
    match endpoint {
        "reset" => {
            state.reset();
            json_response(200, &json!({"reset": true}))
        }
        "health" => {
            let counts = state.counts();
            json_response(
                200,
                &json!({
                    "status": "ok",
                    "uptime_ms": state.now_ms(),
                    "open_connections": state.open_connections(),
                    "in_flight": state.in_flight(),
                    "recorded": counts.total,
                    "dropped": counts.dropped,
                }),
            )
        }
        "requests" => {
            let params = query_params(query);
            let records = state.records(
                params.get("spec").map(String::as_str),
                params.get("logical_id").map(String::as_str),
            );
            json_response(200, &records)
        }
        "counts" => json_response(200, &state.counts()),
        _ => closed_port(),
    }
}

/// Binds an ephemeral port and releases it, so "connection refused" can be tested
/// without guessing a free port. Another process could grab it in between; on a
/// test machine that window is negligible.
fn closed_port() -> Response<ResBody> {
    match std::net::TcpListener::bind(("127.0.0.1", 0)).and_then(|l| l.local_addr()) {
        Ok(addr) => json_response(200, &json!({"port": addr.port()})),
        Err(e) => json_response(500, &json!({"error": format!("bind failed: {e}")})),
    }
}

async fn handle_api(state: Arc<State>, req: Request<Incoming>) -> Result<Response<ResBody>, Abort> {
    let _in_flight = state.in_flight_guard();
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let (spec, api_path) = split_fault_path(&path);
    let shape = Shape::for_api_path(&api_path);

    let logical_id = header_text(&parts, "retrywise-request-id");
    let fault = spec.parse::<Fault>();
    let arrival = |stream: bool| Arrival {
        method: parts.method.to_string(),
        path: path.clone(),
        api_path: api_path.clone(),
        spec: spec.clone(),
        logical_id: logical_id.clone(),
        attempt: header_int(&parts, "retrywise-attempt"),
        deadline_ms: header_int(&parts, "retrywise-deadline-ms"),
        idempotency_key: header_text(&parts, "idempotency-key"),
        x_stainless_retry_count: header_text(&parts, "x-stainless-retry-count"),
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
        stream,
    };

    // A write cut closes the connection while the request body is still arriving
    // (a `seq` step may be one: peek at the count, then count it).
    let cut = fault
        .as_ref()
        .ok()
        .and_then(|f| match Plan::decide(f, state.prior(&spec, logical_id.as_deref())) {
            Plan::WriteCut(after) => {
                state.admit(&spec, logical_id.as_deref());
                Some(after)
            }
            _ => None,
        });
    if let Some(after) = cut {
        let mut body = body;
        let mut got = 0;
        while got < after {
            match body.frame().await {
                Some(Ok(frame)) => got += frame.data_ref().map_or(0, |d| d.len()),
                _ => break,
            }
        }
        state.record(arrival(false), None);
        return Err(Abort("write-cut: closing while the request body arrives"));
    }

    // Every other fault acts after the full request was received, so "the upstream
    // got the request" holds for all of them (`drop` in particular).
    let body = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            let msg = format!("request body exceeds {MAX_BODY_BYTES} bytes");
            return Ok(json_response(413, &shapes::error_body(shape, 413, None, &msg)));
        }
        Err(_) => return Err(Abort("request body was not fully received")),
    };
    let request_json: Option<Value> = serde_json::from_slice(&body).ok();
    let stream = request_json
        .as_ref()
        .and_then(|v| v.get("stream"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let model = request_json
        .as_ref()
        .and_then(|v| v.get("model"))
        .and_then(Value::as_str)
        .unwrap_or(DEFAULT_MODEL)
        .to_owned();

    let fault = match fault {
        Ok(fault) => fault,
        Err(e) => {
            // A typo in a test's spec must fail loudly and must not look retryable.
            state.record(arrival(stream), Some(400));
            let body = shapes::error_body(shape, 400, Some("invalid_fault_spec"), &e.0);
            return Ok(json_response(400, &body));
        }
    };
    // Counted once fully received: a request whose body never arrived takes no step.
    let prior = state.admit(&spec, logical_id.as_deref());
    let plan = Plan::decide(&fault, prior);
    let seq = state.record(arrival(stream), plan.status());
    let ctx = Ctx { shape, model, seq };

    let mut res = match plan {
        Plan::Success { delay } => {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if stream {
                sse_response(&ctx, STREAM_CHUNKS, Duration::ZERO, 0, End::Clean)
            } else {
                json_response(200, &shapes::success_body(&ctx))
            }
        }
        Plan::Error {
            status,
            vendor_code,
            header,
        } => {
            let msg = format!("retrywise-fault-server: injected {status} (spec {spec})");
            let body = shapes::error_body(shape, status, vendor_code.as_deref(), &msg);
            let mut res = json_response(status, &body);
            if let Some((name, value)) = header {
                if let Ok(value) = HeaderValue::from_str(&value) {
                    res.headers_mut().insert(HeaderName::from_static(name), value);
                }
            }
            res
        }
        Plan::Hang => {
            // Hyper drops this future as soon as the client closes the connection;
            // the cap only bounds clients that never give up.
            tokio::time::sleep(Duration::from_millis(MAX_WAIT_MS)).await;
            return Err(Abort("hang reached its cap"));
        }
        Plan::Drop => return Err(Abort("drop: closing without a response")),
        Plan::WriteCut(_) => return Err(Abort("write-cut: closing while the request body arrives")),
        Plan::Malformed => {
            let mut res = Response::new(full(shapes::malformed_body(&ctx)));
            res.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            res
        }
        Plan::Stream { chunks, gap, fast, end } => sse_response(&ctx, chunks, gap, fast, end),
    };

    let id_header = match shape {
        Shape::OpenAi => "x-request-id",
        Shape::Anthropic => "request-id",
    };
    if let Ok(value) = HeaderValue::from_str(&format!("rw-{seq}")) {
        res.headers_mut().insert(HeaderName::from_static(id_header), value);
    }
    if let Ok(value) = HeaderValue::from_str(&spec) {
        res.headers_mut().insert(HeaderName::from_static("x-fault-spec"), value);
    }
    Ok(res)
}

fn sse_response(ctx: &Ctx, chunks: u32, gap: Duration, fast: u32, end: End) -> Response<ResBody> {
    let frames: Vec<Bytes> = shapes::stream_plan(chunks, end == End::Clean)
        .into_iter()
        .map(|chunk: Chunk| shapes::chunk_bytes(ctx, chunk))
        .collect();
    let mut res = Response::new(ScriptBody::new(frames, gap, fast, end).boxed());
    let headers = res.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_paths() {
        assert_eq!(
            split_fault_path("/s/status:503/v1/chat/completions"),
            ("status:503".into(), "/v1/chat/completions".into())
        );
        assert_eq!(
            split_fault_path("/s/ra-secs%3A2/v1/messages"),
            ("ra-secs:2".into(), "/v1/messages".into())
        );
        assert_eq!(split_fault_path("/s/ok"), ("ok".into(), "/".into()));
        assert_eq!(
            split_fault_path("/v1/chat/completions"),
            ("ok".into(), "/v1/chat/completions".into())
        );
    }

    #[test]
    fn decodes_percent_and_plus() {
        assert_eq!(percent_decode("a%3Ab+c%zz%", true), "a:b c%zz%");
        assert_eq!(percent_decode("a+b", false), "a+b");
    }

    #[test]
    fn flaky_and_then_ok_follow_prior_count() {
        let flaky = Fault::Flaky {
            failures: 2,
            code: 503,
            vendor_code: None,
        };
        let statuses: Vec<_> = (0..4).map(|p| Plan::decide(&flaky, p).status()).collect();
        assert_eq!(statuses, [Some(503), Some(503), Some(200), Some(200)]);

        let ra = Fault::RetryAfter {
            hint: RetryAfterHint::Ms("5".into()),
            then_ok: true,
            status: 429,
        };
        assert_eq!(Plan::decide(&ra, 0).status(), Some(429));
        assert_eq!(Plan::decide(&ra, 1).status(), Some(200));

        let seq: Fault = "seq:ra-secs:1:503,hang,status:500".parse().unwrap();
        let statuses: Vec<_> = (0..5).map(|p| Plan::decide(&seq, p).status()).collect();
        assert_eq!(statuses, [Some(503), None, Some(500), Some(200), Some(200)]);
    }

    #[test]
    fn http_date_is_parseable_and_in_the_future() {
        let text = http_date_in(30);
        let at = httpdate::parse_http_date(&text).expect("valid IMF-fixdate");
        let ahead = at.duration_since(SystemTime::now()).expect("date is in the future");
        assert!(ahead <= Duration::from_secs(30) && ahead >= Duration::from_secs(28));
    }
}
