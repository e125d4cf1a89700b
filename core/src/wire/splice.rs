//! The fallback's stream turned into the rest of the caller's stream: after
//! a continuation request ([`super::continuation_body`]) the fallback opens a
//! new answer, but the caller is in the middle of one. The [`Splicer`] drops
//! the fallback's opening (a role-only delta, `message_start`, an empty
//! `content_block_start`, `ping`, `response.created` and the message item and
//! text part it adds), drops the text the fallback restates ([`super::restate`]
//! decides how much), continues the caller's Anthropic content block indexes
//! and Responses API ids and sequence numbers, and passes deltas, the finish,
//! usage and the terminator on. The caller's SDK sees one answer: no second
//! opening, no gap, no repeated text. Events it leaves as they are go on
//! byte for byte; the ones it changes are written again (compact JSON).
//!
//! Hidden reasoning the fallback sends (Anthropic thinking blocks, Responses
//! reasoning items) is dropped: it would open new blocks or items in the
//! middle of the caller's text. Responses API summaries (`*.done`,
//! `response.completed`) name the caller's ids and carry the whole text.

use super::restate::Restate;
use super::sse::meaningful;
use super::sse::EventReader;
use super::transcript::{str_of, u64_of, Block, ResponseIds, Transcript};
use crate::types::ApiFamily;
use serde_json::{json, Value};

/// Turns a fallback's SSE bytes into bytes for the caller's stream (see the
/// module documentation). One per continuation attempt; feed it what the
/// fallback's stream gate released, and feed its output to the caller's
/// [`Transcript`] as well, so a second continuation starts from all the caller has.
#[derive(Debug, Clone)]
pub struct Splicer {
    reader: EventReader,
    state: Splice,
}

/// Where a text event keeps its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TextAt {
    /// `choices[0].delta.content`.
    Chat,
    /// `delta.text`.
    Anthropic,
    /// `delta`.
    Responses,
}

/// What a Responses summary event needs on its way out: the caller's ids and
/// the whole text of the caller's text part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fix {
    None,
    /// `response.output_text.done`: `text`.
    Text,
    /// `response.content_part.done`: `part.text`.
    Part,
    /// `response.output_item.done`: `item`.
    Item,
    /// `response.completed` and its kin: `response`.
    Response,
}

/// One event to send on.
#[derive(Debug, Clone)]
struct Out {
    name: String,
    /// The fallback's bytes, while the event is unchanged.
    raw: Option<Vec<u8>>,
    value: Value,
    /// A text delta's text.
    text: Option<(String, TextAt)>,
    /// Only text: dropped when all of its text was restated.
    pure: bool,
    fix: Fix,
}

impl Out {
    fn new(name: &[u8], bytes: &[u8], value: Value) -> Out {
        Out {
            name: String::from_utf8_lossy(name).into_owned(),
            raw: Some(bytes.to_vec()),
            value,
            text: None,
            pure: false,
            fix: Fix::None,
        }
    }

    /// Marks the event changed: it is written again.
    fn changed(mut self) -> Out {
        self.raw = None;
        self
    }
}

#[derive(Debug, Clone)]
struct Splice {
    restate: Restate,
    /// Text events read while the restatement is undecided.
    held: Vec<Out>,
    out: Vec<u8>,
    /// The caller's text before the splice, and the fallback's text passed on.
    delivered: String,
    passed: String,
    deduplicated: usize,
    /// Anthropic: the caller's last block, the next free index, and the
    /// fallback's block indexes mapped to the caller's (None: dropped).
    block: Option<Block>,
    next_index: u64,
    blocks: Vec<(u64, Option<u64>)>,
    merged_block: bool,
    /// Responses: the caller's ids, the next sequence number and output
    /// index, and the fallback's output indexes mapped to the caller's.
    ids: ResponseIds,
    next_seq: u64,
    next_output: u64,
    items: Vec<(u64, Option<u64>)>,
    /// The fallback's message item and text part that continue the caller's.
    merged_item: Option<String>,
    merged_part: Option<u64>,
}

impl Splicer {
    /// A splicer continuing what `transcript` says the caller has.
    pub fn new(api: ApiFamily, transcript: &Transcript) -> Splicer {
        let _ = api; // every shape is told apart per event
        let seen = &transcript.seen;
        Splicer {
            reader: EventReader::new(),
            state: Splice {
                restate: Restate::new(&seen.text),
                held: Vec::new(),
                out: Vec::new(),
                delivered: seen.text.clone(),
                passed: String::new(),
                deduplicated: 0,
                block: seen.block,
                next_index: seen.block.map_or(0, |b| b.index + 1),
                blocks: Vec::new(),
                merged_block: false,
                next_seq: seen.ids.seq.map_or(0, |s| s + 1),
                next_output: seen.ids.last_output.map_or(0, |o| o + 1),
                ids: seen.ids.clone(),
                items: Vec::new(),
                merged_item: None,
                merged_part: None,
            },
        }
    }

    /// Takes bytes of the fallback's stream; returns the bytes for the caller now.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.reader.push(chunk);
        self.read();
        std::mem::take(&mut self.state.out)
    }

    /// The fallback's stream ended: anything still held (text that may have
    /// been a restatement) is decided and sent. An unfinished last event is dropped.
    pub fn finish(&mut self) -> Vec<u8> {
        self.reader.close();
        self.read();
        self.state.settle();
        std::mem::take(&mut self.state.out)
    }

    /// Bytes of the fallback's text dropped as restating the caller's.
    pub fn deduplicated(&self) -> usize {
        self.state.deduplicated
    }

    fn read(&mut self) {
        while let Some(e) = self.reader.next_event() {
            if !e.truncated {
                self.state.event(e.name, e.data, e.bytes);
            }
        }
        let done = self.reader.pending_start();
        self.reader.consume(done);
    }
}

fn lookup(map: &[(u64, Option<u64>)], k: u64) -> Option<Option<u64>> {
    map.iter().find(|(f, _)| *f == k).map(|(_, c)| *c)
}

impl Splice {
    fn event(&mut self, name: &[u8], data: &[u8], bytes: &[u8]) {
        let Ok(value) = serde_json::from_slice::<Value>(data) else {
            // `[DONE]` (or anything not JSON): on as it is.
            let out = Out::new(name, bytes, Value::Null);
            return self.other(out);
        };
        let out = match str_of(&value, "type") {
            Some(t) if t.starts_with("response.") => {
                let t = t.to_owned();
                self.responses(&t, Out::new(name, bytes, value))
            }
            Some(t) => {
                let t = t.to_owned();
                self.anthropic(&t, Out::new(name, bytes, value))
            }
            None if !meaningful(name, data) => None,
            None => Some(chat(Out::new(name, bytes, value))),
        };
        match out {
            None => {}
            Some(out) if out.text.is_some() => self.text(out),
            Some(out) => self.other(out),
        }
    }

    /// A text delta: held while the restatement is undecided.
    fn text(&mut self, out: Out) {
        if self.restate.decided() {
            return self.send(out);
        }
        let (text, pure) = (out.text.as_ref().map(|t| t.0.clone()).unwrap_or_default(), out.pure);
        self.held.push(out);
        if self.restate.read(&text) || !pure {
            self.settle();
        }
    }

    /// Output other than text: the fallback's leading text (if any) ended.
    fn other(&mut self, out: Out) {
        self.settle();
        self.send(out);
    }

    /// Decides the restatement and sends the held text without it.
    fn settle(&mut self) {
        self.restate.settle();
        if self.held.is_empty() {
            return;
        }
        let mut left = self.restate.overlap();
        self.deduplicated = left;
        for mut out in std::mem::take(&mut self.held) {
            let Some((text, at)) = out.text.take() else { continue };
            let cut = left.min(text.len());
            left -= cut;
            if cut == 0 {
                out.text = Some((text, at));
                self.send(out);
                continue;
            }
            let rest = text[cut..].to_owned();
            if rest.is_empty() && out.pure {
                continue;
            }
            set_text(&mut out.value, at, &rest);
            out.text = Some((rest, at));
            self.send(out.changed());
        }
    }

    fn send(&mut self, mut out: Out) {
        if let Some((t, _)) = &out.text {
            self.passed.push_str(t);
        }
        if out.fix != Fix::None {
            self.fix(&mut out);
            out.raw = None;
        }
        if out.value.get("sequence_number").is_some() {
            out.value["sequence_number"] = json!(self.next_seq);
            self.next_seq += 1;
            out.raw = None;
        }
        match out.raw {
            Some(raw) => self.out.extend_from_slice(&raw),
            None => {
                if !out.name.is_empty() {
                    self.out.extend_from_slice(format!("event: {}\n", out.name).as_bytes());
                }
                self.out
                    .extend_from_slice(format!("data: {}\n\n", out.value).as_bytes());
            }
        }
    }

    /// An Anthropic event, its block index continuing the caller's.
    fn anthropic(&mut self, t: &str, mut out: Out) -> Option<Out> {
        let j = u64_of(&out.value, "index").unwrap_or(0);
        match t {
            "message_start" | "ping" => None,
            "content_block_start" => {
                let block = out.value.get("content_block").cloned().unwrap_or(Value::Null);
                let kind = str_of(&block, "type").unwrap_or("");
                if matches!(kind, "thinking" | "redacted_thinking") {
                    self.blocks.push((j, None));
                    return None;
                }
                if let Some(b) = self
                    .block
                    .filter(|b| kind == "text" && b.open && b.text && !self.merged_block)
                {
                    // The fallback's text continues the caller's open text block.
                    self.merged_block = true;
                    self.blocks.push((j, Some(b.index)));
                    let text = str_of(&block, "text").filter(|t| !t.is_empty())?;
                    let delta = json!({"type": "content_block_delta", "index": b.index,
                                       "delta": {"type": "text_delta", "text": text}});
                    let mut out = Out::new(b"content_block_delta", b"", delta).changed();
                    out.text = Some((text.to_owned(), TextAt::Anthropic));
                    out.pure = true;
                    return Some(out);
                }
                let c = self.next_index;
                self.next_index += 1;
                self.blocks.push((j, Some(c)));
                out.value["index"] = json!(c);
                Some(if c == j { out } else { out.changed() })
            }
            "content_block_delta" | "content_block_stop" => {
                let mut out = match lookup(&self.blocks, j) {
                    Some(None) => return None,
                    Some(Some(c)) if c != j => {
                        out.value["index"] = json!(c);
                        out.changed()
                    }
                    _ => out,
                };
                let delta = out.value.get("delta");
                if delta.and_then(|d| str_of(d, "type")) == Some("text_delta") {
                    let text = delta.and_then(|d| str_of(d, "text")).unwrap_or("").to_owned();
                    out.text = Some((text, TextAt::Anthropic));
                    out.pure = true;
                }
                Some(out)
            }
            _ => Some(out),
        }
    }

    /// A Responses API event, its ids and indexes continuing the caller's.
    fn responses(&mut self, t: &str, mut out: Out) -> Option<Out> {
        let v = &mut out.value;
        match t {
            "response.created" | "response.in_progress" | "response.queued" => return None,
            "response.output_item.added" => {
                let k = u64_of(v, "output_index").unwrap_or(0);
                let item = v.get("item").cloned().unwrap_or(Value::Null);
                match str_of(&item, "type") {
                    Some("reasoning") => {
                        self.items.push((k, None));
                        return None;
                    }
                    Some("message") if self.merged_item.is_none() && self.ids.item.as_ref().is_some_and(|i| i.2) => {
                        let caller = self.ids.item.as_ref().map_or(0, |i| i.1);
                        self.items.push((k, Some(caller)));
                        self.merged_item = Some(str_of(&item, "id").unwrap_or("").to_owned());
                        return None;
                    }
                    _ => {
                        let c = self.next_output;
                        self.next_output += 1;
                        self.items.push((k, Some(c)));
                        v["output_index"] = json!(c);
                        return Some(out.changed());
                    }
                }
            }
            "response.content_part.added" => {
                let merging = self.merged_part.is_none()
                    && self.merged_item.is_some()
                    && str_of(v, "item_id") == self.merged_item.as_deref()
                    && self.ids.part.is_some_and(|p| p.1)
                    && v.get("part").and_then(|p| str_of(p, "type")) == Some("output_text");
                if merging {
                    self.merged_part = u64_of(v, "content_index");
                    return None;
                }
            }
            _ => {}
        }
        if !self.map_ids(&mut out.value) {
            return None;
        }
        let merged = self.merged_item.is_some() && str_of(&out.value, "item_id") == self.caller_item_id();
        out.fix = match t {
            "response.output_text.delta" => {
                let text = str_of(&out.value, "delta").unwrap_or("").to_owned();
                out.text = Some((text, TextAt::Responses));
                out.pure = true;
                Fix::None
            }
            "response.output_text.done" if merged => Fix::Text,
            "response.content_part.done" if merged => Fix::Part,
            "response.output_item.done" => Fix::Item,
            "response.completed" | "response.incomplete" | "response.failed" => Fix::Response,
            _ => Fix::None,
        };
        Some(out)
    }

    fn caller_item_id(&self) -> Option<&str> {
        self.ids.item.as_ref().map(|i| i.0.as_str())
    }

    /// Rewrites a Responses event's `output_index`, `item_id` and
    /// `content_index` to the caller's; false: the event is dropped.
    fn map_ids(&self, v: &mut Value) -> bool {
        if let Some(k) = u64_of(v, "output_index") {
            match lookup(&self.items, k) {
                Some(None) => return false,
                Some(Some(c)) => v["output_index"] = json!(c),
                None => {}
            }
        }
        if self.merged_item.is_some() && str_of(v, "item_id") == self.merged_item.as_deref() {
            v["item_id"] = json!(self.caller_item_id().unwrap_or(""));
            if u64_of(v, "content_index").is_some() && u64_of(v, "content_index") == self.merged_part {
                v["content_index"] = json!(self.ids.part.map_or(0, |p| p.0));
            }
        }
        true
    }

    /// Responses summaries: the caller's ids, and the whole text of the
    /// caller's text part (what it had plus what was passed on).
    fn fix(&self, out: &mut Out) {
        let full = format!("{}{}", self.delivered, self.passed);
        let v = &mut out.value;
        match out.fix {
            Fix::None => {}
            Fix::Text => v["text"] = json!(full),
            Fix::Part => {
                if let Some(p) = v.get_mut("part").filter(|p| p.is_object()) {
                    p["text"] = json!(full);
                }
            }
            Fix::Item => {
                if let Some(item) = v.get_mut("item") {
                    self.fix_item(item, &full);
                }
            }
            Fix::Response => {
                if let Some(r) = v.get_mut("response").filter(|r| r.is_object()) {
                    if let Some(id) = &self.ids.response_id {
                        r["id"] = json!(id);
                    }
                    for item in r.get_mut("output").and_then(Value::as_array_mut).into_iter().flatten() {
                        self.fix_item(item, &full);
                    }
                }
            }
        }
    }

    /// The fallback's merged message item, as the caller's item with the whole text.
    fn fix_item(&self, item: &mut Value, full: &str) {
        if self.merged_item.is_none() || str_of(item, "id") != self.merged_item.as_deref() {
            return;
        }
        item["id"] = json!(self.caller_item_id().unwrap_or(""));
        let part = self.merged_part.unwrap_or(0) as usize;
        if let Some(p) = item.get_mut("content").and_then(|c| c.get_mut(part)) {
            if str_of(p, "type") == Some("output_text") {
                p["text"] = json!(full);
            }
        }
    }
}

/// A chat completion chunk: no second `role`, and its text when it carries some.
fn chat(mut out: Out) -> Out {
    let mut changed = false;
    for c in out
        .value
        .get_mut("choices")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(d) = c.get_mut("delta").and_then(Value::as_object_mut) {
            changed |= d.remove("role").is_some();
        }
    }
    let v = &out.value;
    let choices = v
        .get("choices")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let first = choices.first().filter(|c| u64_of(c, "index").unwrap_or(0) == 0);
    let delta = first.and_then(|c| c.get("delta"));
    if let Some(text) = delta.and_then(|d| str_of(d, "content")).filter(|t| !t.is_empty()) {
        let quiet = |x: Option<&Value>| x.is_none_or(Value::is_null);
        out.pure = choices.len() == 1
            && quiet(first.and_then(|c| c.get("finish_reason")))
            && quiet(v.get("usage"))
            && delta
                .and_then(Value::as_object)
                .is_some_and(|d| d.iter().all(|(k, x)| k == "content" || x.is_null()));
        out.text = Some((text.to_owned(), TextAt::Chat));
    }
    if changed {
        out.changed()
    } else {
        out
    }
}

fn set_text(v: &mut Value, at: TextAt, text: &str) {
    let slot = match at {
        TextAt::Chat => &mut v["choices"][0]["delta"]["content"],
        TextAt::Anthropic => &mut v["delta"]["text"],
        TextAt::Responses => &mut v["delta"],
    };
    *slot = json!(text);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(list: &[&str]) -> String {
        list.iter().map(|e| format!("{e}\n\n")).collect()
    }

    /// The caller's transcript after `caller`, and what the splicer makes of
    /// `fallback` fed byte by byte.
    fn splice(api: ApiFamily, caller: &[&str], fallback: &[&str]) -> (String, Transcript) {
        let mut seen = Transcript::new(api);
        seen.observe(events(caller).as_bytes());
        let mut s = Splicer::new(api, &seen);
        let mut out = Vec::new();
        for b in events(fallback).as_bytes().chunks(1) {
            out.extend(s.feed(b));
        }
        out.extend(s.finish());
        seen.observe(&out);
        (String::from_utf8(out).unwrap(), seen)
    }

    fn a(t: &str, rest: &str) -> String {
        format!("event: {t}\ndata: {{\"type\":\"{t}\"{rest}}}")
    }

    fn a_text(i: u64, text: &str) -> String {
        a(
            "content_block_delta",
            &format!(",\"index\":{i},\"delta\":{{\"type\":\"text_delta\",\"text\":\"{text}\"}}"),
        )
    }

    fn a_start(i: u64, kind: &str) -> String {
        a(
            "content_block_start",
            &format!(",\"index\":{i},\"content_block\":{{\"type\":\"{kind}\",\"text\":\"\"}}"),
        )
    }

    /// The data of every event in `out`.
    fn data(out: &str) -> Vec<Value> {
        out.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    #[test]
    fn anthropic_blocks_continue_the_callers_numbering() {
        let start = a("message_start", ",\"message\":{\"model\":\"primary\",\"content\":[]}");
        let (text0, hello, stop0) = (
            a_start(0, "text"),
            a_text(0, "Hello"),
            a("content_block_stop", ",\"index\":0"),
        );
        let fallback_start = a("message_start", ",\"message\":{\"model\":\"fb\",\"content\":[]}");
        let tool = a(
            "content_block_start",
            ",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}",
        );
        let thought = a(
            "content_block_delta",
            ",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hmm\"}",
        );
        let (thinking, text1, world) = (a_start(0, "thinking"), a_start(1, "text"), a_text(1, " world"));
        let (stop1, stop2, ping, end) = (
            a("content_block_stop", ",\"index\":1"),
            a("content_block_stop", ",\"index\":2"),
            a("ping", ""),
            a("message_stop", ""),
        );
        let fallback = [
            &*fallback_start,
            &thinking,
            &thought,
            &stop0,
            &text1,
            &ping,
            &world,
            &stop1,
            &tool,
            &stop2,
            &end,
        ];
        // The caller's text block is open: the fallback's text joins it (index 0),
        // its thinking is dropped and its tool call comes next (index 1).
        let (out, seen) = splice(ApiFamily::Anthropic, &[&start, &text0, &hello], &fallback);
        let got: Vec<(Value, Value)> = data(&out)
            .iter()
            .map(|v| (v["type"].clone(), v["index"].clone()))
            .collect();
        let want = [
            ("content_block_delta", json!(0)),
            ("content_block_stop", json!(0)),
            ("content_block_start", json!(1)),
            ("content_block_stop", json!(1)),
            ("message_stop", Value::Null),
        ];
        assert_eq!(got, want.map(|(t, i)| (json!(t), i)));
        assert!(out.ends_with(&events(&[&end])), "unchanged events go on byte for byte");
        assert_eq!(seen.text(), "Hello world");
        // The caller's block was closed: the fallback's text opens the next one.
        let (out, seen) = splice(
            ApiFamily::Anthropic,
            &[&start, &text0, &hello, &stop0],
            &[&fallback_start, &text0, &a_text(0, "!")],
        );
        let got: Vec<(Value, Value)> = data(&out)
            .iter()
            .map(|v| (v["type"].clone(), v["index"].clone()))
            .collect();
        assert_eq!(
            got,
            [
                (json!("content_block_start"), json!(1)),
                (json!("content_block_delta"), json!(1))
            ]
        );
        assert_eq!(seen.text(), "Hello!");
    }

    #[test]
    fn chat_chunks_lose_their_role_and_restated_text() {
        let caller = [r#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"The answer is"}}]}"#];
        let fallback = [
            r#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"The"}}]}"#,
            r#"data: {"choices":[{"index":0,"delta":{"content":" answer is 42"}}]}"#,
            r#"data: {"choices":[{"index":0,"delta":{"content":"."},"finish_reason":"stop"}]}"#,
            "data: [DONE]",
        ];
        let (out, seen) = splice(ApiFamily::OpenAi, &caller, &fallback);
        assert_eq!(
            out,
            events(&[
                r#"data: {"choices":[{"delta":{"content":" 42"},"index":0}]}"#,
                fallback[2],
                "data: [DONE]"
            ])
        );
        assert_eq!((seen.text(), seen.finished()), ("The answer is 42.", true));
        // A restatement ending in the finishing chunk keeps the finish.
        let fallback =
            [r#"data: {"choices":[{"index":0,"delta":{"content":"The answer is"},"finish_reason":"stop"}]}"#];
        let (out, seen) = splice(ApiFamily::OpenAi, &caller, &fallback);
        assert_eq!(
            out,
            events(&[r#"data: {"choices":[{"delta":{"content":""},"finish_reason":"stop","index":0}]}"#])
        );
        assert!(seen.finished());
    }

    #[test]
    fn restated_tails_whitespace_and_cut_restatements() {
        let (open, text) = (a_start(0, "text"), a_text(0, "It was the best of times, "));
        let caller = [open.as_str(), text.as_str()];
        // The last words again (a suffix of 19 bytes), then new text.
        let (_, seen) = splice(
            ApiFamily::Anthropic,
            &caller,
            &[&a_text(0, "the best of times, it was"), &a_text(0, " the worst")],
        );
        assert_eq!(seen.text(), "It was the best of times, it was the worst");
        // The whitespace a trimmed prefill left out, sent again.
        let (_, seen) = splice(ApiFamily::Anthropic, &caller, &[&a_text(0, " it was")]);
        assert_eq!(seen.text(), "It was the best of times, it was");
        // A fallback cut while still restating shows nothing; an error event still goes on.
        let error = a(
            "error",
            ",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}",
        );
        let (out, seen) = splice(ApiFamily::Anthropic, &caller, &[&a_text(0, "It was the"), &error]);
        assert_eq!(out, events(&[&error]));
        assert_eq!(seen.text(), "It was the best of times, ");
    }

    #[test]
    fn responses_ids_continue_and_reasoning_is_dropped() {
        let ev = |t: &str, rest: &str| format!("event: {t}\ndata: {{\"type\":\"{t}\"{rest}}}");
        let caller = [
            ev("response.created", ",\"sequence_number\":0,\"response\":{\"id\":\"resp_A\",\"output\":[]}"),
            ev(
                "response.output_item.added",
                ",\"sequence_number\":1,\"output_index\":0,\"item\":{\"id\":\"msg_A\",\"type\":\"message\",\"content\":[]}",
            ),
            ev(
                "response.content_part.added",
                ",\"sequence_number\":2,\"item_id\":\"msg_A\",\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"\"}",
            ),
            ev(
                "response.output_text.delta",
                ",\"sequence_number\":3,\"item_id\":\"msg_A\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"",
            ),
        ];
        let fallback = [
            ev("response.created", ",\"sequence_number\":0,\"response\":{\"id\":\"resp_B\",\"output\":[]}"),
            ev(
                "response.output_item.added",
                ",\"sequence_number\":1,\"output_index\":0,\"item\":{\"id\":\"rs_B\",\"type\":\"reasoning\",\"summary\":[]}",
            ),
            ev(
                "response.reasoning_summary_text.delta",
                ",\"sequence_number\":2,\"item_id\":\"rs_B\",\"output_index\":0,\"delta\":\"hmm\"",
            ),
            ev(
                "response.output_item.added",
                ",\"sequence_number\":3,\"output_index\":1,\"item\":{\"id\":\"msg_B\",\"type\":\"message\",\"content\":[]}",
            ),
            ev(
                "response.content_part.added",
                ",\"sequence_number\":4,\"item_id\":\"msg_B\",\"output_index\":1,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"\"}",
            ),
            ev(
                "response.output_text.delta",
                ",\"sequence_number\":5,\"item_id\":\"msg_B\",\"output_index\":1,\"content_index\":0,\"delta\":\" there\"",
            ),
            ev(
                "response.output_item.added",
                ",\"sequence_number\":6,\"output_index\":2,\"item\":{\"id\":\"fc_B\",\"type\":\"function_call\"}",
            ),
            ev(
                "response.completed",
                ",\"sequence_number\":7,\"response\":{\"id\":\"resp_B\",\"model\":\"fb\",\"output\":[{\"id\":\"msg_B\",\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\" there\"}]}]}",
            ),
        ];
        let caller: Vec<&str> = caller.iter().map(String::as_str).collect();
        let fallback: Vec<&str> = fallback.iter().map(String::as_str).collect();
        let (out, seen) = splice(ApiFamily::OpenAi, &caller, &fallback);
        let lines = data(&out);
        assert_eq!(lines.len(), 3, "{out}");
        assert_eq!(
            (
                &lines[0]["item_id"],
                &lines[0]["output_index"],
                &lines[0]["sequence_number"]
            ),
            (&json!("msg_A"), &json!(0), &json!(4))
        );
        assert_eq!(
            (&lines[1]["output_index"], &lines[1]["sequence_number"]),
            (&json!(1), &json!(5))
        );
        let done = &lines[2]["response"];
        assert_eq!(
            (&done["id"], &lines[2]["sequence_number"]),
            (&json!("resp_A"), &json!(6))
        );
        assert_eq!(done["output"][0]["id"], "msg_A");
        assert_eq!(done["output"][0]["content"][0]["text"], "Hi there");
        assert_eq!(
            (seen.text(), seen.finished(), seen.model()),
            ("Hi there", true, Some("fb"))
        );
    }
}
