//! Streams shaped exactly like the fault server's (tests/fault-server,
//! `shapes/`): sorted JSON keys, fixed `created`, ids from a sequence number,
//! the deterministic answer `answer from M: w1 … wN` in deltas. Checked byte
//! for byte against answers captured from the server (`testdata/`), then
//! used to generate every cut point and chunking in the property tests.

use serde_json::{json, Value};

/// The wire shape of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Chat,
    Responses,
    Anthropic,
}

pub(crate) const SHAPES: [Shape; 3] = [Shape::Chat, Shape::Responses, Shape::Anthropic];

/// The fault server's answer of `model`, as its content deltas.
pub(crate) fn answer(model: &str, words: u32) -> Vec<String> {
    let mut out = vec![format!("answer from {model}:")];
    out.extend((1..=words).map(|i| format!(" w{i}")));
    out
}

/// One response's constants.
pub(crate) struct Ctx<'a> {
    pub(crate) shape: Shape,
    pub(crate) model: &'a str,
    pub(crate) seq: u64,
    pub(crate) include_usage: bool,
    pub(crate) usage: (u64, u64),
}

const CREATED: u64 = 1_700_000_000;

fn sse(name: Option<&str>, v: &Value) -> String {
    match name {
        Some(n) => format!("event: {n}\ndata: {v}\n\n"),
        None => format!("data: {v}\n\n"),
    }
}

/// The frames (body writes) of a stream: preamble, one per delta, then the
/// finish when `finish` (with its terminator when `terminator`).
pub(crate) fn frames(c: &Ctx<'_>, deltas: &[String], finish: bool, terminator: bool) -> Vec<String> {
    match c.shape {
        Shape::Chat => chat(c, deltas, finish, terminator),
        Shape::Anthropic => anthropic(c, deltas, finish, terminator),
        Shape::Responses => responses(c, deltas, finish, terminator),
    }
}

fn chat(c: &Ctx<'_>, deltas: &[String], finish: bool, terminator: bool) -> Vec<String> {
    let chunk = |choices: Value, usage: Option<Value>| {
        let mut v = json!({"id": format!("chatcmpl-rw-{}", c.seq), "object": "chat.completion.chunk",
                           "created": CREATED, "model": c.model, "choices": choices});
        if c.include_usage {
            v["usage"] = usage.unwrap_or(Value::Null);
        }
        sse(None, &v)
    };
    let choice =
        |delta: Value, fin: Option<&str>| json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": fin}]);
    let mut out = vec![chunk(choice(json!({"role": "assistant", "content": ""}), None), None)];
    out.extend(deltas.iter().map(|d| chunk(choice(json!({"content": d}), None), None)));
    if finish {
        let mut f = chunk(choice(json!({}), Some("stop")), None);
        if c.include_usage {
            let (i, o) = c.usage;
            let u = json!({"prompt_tokens": i, "completion_tokens": o, "total_tokens": i + o});
            f.push_str(&chunk(json!([]), Some(u)));
        }
        if terminator {
            f.push_str("data: [DONE]\n\n");
        }
        out.push(f);
    }
    out
}

fn anthropic(c: &Ctx<'_>, deltas: &[String], finish: bool, terminator: bool) -> Vec<String> {
    let message = json!({"id": format!("msg_rw_{}", c.seq), "type": "message", "role": "assistant",
        "model": c.model, "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": c.usage.0, "output_tokens": 1}});
    let mut pre = sse(
        Some("message_start"),
        &json!({"type": "message_start", "message": message}),
    );
    pre.push_str(&sse(
        Some("content_block_start"),
        &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ));
    let mut out = vec![pre];
    out.extend(deltas.iter().map(|d| {
        sse(
            Some("content_block_delta"),
            &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": d}}),
        )
    }));
    if finish {
        let mut f = sse(
            Some("content_block_stop"),
            &json!({"type": "content_block_stop", "index": 0}),
        );
        f.push_str(&sse(
            Some("message_delta"),
            &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                    "usage": {"output_tokens": c.usage.1}}),
        ));
        if terminator {
            f.push_str(&sse(Some("message_stop"), &json!({"type": "message_stop"})));
        }
        out.push(f);
    }
    out
}

fn responses(c: &Ctx<'_>, deltas: &[String], finish: bool, terminator: bool) -> Vec<String> {
    let item_id = format!("msg_rw_{}", c.seq);
    let part = |text: &str| json!({"type": "output_text", "text": text, "annotations": []});
    let item = |status: &str, content: Value| json!({"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content});
    let response = |status: &str, output: Value, usage: Value| {
        json!({"id": format!("resp_rw_{}", c.seq), "object": "response", "created_at": CREATED,
            "status": status, "model": c.model, "output": output, "error": null,
            "incomplete_details": null, "parallel_tool_calls": true, "tool_choice": "auto",
            "tools": [], "usage": usage})
    };
    let mut seq = 0;
    let mut event = |out: &mut String, kind: &str, mut v: Value| {
        v["type"] = json!(kind);
        v["sequence_number"] = json!(seq);
        seq += 1;
        out.push_str(&sse(Some(kind), &v));
    };
    let ids = |mut v: Value| {
        v["item_id"] = json!(item_id);
        v["output_index"] = json!(0);
        v["content_index"] = json!(0);
        v
    };
    let mut pre = String::new();
    event(
        &mut pre,
        "response.created",
        json!({"response": response("in_progress", json!([]), Value::Null)}),
    );
    event(
        &mut pre,
        "response.output_item.added",
        json!({"output_index": 0, "item": item("in_progress", json!([]))}),
    );
    event(&mut pre, "response.content_part.added", ids(json!({"part": part("")})));
    let mut out = vec![pre];
    for d in deltas {
        let mut f = String::new();
        event(&mut f, "response.output_text.delta", ids(json!({"delta": d})));
        out.push(f);
    }
    if finish {
        let text: String = deltas.concat();
        let mut f = String::new();
        event(&mut f, "response.output_text.done", ids(json!({"text": text})));
        event(&mut f, "response.content_part.done", ids(json!({"part": part(&text)})));
        let done = item("completed", json!([part(&text)]));
        event(
            &mut f,
            "response.output_item.done",
            json!({"output_index": 0, "item": done}),
        );
        if terminator {
            let (i, o) = c.usage;
            let usage = json!({"input_tokens": i, "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": o, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": i + o});
            let r = response("completed", json!([done]), usage);
            event(&mut f, "response.completed", json!({"response": r}));
        }
        out.push(f);
    }
    out
}

/// The fault server's usage count: whitespace-separated words.
pub(crate) fn words(texts: &[&str]) -> u64 {
    texts.iter().map(|t| t.split_whitespace().count() as u64).sum()
}
