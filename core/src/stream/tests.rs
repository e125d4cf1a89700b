//! The gate's tests: preamble shapes, error events, framing, chunking.

use super::*;
use proptest::prelude::*;

const ROLE: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":null}]}\n\n";
const TEXT: &str =
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";

fn sse() -> StreamGate {
    StreamGate::new(Some("text/event-stream; charset=utf-8"))
}

#[test]
fn openai_role_chunk_is_held_until_the_first_text() {
    let mut g = sse();
    assert_eq!(
        g.clone().feed_pass(ROLE.as_bytes()),
        Some(Vec::new()),
        "held: nothing yet"
    );
    assert_eq!(g.feed(ROLE.as_bytes()).len(), 0);
    assert_eq!(g.phase(), Phase::StreamOpen);
    assert_eq!(g.held(), ROLE.len());
    assert_eq!(
        g.feed(TEXT.as_bytes()).into_owned(),
        format!("{ROLE}{TEXT}").into_bytes()
    );
    assert_eq!(g.phase(), Phase::StreamVisible);
    // Once visible, chunks pass through as they are (borrowed, not copied).
    assert!(matches!(g.feed(DONE.as_bytes()), Cow::Borrowed(b) if b == DONE.as_bytes()));
    assert_eq!(g.feed_pass(DONE.as_bytes()), None, "the caller's own chunk");
    assert_eq!(g.finish(), b"");
}

#[test]
fn every_kind_of_output_releases() {
    for data in [
        r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t","function":{"name":"f","arguments":""}}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"refusal":"no"}}]}"#,
        r#"{"id":"c","object":"text_completion","choices":[{"text":"Hello","index":0,"logprobs":null,"finish_reason":null}]}"#,
        r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"Hi"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"role":"assistant"}}],"usage":{"total_tokens":3}}"#,
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        r#"{"choices":[{"index":0,"delta":{"role":"assistant"},"logprobs":{"content":[{"token":"a"}]}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"role":"assistant"}}],"error":{"message":"x"}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
        r#"{"type":"response.output_item.added","item":{"type":"function_call","name":"f","arguments":""}}"#,
        r#"{"type":"response.output_text.delta","delta":"Hi"}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"Hi"}]}}]}"#,
        "[DONE]",
    ] {
        let mut g = sse();
        let ev = format!("data: {data}\n\n");
        assert_eq!(g.feed(ev.as_bytes()).into_owned(), ev.as_bytes(), "{data}");
        assert!(g.is_visible(), "{data}");
    }
}

#[test]
fn error_events_before_output_are_held_and_never_delivered() {
    for (ev, code) in [
        (
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
            Some("overloaded_error"),
        ),
        (
            "data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"code\":null}}\n\n",
            Some("server_error"),
        ),
        (
            "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"error\":{\"code\":\"server_error\",\"message\":\"x\"}}}\n\n",
            Some("server_error"),
        ),
        ("event: error\ndata: not json\n\n", None),
    ] {
        let mut g = sse();
        assert!(g.feed(ROLE.as_bytes()).is_empty());
        assert!(g.feed(ev.as_bytes()).is_empty(), "{ev}");
        // Whatever follows the error is not delivered either.
        assert!(g.feed(TEXT.as_bytes()).is_empty(), "{ev}");
        assert!(g.finish().is_empty(), "{ev}");
        assert!(!g.is_visible() && !g.watching(), "{ev}");
        let e = g.stream_error().expect(ev);
        assert_eq!((e.code.as_deref(), e.after_output), (code, false), "{ev}");
        let o = g.outcome(200);
        assert_eq!((o.phase, o.status), (Some(Phase::StreamOpen), Some(e.status())), "{ev}");
    }
    let e = |code: &str| StreamError {
        code: Some(code.into()),
        message: None,
        after_output: false,
    };
    assert_eq!(e("overloaded_error").status(), 529);
    assert_eq!(e("rate_limit_error").status(), 429);
    assert_eq!(e("invalid_request_error").status(), 400);
    assert_eq!(e("api_error").status(), 500);
}

#[test]
fn error_events_after_output_are_watched_for() {
    // The error in the same chunk as the first output, and in a later chunk split mid-line.
    let err = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n";
    let mut g = sse();
    let both = format!("{TEXT}{err}");
    assert_eq!(g.feed(both.as_bytes()).into_owned(), both.as_bytes());
    assert_eq!(g.stream_error().map(|e| e.after_output), Some(true));
    assert_eq!(g.outcome(200).phase, Some(Phase::StreamVisible));

    let mut g = sse();
    for _ in 0..4 {
        g.feed(TEXT.as_bytes());
    }
    assert!(g.stream_error().is_none() && g.watching());
    let (a, b) = err.split_at(30);
    // An unfinished event waits for its blank line (it could turn out malformed).
    assert_eq!(g.feed(a.as_bytes()).into_owned(), b"");
    assert!(g.stream_error().is_none());
    assert_eq!(g.feed(b.as_bytes()).into_owned(), err.as_bytes());
    assert_eq!(
        g.stream_error().and_then(|e| e.code.as_deref()),
        Some("overloaded_error")
    );
    assert!(!g.watching());
    // A clean stream ends a success.
    let mut g = sse();
    g.feed(TEXT.as_bytes());
    g.feed(DONE.as_bytes());
    assert_eq!(g.outcome(200), crate::outcome::Outcome::status(200));
}

#[test]
fn end_at_error_keeps_the_error_event_from_the_consumer() {
    let err = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n";
    // In the chunk that releases the preamble, and after release split mid-line: the
    // output before the event is delivered, the event and what follows are not.
    let mut g = sse().end_at_error();
    let all = format!("{ROLE}{TEXT}{err}{TEXT}");
    assert_eq!(
        g.feed(all.as_bytes()).into_owned(),
        format!("{ROLE}{TEXT}").into_bytes()
    );
    assert_eq!(g.stream_error().map(|e| e.after_output), Some(true));
    assert_eq!((g.feed(TEXT.as_bytes()).len(), g.finish().len()), (0, 0));
    assert!(!g.watching());
    let o = g.outcome(200);
    assert_eq!(
        (o.status, o.phase, o.vendor_code.as_deref()),
        (Some(529), Some(Phase::StreamVisible), Some("overloaded_error"))
    );

    let mut g = sse().end_at_error();
    assert_eq!(
        g.feed(format!("{ROLE}{TEXT}").as_bytes()).len(),
        ROLE.len() + TEXT.len()
    );
    let (a, b) = err.split_at(30);
    let split = format!("{TEXT}{a}");
    assert_eq!(g.feed(split.as_bytes()).into_owned(), TEXT.as_bytes());
    assert_eq!(g.feed(b.as_bytes()).into_owned(), b"");
    assert_eq!(
        g.stream_error().and_then(|e| e.code.as_deref()),
        Some("overloaded_error")
    );
    // Before output it is held as without the option.
    let mut g = sse().end_at_error();
    assert_eq!(g.feed(format!("{ROLE}{err}").as_bytes()).len(), 0);
    assert_eq!(g.stream_error().map(|e| e.after_output), Some(false));
}

/// Feeds `chunks` through a gate (SSE) and a transcript of what it delivered.
fn delivered(chunks: &[&str], api: crate::types::ApiFamily) -> (StreamGate, crate::wire::Transcript) {
    let mut g = sse().end_at_error();
    let mut t = crate::wire::Transcript::new(api);
    for c in chunks {
        t.observe(&g.feed(c.as_bytes()));
    }
    (g, t)
}

#[test]
fn a_clean_end_after_text_without_a_finish_is_a_cut() {
    use crate::types::ApiFamily::{Anthropic, OpenAi};
    let stop = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
    // Text, then the body ends: a cut, continued elsewhere if the route says so.
    let (g, t) = delivered(&[ROLE, TEXT, TEXT], OpenAi);
    let o = g.end_outcome(200, &t);
    assert_eq!(
        (o.status, o.error, o.phase, o.resumable),
        (
            Some(200),
            Some(ErrorKind::ConnectionReset),
            Some(Phase::StreamVisible),
            true
        )
    );
    // With its finish (a finish_reason, or the terminator alone): the 200 it is.
    for tail in [&[stop][..], &[DONE][..], &[stop, DONE][..]] {
        let (g, t) = delivered(&[&[ROLE, TEXT][..], tail].concat(), OpenAi);
        assert_eq!(g.end_outcome(200, &t), crate::outcome::Outcome::status(200));
    }
    // Nothing shown (a preamble only, or an empty body): no answer was cut.
    for chunks in [&[ROLE][..], &[][..]] {
        let (g, t) = delivered(chunks, OpenAi);
        assert_eq!(g.end_outcome(200, &t), crate::outcome::Outcome::status(200));
    }
    // Anthropic: text blocks, then no message_stop.
    let start =
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\"}}\n\n";
    let block = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n";
    let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n";
    let end = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let (g, t) = delivered(&[start, block, delta], Anthropic);
    assert_eq!(g.end_outcome(200, &t).error, Some(ErrorKind::ConnectionReset));
    let (g, t) = delivered(&[start, block, delta, end], Anthropic);
    assert_eq!(g.end_outcome(200, &t), crate::outcome::Outcome::status(200));
    // An error event after text is the event's failure, continued when only text was shown.
    let err = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n";
    let (g, t) = delivered(&[ROLE, TEXT, err], OpenAi);
    let o = g.end_outcome(200, &t);
    assert_eq!(
        (o.status, o.error, o.phase, o.resumable),
        (Some(529), None, Some(Phase::StreamVisible), true)
    );
    // A half tool call (no text) is cut too, and cannot be continued: the call stops.
    let tool = "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"ci\"}}]}}]}\n\n";
    let (g, t) = delivered(&[ROLE, tool], OpenAi);
    let o = g.end_outcome(200, &t);
    assert_eq!(
        (o.error, o.phase, o.resumable),
        (Some(ErrorKind::ConnectionReset), Some(Phase::StreamVisible), false)
    );
    let (g, t) = delivered(&[ROLE, tool, stop], OpenAi);
    assert_eq!(g.end_outcome(200, &t), crate::outcome::Outcome::status(200));
    // An event stream of another shape, with no finish the reader knows: its status.
    let (g, t) = delivered(&["data: {\"type\":\"progress\",\"pct\":50}\n\n"], OpenAi);
    assert_eq!(g.end_outcome(200, &t), crate::outcome::Outcome::status(200));
    // Not an event stream: the status alone.
    let mut g = StreamGate::new(Some("application/json"));
    let mut t = crate::wire::Transcript::new(OpenAi);
    t.observe(&g.feed(b"{\"choices\":[]}"));
    assert_eq!(g.end_outcome(200, &t), crate::outcome::Outcome::status(200));
}

#[test]
fn preamble_shapes_are_held() {
    let anthropic = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[]}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: ping\ndata: {\"type\": \"ping\"}\n\n",
        ": keep-alive comment\n\n",
        "id: 7\nretry: 1000\n\n",
    );
    let responses = concat!(
        "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"output\":[\"x\"]}}\n\n",
        "event: response.in_progress\ndata: {\"type\":\"response.in_progress\"}\n\n",
        "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"item\":{\"type\":\"message\",\"id\":\"i\",\"role\":\"assistant\",\"status\":\"in_progress\",\"content\":[]}}\n\n",
        "event: response.content_part.added\ndata: {\"type\":\"response.content_part.added\",\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}\n\n",
    );
    let azure = concat!(
        "data: {\"choices\":[],\"prompt_filter_results\":[{\"prompt_index\":0}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},",
        "\"content_filter_results\":{\"hate\":{\"filtered\":false}},\"finish_reason\":null}],\"usage\":null}\n\n",
    );
    let groq = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"x_groq\":{\"id\":\"req_1\"}}\n\n";
    let reasoning = concat!(
        "event: response.queued\ndata: {\"type\":\"response.queued\"}\n\n",
        "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"item\":{\"type\":\"reasoning\",\"id\":\"rs\",\"summary\":[]}}\n\n",
    );
    let bom = format!("\u{feff}{ROLE}");
    for pre in [anthropic, responses, azure, groq, reasoning, ROLE, &bom] {
        let mut g = sse();
        assert_eq!(g.feed(pre.as_bytes()).len(), 0, "{pre}");
        assert_eq!(g.held(), pre.len());
        assert!(!g.is_visible());
        // The body ends with only preamble: all of it is delivered at the end.
        assert_eq!(g.finish(), pre.as_bytes());
    }
}

#[test]
fn line_endings_and_split_lines() {
    for sep in ["\n", "\r\n", "\r"] {
        let role = ROLE.replace('\n', sep);
        let text = TEXT.replace('\n', sep);
        let whole = format!("{role}{text}");
        let mut g = sse();
        // Byte by byte: nothing is released before the text event's blank line completes.
        let bytes = whole.as_bytes();
        let last = bytes.len() - if sep == "\r" { 0 } else { 1 };
        let mut out = Vec::new();
        for (i, b) in bytes.iter().enumerate() {
            let r = g.feed(std::slice::from_ref(b)).into_owned();
            if i + 1 < last {
                assert!(r.is_empty(), "{sep:?}: released at byte {i}");
            }
            out.extend(r);
        }
        if sep == "\r" {
            // A final CR may be half a CRLF: the event completes with the next byte or the end.
            assert!(!g.is_visible());
            out.extend(g.finish());
        }
        assert_eq!(out, bytes, "{sep:?}");
    }
}

#[test]
fn a_leading_byte_order_mark_is_ignored() {
    let whole = format!("\u{feff}{ROLE}{TEXT}");
    let mut g = sse();
    let mut out = Vec::new();
    for (i, b) in whole.as_bytes().iter().enumerate() {
        let r = g.feed(std::slice::from_ref(b)).into_owned();
        assert!(r.is_empty() || i + 1 == whole.len(), "released at byte {i}");
        out.extend(r);
    }
    assert_eq!(out, whole.as_bytes());
}

#[test]
fn multi_line_data_is_joined() {
    let mut g = sse();
    let ev = "data: {\"choices\":\ndata: [{\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    assert_eq!(g.feed(ev.as_bytes()).len(), 0);
    let ev2 = "data: {\"choices\":\ndata: [{\"delta\":{\"content\":\"x\"}}]}\n\n";
    assert_eq!(g.feed(ev2.as_bytes()).len(), ev.len() + ev2.len());
}

#[test]
fn other_bodies_pass_through() {
    for ct in [
        None,
        Some("application/json"),
        Some("text/plain"),
        Some("text/event-streamx"),
    ] {
        let mut g = StreamGate::new(ct);
        assert!(!g.may_hold(), "{ct:?}");
        // Nothing delivered yet: a cut now is still stream_open.
        assert_eq!(g.phase(), Phase::StreamOpen, "{ct:?}");
        assert!(g.feed(b"").is_empty());
        assert_eq!(g.phase(), Phase::StreamOpen, "{ct:?}: an empty chunk delivers nothing");
        assert_eq!(g.feed(ROLE.as_bytes()).into_owned(), ROLE.as_bytes());
        assert_eq!(g.phase(), Phase::StreamVisible, "{ct:?}");
        assert!(g.finish().is_empty());
    }
    let g = StreamGate::new(Some(" Text/Event-Stream "));
    assert!(g.may_hold() && !g.is_visible());
}

#[test]
fn a_long_preamble_is_released_at_the_hold_limit() {
    let mut g = sse();
    let mut fed = 0;
    let comment = ": padding padding padding padding padding padding padding padding\n";
    loop {
        let r = g.feed(comment.as_bytes());
        fed += comment.len();
        if !r.is_empty() {
            assert_eq!(r.len(), fed);
            assert!(fed > HOLD_LIMIT && fed <= HOLD_LIMIT + comment.len());
            break;
        }
        assert!(g.held() <= HOLD_LIMIT);
    }
    assert!(g.is_visible());
}

#[test]
fn a_long_line_in_small_pieces_is_searched_once() {
    let mut g = sse();
    let line = format!("data: {{\"choices\":[],\"id\":\"{}\"}}", "x".repeat(HOLD_LIMIT / 2));
    for b in line.as_bytes() {
        assert!(g.feed(std::slice::from_ref(b)).is_empty());
    }
    assert_eq!(g.reader.searched(), line.len());
    assert!(g.feed(b"\r").is_empty(), "a CR may be half a CRLF");
    assert_eq!(g.feed(b"\n\n").len(), 0, "a preamble event: still held");
    assert_eq!(g.held(), line.len() + 3);
    assert_eq!(g.feed(TEXT.as_bytes()).len(), line.len() + 3 + TEXT.len());
}

proptest! {
    /// With malformed events, errors and unfinished events in the mix,
    /// chunking never changes what comes out, nor the skip count.
    #[test]
    fn chunking_never_changes_what_is_dropped(
        pieces in prop::collection::vec(0usize..7, 0..16),
        size in 1usize..50,
        error_mode in any::<bool>(),
    ) {
        let p = [ROLE, TEXT, "data: {\"x\":\n\n", "event: e\r\ndata: nope\r\n\r\n", ": c\n\n", "data: [DONE]\n\n", "data: {\"choi"];
        let body: String = pieces.iter().map(|&i| p[i]).collect();
        let gate = || if error_mode { sse().on_malformed(MalformedEvent::Error) } else { sse() };
        let (whole, want) = run(gate(), body.as_bytes(), body.len().max(1));
        let (g, out) = run(gate(), body.as_bytes(), size);
        prop_assert_eq!(out, want);
        prop_assert_eq!((g.skipped(), g.stream_error()), (whole.skipped(), whole.stream_error()));
    }

    /// However the bytes are split, nothing is lost or reordered, and the
    /// first release comes with the same byte: the end of the first event with output.
    #[test]
    fn chunking_never_changes_what_is_released_or_when(
        pre in prop::collection::vec(0usize..4, 0..6),
        cuts in prop::collection::vec(1usize..40, 1..60),
        tail in 0usize..3,
    ) {
        let pieces = [ROLE, ": c\n\n", "event: ping\ndata: {\"type\":\"ping\"}\n\n", "id: 1\n\n"];
        let mut body: String = pre.iter().map(|&i| pieces[i]).collect();
        let release_at = body.len() + TEXT.len();
        body.push_str(TEXT);
        for _ in 0..tail { body.push_str(TEXT); }
        body.push_str(DONE);
        let bytes = body.as_bytes();
        let mut g = sse();
        let (mut out, mut at, mut i, mut k) = (Vec::new(), None, 0, 0);
        while i < bytes.len() {
            let n = cuts[k % cuts.len()].min(bytes.len() - i);
            k += 1;
            let r = g.feed(&bytes[i..i + n]).into_owned();
            i += n;
            if at.is_none() && !r.is_empty() { at = Some(i); }
            out.extend(r);
        }
        out.extend(g.finish());
        prop_assert_eq!(&out[..], bytes);
        let at = at.unwrap();
        prop_assert!(at >= release_at && at < release_at + 40, "released at {} for {}", at, release_at);
    }
}

/// The fault server's `fb-malformed-sse` streams (chat, Anthropic, Responses):
/// after two deltas, one event whose data is cut JSON, then the rest.
const MALFORMED: [&[u8]; 3] = [
    include_bytes!("../wire/testdata/chat_malformed.sse"),
    include_bytes!("../wire/testdata/msg_malformed.sse"),
    include_bytes!("../wire/testdata/resp_malformed.sse"),
];

/// Where the one malformed event of `body` sits.
fn bad_event(body: &[u8]) -> std::ops::Range<usize> {
    let mut r = EventReader::new();
    r.push(body);
    let mut found = Vec::new();
    while let Some(e) = r.next_event() {
        if malformed(e.data) {
            found.push(e.raw);
        }
    }
    assert_eq!(found.len(), 1);
    found.remove(0)
}

fn run(mut g: StreamGate, body: &[u8], size: usize) -> (StreamGate, Vec<u8>) {
    let mut out = Vec::new();
    for c in body.chunks(size) {
        out.extend_from_slice(&g.feed(c));
    }
    out.extend(g.finish());
    (g, out)
}

#[test]
fn malformed_events_are_skipped_in_any_chunking() {
    for body in MALFORMED {
        let bad = bad_event(body);
        let want = [&body[..bad.start], &body[bad.end..]].concat();
        for size in [1, 2, 3, 7, 64, 1000, body.len()] {
            let (g, out) = run(sse(), body, size);
            assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(&want), "{size}");
            assert_eq!(g.skipped(), 1);
            assert_eq!(g.outcome(200), crate::outcome::Outcome::status(200));
        }
    }
}

#[test]
fn a_malformed_event_under_error_ends_the_stream() {
    for body in MALFORMED {
        let bad = bad_event(body);
        for size in [1, 5, 64, body.len()] {
            let (mut g, out) = run(sse().on_malformed(MalformedEvent::Error), body, size);
            assert_eq!(
                out,
                &body[..bad.start],
                "{size}: everything before it, nothing from it on"
            );
            assert!(!g.watching() && g.skipped() == 0);
            let e = g.stream_error().expect("malformed");
            assert!(e.is_malformed() && e.after_output);
            let o = g.outcome(200);
            assert_eq!(
                (o.error, o.phase, o.vendor_code.as_deref()),
                (
                    Some(ErrorKind::MalformedResponse),
                    Some(Phase::StreamVisible),
                    Some(MALFORMED_EVENT)
                )
            );
            assert!(!o.is_success());
            assert!(g.feed(TEXT.as_bytes()).is_empty() && g.finish().is_empty());
        }
    }
}

#[test]
fn a_malformed_event_before_output_never_releases_anything() {
    let bad = "data: upstream timeout\n\ndata:\n\nevent: x\ndata: {\"a\":\n\n";
    let mut g = sse();
    assert!(g.feed(format!("{ROLE}{bad}").as_bytes()).is_empty());
    assert_eq!((g.skipped(), g.phase()), (3, Phase::StreamOpen));
    assert_eq!(g.feed(TEXT.as_bytes()).into_owned(), format!("{ROLE}{TEXT}").as_bytes());

    let mut g = sse().on_malformed(MalformedEvent::Error);
    assert!(g.feed(format!("{ROLE}{bad}").as_bytes()).is_empty());
    assert!(g.feed(TEXT.as_bytes()).is_empty() && g.finish().is_empty());
    assert!(!g.is_visible());
    let o = g.outcome(200);
    assert_eq!(
        (o.error, o.phase),
        (Some(ErrorKind::MalformedResponse), Some(Phase::StreamOpen))
    );
}

#[test]
fn well_formed_data_of_every_kind_is_kept() {
    for data in [
        "data: [DONE]\n\n",
        "data: {\"choices\":\ndata: [{\"delta\":{\"content\":\"x\"}}]}\n\n",
        "data: \"a string\"\n\n",
        "data: 42\n\n",
        "event: ping\ndata: {\"type\": \"ping\"}\n\n",
        "id: 3\n\n",
        ": comment\n\n",
    ] {
        let mut g = sse();
        g.feed(TEXT.as_bytes());
        assert_eq!(g.feed(data.as_bytes()).into_owned(), data.as_bytes(), "{data}");
        assert_eq!(g.skipped(), 0, "{data}");
    }
    for bad in [
        &b"data: {\"a\":\"\xff\"}\n\n"[..],
        b"data: {\"a\":1}{\"b\":2}\n\n",
        b"data: {\"a\": tru}\n\n",
    ] {
        let mut g = sse();
        g.feed(TEXT.as_bytes());
        assert!(g.feed(bad).is_empty(), "{}", String::from_utf8_lossy(bad));
        assert_eq!(g.skipped(), 1);
    }
}

#[test]
fn whole_events_pass_without_a_copy_and_unfinished_ones_wait() {
    let mut g = sse();
    g.feed(TEXT.as_bytes());
    let two = format!("{TEXT}{TEXT}");
    assert!(matches!(g.feed(two.as_bytes()), Cow::Borrowed(b) if b == two.as_bytes()));
    let (a, b) = TEXT.split_at(20);
    let split = format!("{TEXT}{a}");
    assert!(matches!(g.feed(split.as_bytes()), Cow::Borrowed(x) if x == TEXT.as_bytes()));
    assert_eq!(g.held(), a.len());
    assert_eq!(g.feed_pass(b.as_bytes()), Some(TEXT.as_bytes().to_vec()));
    // A body that ends inside an event hands its bytes over at the end.
    assert!(g.feed(a.as_bytes()).is_empty());
    assert_eq!(g.finish(), a.as_bytes());
}
