//! Anthropic messages: `message` bodies and `message_start` … `message_stop` streams.

use serde_json::{json, Value};

use super::{sse_event, Ctx, Frame};

pub fn body(ctx: &Ctx, text: &str) -> Value {
    json!({
        "id": ctx.id(),
        "type": "message",
        "role": "assistant",
        "model": ctx.model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": null,
        "usage": {"input_tokens": ctx.usage.input, "output_tokens": ctx.usage.output},
    })
}

pub fn stream(ctx: &Ctx, deltas: &[String], terminator: bool) -> Vec<Frame> {
    let mut preamble = String::new();
    sse_event(
        &mut preamble,
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
                "usage": {"input_tokens": ctx.usage.input, "output_tokens": 1},
            },
        }),
    );
    sse_event(
        &mut preamble,
        "content_block_start",
        &json!({
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        }),
    );
    let mut frames = vec![Frame::event(preamble)];
    frames.extend(deltas.iter().map(|d| {
        let mut out = String::new();
        sse_event(
            &mut out,
            "content_block_delta",
            &json!({
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": d},
            }),
        );
        Frame {
            bytes: out.into(),
            delta: Some(d.clone()),
        }
    }));
    let mut finish = String::new();
    sse_event(
        &mut finish,
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
    );
    sse_event(
        &mut finish,
        "message_delta",
        &json!({
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"output_tokens": ctx.usage.output},
        }),
    );
    if terminator {
        sse_event(&mut finish, "message_stop", &json!({"type": "message_stop"}));
    }
    frames.push(Frame::event(finish));
    frames
}

/// What Anthropic sends when it is overloaded mid-stream.
pub fn error_event() -> String {
    let mut out = String::new();
    sse_event(
        &mut out,
        "error",
        &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    );
    out
}
