//! What a streamed answer delivered to the caller so far, read from exactly
//! the bytes the caller received (after the gate, after any splice): the
//! visible text, whether the answer finished, whether it can be continued
//! by another upstream, its usage and the model that answered.
//!
//! One reader for the three stream shapes, told apart per event: OpenAI chat
//! completion chunks (and legacy completions), OpenAI Responses API events
//! (`type: "response.*"`), Anthropic messages events.
//!
//! *Finished* means the answer's own finish arrived: a chat `finish_reason`
//! (or `[DONE]`), Anthropic's `message_delta` with a `stop_reason` (or
//! `message_stop`), the Responses API's `response.completed` /
//! `response.incomplete` or every output item it opened done. A stream that
//! ends without it after output was cut; one that finished but lacks its
//! terminator (`[DONE]`, `message_stop`, `response.completed`) is complete.

use super::sse::EventReader;
use crate::types::ApiFamily;
use serde_json::Value;

/// An event longer than this is not read (its answer is not continued).
const MAX_EVENT: usize = 8 << 20;

/// Token counts an answer reported, each when seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens (`prompt_tokens`, `input_tokens`).
    pub input_tokens: Option<u64>,
    /// Generated tokens (`completion_tokens`, `output_tokens`).
    pub output_tokens: Option<u64>,
}

/// The Anthropic content block the caller saw last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Block {
    pub(crate) index: u64,
    pub(crate) open: bool,
    pub(crate) text: bool,
}

/// The Responses API ids the caller saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResponseIds {
    pub(crate) response_id: Option<String>,
    /// The last `sequence_number`.
    pub(crate) seq: Option<u64>,
    /// The message item holding the text: its id, `output_index`, still open.
    pub(crate) item: Option<(String, u64, bool)>,
    /// Its text part: `content_index`, still open.
    pub(crate) part: Option<(u64, bool)>,
    /// The highest `output_index` opened.
    pub(crate) last_output: Option<u64>,
    /// Output items opened and not done.
    open_items: u32,
    /// An output item other than reasoning is done.
    answered: bool,
}

/// What the caller saw, event by event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) text: String,
    /// Output other than text reached the caller (a tool call, a refusal, a
    /// second choice, an event not understood).
    other: bool,
    /// Of that, output the reader knows to be part of the answer (all but the
    /// events it does not understand).
    output: bool,
    pub(crate) finished: bool,
    usage: Usage,
    usage_seen: bool,
    pub(crate) model: Option<String>,
    pub(crate) block: Option<Block>,
    pub(crate) ids: ResponseIds,
}

/// What a streamed answer delivered so far (see the module documentation).
#[derive(Debug, Clone)]
pub struct Transcript {
    api: ApiFamily,
    reader: EventReader,
    pub(crate) seen: Seen,
}

impl Transcript {
    /// An empty transcript for a stream of `api`'s family.
    pub fn new(api: ApiFamily) -> Transcript {
        Transcript {
            api,
            reader: EventReader::new(),
            seen: Seen {
                text: String::new(),
                other: false,
                output: false,
                finished: false,
                usage: Usage::default(),
                usage_seen: false,
                model: None,
                block: None,
                ids: ResponseIds::default(),
            },
        }
    }

    /// The family given at creation.
    pub fn api(&self) -> ApiFamily {
        self.api
    }

    /// Reads bytes the caller received, in any chunking.
    pub fn observe(&mut self, delivered: &[u8]) {
        self.reader.push(delivered);
        while let Some(e) = self.reader.next_event() {
            if e.truncated {
                self.seen.other = true;
            } else {
                self.seen.event(e.data);
            }
        }
        let done = self.reader.pending_start();
        self.reader.consume(done);
        if self.reader.buffered().len() > MAX_EVENT {
            self.reader.drop_buffered();
            self.seen.other = true;
        }
    }

    /// The visible text so far: choice 0's content, the text blocks, the
    /// output text (reasoning is not part of it).
    pub fn text(&self) -> &str {
        &self.seen.text
    }

    /// Whether another upstream can continue the answer: only text reached
    /// the caller (no tool-call or function-call delta, no refusal, no second
    /// choice) and it did not finish.
    pub fn resumable(&self) -> bool {
        !self.seen.other && !self.seen.finished
    }

    /// Whether the answer's finish arrived (see the module documentation).
    pub fn finished(&self) -> bool {
        self.seen.finished
    }

    /// Whether any of the answer reached the caller: text, or output the
    /// reader knows (a tool-call or function-call delta, a refusal, a second
    /// choice, content parts). Events it does not understand do not count, so
    /// an event stream of another shape is never taken for a cut answer.
    pub fn shown(&self) -> bool {
        !self.seen.text.is_empty() || self.seen.output
    }

    /// The usage the stream reported, when it reported any.
    pub fn usage(&self) -> Option<Usage> {
        self.seen.usage_seen.then_some(self.seen.usage)
    }

    /// The model the stream named last (a splice's is the fallback's).
    pub fn model(&self) -> Option<&str> {
        self.seen.model.as_deref()
    }
}

/// `v[key]` as a string.
pub(crate) fn str_of<'v>(v: &'v Value, key: &str) -> Option<&'v str> {
    v.get(key).and_then(Value::as_str)
}

/// `v[key]` as an integer.
pub(crate) fn u64_of(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

/// Present and not null, `""`, `[]` or `{}`.
fn present(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(_) => true,
    }
}

impl Seen {
    /// Output other than text, known to be part of the answer, reached the caller.
    fn shown_other(&mut self) {
        self.other = true;
        self.output = true;
    }

    fn event(&mut self, data: &[u8]) {
        if data.starts_with(b"[DONE]") {
            self.finished = true;
            return;
        }
        if !super::quick::text_event(self, data) {
            self.event_tree(data);
        }
    }

    /// An event read as a JSON tree: every shape, every field.
    pub(crate) fn event_tree(&mut self, data: &[u8]) {
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            return; // not JSON: the gate's to drop, nothing shown
        };
        if let Some(n) = u64_of(&v, "sequence_number") {
            self.ids.seq = Some(n);
        }
        match str_of(&v, "type") {
            Some(t) if t.starts_with("response.") => self.responses(t, &v),
            Some(t) => self.anthropic(t, &v),
            None => self.chat(&v),
        }
    }

    fn add_usage(&mut self, u: Option<&Value>, input: &str, output: &str) {
        let Some(u) = u.filter(|u| u.is_object()) else { return };
        self.usage_seen = true;
        if let Some(n) = u64_of(u, input) {
            self.usage.input_tokens = Some(n);
        }
        if let Some(n) = u64_of(u, output) {
            self.usage.output_tokens = Some(n);
        }
    }

    pub(crate) fn set_model(&mut self, m: Option<&str>) {
        if let Some(m) = m {
            if self.model.as_deref() != Some(m) {
                self.model = Some(m.to_owned());
            }
        }
    }

    /// An OpenAI chat completion chunk (or a legacy completion chunk).
    fn chat(&mut self, v: &Value) {
        self.set_model(str_of(v, "model"));
        self.add_usage(v.get("usage"), "prompt_tokens", "completion_tokens");
        if v.get("error").is_some_and(Value::is_object) {
            return; // an error chunk: the gate reports it
        }
        for c in v.get("choices").and_then(Value::as_array).into_iter().flatten() {
            if u64_of(c, "index").unwrap_or(0) != 0 {
                self.shown_other();
                continue;
            }
            if let Some(d) = c.get("delta").or_else(|| c.get("message")) {
                if let Some(t) = str_of(d, "content") {
                    self.text.push_str(t);
                } else if present(d.get("content")) {
                    self.shown_other(); // content parts: not plain text
                }
                if ["tool_calls", "function_call", "refusal", "audio"]
                    .iter()
                    .any(|k| present(d.get(*k)))
                {
                    self.shown_other();
                }
            }
            if let Some(t) = str_of(c, "text") {
                self.text.push_str(t);
            }
            if present(c.get("finish_reason")) {
                self.finished = true;
            }
        }
    }

    /// An Anthropic messages event.
    fn anthropic(&mut self, t: &str, v: &Value) {
        match t {
            "message_start" => {
                let m = v.get("message");
                self.set_model(m.and_then(|m| str_of(m, "model")));
                self.add_usage(m.and_then(|m| m.get("usage")), "input_tokens", "output_tokens");
            }
            "content_block_start" => {
                let b = v.get("content_block");
                let kind = b.and_then(|b| str_of(b, "type")).unwrap_or("");
                let text = kind == "text";
                if text {
                    self.text.push_str(b.and_then(|b| str_of(b, "text")).unwrap_or(""));
                } else if !matches!(kind, "thinking" | "redacted_thinking") {
                    self.shown_other(); // tool_use, server tool results, ...
                }
                self.block = Some(Block {
                    index: u64_of(v, "index").unwrap_or(0),
                    open: true,
                    text,
                });
            }
            "content_block_delta" => {
                let d = v.get("delta");
                match d.and_then(|d| str_of(d, "type")) {
                    Some("text_delta") => self.text.push_str(d.and_then(|d| str_of(d, "text")).unwrap_or("")),
                    Some("thinking_delta" | "signature_delta" | "citations_delta") => {}
                    _ => self.shown_other(), // input_json_delta, ...
                }
            }
            "content_block_stop" => {
                if let Some(b) = &mut self.block {
                    b.open &= u64_of(v, "index") != Some(b.index);
                }
            }
            "message_delta" => {
                if present(v.get("delta").and_then(|d| d.get("stop_reason"))) {
                    self.finished = true;
                }
                self.add_usage(v.get("usage"), "input_tokens", "output_tokens");
            }
            "message_stop" => self.finished = true,
            "ping" | "error" => {}
            _ => self.other = true,
        }
    }

    /// An OpenAI Responses API event.
    fn responses(&mut self, t: &str, v: &Value) {
        let ids = &mut self.ids;
        match t {
            "response.created" | "response.in_progress" | "response.queued" => {
                let r = v.get("response");
                if let Some(id) = r.and_then(|r| str_of(r, "id")) {
                    ids.response_id = Some(id.to_owned());
                }
                self.set_model(r.and_then(|r| str_of(r, "model")));
            }
            "response.output_item.added" => {
                let item = v.get("item");
                let at = u64_of(v, "output_index").unwrap_or(0);
                ids.open_items += 1;
                ids.last_output = Some(ids.last_output.map_or(at, |l| l.max(at)));
                match item.and_then(|i| str_of(i, "type")) {
                    Some("message") => {
                        let id = item.and_then(|i| str_of(i, "id")).unwrap_or("").to_owned();
                        ids.item = Some((id, at, true));
                        ids.part = None;
                    }
                    Some("reasoning") => {}
                    _ => self.shown_other(), // function_call, ...
                }
            }
            "response.content_part.added" => match v.get("part").and_then(|p| str_of(p, "type")) {
                Some("output_text") => ids.part = Some((u64_of(v, "content_index").unwrap_or(0), true)),
                _ => self.shown_other(), // refusal, ...
            },
            "response.output_text.delta" => self.text.push_str(str_of(v, "delta").unwrap_or("")),
            "response.output_text.done" | "response.content_part.done" => {
                if let Some(p) = &mut ids.part {
                    p.1 = false;
                }
            }
            "response.output_item.done" => {
                ids.open_items = ids.open_items.saturating_sub(1);
                let item = v.get("item");
                let id = item.and_then(|i| str_of(i, "id"));
                if let Some(open) = ids.item.as_mut().filter(|i| Some(i.0.as_str()) == id) {
                    open.2 = false;
                }
                ids.answered |= item.and_then(|i| str_of(i, "type")) != Some("reasoning");
                // Every item it opened is done, an answer among them: only the
                // summary event was to come.
                self.finished |= ids.open_items == 0 && ids.answered;
            }
            "response.completed" | "response.incomplete" => {
                self.finished = true;
                let r = v.get("response");
                self.set_model(r.and_then(|r| str_of(r, "model")));
                self.add_usage(r.and_then(|r| r.get("usage")), "input_tokens", "output_tokens");
            }
            "response.output_text.annotation.added"
            | "response.reasoning_summary_part.added"
            | "response.reasoning_summary_part.done"
            | "response.reasoning_summary_text.delta"
            | "response.reasoning_summary_text.done"
            | "response.reasoning_text.delta"
            | "response.reasoning_text.done"
            | "response.failed" => {}
            _ => self.other = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(api: ApiFamily, events: &[&str]) -> Transcript {
        let mut t = Transcript::new(api);
        let body: String = events.iter().map(|e| format!("{e}\n\n")).collect();
        // Byte by byte: the transcript reads any chunking.
        for b in body.as_bytes().chunks(1) {
            t.observe(b);
        }
        t
    }

    // OpenAI chat completion chunks as the API sends them (with
    // `stream_options.include_usage`: `usage: null` until the last chunk).
    const CHAT_ROLE: &str = r#"data: {"id":"chatcmpl-B9","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_f9f4fb6dbf","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"x"}"#;
    const CHAT_TEXT: &str = r#"data: {"id":"chatcmpl-B9","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_f9f4fb6dbf","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}"#;
    const CHAT_STOP: &str = r#"data: {"id":"chatcmpl-B9","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}"#;
    const CHAT_USAGE: &str = r#"data: {"id":"chatcmpl-B9","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}"#;
    const CHAT_TOOL: &str = r#"data: {"id":"chatcmpl-B9","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}],"refusal":null},"logprobs":null,"finish_reason":null}]}"#;

    #[test]
    fn openai_chat_text_finish_and_usage() {
        let t = read(ApiFamily::OpenAi, &[CHAT_ROLE, CHAT_TEXT, CHAT_TEXT]);
        assert_eq!((t.text(), t.resumable(), t.finished()), ("HelloHello", true, false));
        assert_eq!((t.usage(), t.model()), (None, Some("gpt-4o-2024-08-06")));
        let t = read(
            ApiFamily::OpenAi,
            &[CHAT_ROLE, CHAT_TEXT, CHAT_STOP, CHAT_USAGE, "data: [DONE]"],
        );
        assert!(t.finished() && !t.resumable());
        let usage = Usage {
            input_tokens: Some(19),
            output_tokens: Some(10),
        };
        assert_eq!(t.usage(), Some(usage));
        // Finished without [DONE] (and [DONE] alone finishes a stream that sent no finish_reason).
        assert!(read(ApiFamily::OpenAi, &[CHAT_TEXT, CHAT_STOP]).finished());
        assert!(read(ApiFamily::OpenAi, &[CHAT_TEXT, "data: [DONE]"]).finished());
    }

    #[test]
    fn openai_chat_output_that_cannot_be_continued() {
        let refusal = r#"data: {"choices":[{"index":0,"delta":{"refusal":"I can't"}}]}"#;
        let second = r#"data: {"choices":[{"index":1,"delta":{"content":"B"}}]}"#;
        let parts = r#"data: {"choices":[{"index":0,"delta":{"content":[{"type":"text","text":"x"}]}}]}"#;
        let error = r#"data: {"error":{"message":"boom","type":"server_error"}}"#;
        for other in [CHAT_TOOL, refusal, second, parts] {
            let t = read(ApiFamily::OpenAi, &[CHAT_TEXT, other]);
            assert!(!t.resumable() && !t.finished(), "{other}");
            // Without any text, each is still output the caller was shown.
            assert!(read(ApiFamily::OpenAi, &[other]).shown(), "{other}");
        }
        // The role-only opening and usage show nothing; events of another shape are not taken for output.
        assert!(!read(ApiFamily::OpenAi, &[CHAT_ROLE, CHAT_USAGE]).shown());
        let foreign = read(ApiFamily::OpenAi, &[r#"data: {"type":"progress","pct":50}"#]);
        assert!(!foreign.shown() && !foreign.resumable());
        // An error event and malformed data are the gate's; DeepSeek-style reasoning is not text.
        let reasoning = r#"data: {"choices":[{"index":0,"delta":{"content":null,"reasoning_content":"think"}}]}"#;
        let t = read(ApiFamily::OpenAi, &[reasoning, CHAT_TEXT, error, "data: {\"x\":"]);
        assert_eq!((t.text(), t.resumable()), ("Hello", true));
        // Legacy completions.
        let legacy = r#"data: {"id":"cmpl-1","object":"text_completion","choices":[{"text":" world","index":0,"logprobs":null,"finish_reason":null}],"model":"gpt-3.5-turbo-instruct"}"#;
        assert_eq!(read(ApiFamily::OpenAi, &[legacy]).text(), " world");
    }

    // Anthropic events as the API documents them (spacing included).
    const MSG_START: &str = "event: message_start\ndata: {\"type\": \"message_start\", \"message\": {\"id\": \"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY\", \"type\": \"message\", \"role\": \"assistant\", \"content\": [], \"model\": \"claude-sonnet-4-5-20250929\", \"stop_reason\": null, \"stop_sequence\": null, \"usage\": {\"input_tokens\": 25, \"output_tokens\": 1}}}";
    const BLOCK_START: &str = "event: content_block_start\ndata: {\"type\": \"content_block_start\", \"index\": 0, \"content_block\": {\"type\": \"text\", \"text\": \"\"}}";
    const PING: &str = "event: ping\ndata: {\"type\": \"ping\"}";
    const DELTA: &str = "event: content_block_delta\ndata: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"Hello\"}}";
    const BLOCK_STOP: &str = "event: content_block_stop\ndata: {\"type\": \"content_block_stop\", \"index\": 0}";
    const MSG_DELTA: &str = "event: message_delta\ndata: {\"type\": \"message_delta\", \"delta\": {\"stop_reason\": \"end_turn\", \"stop_sequence\":null}, \"usage\": {\"output_tokens\": 15}}";
    const MSG_STOP: &str = "event: message_stop\ndata: {\"type\": \"message_stop\"}";
    const OVERLOADED: &str = "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}";

    #[test]
    fn anthropic_text_blocks_pings_errors_and_finish() {
        let t = read(
            ApiFamily::Anthropic,
            &[MSG_START, BLOCK_START, PING, DELTA, PING, DELTA, OVERLOADED],
        );
        assert_eq!((t.text(), t.resumable(), t.finished()), ("HelloHello", true, false));
        assert_eq!(
            t.seen.block,
            Some(Block {
                index: 0,
                open: true,
                text: true
            })
        );
        assert_eq!(t.model(), Some("claude-sonnet-4-5-20250929"));
        let t = read(
            ApiFamily::Anthropic,
            &[MSG_START, BLOCK_START, DELTA, BLOCK_STOP, MSG_DELTA],
        );
        assert!(
            t.finished(),
            "a stop_reason is the finish; message_stop only ends the stream"
        );
        assert_eq!(t.seen.block.map(|b| b.open), Some(false));
        let usage = Usage {
            input_tokens: Some(25),
            output_tokens: Some(15),
        };
        assert_eq!(t.usage(), Some(usage));
        assert!(read(ApiFamily::Anthropic, &[MSG_START, BLOCK_START, DELTA, MSG_STOP]).finished());
    }

    #[test]
    fn anthropic_tool_use_is_not_resumable_and_thinking_is_not_text() {
        let tool = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_01\",\"name\":\"get_weather\",\"input\":{}}}";
        let json = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"loc\"}}";
        let t = read(
            ApiFamily::Anthropic,
            &[MSG_START, BLOCK_START, DELTA, BLOCK_STOP, tool, json],
        );
        assert!(!t.resumable());
        let thinking = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}";
        let thought = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Let me\"}}";
        let signature = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"EqQB\"}}";
        let text1 = BLOCK_START.replace("\"index\": 0", "\"index\": 1");
        let delta1 = DELTA.replace("\"index\": 0", "\"index\": 1");
        let t = read(
            ApiFamily::Anthropic,
            &[MSG_START, thinking, thought, signature, BLOCK_STOP, &text1, &delta1],
        );
        assert_eq!((t.text(), t.resumable()), ("Hello", true));
        assert_eq!(t.seen.block.map(|b| (b.index, b.text)), Some((1, true)));
        let unknown = "event: brand_new\ndata: {\"type\":\"brand_new\"}";
        assert!(!read(ApiFamily::Anthropic, &[MSG_START, unknown]).resumable());
    }

    // Responses API events as the API sends them (trimmed of fields no reader needs).
    const R_CREATED: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_67c9\",\"object\":\"response\",\"created_at\":1741290958,\"status\":\"in_progress\",\"model\":\"gpt-4.1-2025-04-14\",\"output\":[],\"usage\":null}}";
    const R_PROGRESS: &str = "event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_67c9\",\"status\":\"in_progress\",\"output\":[]}}";
    const R_ITEM: &str = "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,\"item\":{\"id\":\"msg_67c9\",\"type\":\"message\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}";
    const R_PART: &str = "event: response.content_part.added\ndata: {\"type\":\"response.content_part.added\",\"sequence_number\":3,\"item_id\":\"msg_67c9\",\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}";
    const R_DELTA: &str = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,\"item_id\":\"msg_67c9\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\",\"logprobs\":[]}";
    const R_ITEM_DONE: &str = "event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"sequence_number\":7,\"output_index\":0,\"item\":{\"id\":\"msg_67c9\",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi\",\"annotations\":[]}]}}";
    const R_COMPLETED: &str = "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":8,\"response\":{\"id\":\"resp_67c9\",\"status\":\"completed\",\"model\":\"gpt-4.1-2025-04-14\",\"output\":[],\"usage\":{\"input_tokens\":36,\"output_tokens\":87,\"total_tokens\":123}}}";

    #[test]
    fn responses_text_ids_and_finish() {
        let t = read(ApiFamily::OpenAi, &[R_CREATED, R_PROGRESS, R_ITEM, R_PART, R_DELTA]);
        assert_eq!((t.text(), t.resumable(), t.finished()), ("Hi", true, false));
        let ids = &t.seen.ids;
        assert_eq!(ids.response_id.as_deref(), Some("resp_67c9"));
        assert_eq!(
            (ids.seq, ids.item.clone(), ids.part),
            (Some(4), Some(("msg_67c9".into(), 0, true)), Some((0, true)))
        );
        let t = read(ApiFamily::OpenAi, &[R_CREATED, R_ITEM, R_PART, R_DELTA, R_ITEM_DONE]);
        assert!(t.finished(), "every item it opened is done");
        let t = read(
            ApiFamily::OpenAi,
            &[R_CREATED, R_ITEM, R_PART, R_DELTA, R_ITEM_DONE, R_COMPLETED],
        );
        let usage = Usage {
            input_tokens: Some(36),
            output_tokens: Some(87),
        };
        assert_eq!(t.usage(), Some(usage));
    }

    #[test]
    fn responses_reasoning_is_not_an_answer_and_function_calls_are_not_text() {
        let reasoning = "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"id\":\"rs_1\",\"type\":\"reasoning\",\"summary\":[]}}";
        let reasoned = "event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"output_index\":0,\"item\":{\"id\":\"rs_1\",\"type\":\"reasoning\",\"summary\":[]}}";
        let t = read(ApiFamily::OpenAi, &[R_CREATED, reasoning, reasoned]);
        assert!(!t.finished() && t.resumable(), "reasoning done is not the answer done");
        let call = "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":1,\"item\":{\"id\":\"fc_1\",\"type\":\"function_call\",\"status\":\"in_progress\",\"arguments\":\"\",\"call_id\":\"call_1\",\"name\":\"get_weather\"}}";
        let args = "event: response.function_call_arguments.delta\ndata: {\"type\":\"response.function_call_arguments.delta\",\"item_id\":\"fc_1\",\"output_index\":1,\"delta\":\"{\\\"\"}";
        let t = read(ApiFamily::OpenAi, &[R_CREATED, R_ITEM, R_PART, R_DELTA, call, args]);
        assert!(!t.resumable());
        assert_eq!(t.seen.ids.last_output, Some(1));
    }

    #[test]
    fn an_event_too_long_to_read_is_not_continued() {
        let mut t = Transcript::new(ApiFamily::OpenAi);
        t.observe(CHAT_TEXT.as_bytes());
        t.observe(b"\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"");
        t.observe(&vec![b'x'; MAX_EVENT]);
        assert!(!t.resumable());
        t.observe(b"\"}}]}\n\n");
        assert_eq!(t.text(), "Hello");
    }
}
