//! The events that make up almost every streamed answer, read without
//! building a JSON tree: a chat completion chunk whose only output is
//! choice 0's text (and its finish), Anthropic's `text_delta`, the
//! Responses API's `response.output_text.delta`. Borrowed fields, unknown
//! ones skipped: a fraction of the tree's cost per event, which a relay pays
//! for every chunk it passes on.
//!
//! Anything else — a tool call, a refusal, usage, an error, a second
//! choice, any other event type — is left to the tree reader
//! (`Seen::event_tree`), which reads every shape; the tests check that both
//! readers agree on every event this one takes.

use super::transcript::Seen;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::fmt;

/// Reads `data` into `seen` when it is one of the common text events; false
/// (nothing changed) for anything else.
pub(crate) fn text_event(seen: &mut Seen, data: &[u8]) -> bool {
    let Ok(e) = serde_json::from_slice::<Event<'_>>(data) else {
        return false;
    };
    if e.usage.is_some() || e.error.is_some() {
        return false;
    }
    match e.kind.as_deref() {
        None => chat(seen, e),
        Some("content_block_delta") => match e.delta {
            Some(Delta::Block { kind, text }) if kind.as_deref() == Some("text_delta") => {
                note_seq(seen, e.sequence_number);
                seen.text.push_str(text.as_deref().unwrap_or(""));
                true
            }
            _ => false,
        },
        Some("response.output_text.delta") => match e.delta {
            Some(Delta::Text(t)) => {
                note_seq(seen, e.sequence_number);
                seen.text.push_str(&t);
                true
            }
            _ => false,
        },
        Some(_) => false,
    }
}

fn note_seq(seen: &mut Seen, n: Option<u64>) {
    if let Some(n) = n {
        seen.ids.seq = Some(n);
    }
}

/// A chat chunk: only choice 0, only text (or nothing) and a finish.
fn chat(seen: &mut Seen, e: Event<'_>) -> bool {
    if e.sequence_number.is_some() || e.delta.is_some() {
        return false;
    }
    let choice = match e.choices {
        None | Some(Choices::None) => None,
        Some(Choices::One(c)) => Some(c),
        Some(Choices::Many) => return false,
    };
    if let Some(c) = &choice {
        let d = c.delta.as_ref();
        let other = c.index.unwrap_or(0) != 0
            || c.message.is_some()
            || d.is_some_and(|d| {
                d.tool_calls.is_some() || d.function_call.is_some() || d.refusal.is_some() || d.audio.is_some()
            });
        if other {
            return false;
        }
    }
    seen.set_model(e.model.as_deref());
    if let Some(c) = choice {
        if let Some(t) = c.delta.and_then(|d| d.content) {
            seen.text.push_str(&t);
        }
        if let Some(t) = c.text {
            seen.text.push_str(&t);
        }
        if c.finish_reason.is_some_and(|r| !r.is_empty()) {
            seen.finished = true;
        }
    }
    true
}

/// One event's top-level members this reader looks at.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    sequence_number: Option<u64>,
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    choices: Option<Choices<'a>>,
    #[serde(default)]
    usage: Option<IgnoredAny>,
    #[serde(default)]
    error: Option<IgnoredAny>,
}

/// Choice 0 of a chat chunk (`None`: an empty list; `Many`: more than one).
enum Choices<'a> {
    None,
    One(Choice<'a>),
    Many,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(borrow, default)]
    delta: Option<ChatDelta<'a>>,
    #[serde(default)]
    message: Option<IgnoredAny>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

/// A chat delta: text, and the members that would make it something else.
#[derive(Deserialize)]
struct ChatDelta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<IgnoredAny>,
    #[serde(default)]
    function_call: Option<IgnoredAny>,
    #[serde(default)]
    refusal: Option<IgnoredAny>,
    #[serde(default)]
    audio: Option<IgnoredAny>,
}

/// A top-level `delta`: the Responses API's text, or Anthropic's block delta.
enum Delta<'a> {
    Text(Cow<'a, str>),
    Block {
        kind: Option<Cow<'a, str>>,
        text: Option<Cow<'a, str>>,
    },
}

impl<'de: 'a, 'a> Deserialize<'de> for Choices<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Choices<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of choices")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let Some(first) = seq.next_element::<Choice<'a>>()? else {
                    return Ok(Choices::None);
                };
                if seq.next_element::<IgnoredAny>()?.is_some() {
                    while seq.next_element::<IgnoredAny>()?.is_some() {}
                    return Ok(Choices::Many);
                }
                Ok(Choices::One(first))
            }
        }
        d.deserialize_seq(V(std::marker::PhantomData))
    }
}

/// A string, borrowed from the event when it has no escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Delta::deserialize(d)? {
            Delta::Text(t) => Ok(Text(t)),
            Delta::Block { .. } => Err(de::Error::custom("expected a string")),
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Delta<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Delta<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a text or a delta object")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Delta::Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Delta::Text(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(Delta::Text(Cow::Owned(s)))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let (mut kind, mut text) = (None, None);
                while let Some(k) = map.next_key::<&'a str>()? {
                    match k {
                        "type" => kind = map.next_value::<Option<Text<'a>>>()?.map(|t| t.0),
                        "text" => text = map.next_value::<Option<Text<'a>>>()?.map(|t| t.0),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Delta::Block { kind, text })
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::super::transcript::Transcript;
    use crate::types::ApiFamily;

    const CAPTURED: [&[u8]; 18] = [
        include_bytes!("testdata/chat_cut.sse"),
        include_bytes!("testdata/chat_error.sse"),
        include_bytes!("testdata/chat_malformed.sse"),
        include_bytes!("testdata/chat_no_done.sse"),
        include_bytes!("testdata/chat_prefill.sse"),
        include_bytes!("testdata/chat_resend.sse"),
        include_bytes!("testdata/msg_cut.sse"),
        include_bytes!("testdata/msg_error.sse"),
        include_bytes!("testdata/msg_malformed.sse"),
        include_bytes!("testdata/msg_no_done.sse"),
        include_bytes!("testdata/msg_prefill.sse"),
        include_bytes!("testdata/msg_resend.sse"),
        include_bytes!("testdata/resp_cut.sse"),
        include_bytes!("testdata/resp_error.sse"),
        include_bytes!("testdata/resp_malformed.sse"),
        include_bytes!("testdata/resp_no_done.sse"),
        include_bytes!("testdata/resp_prefill.sse"),
        include_bytes!("testdata/resp_resend.sse"),
    ];

    /// Every event of the transcript's tests and the wire fixtures, and
    /// variations on the common ones: this reader either declines an event
    /// or leaves exactly what the tree reader leaves.
    #[test]
    fn agrees_with_the_tree_reader_on_every_event_it_takes() {
        let mut events: Vec<String> = vec![
            r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}"#.into(),
            r#"{"id":"c","model":"gpt-4o","choices":[{"index":0,"delta":{"content":"Hel\"lo \u00e9"},"finish_reason":null}]}"#.into(),
            r#"{"id":"c","model":"gpt-4o-mini","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}"#.into(),
            r#"{"id":"c","model":"gpt-4o","choices":[{"index":0,"delta":{},"finish_reason":""}]}"#.into(),
            r#"{"id":"c","model":"gpt-4o","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#.into(),
            r#"{"id":"c","model":"gpt-4o","choices":[]}"#.into(),
            r#"{"model":"m","choices":[{"index":0,"text":"legacy","finish_reason":null}]}"#.into(),
            r#"{"model":"m","choices":[{"index":1,"delta":{"content":"second"}}]}"#.into(),
            r#"{"model":"m","choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"}}]}"#.into(),
            r#"{"model":"m","choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}}]}"#.into(),
            r#"{"model":"m","choices":[{"index":0,"delta":{"refusal":"no"}}]}"#.into(),
            r#"{"model":"m","choices":[{"index":0,"delta":{"refusal":""}}]}"#.into(),
            r#"{"model":"m","choices":[{"index":0,"delta":{"content":[{"type":"text","text":"x"}]}}]}"#.into(),
            r#"{"model":"m","choices":[{"index":0,"message":{"content":"whole"}}]}"#.into(),
            r#"{"error":{"message":"boom","type":"server_error"}}"#.into(),
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#.into(),
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\""}}"#.into(),
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}"#.into(),
            r#"{"type":"content_block_delta","index":0,"delta":{"text":"typeless","type":"text_delta"}}"#.into(),
            r#"{"type":"message_start","message":{"model":"claude","usage":{"input_tokens":3,"output_tokens":1}}}"#.into(),
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}"#.into(),
            r#"{"type":"message_stop"}"#.into(),
            r#"{"type":"ping"}"#.into(),
            r#"{"type":"response.output_text.delta","sequence_number":7,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hey"}"#.into(),
            r#"{"type":"response.output_text.delta","item_id":"msg_1","delta":"no seq"}"#.into(),
            r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","model":"o3"}}"#.into(),
            r#"{"type":"response.completed","sequence_number":9,"response":{"model":"o3","usage":{"input_tokens":1,"output_tokens":2}}}"#.into(),
            r#"{"type":"something.else"}"#.into(),
            r#"{"model":null,"choices":null}"#.into(),
            r#"[1,2]"#.into(),
            r#"{"choices":[{"index":0,"delta":{"content":"cut"#.into(),
        ];
        // Every event the fault server sends, in each shape and ending.
        for body in CAPTURED {
            for line in std::str::from_utf8(body).unwrap().lines() {
                if let Some(data) = line.strip_prefix("data: ") {
                    events.push(data.to_string());
                }
            }
        }
        let mut taken = 0;
        for e in &events {
            for start in [None, Some("gpt-4o")] {
                let mut quick = Transcript::new(ApiFamily::OpenAi).seen;
                quick.set_model(start);
                let mut tree = quick.clone();
                if super::text_event(&mut quick, e.as_bytes()) {
                    taken += 1;
                    tree.event_tree(e.as_bytes());
                    assert_eq!(quick, tree, "{e}");
                } else {
                    assert_eq!(quick, tree, "declined, yet changed: {e}");
                }
            }
        }
        // The common events are taken (not all declined).
        assert!(taken >= 14, "{taken}");
    }
}
