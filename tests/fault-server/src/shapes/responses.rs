//! OpenAI Responses API: `response` bodies and `response.*` event streams.

use serde_json::{json, Value};

use super::{sse_event, Ctx, Frame, CREATED};

fn item_id(ctx: &Ctx) -> String {
    format!("msg_rw_{}", ctx.seq)
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

fn message_item(ctx: &Ctx, status: &str, content: Value) -> Value {
    json!({
        "id": item_id(ctx),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    })
}

fn response(ctx: &Ctx, status: &str, output: Value, usage: Value) -> Value {
    json!({
        "id": ctx.id(),
        "object": "response",
        "created_at": CREATED,
        "status": status,
        "model": ctx.model,
        "output": output,
        "error": null,
        "incomplete_details": null,
        "parallel_tool_calls": true,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    })
}

fn usage(ctx: &Ctx) -> Value {
    json!({
        "input_tokens": ctx.usage.input,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": ctx.usage.output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": ctx.usage.input + ctx.usage.output,
    })
}

pub fn body(ctx: &Ctx, text: &str) -> Value {
    let item = message_item(ctx, "completed", json!([text_part(text)]));
    response(ctx, "completed", json!([item]), usage(ctx))
}

/// Writes one event with its `type` and running `sequence_number`.
fn event(out: &mut String, seq: &mut usize, kind: &str, mut value: Value) {
    value["type"] = json!(kind);
    value["sequence_number"] = json!(*seq);
    *seq += 1;
    sse_event(out, kind, &value);
}

pub fn stream(ctx: &Ctx, deltas: &[String], terminator: bool) -> Vec<Frame> {
    let mut seq = 0;
    let ids = json!({"item_id": item_id(ctx), "output_index": 0, "content_index": 0});
    let with_ids = |mut v: Value| {
        for (k, id) in ids.as_object().into_iter().flatten() {
            v[k] = id.clone();
        }
        v
    };
    let mut preamble = String::new();
    let in_progress = response(ctx, "in_progress", json!([]), Value::Null);
    event(
        &mut preamble,
        &mut seq,
        "response.created",
        json!({"response": in_progress}),
    );
    event(
        &mut preamble,
        &mut seq,
        "response.output_item.added",
        json!({"output_index": 0, "item": message_item(ctx, "in_progress", json!([]))}),
    );
    event(
        &mut preamble,
        &mut seq,
        "response.content_part.added",
        with_ids(json!({"part": text_part("")})),
    );
    let mut frames = vec![Frame::event(preamble)];
    for d in deltas {
        let mut out = String::new();
        event(
            &mut out,
            &mut seq,
            "response.output_text.delta",
            with_ids(json!({"delta": d})),
        );
        frames.push(Frame {
            bytes: out.into(),
            delta: Some(d.clone()),
        });
    }
    let text: String = deltas.concat();
    let mut finish = String::new();
    event(
        &mut finish,
        &mut seq,
        "response.output_text.done",
        with_ids(json!({"text": text})),
    );
    event(
        &mut finish,
        &mut seq,
        "response.content_part.done",
        with_ids(json!({"part": text_part(&text)})),
    );
    let item = message_item(ctx, "completed", json!([text_part(&text)]));
    event(
        &mut finish,
        &mut seq,
        "response.output_item.done",
        json!({"output_index": 0, "item": item.clone()}),
    );
    if terminator {
        let done = response(ctx, "completed", json!([item]), usage(ctx));
        event(&mut finish, &mut seq, "response.completed", json!({"response": done}));
    }
    frames.push(Frame::event(finish));
    frames
}

/// The Responses API's `error` event.
pub fn error_event(sequence_number: usize) -> String {
    let mut out = String::new();
    let mut seq = sequence_number;
    event(
        &mut out,
        &mut seq,
        "error",
        json!({
            "code": "server_error",
            "message": "retrywise-fault-server: the stream failed (overloaded)",
            "param": null,
        }),
    );
    out
}
