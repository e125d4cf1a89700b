//! OpenAI chat completions: `chat.completion` bodies and `chat.completion.chunk`
//! streams ending in `data: [DONE]`.

use serde_json::{json, Value};

use super::{sse_data, Ctx, Frame, CREATED};

fn usage(ctx: &Ctx) -> Value {
    json!({
        "prompt_tokens": ctx.usage.input,
        "completion_tokens": ctx.usage.output,
        "total_tokens": ctx.usage.input + ctx.usage.output,
    })
}

pub fn body(ctx: &Ctx, text: &str) -> Value {
    json!({
        "id": ctx.id(),
        "object": "chat.completion",
        "created": CREATED,
        "model": ctx.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": null},
            "logprobs": null,
            "finish_reason": "stop",
        }],
        "usage": usage(ctx),
    })
}

fn chunk(ctx: &Ctx, choices: Value, usage: Option<Value>) -> String {
    let mut value = json!({
        "id": ctx.id(),
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": ctx.model,
        "choices": choices,
    });
    // With include_usage the real API sends `usage: null` on every chunk but the last.
    if ctx.include_usage {
        value["usage"] = usage.unwrap_or(Value::Null);
    }
    let mut out = String::new();
    sse_data(&mut out, &value);
    out
}

fn choice(delta: Value, finish: Option<&str>) -> Value {
    json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}])
}

pub fn stream(ctx: &Ctx, deltas: &[String], terminator: bool) -> Vec<Frame> {
    let mut frames = vec![Frame::event(chunk(
        ctx,
        choice(json!({"role": "assistant", "content": ""}), None),
        None,
    ))];
    frames.extend(deltas.iter().map(|d| Frame {
        bytes: chunk(ctx, choice(json!({"content": d}), None), None).into(),
        delta: Some(d.clone()),
    }));
    let mut finish = chunk(ctx, choice(json!({}), Some("stop")), None);
    if ctx.include_usage {
        finish.push_str(&chunk(ctx, json!([]), Some(usage(ctx))));
    }
    if terminator {
        finish.push_str("data: [DONE]\n\n");
    }
    frames.push(Frame::event(finish));
    frames
}

/// openai-python and openai-node raise an `APIError` on a chunk with an `error` key.
pub fn error_event() -> String {
    let mut out = String::new();
    sse_data(
        &mut out,
        &json!({"error": {
            "message": "retrywise-fault-server: the stream failed (overloaded)",
            "type": "server_error",
            "param": null,
            "code": null,
        }}),
    );
    out
}
