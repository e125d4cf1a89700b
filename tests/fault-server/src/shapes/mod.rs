//! Wire shapes: OpenAI chat completions, the OpenAI Responses API and Anthropic
//! messages, as JSON bodies, error bodies and SSE frames.
//!
//! The shapes are the minimum the official SDKs parse without complaint, so an SDK
//! pointed at the fault server fails only where a fault was asked for. JSON objects
//! are written with sorted keys (serde_json's default map), so every byte is a
//! function of the request and the record's seq: tests can compare frames exactly.

mod anthropic;
mod chat;
mod errors;
mod responses;

use bytes::Bytes;
use serde_json::Value;

pub use errors::{content_filter_body, context_length_body, error_body, prefill_rejected_body, rate_limit_body};

/// Which wire format a request expects, chosen from its API path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// OpenAI chat completions (and anything not matched below).
    Chat,
    /// OpenAI Responses API: `/v1/responses`.
    Responses,
    /// Anthropic messages: `/v1/messages`.
    Anthropic,
}

impl Shape {
    pub fn for_api_path(api_path: &str) -> Self {
        if api_path.starts_with("/v1/messages") {
            Shape::Anthropic
        } else if api_path.starts_with("/v1/responses") {
            Shape::Responses
        } else {
            Shape::Chat
        }
    }

    /// The response header carrying the request id, as each vendor names it.
    pub fn request_id_header(self) -> &'static str {
        match self {
            Shape::Chat | Shape::Responses => "x-request-id",
            Shape::Anthropic => "request-id",
        }
    }
}

/// `created` / `created_at` of every body: fixed, so bodies are byte-for-byte
/// reproducible (no SDK checks it against the clock).
pub const CREATED: u64 = 1_700_000_000;

/// Token counts reported in bodies (the fault server counts words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
}

/// Per-response values that appear in every body of one response.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub shape: Shape,
    /// Model named in the request, echoed back like the real APIs do.
    pub model: String,
    /// Response id suffix (the record's seq), so ids are unique per attempt.
    pub seq: u64,
    /// Chat: `stream_options.include_usage` asked for a final usage chunk.
    pub include_usage: bool,
    pub usage: Usage,
}

impl Ctx {
    fn id(&self) -> String {
        match self.shape {
            Shape::Chat => format!("chatcmpl-rw-{}", self.seq),
            Shape::Responses => format!("resp_rw_{}", self.seq),
            Shape::Anthropic => format!("msg_rw_{}", self.seq),
        }
    }
}

/// One body write of a stream; `delta` is the visible text it carries, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub bytes: Bytes,
    pub delta: Option<String>,
}

impl Frame {
    fn event(bytes: String) -> Self {
        Frame {
            bytes: Bytes::from(bytes),
            delta: None,
        }
    }
}

/// A complete non-streaming success body with `text` as the answer.
pub fn success_body(ctx: &Ctx, text: &str) -> Value {
    match ctx.shape {
        Shape::Chat => chat::body(ctx, text),
        Shape::Responses => responses::body(ctx, text),
        Shape::Anthropic => anthropic::body(ctx, text),
    }
}

/// A whole stream: the preamble frame (stream open, no visible output), one frame
/// per delta, and the finish frame. Without `terminator` the finish frame lacks
/// the end marker (chat `data: [DONE]`, Anthropic `message_stop`, Responses
/// `response.completed`), so the body ends cleanly but the stream is unfinished.
pub fn stream(ctx: &Ctx, deltas: &[String], terminator: bool) -> Vec<Frame> {
    match ctx.shape {
        Shape::Chat => chat::stream(ctx, deltas, terminator),
        Shape::Responses => responses::stream(ctx, deltas, terminator),
        Shape::Anthropic => anthropic::stream(ctx, deltas, terminator),
    }
}

/// An SSE event whose `data:` is not JSON, framed like a content delta.
pub fn malformed_event(ctx: &Ctx) -> Bytes {
    let bytes: &'static [u8] = match ctx.shape {
        Shape::Chat => b"data: {\"choices\":[{\"delta\":{\"content\":\n\n",
        Shape::Responses => b"event: response.output_text.delta\ndata: {\"delta\":\n\n",
        Shape::Anthropic => b"event: content_block_delta\ndata: {\"delta\":\n\n",
    };
    Bytes::from_static(bytes)
}

/// The vendor's in-stream error event (Anthropic `overloaded_error`); the stream
/// then ends cleanly. `sequence_number` is the Responses API's event counter.
pub fn error_event(ctx: &Ctx, sequence_number: usize) -> Bytes {
    Bytes::from(match ctx.shape {
        Shape::Chat => chat::error_event(),
        Shape::Responses => responses::error_event(sequence_number),
        Shape::Anthropic => anthropic::error_event(),
    })
}

/// A success body cut in the middle of a string: valid HTTP framing, invalid JSON.
pub fn malformed_body(ctx: &Ctx, text: &str) -> Bytes {
    let full = success_body(ctx, text).to_string();
    let cut = full.len() / 2;
    // Cut on a char boundary (a model name could be non-ASCII).
    let cut = (0..=cut).rev().find(|&i| full.is_char_boundary(i)).unwrap_or(0);
    Bytes::from(full[..cut].to_owned())
}

fn sse_data(out: &mut String, value: &Value) {
    out.push_str("data: ");
    out.push_str(&value.to_string());
    out.push_str("\n\n");
}

fn sse_event(out: &mut String, event: &str, value: &Value) {
    out.push_str("event: ");
    out.push_str(event);
    out.push('\n');
    sse_data(out, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(shape: Shape) -> Ctx {
        Ctx {
            shape,
            model: "m".into(),
            seq: 1,
            include_usage: false,
            usage: Usage { input: 1, output: 1 },
        }
    }

    #[test]
    fn malformed_is_not_json() {
        for shape in [Shape::Chat, Shape::Responses, Shape::Anthropic] {
            let body = malformed_body(&ctx(shape), "ok");
            assert!(serde_json::from_slice::<Value>(&body).is_err());
        }
    }

    #[test]
    fn streams_carry_their_deltas_in_order() {
        let deltas = ["a".to_owned(), " b".to_owned()];
        for shape in [Shape::Chat, Shape::Responses, Shape::Anthropic] {
            let frames = stream(&ctx(shape), &deltas, true);
            assert_eq!(frames.len(), 4, "{shape:?}");
            let seen: Vec<_> = frames.iter().map(|f| f.delta.as_deref()).collect();
            assert_eq!(seen, [None, Some("a"), Some(" b"), None]);
        }
    }
}
