//! End-to-end checks of every path fault spec and the control API, over real
//! sockets with the minimal client in `common` (the fault models have `models.rs`).

mod common;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::*;
use serde_json::{json, Value};

#[test]
fn ok_returns_a_chat_completion() {
    let (addr, _server) = server();
    for path in ["/s/ok/v1/chat/completions", "/v1/chat/completions"] {
        let reply = post(addr, path, r#"{"model":"gpt-test","messages":[]}"#);
        assert_eq!(reply.status, 200);
        assert!(reply.complete);
        assert_eq!(reply.header("content-type"), Some("application/json"));
        let body = reply.json();
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["model"], "gpt-test");
        assert_eq!(body["choices"][0]["message"]["content"], "ok");
    }
}

#[test]
fn ok_streams_five_openai_chunks_then_done() {
    let (addr, _server) = server();
    let reply = post(addr, "/s/ok/v1/chat/completions", r#"{"stream":true}"#);
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some("text/event-stream"));
    assert!(reply.complete, "stream ends with the chunked terminator");
    let data = sse_data_lines(&reply);
    assert_eq!(data.len(), 6, "{data:?}");
    assert_eq!(data[5], "[DONE]");
    let chunks: Vec<Value> = data[..5]
        .iter()
        .map(|d| serde_json::from_str(d).expect("chunk JSON"))
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[1]["choices"][0]["delta"]["content"], "c1 ");
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "stop");
}

#[test]
fn anthropic_paths_get_message_shapes() {
    let (addr, _server) = server();
    let reply = post(addr, "/s/ok/v1/messages", r#"{"model":"claude-test"}"#);
    assert_eq!(reply.status, 200);
    let body = reply.json();
    assert_eq!(body["type"], "message");
    assert_eq!(body["model"], "claude-test");
    assert_eq!(body["content"][0]["text"], "ok");

    let reply = post(addr, "/s/ok/v1/messages", r#"{"stream":true}"#);
    assert!(reply.complete);
    assert_eq!(
        sse_events(&reply),
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );

    let reply = post(addr, "/s/status:529:overloaded_error/v1/messages", "{}");
    assert_eq!(reply.status, 529);
    let body = reply.json();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "overloaded_error");

    let reply = post(addr, "/s/status:429/v1/messages", "{}");
    assert_eq!(reply.json()["error"]["type"], "rate_limit_error");
}

#[test]
fn status_specs_return_openai_error_bodies() {
    let (addr, _server) = server();
    let reply = post(addr, "/s/status:503/v1/chat/completions", "{}");
    assert_eq!(reply.status, 503);
    assert_eq!(reply.json()["error"]["code"], Value::Null);
    assert_eq!(reply.json()["error"]["type"], "server_error");

    let reply = post(addr, "/s/status:429:insufficient_quota/v1/chat/completions", "{}");
    assert_eq!(reply.status, 429);
    assert_eq!(reply.json()["error"]["code"], "insufficient_quota");
    assert_eq!(reply.json()["error"]["type"], "insufficient_quota");

    for code in [400, 401] {
        let reply = post(addr, &format!("/s/status:{code}/v1/chat/completions"), "{}");
        assert_eq!(reply.status, code);
        assert!(reply.json()["error"]["message"].is_string());
    }
}

#[test]
fn flaky_fails_n_times_per_logical_request() {
    let (addr, _server) = server();
    let path = "/s/flaky:2:503/v1/chat/completions";
    let statuses: Vec<u16> = (0..4).map(|_| post_as(addr, path, "A").status).collect();
    assert_eq!(statuses, [503, 503, 200, 200]);
    // Another logical request starts its own sequence.
    assert_eq!(post_as(addr, path, "B").status, 503);
    // Without a logical id the whole spec is one sequence.
    let anon: Vec<u16> = (0..3).map(|_| post(addr, path, "{}").status).collect();
    assert_eq!(anon, [503, 503, 200]);
}

#[test]
fn retry_after_forms() {
    let (addr, _server) = server();
    let reply = post(addr, "/s/ra-secs:1.5/v1/chat/completions", "{}");
    assert_eq!(reply.status, 429);
    assert_eq!(reply.header("retry-after"), Some("1.5"));
    assert_eq!(reply.header("retry-after-ms"), None);

    let reply = post(addr, "/s/ra-ms:250/v1/chat/completions", "{}");
    assert_eq!(reply.status, 429);
    assert_eq!(reply.header("retry-after-ms"), Some("250"));
    assert_eq!(reply.header("retry-after"), None);

    let reply = post(addr, "/s/ra-date:30/v1/chat/completions", "{}");
    assert_eq!(reply.status, 429);
    let date = reply.header("retry-after").expect("retry-after");
    let at = httpdate::parse_http_date(date).expect("IMF-fixdate");
    let ahead = at
        .duration_since(SystemTime::now())
        .expect("in the future")
        .as_secs_f64();
    assert!((27.0..=30.0).contains(&ahead), "{ahead}");

    // `then-ok`: only the first attempt of each logical request is refused.
    let path = "/s/ra-secs:0:then-ok/v1/chat/completions";
    assert_eq!(post_as(addr, path, "X").status, 429);
    assert_eq!(post_as(addr, path, "X").status, 200);
    assert_eq!(post_as(addr, path, "Y").status, 429);
}

#[test]
fn retry_after_on_another_status() {
    let (addr, _server) = server();
    let reply = post(addr, "/s/ra-secs:1:503/v1/chat/completions", "{}");
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(reply.json()["error"]["type"], "server_error");
    let path = "/s/ra-ms:20:503:then-ok/v1/chat/completions";
    assert_eq!(post_as(addr, path, "Z").status, 503);
    assert_eq!(post_as(addr, path, "Z").status, 200);
}

#[test]
fn seq_gives_each_attempt_of_a_logical_request_its_own_fault() {
    let (addr, _server) = server();
    let path = "/s/seq:ra-secs:1,status:500,sse-cut:2/v1/chat/completions";
    let a = post_as(addr, path, "S1");
    assert_eq!((a.status, a.header("retry-after")), (429, Some("1")));
    assert_eq!(post_as(addr, path, "S1").status, 500);
    let cut = call(
        addr,
        "POST",
        path,
        &[("retrywise-request-id", "S1")],
        r#"{"stream":true}"#,
    );
    assert_eq!(cut.status, 200);
    assert!(!cut.complete, "the third step cuts the stream");
    // After the last step: ok. Another logical request starts over.
    assert_eq!(post_as(addr, path, "S1").status, 200);
    assert_eq!(post_as(addr, path, "S2").status, 429);
    let records = get_json(addr, "/control/requests?logical_id=S1");
    let statuses: Vec<&Value> = records.as_array().unwrap().iter().map(|r| &r["status"]).collect();
    assert_eq!(statuses, [&json!(429), &json!(500), &json!(200), &json!(200)]);
}

#[test]
fn drop_closes_without_any_response() {
    let (addr, _server) = server();
    let reply = post(addr, "/s/drop/v1/chat/completions", r#"{"model":"m"}"#);
    assert_eq!(reply.raw_len, 0, "not a single byte of response");
    // The request did arrive: the outcome is unknown to the client, not absent.
    let records = get_json(addr, "/control/requests?spec=drop");
    assert_eq!(records.as_array().map(Vec::len), Some(1));
    assert_eq!(records[0]["status"], Value::Null);
}

#[test]
fn a_request_whose_body_never_arrives_takes_no_step() {
    let (addr, _server) = server();
    let path = "/s/seq:status:503,ok/v1/chat/completions";
    {
        // Promises 100 bytes, sends 2, goes away.
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nhost: x\r\nretrywise-request-id: r9\r\ncontent-length: 100\r\n\r\n{{}}"
        )
        .unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(post_as(addr, path, "r9").status, 503, "the first step is still unused");
    assert_eq!(post_as(addr, path, "r9").status, 200);
}

#[test]
fn write_cut_closes_while_the_body_is_still_being_sent() {
    let (addr, _server) = server();
    let path = "/s/write-cut:64/v1/chat/completions";
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let len = 16 << 20;
    write!(
        s,
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
    )
    .unwrap();
    // The server closes after 64 KiB: writing the rest of 16 MiB fails long
    // before it is all sent (it fits no socket buffer).
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    let err = loop {
        match s.write_all(&chunk) {
            Ok(()) => sent += chunk.len(),
            Err(e) => break e,
        }
        assert!(sent < len, "the whole body was accepted");
    };
    assert!(
        matches!(err.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset),
        "{err:?}"
    );
    let records = get_json(addr, "/control/requests?spec=write-cut%3A64");
    assert_eq!(records.as_array().map(Vec::len), Some(1));
    assert_eq!(records[0]["status"], Value::Null);
}

#[test]
fn sse_cut_delivers_exactly_n_chunks_then_breaks() {
    let (addr, _server) = server();
    let reply = post(addr, "/s/sse-cut:2/v1/chat/completions", r#"{"stream":true}"#);
    assert_eq!(reply.status, 200);
    assert!(!reply.complete, "no chunked terminator");
    let data = sse_data_lines(&reply);
    assert_eq!(data.len(), 2, "{data:?}");
    assert!(!data.iter().any(|d| d == "[DONE]"));

    // Zero chunks: headers, then the connection dies before any event.
    let reply = post(addr, "/s/sse-cut:0/v1/messages", "{}");
    assert_eq!(reply.status, 200);
    assert!(!reply.complete);
    assert!(reply.body.is_empty());
}

#[test]
fn slow_sse_and_delay_wait_before_sending() {
    let (addr, _server) = server();
    let started = Instant::now();
    let reply = post(addr, "/s/slow-sse:40/v1/chat/completions", "{}");
    assert!(started.elapsed() >= Duration::from_millis(4 * 40));
    assert!(reply.complete);
    assert_eq!(sse_data_lines(&reply).len(), 6);

    let started = Instant::now();
    let reply = post(addr, "/s/delay:100/v1/chat/completions", "{}");
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["object"], "chat.completion");
}

#[test]
fn malformed_is_200_json_that_does_not_parse() {
    let (addr, _server) = server();
    let reply = post(addr, "/s/malformed/v1/chat/completions", "{}");
    assert_eq!(reply.status, 200);
    assert!(reply.complete);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert!(serde_json::from_slice::<Value>(&reply.body).is_err());
}

#[test]
fn hang_never_answers_and_frees_work_when_the_client_leaves() {
    let (addr, _server) = server();
    let mut stream = connect(addr);
    send(&mut stream, "POST", "/s/hang/v1/chat/completions", &[], "{}");
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("expected no answer, got {other:?}"),
    }
    assert_eq!(get_json(addr, "/control/health")["in_flight"], 1);
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        if get_json(addr, "/control/health")["in_flight"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "hung request outlived its client");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn recording_captures_propagation_headers_and_reset_clears() {
    let (addr, _server) = server();
    let headers = [
        ("retrywise-request-id", "L-1"),
        ("retrywise-attempt", "2"),
        ("retrywise-deadline-ms", "1500"),
        ("idempotency-key", "idem-7"),
        ("x-stainless-retry-count", "0"),
    ];
    let path = "/s/flaky:1:503/v1/chat/completions";
    assert_eq!(call(addr, "POST", path, &headers, "{}").status, 503);
    assert_eq!(call(addr, "POST", path, &headers, "{}").status, 200);
    post_as(addr, "/s/status:400/v1/chat/completions", "L-2");
    call(addr, "GET", "/v1/models", &[("retrywise-attempt", "x")], "");

    let records = get_json(addr, "/control/requests?logical_id=L-1");
    let records = records.as_array().expect("array");
    assert_eq!(records.len(), 2);
    let first = &records[0];
    assert_eq!(first["seq"], 1);
    assert_eq!(first["method"], "POST");
    assert_eq!(first["path"], path);
    assert_eq!(first["api_path"], "/v1/chat/completions");
    assert_eq!(first["spec"], "flaky:1:503");
    assert_eq!(first["attempt"], 2);
    assert_eq!(first["deadline_ms"], 1500);
    assert_eq!(first["idempotency_key"], "idem-7");
    assert_eq!(first["x_stainless_retry_count"], "0");
    assert_eq!(first["retrywise_headers"]["retrywise-deadline-ms"], "1500");
    assert_eq!(first["status"], 503);
    assert_eq!(records[1]["status"], 200);
    assert!(records[1]["at_ms"].as_f64() >= first["at_ms"].as_f64());

    let plain = get_json(addr, "/control/requests?spec=ok");
    assert_eq!(plain[0]["api_path"], "/v1/models");
    assert_eq!(plain[0]["attempt"], Value::Null, "unparseable attempt is null");
    assert_eq!(plain[0]["logical_id"], Value::Null);

    let counts = get_json(addr, "/control/counts");
    assert_eq!(counts["total"], 4);
    assert_eq!(counts["by_logical_id"], json!({"L-1": 2, "L-2": 1}));
    assert_eq!(counts["by_spec"]["flaky:1:503"], 2);

    let reset = call(addr, "POST", "/control/reset", &[], "");
    assert_eq!(reset.status, 200);
    assert_eq!(get_json(addr, "/control/requests"), json!([]));
    assert_eq!(get_json(addr, "/control/counts")["total"], 0);
    // Reset also restarts fault sequences.
    assert_eq!(call(addr, "POST", path, &headers, "{}").status, 503);
}

#[test]
fn closed_port_refuses_connections() {
    let (addr, _server) = server();
    let port = get_json(addr, "/control/closed-port")["port"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .expect("port");
    let err = TcpStream::connect(("127.0.0.1", port)).expect_err("nothing listens");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
}

#[test]
fn bad_specs_and_control_misuse_are_rejected() {
    let (addr, _server) = server();
    let reply = post(addr, "/s/status:abc/v1/chat/completions", "{}");
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["error"]["code"], "invalid_fault_spec");
    // Percent-encoded colons are accepted too.
    assert_eq!(post(addr, "/s/status%3A418/v1/chat/completions", "{}").status, 418);

    assert_eq!(call(addr, "GET", "/control/nope", &[], "").status, 404);
    let reply = call(addr, "GET", "/control/reset", &[], "");
    assert_eq!(reply.status, 405);
    assert_eq!(reply.header("allow"), Some("POST"));
}

#[test]
fn in_process_handle_exposes_state_and_stops() {
    let (addr, server) = server();
    assert_eq!(server.addr(), addr);
    let base = server.base_url("status:503");
    let path = base.trim_start_matches(&format!("http://{addr}"));
    assert_eq!(post(addr, &format!("{path}/v1/chat/completions"), "{}").status, 503);
    assert_eq!(server.state().counts().total, 1);
    server.shutdown().expect("clean shutdown");
    assert!(TcpStream::connect(addr).is_err(), "listener closed");
}

/// Starts the real binary the way the Python and Node harnesses do.
fn start_binary() -> (std::process::Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_retrywise-fault-server"))
        .arg("--exit-on-stdin-close")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn binary");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read");
    let addr = line
        .trim()
        .strip_prefix("LISTENING ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    (child, addr)
}

fn wait_exit(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("server did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn binary_announces_port_and_exits_when_stdin_closes() {
    let (mut child, addr) = start_binary();
    assert_eq!(get_json(addr, "/control/health")["status"], "ok");
    drop(child.stdin.take());
    assert!(wait_exit(&mut child).success());
}

#[cfg(unix)]
#[test]
fn binary_exits_cleanly_on_sigterm() {
    let (mut child, addr) = start_binary();
    assert_eq!(post(addr, "/s/ok/v1/chat/completions", "{}").status, 200);
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    assert!(wait_exit(&mut child).success());
}
