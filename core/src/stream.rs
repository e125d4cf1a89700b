//! A streamed answer's phase, read from its bytes: [`Phase::StreamOpen`]
//! until its first meaningful event, [`Phase::StreamVisible`] after.
//!
//! Model APIs open a stream with events that carry nothing for the reader:
//! OpenAI's first chunk is a role-only delta, Anthropic sends
//! `message_start`, an empty `content_block_start` and `ping`s. Passing
//! those on at once would make a cut right after them look like visible
//! output, which is never replayed. A [`StreamGate`] holds such events back
//! until the first event with output (text, a tool call, a finish reason,
//! anything it does not know), then releases everything held and passes the
//! rest through untouched. A stream cut while the gate still holds is
//! `StreamOpen`: nothing reached the consumer, so the attempt may be retried
//! and the next attempt's stream delivered in its place.
//!
//! An error event (`event: error`, Anthropic's `{"type": "error", ...}`,
//! OpenAI's `{"error": {...}}` chunk, the Responses API's `response.failed`)
//! is not output either: before any output the gate holds it and everything
//! after it, and [`StreamGate::outcome`] reports the attempt as the failure
//! the event names (an `overloaded_error` is an overload, retried like a
//! 529), still `StreamOpen`. After output, the gate keeps watching the bytes
//! it passes on for one, so a stream that shows text and then an error is a
//! partial stream, never a success.
//!
//! The SSE framing (lines ending in LF, CRLF or CR; an event ends at a blank
//! line; `event:` and `data:` fields; `:` comments) is scanned by hand: only
//! the first few events are looked at, from bytes already buffered, which the
//! SSE crates (built around async streams) do not offer.
//!
//! ```
//! use retrywise::stream::StreamGate;
//!
//! let mut gate = StreamGate::new(Some("text/event-stream"));
//! let role = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
//! assert!(gate.feed(role).is_empty()); // held: a cut now is stream_open
//! let text = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
//! let out = gate.feed(text).into_owned();
//! assert_eq!(out, [&role[..], &text[..]].concat()); // both released at once
//! assert!(gate.is_visible());
//! ```

use crate::outcome::{media_type, Outcome};
use crate::types::Phase;
use serde_json::Value;
use std::borrow::Cow;

/// Bytes a gate holds at most; past that it releases them (and counts the
/// stream as visible), so a long preamble is never buffered without bound.
pub const HOLD_LIMIT: usize = 64 * 1024;

/// Holds a stream's preamble back until its first meaningful event (see the
/// module documentation). One per attempt's response body.
#[derive(Debug, Clone)]
pub struct StreamGate {
    /// Bytes received and not yet released.
    held: Vec<u8>,
    /// Offset in `held` of the next line to scan.
    line: usize,
    /// Offset in `held` up to which no line end was found.
    searched: usize,
    /// The event being read: its `event:` name and its `data:` lines.
    name: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    /// Whether a leading byte-order mark was looked for (SSE ignores one).
    bom_checked: bool,
    /// An event stream whose first meaningful event has not come yet.
    holding: bool,
    /// Bytes reached the consumer.
    visible: bool,
    /// An event stream: after release, its lines are still watched for an error event.
    sse: bool,
    /// The error event the stream carried, when it carried one.
    error: Option<StreamError>,
}

/// An error event carried by a stream (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamError {
    /// The provider's error type or code (`overloaded_error`, `server_error`, `rate_limit_exceeded`).
    pub code: Option<String>,
    /// Its message, when it had one.
    pub message: Option<String>,
    /// It came after output reached the consumer.
    pub after_output: bool,
}

impl StreamError {
    /// The HTTP status an error of this type stands for in the classifier's
    /// tables (the stream itself answered 200): overloads are 529, rate
    /// limits 429, request and auth errors their 4xx, anything else a 500.
    pub fn status(&self) -> u16 {
        match self.code.as_deref().unwrap_or("") {
            "overloaded_error" | "overloaded" => 529,
            "rate_limit_error" | "rate_limit_exceeded" | "rate_limited" | "RESOURCE_EXHAUSTED" => 429,
            "invalid_request_error" | "invalid_request" | "context_length_exceeded" => 400,
            "authentication_error" | "invalid_api_key" => 401,
            "permission_error" => 403,
            "not_found_error" => 404,
            "request_too_large" => 413,
            "timeout_error" => 504,
            _ => 500,
        }
    }
}

impl StreamGate {
    /// A gate for a response body of `content_type`. Only `text/event-stream`
    /// bodies are gated; any other body passes through from its first byte.
    pub fn new(content_type: Option<&str>) -> StreamGate {
        let sse = content_type.is_some_and(|ct| media_type(ct).eq_ignore_ascii_case("text/event-stream"));
        StreamGate {
            held: Vec::new(),
            line: 0,
            searched: 0,
            name: Vec::new(),
            data: Vec::new(),
            has_data: false,
            bom_checked: false,
            holding: sse,
            visible: false,
            sse,
            error: None,
        }
    }

    /// The error event the stream carried, when it carried one.
    pub fn stream_error(&self) -> Option<&StreamError> {
        self.error.as_ref()
    }

    /// Whether the gate still reads what it is fed: an event stream is
    /// watched for an error event to its end, other bodies only until their
    /// first byte. A binding that stops feeding once this is false loses nothing.
    pub fn watching(&self) -> bool {
        self.error.is_none() && (self.holding || self.sse || !self.visible)
    }

    /// The outcome of an attempt whose body ended (or broke) now with HTTP
    /// `status`: a plain `status` when the stream carried no error event,
    /// else the failure the event names (see [`StreamError::status`]) with
    /// its vendor code, in the phase it came in.
    pub fn outcome(&self, status: u16) -> Outcome {
        match &self.error {
            None => Outcome::status(status),
            Some(e) => {
                let mut o = Outcome::status(e.status()).phase(if e.after_output {
                    Phase::StreamVisible
                } else {
                    Phase::StreamOpen
                });
                o.vendor_code = e.code.clone();
                o
            }
        }
    }

    /// Whether bytes were released: a cut from now on is `StreamVisible`.
    pub fn is_visible(&self) -> bool {
        self.visible
    }

    /// Whether feeding may still hold bytes back: an event stream before its
    /// first meaningful event. Once false, [`StreamGate::feed`] returns every
    /// chunk as it is (a binding may then stop copying chunks through it,
    /// as long as it feeds one non-empty chunk for [`StreamGate::phase`]).
    pub fn may_hold(&self) -> bool {
        self.holding
    }

    /// The phase a failure of the body would have now.
    pub fn phase(&self) -> Phase {
        if self.visible {
            Phase::StreamVisible
        } else {
            Phase::StreamOpen
        }
    }

    /// Bytes held back so far.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Takes `chunk`, received from upstream, and returns what the consumer
    /// may see now: nothing while only preamble arrived; everything held when
    /// the first meaningful event completes (or the hold limit is passed);
    /// `chunk` itself after that (and from the first byte for other bodies).
    pub fn feed<'a>(&mut self, chunk: &'a [u8]) -> Cow<'a, [u8]> {
        if !self.holding {
            if self.error.is_some() && !self.visible {
                // The attempt failed before any output: nothing of it is shown.
                return Cow::Borrowed(&[]);
            }
            self.visible |= !chunk.is_empty();
            if self.sse && self.error.is_none() {
                self.watch(chunk);
            }
            return Cow::Borrowed(chunk);
        }
        self.held.extend_from_slice(chunk);
        let output = self.scan();
        if self.error.is_some() {
            // Held, never delivered: the next attempt's stream takes its place.
            self.holding = false;
            self.held = Vec::new();
            return Cow::Borrowed(&[]);
        }
        if output || self.held.len() > HOLD_LIMIT {
            // What followed the first output in this chunk is watched like any later chunk.
            let unread = self.held.get(self.line..).map(<[u8]>::to_vec).unwrap_or_default();
            let out = self.release();
            if self.sse && output {
                self.watch(&unread);
            }
            return Cow::Owned(out);
        }
        Cow::Borrowed(&[])
    }

    /// [`StreamGate::feed`] for a binding that can hand the caller's own chunk
    /// back: `None` when the consumer gets `chunk` as it is, else the bytes
    /// it gets instead (empty while holding).
    pub fn feed_pass(&mut self, chunk: &[u8]) -> Option<Vec<u8>> {
        match self.feed(chunk) {
            Cow::Owned(v) => Some(v),
            Cow::Borrowed(b) if b.len() == chunk.len() => None,
            Cow::Borrowed(_) => Some(Vec::new()),
        }
    }

    /// The body ended: everything still held (a stream of preamble only, or
    /// a last event without its blank line), to deliver before the end.
    pub fn finish(&mut self) -> Vec<u8> {
        if self.error.is_some() && !self.visible {
            return Vec::new();
        }
        if self.holding {
            return self.release();
        }
        Vec::new()
    }

    fn release(&mut self) -> Vec<u8> {
        self.holding = false;
        (self.line, self.searched) = (0, 0);
        self.name = Vec::new();
        self.data = Vec::new();
        let out = std::mem::take(&mut self.held);
        self.visible |= !out.is_empty();
        out
    }

    /// After release: reads the lines of `chunk` passed on for an error
    /// event, keeping only an unfinished line (and the event being read only
    /// when it may be an error) between chunks.
    fn watch(&mut self, chunk: &[u8]) {
        self.held.extend_from_slice(chunk);
        self.scan();
        let consumed = self.line.min(self.held.len());
        self.held.drain(..consumed);
        self.searched = self.searched.saturating_sub(consumed);
        self.line = 0;
        if self.held.len() > HOLD_LIMIT {
            // A line this long is output, not an error event.
            self.held.clear();
            self.searched = 0;
        }
    }

    /// Reads the complete lines not read yet; true when an event with output completed.
    fn scan(&mut self) -> bool {
        if !self.bom_checked {
            const BOM: &[u8] = b"\xef\xbb\xbf";
            if self.held.len() < BOM.len() && BOM.starts_with(&self.held) {
                return false;
            }
            self.bom_checked = true;
            if self.held.starts_with(BOM) {
                (self.line, self.searched) = (BOM.len(), BOM.len());
            }
        }
        loop {
            let rest = &self.held[self.line..];
            // Bytes already searched hold no line end: a long line fed in
            // small pieces is searched once, not once per piece.
            let from = self.searched.saturating_sub(self.line);
            let Some(end) = rest[from..]
                .iter()
                .position(|&b| b == b'\n' || b == b'\r')
                .map(|i| from + i)
            else {
                self.searched = self.held.len();
                return false;
            };
            // A CR at the end may be the first half of a CRLF: wait for the next byte.
            let next = match rest[end] {
                b'\r' if end + 1 == rest.len() => {
                    self.searched = self.line + end;
                    return false;
                }
                b'\r' if rest[end + 1] == b'\n' => end + 2,
                _ => end + 1,
            };
            let (start, len) = (self.line, end);
            self.line += next;
            if len == 0 {
                if self.dispatch() {
                    return true;
                }
                continue;
            }
            let line = &self.held[start..start + len];
            let (field, value) = match line.iter().position(|&b| b == b':') {
                Some(0) => continue, // a comment
                Some(i) => {
                    let v = &line[i + 1..];
                    (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
                }
                None => (line, &[][..]),
            };
            match field {
                b"event" => self.name = value.to_vec(),
                b"data" => {
                    // After release only a possible error event is kept whole.
                    if self.holding || may_be_error(&self.name, value) || (self.has_data && !self.data.is_empty()) {
                        if self.has_data {
                            self.data.push(b'\n');
                        }
                        self.data.extend_from_slice(value);
                    }
                    self.has_data = true;
                }
                _ => {} // id, retry, unknown fields: nothing for a reader
            }
        }
    }

    /// The event just ended: whether it carries output (an error event is
    /// recorded instead). Resets the event.
    fn dispatch(&mut self) -> bool {
        let name = std::mem::take(&mut self.name);
        let data = std::mem::take(&mut self.data);
        // SSE drops an event without data; a reader sees nothing.
        if !std::mem::replace(&mut self.has_data, false) {
            return false;
        }
        if self.error.is_none() {
            if let Some(mut e) = error_event(&name, &data) {
                e.after_output = self.visible;
                self.error = Some(e);
                return false;
            }
        }
        self.holding && meaningful(&name, &data)
    }
}

/// Whether a `data:` line of an event named `name` may belong to an error
/// event (cheap: the first bytes only), so an event stream's output is not
/// copied while it is watched.
fn may_be_error(name: &[u8], value: &[u8]) -> bool {
    name == b"error"
        || name == b"response.failed"
        || value.starts_with(b"{\"error\"")
        || value.starts_with(b"{\"type\":\"error\"")
        || value.starts_with(b"{\"type\": \"error\"")
        || value.starts_with(b"{\"type\":\"response.failed\"")
}

/// The error an SSE event reports, when it is an error event: `event: error`,
/// a JSON payload of `type` `error` (Anthropic, the Responses API) or with an
/// `error` object (OpenAI chat chunks), or `response.failed`.
pub fn error_event(name: &[u8], data: &[u8]) -> Option<StreamError> {
    let named = name == b"error" || name == b"response.failed";
    if !named && !may_be_error(name, data) {
        return None;
    }
    let v: Value = serde_json::from_slice(data).unwrap_or(Value::Null);
    let ty = v.get("type").and_then(Value::as_str);
    let err = match ty {
        Some("response.failed") => v.get("response").and_then(|r| r.get("error")),
        _ => v.get("error"),
    };
    let text = |x: Option<&Value>, k: &str| {
        x.and_then(|x| x.get(k))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let is_error = named || ty == Some("error") || ty == Some("response.failed") || err.is_some_and(Value::is_object);
    if !is_error {
        return None;
    }
    let obj = err.filter(|e| e.is_object());
    Some(StreamError {
        code: text(obj, "type")
            .or_else(|| text(obj, "code"))
            .or_else(|| text(Some(&v), "code")),
        message: text(obj, "message").or_else(|| text(Some(&v), "message")),
        after_output: false,
    })
}

/// Whether an SSE event (its `event:` name and `data:`) carries output.
/// Only known preamble shapes are not: anything else counts as output.
pub fn meaningful(name: &[u8], data: &[u8]) -> bool {
    if OPENING_EVENTS.iter().any(|e| e.as_bytes() == name) {
        return false;
    }
    match serde_json::from_slice::<Value>(data) {
        Ok(v) => !preamble(&v),
        Err(_) => true,
    }
}

/// Events (by `event:` name or JSON `type`) that only open or keep alive an
/// answer: Anthropic's and the OpenAI Responses API's.
const OPENING_EVENTS: &[&str] = &[
    "ping",
    "message_start",
    "response.created",
    "response.queued",
    "response.in_progress",
];

/// A JSON event payload that only opens the answer: no text, tool call,
/// refusal, log-probabilities or finish reason in it.
fn preamble(v: &Value) -> bool {
    match v.get("type").and_then(Value::as_str) {
        // Anthropic and the OpenAI Responses API.
        Some(t) if OPENING_EVENTS.contains(&t) => true,
        Some("content_block_start") => v.get("content_block").is_some_and(|b| {
            matches!(b.get("type").and_then(Value::as_str), Some("text" | "thinking")) && empty_except(b, &["type"])
        }),
        Some("response.output_item.added") => {
            v.get("item")
                .is_some_and(|i| match i.get("type").and_then(Value::as_str) {
                    Some("message") => empty_except(i, &["type", "id", "role", "status"]),
                    // Reasoning starts; its summary, once it has one, is output.
                    Some("reasoning") => empty_except(i, &["type", "id", "status", "encrypted_content"]),
                    _ => false,
                })
        }
        Some("response.content_part.added") => v.get("part").is_some_and(|p| empty_except(p, &["type"])),
        Some(_) => false,
        // OpenAI chat completion chunks (`choices: []` opens Azure streams). A
        // choice's other members (a legacy completion's `text`, a finish
        // reason, log-probabilities) are output unless empty.
        None => v.get("choices").and_then(Value::as_array).is_some_and(|choices| {
            empty_except(v, CHUNK_META)
                && choices.iter().all(|c| {
                    c.get("delta").is_none_or(|d| empty_except(d, &["role"]))
                        && empty_except(c, &["index", "delta", "content_filter_results"])
                })
        }),
    }
}

/// Members of an OpenAI chat completion chunk that describe it rather than carry output.
const CHUNK_META: &[&str] = &[
    "id",
    "object",
    "created",
    "model",
    "system_fingerprint",
    "service_tier",
    "choices",
    "prompt_filter_results",
    "obfuscation",
    "x_groq",
];

/// `v` is an object whose members other than `keep` are all empty.
fn empty_except(v: &Value, keep: &[&str]) -> bool {
    v.as_object()
        .is_some_and(|o| o.iter().all(|(k, x)| keep.contains(&k.as_str()) || empty(x)))
}

/// Null, `""`, `[]`, `{}`, or an object of empty members.
fn empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(empty),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

#[cfg(test)]
mod tests {
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
            "not json",
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
        assert_eq!(g.feed(a.as_bytes()).into_owned(), a.as_bytes());
        assert!(g.stream_error().is_none());
        assert_eq!(g.feed(b.as_bytes()).into_owned(), b.as_bytes());
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
        assert_eq!(g.searched, line.len());
        assert!(g.feed(b"\r").is_empty(), "a CR may be half a CRLF");
        assert_eq!(g.feed(b"\n\n").len(), 0, "a preamble event: still held");
        assert_eq!(g.held(), line.len() + 3);
        assert_eq!(g.feed(TEXT.as_bytes()).len(), line.len() + 3 + TEXT.len());
    }

    proptest! {
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
}
