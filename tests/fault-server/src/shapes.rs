//! Response shapes: OpenAI chat completions and Anthropic messages, as JSON bodies,
//! error bodies and SSE chunks.
//!
//! The shapes are the minimum the official SDKs parse without complaint, so an SDK
//! pointed at the fault server fails only where a fault was asked for.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{json, Value};

/// Which vendor's wire format a request expects, chosen from its API path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    OpenAi,
    Anthropic,
}

impl Shape {
    /// `/v1/messages...` is Anthropic; everything else gets the OpenAI shape.
    pub fn for_api_path(api_path: &str) -> Self {
        if api_path.starts_with("/v1/messages") {
            Shape::Anthropic
        } else {
            Shape::OpenAi
        }
    }
}

/// Per-response values that appear in every body of one response.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub shape: Shape,
    /// Model named in the request, echoed back like the real APIs do.
    pub model: String,
    /// Response id suffix (the record's seq), so ids are unique per attempt.
    pub seq: u64,
}

impl Ctx {
    fn id(&self) -> String {
        match self.shape {
            Shape::OpenAi => format!("chatcmpl-rw-{}", self.seq),
            Shape::Anthropic => format!("msg_rw_{}", self.seq),
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The text of a non-streaming success.
pub const OK_TEXT: &str = "ok";

/// A complete non-streaming success body.
pub fn success_body(ctx: &Ctx) -> Value {
    match ctx.shape {
        Shape::OpenAi => json!({
            "id": ctx.id(),
            "object": "chat.completion",
            "created": unix_now(),
            "model": ctx.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": OK_TEXT, "refusal": null},
                "logprobs": null,
                "finish_reason": "stop",
            }],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }),
        Shape::Anthropic => json!({
            "id": ctx.id(),
            "type": "message",
            "role": "assistant",
            "model": ctx.model,
            "content": [{"type": "text", "text": OK_TEXT}],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }),
    }
}

/// A success body cut in the middle of a string: valid HTTP framing, invalid JSON.
pub fn malformed_body(ctx: &Ctx) -> Bytes {
    let full = success_body(ctx).to_string();
    let cut = full.len() / 2;
    // The body is ASCII, so any byte index is a char boundary; stay safe anyway.
    let truncated = full.get(..cut).unwrap_or("{\"id\":");
    Bytes::from(truncated.to_owned())
}

fn openai_error_type(status: u16, vendor_code: Option<&str>) -> &'static str {
    match (status, vendor_code) {
        // The real API reports an exhausted quota with this type as well as code.
        (429, Some("insufficient_quota")) => "insufficient_quota",
        (400 | 404 | 409 | 422, _) => "invalid_request_error",
        (401, _) => "authentication_error",
        (403, _) => "permission_error",
        (429, _) => "rate_limit_error",
        (500..=599, _) => "server_error",
        _ => "api_error",
    }
}

/// Anthropic carries its machine-readable code in `error.type`.
fn anthropic_error_type(status: u16) -> &'static str {
    match status {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

/// A vendor-shaped error body; `vendor_code` becomes OpenAI's `error.code` or
/// Anthropic's `error.type`.
pub fn error_body(shape: Shape, status: u16, vendor_code: Option<&str>, message: &str) -> Value {
    match shape {
        Shape::OpenAi => json!({
            "error": {
                "message": message,
                "type": openai_error_type(status, vendor_code),
                "param": null,
                "code": vendor_code,
            }
        }),
        Shape::Anthropic => json!({
            "type": "error",
            "error": {
                "type": vendor_code.unwrap_or(anthropic_error_type(status)),
                "message": message,
            }
        }),
    }
}

/// One SSE chunk of a stream. Chunk numbering is shared by both shapes so a spec
/// means the same thing for either SDK:
/// - `Preamble`: stream opened, no visible output yet (OpenAI: role-only delta;
///   Anthropic: `message_start` + `content_block_start`);
/// - `Text(k)`: the k-th visible text delta (`"c<k> "`);
/// - `Finish`: end of message (OpenAI: `finish_reason: "stop"` then
///   `data: [DONE]`; Anthropic: `content_block_stop`, `message_delta`, `message_stop`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk {
    Preamble,
    Text(u32),
    Finish,
}

/// Chunks of a stream: a complete stream of `len` chunks is preamble, text deltas and
/// finish; an incomplete one (for `sse-cut`) is preamble then text deltas only.
pub fn stream_plan(len: u32, complete: bool) -> Vec<Chunk> {
    (1..=len)
        .map(|i| match i {
            1 => Chunk::Preamble,
            i if complete && i == len => Chunk::Finish,
            i => Chunk::Text(i - 1),
        })
        .collect()
}

/// Number of chunks in a complete stream (`ok` with `"stream": true`, `slow-sse`).
pub const STREAM_CHUNKS: u32 = 5;

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

/// Wire bytes of one chunk; each chunk is sent as one body frame.
pub fn chunk_bytes(ctx: &Ctx, chunk: Chunk) -> Bytes {
    let mut out = String::new();
    match ctx.shape {
        Shape::OpenAi => {
            let (delta, finish) = match chunk {
                Chunk::Preamble => (json!({"role": "assistant", "content": ""}), None),
                Chunk::Text(k) => (json!({"content": format!("c{k} ")}), None),
                Chunk::Finish => (json!({}), Some("stop")),
            };
            sse_data(
                &mut out,
                &json!({
                    "id": ctx.id(),
                    "object": "chat.completion.chunk",
                    "created": unix_now(),
                    "model": ctx.model,
                    "choices": [{
                        "index": 0,
                        "delta": delta,
                        "logprobs": null,
                        "finish_reason": finish,
                    }],
                }),
            );
            if chunk == Chunk::Finish {
                out.push_str("data: [DONE]\n\n");
            }
        }
        Shape::Anthropic => match chunk {
            Chunk::Preamble => {
                sse_event(
                    &mut out,
                    "message_start",
                    &json!({
                        "type": "message_start",
                        "message": {
                            "id": ctx.id(),
                            "type": "message",
                            "role": "assistant",
                            "model": ctx.model,
                            "content": [],
                            "stop_reason": null,
                            "stop_sequence": null,
                            "usage": {"input_tokens": 1, "output_tokens": 1},
                        },
                    }),
                );
                sse_event(
                    &mut out,
                    "content_block_start",
                    &json!({
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {"type": "text", "text": ""},
                    }),
                );
            }
            Chunk::Text(k) => sse_event(
                &mut out,
                "content_block_delta",
                &json!({
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": format!("c{k} ")},
                }),
            ),
            Chunk::Finish => {
                sse_event(
                    &mut out,
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": 0}),
                );
                sse_event(
                    &mut out,
                    "message_delta",
                    &json!({
                        "type": "message_delta",
                        "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                        "usage": {"output_tokens": 3},
                    }),
                );
                sse_event(&mut out, "message_stop", &json!({"type": "message_stop"}));
            }
        },
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_plans() {
        assert_eq!(
            stream_plan(5, true),
            vec![
                Chunk::Preamble,
                Chunk::Text(1),
                Chunk::Text(2),
                Chunk::Text(3),
                Chunk::Finish
            ]
        );
        assert_eq!(stream_plan(2, false), vec![Chunk::Preamble, Chunk::Text(1)]);
        assert!(stream_plan(0, false).is_empty());
    }

    #[test]
    fn malformed_is_not_json() {
        let ctx = Ctx {
            shape: Shape::OpenAi,
            model: "m".into(),
            seq: 1,
        };
        let body = malformed_body(&ctx);
        assert!(serde_json::from_slice::<Value>(&body).is_err());
    }
}
