//! The sixteen fault models (README "Choosing a fault: the model name"), each over
//! real sockets with the minimal client in `common`: exact statuses and bytes, how
//! each exchange ended, and lower bounds on the pauses. Pauses are shrunk through
//! the model name, so no test waits more than about two seconds.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";
const RESPONSES: &str = "/v1/responses";

/// A one-turn request body for `model` in the shape `path` expects.
fn request(path: &str, model: &str, stream: bool) -> String {
    let body = if path == RESPONSES {
        json!({"model": model, "stream": stream, "input": "hi"})
    } else {
        json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
    };
    body.to_string()
}

fn ask(addr: std::net::SocketAddr, path: &str, model: &str, stream: bool) -> Reply {
    post(addr, path, &request(path, model, stream))
}

fn ask_as(addr: std::net::SocketAddr, model: &str, logical_id: &str) -> Reply {
    call(
        addr,
        "POST",
        CHAT,
        &[("retrywise-request-id", logical_id)],
        &request(CHAT, model, false),
    )
}

/// The deterministic answer of `model` with the default six words.
fn answer(model: &str) -> String {
    format!("answer from {model}: w1 w2 w3 w4 w5 w6")
}

fn chat_content(reply: &Reply) -> Value {
    reply.json()["choices"][0]["message"]["content"].clone()
}

/// Concatenated content deltas of a chat stream (non-JSON data lines skipped).
fn chat_deltas(reply: &Reply) -> String {
    sse_data_lines(reply)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect()
}

/// Concatenated `text_delta`s of an Anthropic stream.
fn anthropic_deltas(reply: &Reply) -> String {
    sse_data_lines(reply)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|e| e["delta"]["text"].as_str().map(str::to_owned))
        .collect()
}

/// Chat chunk bytes as the server writes them (sorted keys, fixed `created`).
fn chat_chunk(seq: u64, model: &str, delta: &str) -> String {
    format!(
        "data: {{\"choices\":[{{\"delta\":{delta},\"finish_reason\":null,\"index\":0,\"logprobs\":null}}],\
         \"created\":1700000000,\"id\":\"chatcmpl-rw-{seq}\",\"model\":\"{model}\",\"object\":\"chat.completion.chunk\"}}\n\n"
    )
}

fn error_text(status: u16, model: &str, kind: &str) -> String {
    format!(
        "{{\"error\":{{\"code\":null,\"message\":\"retrywise-fault-server: injected {status} (model {model})\",\
         \"param\":null,\"type\":\"{kind}\"}}}}"
    )
}

fn records(addr: std::net::SocketAddr, model: &str) -> Vec<Value> {
    get_json(addr, &format!("/control/requests?model={model}"))
        .as_array()
        .expect("array")
        .clone()
}

#[test]
fn m01_429_with_retry_after_then_healthy() {
    let (addr, _server) = server();
    let m = "fb-429-retry-after";
    let r = ask(addr, CHAT, m, false);
    assert_eq!(
        (r.status, r.header("retry-after"), r.header("retry-after-ms")),
        (429, Some("1"), None)
    );
    assert_eq!(r.text(), error_text(429, m, "rate_limit_error"));
    let r = ask(addr, CHAT, m, false);
    assert_eq!((r.status, chat_content(&r)), (200, json!(answer(m))));
    // Counted per logical request: each one is refused once.
    for id in ["A", "B"] {
        assert_eq!(ask_as(addr, m, id).status, 429);
        assert_eq!(ask_as(addr, m, id).status, 200);
    }
    let m = "fb-429-retry-after:ra=2.5:n=always";
    for _ in 0..3 {
        let r = ask(addr, CHAT, m, false);
        assert_eq!((r.status, r.header("retry-after")), (429, Some("2.5")));
    }
    let r = ask(addr, MESSAGES, "fb-429-retry-after:id=anthropic", false);
    assert_eq!(r.status, 429);
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
}

#[test]
fn m02_429_without_retry_after() {
    let (addr, _server) = server();
    let m = "fb-429:n=2";
    for _ in 0..2 {
        let r = ask(addr, CHAT, m, false);
        assert_eq!(r.status, 429);
        assert_eq!((r.header("retry-after"), r.header("retry-after-ms")), (None, None));
        assert_eq!(r.text(), error_text(429, m, "rate_limit_error"));
    }
    assert_eq!(chat_content(&ask(addr, CHAT, m, false)), json!(answer(m)));
}

#[test]
fn m03_500_once_then_healthy() {
    let (addr, _server) = server();
    let m = "fb-500-once";
    let r = ask(addr, CHAT, m, true);
    assert_eq!((r.status, r.text()), (500, error_text(500, m, "server_error")));
    let r = ask(addr, CHAT, m, true);
    assert_eq!(r.status, 200);
    assert!(r.complete);
    assert_eq!(chat_deltas(&r), answer(m));
    let statuses: Vec<Value> = records(addr, m).iter().map(|r| r["status"].clone()).collect();
    assert_eq!(statuses, [json!(500), json!(200)]);
}

#[test]
fn m04_503_persistent() {
    let (addr, _server) = server();
    let m = "fb-503";
    for _ in 0..3 {
        let r = ask(addr, CHAT, m, false);
        assert_eq!((r.status, r.text()), (503, error_text(503, m, "server_error")));
    }
    let r = ask(addr, MESSAGES, "fb-503:status=529", false);
    assert_eq!(r.status, 529);
    assert_eq!(
        r.text(),
        "{\"error\":{\"message\":\"retrywise-fault-server: injected 529 (model fb-503:status=529)\",\
         \"type\":\"overloaded_error\"},\"type\":\"error\"}"
    );
}

#[test]
fn m05_reset_before_headers() {
    let (addr, _server) = server();
    let m = "fb-reset";
    let r = ask(addr, CHAT, m, false);
    assert_eq!(r.raw_len, 0, "not a single byte of response");
    assert!(r.reset, "the connection is reset, not closed");
    // The request did arrive, and the next one is answered.
    assert_eq!(chat_content(&ask(addr, CHAT, m, false)), json!(answer(m)));
    let log = records(addr, m);
    assert_eq!(
        (log[0]["status"].clone(), log[0]["end"].clone()),
        (Value::Null, json!("reset"))
    );
    assert_eq!(log[1]["end"], "complete");
    let r = ask(addr, CHAT, "fb-reset:n=always", true);
    assert!(r.reset && r.raw_len == 0);
}

#[test]
fn m06_silent_upstream_never_answers() {
    let (addr, _server) = server();
    let mut live = Live::open(addr, CHAT, &request(CHAT, "fb-silent", true));
    // Recorded (so `at_ms` is in the past) before the client starts waiting.
    let deadline = Instant::now() + READ_TIMEOUT;
    while records(addr, "fb-silent").is_empty() {
        assert!(Instant::now() < deadline, "the request was never recorded");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(live.quiet_for(Duration::from_millis(300)), "no byte, connection open");
    assert_eq!(get_json(addr, "/control/health")["in_flight"], 1);
    drop(live);
    let rec = ended_record(addr, "model=fb-silent");
    assert_eq!(
        (rec["status"].clone(), rec["end"].clone()),
        (Value::Null, json!("client_closed"))
    );
    let held = rec["ended_at_ms"].as_f64().unwrap() - rec["at_ms"].as_f64().unwrap();
    assert!(held >= 300.0, "the server logged when the client gave up: {held} ms");
}

#[test]
fn m07_slow_first_token() {
    let (addr, _server) = server();
    let m = "fb-slow-first-token:ms=600";
    let sent = Instant::now();
    let mut live = Live::open(addr, CHAT, &request(CHAT, m, true));
    live.until("\"role\":\"assistant\"");
    assert!(
        !live.text().contains("answer from"),
        "the preamble comes before the pause"
    );
    let first = live.until("answer from");
    assert!(
        first - sent >= Duration::from_millis(600),
        "first delta after {:?}",
        first - sent
    );
    let r = live.finish();
    assert!(r.complete);
    assert_eq!(chat_deltas(&r), answer(m));

    // Without streaming the whole answer waits.
    let started = Instant::now();
    let r = ask(addr, CHAT, m, false);
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_eq!(chat_content(&r), json!(answer(m)));
}

#[test]
fn m07_slow_first_token_after_a_fast_start() {
    let (addr, _server) = server();
    // Fast for the model name's first two requests, whatever their logical
    // request (a transport sends a new one per call); slow from the third on.
    let m = "fb-slow-first-token:after=2:ms=600";
    for id in ["a", "b"] {
        let started = Instant::now();
        let r = call(
            addr,
            "POST",
            CHAT,
            &[("retrywise-request-id", id)],
            &request(CHAT, m, true),
        );
        assert!(r.complete && started.elapsed() < Duration::from_millis(500));
        assert_eq!(chat_deltas(&r), answer(m));
    }
    let sent = Instant::now();
    let mut live = Live::open(addr, CHAT, &request(CHAT, m, true));
    live.until("\"role\":\"assistant\"");
    let first = live.until("answer from");
    assert!(
        first - sent >= Duration::from_millis(600),
        "first delta after {:?}",
        first - sent
    );
    assert_eq!(chat_deltas(&live.finish()), answer(m));
    // A reset starts the count again.
    call(addr, "POST", "/control/reset", &[], "");
    let started = Instant::now();
    assert_eq!(chat_content(&ask(addr, CHAT, m, false)), json!(answer(m)));
    assert!(started.elapsed() < Duration::from_millis(500));
}

#[test]
fn m08_stream_cut_after_k_deltas() {
    let (addr, _server) = server();
    let m = "fb-stream-cut";
    let r = ask(addr, CHAT, m, true);
    assert_eq!(r.status, 200);
    assert!(!r.complete, "no chunked terminator");
    let want = [
        chat_chunk(1, m, r#"{"content":"","role":"assistant"}"#),
        chat_chunk(1, m, r#"{"content":"answer from fb-stream-cut:"}"#),
        chat_chunk(1, m, r#"{"content":" w1"}"#),
    ]
    .concat();
    assert_eq!(r.text(), want, "exactly the preamble and k=2 deltas");
    let rec = ended_record(addr, "model=fb-stream-cut");
    assert_eq!((rec["end"].clone(), rec["deltas"].clone()), (json!("cut"), json!(2)));
    assert_eq!(rec["text"], "answer from fb-stream-cut: w1");

    // k=0: the stream opens and dies before any output.
    let r = ask(addr, CHAT, "fb-stream-cut:k=0", true);
    assert_eq!(sse_data_lines(&r).len(), 1);
    assert!(!r.complete && chat_deltas(&r).is_empty());

    // end=error: the vendor's error event, then a clean end of body.
    let r = ask(addr, CHAT, "fb-stream-cut:k=1:end=error", true);
    assert!(r.complete);
    let data = sse_data_lines(&r);
    assert_eq!(
        data.last().map(String::as_str),
        Some(
            r#"{"error":{"code":null,"message":"retrywise-fault-server: the stream failed (overloaded)","param":null,"type":"server_error"}}"#
        )
    );
    assert_eq!(chat_deltas(&r), "answer from fb-stream-cut:k=1:end=error:");
    let r = ask(addr, MESSAGES, "fb-stream-cut:k=1:end=error", true);
    assert!(r.complete);
    assert!(r.text().ends_with(
        "event: error\ndata: {\"error\":{\"message\":\"Overloaded\",\"type\":\"overloaded_error\"},\"type\":\"error\"}\n\n"
    ));
    assert_eq!(
        sse_events(&r),
        ["message_start", "content_block_start", "content_block_delta", "error"]
    );

    // end=close: the k deltas, then a clean end of body with no finish and no [DONE].
    let r = ask(addr, CHAT, "fb-stream-cut:k=2:end=close", true);
    assert!(r.complete);
    assert_eq!(chat_deltas(&r), "answer from fb-stream-cut:k=2:end=close: w1");
    assert!(!r.text().contains("finish_reason\":\"") && !r.text().contains("[DONE]"));
    let r = ask(addr, MESSAGES, "fb-stream-cut:k=1:end=close", true);
    assert!(r.complete);
    assert_eq!(
        sse_events(&r),
        ["message_start", "content_block_start", "content_block_delta"]
    );

    // The Responses API: the same k deltas, then the cut.
    let r = ask(addr, RESPONSES, "fb-stream-cut:k=3", true);
    assert!(!r.complete);
    let kinds = sse_events(&r);
    assert_eq!(kinds.iter().filter(|e| *e == "response.output_text.delta").count(), 3);
    assert_eq!(kinds.last().map(String::as_str), Some("response.output_text.delta"));

    // Not streamed: half the JSON body under its full content-length, then the cut.
    let r = ask(addr, CHAT, "fb-stream-cut:id=json", false);
    let len: usize = r.header("content-length").unwrap().parse().unwrap();
    assert!(!r.complete && r.body.len() == len / 2, "{} of {len}", r.body.len());
}

#[test]
fn m09_stream_stall_keeps_the_connection_open() {
    let (addr, _server) = server();
    let m = "fb-stream-stall:k=1";
    let mut live = Live::open(addr, CHAT, &request(CHAT, m, true));
    live.until("answer from fb-stream-stall:k=1:");
    assert!(
        live.quiet_for(Duration::from_millis(300)),
        "silence on an open connection"
    );
    let got = parse(&live.raw);
    assert_eq!(chat_deltas(&got), "answer from fb-stream-stall:k=1:");
    drop(live);
    let rec = ended_record(addr, "model=fb-stream-stall:k=1");
    assert_eq!(
        (rec["end"].clone(), rec["deltas"].clone()),
        (json!("client_closed"), json!(1))
    );
    assert!(rec["ended_at_ms"].as_f64().unwrap() - rec["at_ms"].as_f64().unwrap() >= 300.0);

    // Not streamed: half the body, then silence.
    let mut live = Live::open(addr, CHAT, &request(CHAT, "fb-stream-stall:id=json", false));
    live.until("\r\n\r\n{");
    assert!(live.quiet_for(Duration::from_millis(200)));
}

#[test]
fn m10_malformed_sse_event_mid_stream() {
    let (addr, _server) = server();
    let m = "fb-malformed-sse";
    let r = ask(addr, CHAT, m, true);
    assert!(r.complete);
    let data = sse_data_lines(&r);
    // Preamble, two deltas, the bad line, the other five deltas, finish, [DONE].
    assert_eq!(data.len(), 11, "{data:?}");
    assert_eq!(data[3], r#"{"choices":[{"delta":{"content":"#);
    assert!(serde_json::from_str::<Value>(&data[3]).is_err());
    for (i, d) in data.iter().enumerate().filter(|(i, _)| *i != 3 && *i != 10) {
        assert!(serde_json::from_str::<Value>(d).is_ok(), "line {i} is JSON");
    }
    assert_eq!(data[10], "[DONE]");
    assert_eq!(chat_deltas(&r), answer(m), "skipping the bad line loses nothing");

    let r = ask(addr, MESSAGES, "fb-malformed-sse:k=1", true);
    let text = r.text();
    let bad = "event: content_block_delta\ndata: {\"delta\":\n\n";
    let at = text.find(bad).expect("the bad event");
    assert!(text[..at].contains("answer from fb-malformed-sse:k=1:") && !text[..at].contains(" w1"));
    assert_eq!(anthropic_deltas(&r), answer("fb-malformed-sse:k=1"));

    // Not streamed: a 200 JSON body that does not parse.
    let r = ask(addr, CHAT, "fb-malformed-sse:id=json", false);
    assert_eq!((r.status, r.complete), (200, true));
    assert!(serde_json::from_slice::<Value>(&r.body).is_err());
}

#[test]
fn m11_no_done_terminator() {
    let (addr, _server) = server();
    let m = "fb-no-done";
    let r = ask(addr, CHAT, m, true);
    assert!(r.complete, "the body ends cleanly");
    let data = sse_data_lines(&r);
    assert!(!data.iter().any(|d| d == "[DONE]"));
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert_eq!(chat_deltas(&r), answer(m));

    let r = ask(addr, MESSAGES, m, true);
    assert!(r.complete);
    let kinds = sse_events(&r);
    assert_eq!(kinds.last().map(String::as_str), Some("message_delta"));
    assert!(!kinds.iter().any(|e| e == "message_stop"));

    let r = ask(addr, RESPONSES, m, true);
    let kinds = sse_events(&r);
    assert_eq!(kinds.last().map(String::as_str), Some("response.output_item.done"));
    assert!(!kinds.iter().any(|e| e == "response.completed"));
}

#[test]
fn m12_context_length_exceeded() {
    let (addr, _server) = server();
    let m = "fb-context-length";
    let r = ask(addr, CHAT, m, true);
    assert_eq!(r.status, 400);
    assert_eq!(
        r.text(),
        "{\"error\":{\"code\":\"context_length_exceeded\",\"message\":\"This model's maximum context length is \
         128000 tokens. However, your messages resulted in 128001 tokens. Please reduce the length of the \
         messages.\",\"param\":\"messages\",\"type\":\"invalid_request_error\"}}"
    );
    let r = ask(addr, MESSAGES, m, false);
    assert_eq!(
        (r.status, r.text()),
        (
            400,
            "{\"error\":{\"message\":\"prompt is too long: 200001 tokens > 200000 maximum\",\
             \"type\":\"invalid_request_error\"},\"type\":\"error\"}"
                .to_owned()
        )
    );
    let r = ask(addr, RESPONSES, m, false);
    assert_eq!(
        (r.json()["error"]["code"].clone(), r.json()["error"]["param"].clone()),
        (json!("context_length_exceeded"), json!("input"))
    );
}

#[test]
fn m13_content_filter() {
    let (addr, _server) = server();
    let r = ask(addr, CHAT, "fb-content-filter", false);
    assert_eq!(r.status, 400);
    assert_eq!(
        r.text(),
        "{\"error\":{\"code\":\"content_filter\",\"innererror\":{\"code\":\"ResponsibleAIPolicyViolation\",\
         \"content_filter_result\":{\"hate\":{\"filtered\":true,\"severity\":\"high\"}}},\"message\":\"The \
         response was filtered due to the prompt triggering Azure OpenAI's content management policy (reason: \
         hate, severity: high). Please modify your prompt and retry.\",\"param\":\"prompt\",\"status\":400,\
         \"type\":null}}"
    );
    let r = ask(
        addr,
        CHAT,
        "fb-content-filter:code=content_policy_violation:reason=violence",
        true,
    );
    assert_eq!(
        (r.status, r.text()),
        (
            400,
            "{\"error\":{\"code\":\"content_policy_violation\",\"message\":\"Your request was rejected as a \
             result of our safety system (reason: violence).\",\"param\":null,\"type\":\"invalid_request_error\"}}"
                .to_owned()
        )
    );
    let r = ask(addr, MESSAGES, "fb-content-filter", false);
    assert_eq!(
        r.text(),
        "{\"error\":{\"message\":\"Output blocked by content filtering policy (reason: hate)\",\
         \"type\":\"invalid_request_error\"},\"type\":\"error\"}"
    );
}

#[test]
fn m14_fallback_that_rejects_assistant_prefill() {
    let (addr, _server) = server();
    let m = "fb-no-prefill";
    assert_eq!(chat_content(&ask(addr, CHAT, m, false)), json!(answer(m)));
    let prefill = |path: &str| {
        json!({"model": m, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "answer from fb-stream-cut: w1"},
        ]})
        .to_string()
        .replace(
            "\"messages\"",
            if path == RESPONSES { "\"input\"" } else { "\"messages\"" },
        )
    };
    let r = post(addr, CHAT, &prefill(CHAT));
    assert_eq!(r.status, 400);
    assert_eq!(
        r.text(),
        "{\"error\":{\"code\":null,\"message\":\"This model does not support assistant message prefill. The \
         conversation must end with a user message.\",\"param\":\"messages\",\"type\":\"invalid_request_error\"}}"
    );
    let r = post(addr, MESSAGES, &prefill(MESSAGES));
    assert_eq!(
        r.text(),
        "{\"error\":{\"message\":\"This model does not support assistant message prefill. The conversation \
         must end with a user message.\",\"type\":\"invalid_request_error\"},\"type\":\"error\"}"
    );
    assert_eq!(post(addr, RESPONSES, &prefill(RESPONSES)).status, 400);
    // A continuation instruction (the prefix quoted in the user turn) is answered.
    let quoted = json!({"model": m, "messages": [
        {"role": "user", "content": "Continue exactly after: answer from fb-stream-cut: w1"},
    ]});
    let r = post(addr, CHAT, &quoted.to_string());
    assert_eq!(chat_content(&r), " w2 w3 w4 w5 w6");
}

#[test]
fn m15_flap_down_for_a_window_then_healthy() {
    let (addr, _server) = server();
    // Generous: the first two requests must land inside the window.
    let m = "fb-flap:down=2000";
    assert_eq!(ask(addr, CHAT, m, false).status, 503);
    assert_eq!(ask(addr, CHAT, m, false).status, 503, "still inside the window");
    let first = records(addr, m)[0]["at_ms"].as_f64().unwrap();
    let now = get_json(addr, "/control/health")["uptime_ms"].as_f64().unwrap();
    std::thread::sleep(Duration::from_millis((first + 2050.0 - now).max(0.0) as u64));
    for _ in 0..2 {
        let r = ask(addr, CHAT, m, false);
        assert_eq!((r.status, chat_content(&r)), (200, json!(answer(m))));
    }
    let log = records(addr, m);
    assert!(log[2]["at_ms"].as_f64().unwrap() - first >= 2000.0);
    assert_eq!(log[1]["status"], 503);
    // A reset starts the window again.
    call(addr, "POST", "/control/reset", &[], "");
    let r = ask(addr, MESSAGES, "fb-flap:down=2000:status=529", false);
    assert_eq!(
        (r.status, r.json()["error"]["type"].clone()),
        (529, json!("overloaded_error"))
    );
    assert_eq!(ask(addr, CHAT, m, false).status, 503);
}

#[test]
fn m16_healthy_fallback_names_itself_and_reports_usage() {
    let (addr, _server) = server();
    let m = "fb-ok";
    let r = ask(addr, CHAT, m, false);
    assert_eq!(r.header("x-fault-spec"), Some("fb-ok"));
    assert_eq!(
        r.text(),
        "{\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"logprobs\":null,\"message\":{\"content\":\
         \"answer from fb-ok: w1 w2 w3 w4 w5 w6\",\"refusal\":null,\"role\":\"assistant\"}}],\"created\":\
         1700000000,\"id\":\"chatcmpl-rw-1\",\"model\":\"fb-ok\",\"object\":\"chat.completion\",\"usage\":\
         {\"completion_tokens\":9,\"prompt_tokens\":1,\"total_tokens\":10}}"
    );
    let body = json!({"model": m, "stream": true, "stream_options": {"include_usage": true},
                      "messages": [{"role": "user", "content": "two words"}]});
    let r = post(addr, CHAT, &body.to_string());
    let data = sse_data_lines(&r);
    assert_eq!(
        data[data.len() - 2..],
        [
            "{\"choices\":[],\"created\":1700000000,\"id\":\"chatcmpl-rw-2\",\"model\":\"fb-ok\",\"object\":\
             \"chat.completion.chunk\",\"usage\":{\"completion_tokens\":9,\"prompt_tokens\":2,\"total_tokens\":11}}"
                .to_owned(),
            "[DONE]".to_owned()
        ]
    );
    assert_eq!(chat_deltas(&r), answer(m));
    assert!(data[..data.len() - 2].iter().all(|d| d.ends_with(",\"usage\":null}")));

    let r = ask(addr, MESSAGES, m, false);
    assert_eq!(
        r.text(),
        "{\"content\":[{\"text\":\"answer from fb-ok: w1 w2 w3 w4 w5 w6\",\"type\":\"text\"}],\"id\":\"msg_rw_3\",\
         \"model\":\"fb-ok\",\"role\":\"assistant\",\"stop_reason\":\"end_turn\",\"stop_sequence\":null,\"type\":\
         \"message\",\"usage\":{\"input_tokens\":1,\"output_tokens\":9}}"
    );
    let r = ask(addr, MESSAGES, m, true);
    let mut want = vec!["message_start", "content_block_start"];
    want.extend(["content_block_delta"; 7]);
    want.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(sse_events(&r), want);
    assert_eq!(anthropic_deltas(&r), answer(m));
    assert!(r.text().contains("\"usage\":{\"output_tokens\":9}"));

    let r = ask(addr, RESPONSES, m, false);
    let body = r.json();
    assert_eq!(
        (body["object"].clone(), body["model"].clone()),
        (json!("response"), json!(m))
    );
    assert_eq!(body["output"][0]["content"][0]["text"], answer(m));
    assert_eq!(body["usage"]["output_tokens"], 9);
    let r = ask(addr, RESPONSES, m, true);
    let done = sse_data_lines(&r).last().cloned().unwrap();
    let done: Value = serde_json::from_str(&done).unwrap();
    assert_eq!(done["type"], "response.completed");
    assert_eq!(done["response"]["output"][0]["content"][0]["text"], answer(m));
    assert_eq!(done["response"]["usage"]["total_tokens"], 10);
}

#[test]
fn a_cut_stream_is_continued_byte_for_byte_by_prefill_or_instruction() {
    let (addr, _server) = server();
    for path in [CHAT, MESSAGES] {
        let primary = "fb-stream-cut:k=3";
        let r = ask(addr, path, primary, true);
        let delivered = if path == CHAT {
            chat_deltas(&r)
        } else {
            anthropic_deltas(&r)
        };
        assert_eq!(delivered, "answer from fb-stream-cut:k=3: w1 w2");
        // Prefill: the fallback streams only the rest.
        let body = json!({"model": "fb-ok", "stream": true, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": delivered},
        ]});
        let r = post(addr, path, &body.to_string());
        let rest = if path == CHAT {
            chat_deltas(&r)
        } else {
            anthropic_deltas(&r)
        };
        assert_eq!(format!("{delivered}{rest}"), answer(primary), "{path}");
    }
    let rec = &records(addr, "fb-ok")[0];
    assert_eq!(
        rec["continuation"],
        json!({"via": "prefill", "prefix": "answer from fb-stream-cut:k=3: w1 w2", "of_model": "fb-stream-cut:k=3"})
    );
    assert_eq!(rec["text"], " w3 w4 w5 w6");

    // Instruction: the prefix quoted in the last user turn; resend=1 repeats it.
    let quoted = |model: &str| {
        json!({"model": model, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "user", "content": "Continue exactly after «answer from fb-stream-cut:k=3: w1 w2»"},
        ]})
        .to_string()
    };
    assert_eq!(chat_content(&post(addr, CHAT, &quoted("fb-ok"))), " w3 w4 w5 w6");
    assert_eq!(
        chat_content(&post(addr, CHAT, &quoted("fb-ok:resend=1"))),
        json!(answer("fb-stream-cut:k=3"))
    );

    // A prefill that is not exactly a delivered prefix fails loudly.
    let body = json!({"model": "fb-ok", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "answer from fb-stream-cut:k=3: w1 w1"},
    ]});
    let r = post(addr, CHAT, &body.to_string());
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "continuation_mismatch");
}

#[test]
fn the_log_says_what_each_model_was_sent_and_when() {
    let (addr, _server) = server();
    let headers = [("retrywise-request-id", "L-1"), ("retrywise-attempt", "1")];
    call(addr, "POST", CHAT, &headers, &request(CHAT, "fb-503", false));
    call(addr, "POST", CHAT, &headers, &request(CHAT, "fb-ok", true));
    let log = get_json(addr, "/control/requests?logical_id=L-1");
    let log = log.as_array().unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0]["model"], "fb-503");
    assert_eq!(log[0]["fault"], "fb-503");
    assert_eq!(log[0]["spec"], "fb-503");
    assert_eq!(log[0]["path"], CHAT);
    assert_eq!(log[0]["status"], 503);
    assert_eq!(
        (log[0]["end"].clone(), log[0]["text"].clone()),
        (json!("complete"), json!(""))
    );
    assert_eq!(log[1]["stream"], true);
    assert_eq!(
        (log[1]["end"].clone(), log[1]["deltas"].clone()),
        (json!("complete"), json!(7))
    );
    assert_eq!(log[1]["text"], answer("fb-ok"));
    assert_eq!(log[1]["attempt"], 1);
    for rec in log {
        assert!(rec["ended_at_ms"].as_f64().unwrap() >= rec["at_ms"].as_f64().unwrap());
    }
    assert!(log[1]["at_ms"].as_f64() >= log[0]["at_ms"].as_f64());
    assert_eq!(
        get_json(addr, "/control/requests?fault=fb-ok")
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        get_json(addr, "/control/counts")["by_model"],
        json!({"fb-503": 1, "fb-ok": 1})
    );

    // A path spec wins over the model; the model is still logged.
    let r = post(
        addr,
        "/s/status:502/v1/chat/completions",
        &request(CHAT, "fb-ok", false),
    );
    assert_eq!(r.status, 502);
    let rec = &get_json(addr, "/control/requests?spec=status:502")[0];
    assert_eq!(
        (rec["model"].clone(), rec["fault"].clone()),
        (json!("fb-ok"), Value::Null)
    );

    // A typo in a fault model is a loud, non-retryable 400, and logged.
    let r = ask(addr, CHAT, "fb-stream-cutt", false);
    assert_eq!(
        (r.status, r.json()["error"]["code"].clone()),
        (400, json!("invalid_fault_spec"))
    );
    assert_eq!(records(addr, "fb-stream-cutt")[0]["status"], 400);
}
