//! What a request an SDK built needs from any upstream that serves it, read
//! once from its URL, headers and body: the drop-in transports begin every
//! call with these needs, so a fallback keeps what the request relies on
//! (tools, structured output, images, its size, its wire family).
//!
//! Per family:
//!
//! | need | OpenAI chat completions | OpenAI Responses | Anthropic messages |
//! |---|---|---|---|
//! | `streaming` | `stream: true` | `stream: true` | `stream: true` |
//! | `tool_calling` | `tools` / `functions` not empty | `tools` not empty | `tools` not empty |
//! | `json_schema` | `response_format.type` | `text.format.type` | `output_config.format.type` or `output_format.type` |
//! | `json_mode` | `response_format.type: json_object` | `text.format.type: json_object` | — |
//! | `vision` | `image_url` parts | `input_image` parts | `image` blocks |
//! | `audio` | `input_audio` parts, `audio`, `modalities` with `audio` | `input_audio` parts | — |
//! | `file_input` | `file` parts | `input_file` parts | `document` blocks |
//! | `max_output_tokens` | `max_completion_tokens`, else `max_tokens` | `max_output_tokens` | `max_tokens` |
//!
//! `input_tokens` is an estimate that errs low: the characters of every
//! string in the body outside media parts, divided by
//! [`CHARS_PER_TOKEN`]. Tokenizers give English prose about 4 characters a
//! token and code, JSON and non-Latin scripts fewer, so the estimate rarely
//! exceeds the real count; images, audio and files are not counted at all.
//! It only keeps a request off a candidate whose declared `context_tokens`
//! is surely too small; a window that is too small anyway answers
//! `context_length_exceeded` with the real count, and the call moves on.

use super::api::Endpoint;
use crate::rules::route::Needs;
use crate::types::ApiFamily;
use serde_json::{Map, Value};

/// Characters counted as one token by the input estimate.
pub const CHARS_PER_TOKEN: u64 = 4;

/// Content parts that carry media (their payloads are not text to count),
/// and the capability each needs.
const MEDIA_PARTS: &[(&str, &str)] = &[
    ("image_url", "vision"),
    ("input_image", "vision"),
    ("image", "vision"),
    ("input_audio", "audio"),
    ("file", "file_input"),
    ("input_file", "file_input"),
    ("document", "file_input"),
];

/// Needs in the vocabulary's order, so two readings of one request compare equal.
const ORDER: &[&str] = &[
    "streaming",
    "tool_calling",
    "json_schema",
    "json_mode",
    "vision",
    "audio",
    "file_input",
];

/// What a request says about itself ([`RequestFacts::read`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestFacts {
    /// The wire family it was built for ([`ApiFamily::of_request`]).
    pub family: ApiFamily,
    /// Its endpoint, when its path names one.
    pub endpoint: Option<Endpoint>,
    /// The body's `model`, when it names one (what a transport routes on).
    pub model: Option<String>,
    /// What any upstream serving it must offer (its `api` is `family`).
    pub needs: Needs,
}

impl RequestFacts {
    /// Reads a request: its family from the URL and headers, its model and
    /// needs from the body (a body that is not a JSON object gives none but
    /// the family's).
    ///
    /// ```
    /// use retrywise::wire::RequestFacts;
    /// use retrywise::ApiFamily;
    /// let body = br#"{"model":"gpt-4o","stream":true,"max_tokens":500,
    ///   "tools":[{"type":"function","function":{"name":"f","parameters":{}}}],
    ///   "messages":[{"role":"user","content":[{"type":"text","text":"What is in this picture?"},
    ///     {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}"#;
    /// let f = RequestFacts::read("https://api.openai.com/v1/chat/completions", &[], body);
    /// assert_eq!(f.model.as_deref(), Some("gpt-4o"));
    /// assert_eq!(f.needs.capabilities, ["streaming", "tool_calling", "vision"]);
    /// assert_eq!(f.needs.max_output_tokens, Some(500));
    /// assert_eq!(f.needs.api, Some(ApiFamily::OpenAi));
    /// ```
    pub fn read(url: &str, headers: &[(String, String)], body: &[u8]) -> RequestFacts {
        let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
        Self::read_with(url, &has, body)
    }

    /// [`RequestFacts::read`] with the headers asked by name (`has(name)`:
    /// the request carries that header), for a binding that keeps its own.
    pub fn read_with(url: &str, has: &dyn Fn(&str) -> bool, body: &[u8]) -> RequestFacts {
        let family = ApiFamily::of_request_with(url, has);
        let endpoint = super::api::Url::parse(url).and_then(|u| Endpoint::find(u.path).map(|(_, e)| e));
        let mut facts = RequestFacts {
            family,
            endpoint,
            model: None,
            needs: Needs {
                api: Some(family),
                ..Needs::default()
            },
        };
        let trimmed = body.trim_ascii_start();
        if !trimmed.starts_with(b"{") {
            return facts;
        }
        let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(trimmed) else {
            return facts;
        };
        facts.model = o.get("model").and_then(Value::as_str).map(str::to_string);
        let mut caps: Vec<&'static str> = Vec::new();
        let mut add = |c: &'static str| {
            if !caps.contains(&c) {
                caps.push(c);
            }
        };
        if o.get("stream").and_then(Value::as_bool) == Some(true) {
            add("streaming");
        }
        if non_empty(&o, "tools") || non_empty(&o, "functions") {
            add("tool_calling");
        }
        let format = [
            o.get("response_format"),
            o.get("text").and_then(|t| t.get("format")),
            o.get("output_config").and_then(|c| c.get("format")),
            o.get("output_format"),
        ];
        for f in format.into_iter().flatten() {
            match f.get("type").and_then(Value::as_str) {
                Some("json_schema") => add("json_schema"),
                Some("json_object") => add("json_mode"),
                _ => {}
            }
        }
        let audio_out = o.contains_key("audio")
            || o.get("modalities")
                .and_then(Value::as_array)
                .is_some_and(|m| m.iter().any(|x| x.as_str() == Some("audio")));
        if audio_out {
            add("audio");
        }
        let mut chars = 0u64;
        for (key, v) in &o {
            if key != "model" {
                walk(v, &mut chars, &mut add);
            }
        }
        caps.sort_by_key(|c| ORDER.iter().position(|o| o == c));
        facts.needs.capabilities = caps.into_iter().map(str::to_string).collect();
        facts.needs.input_tokens = (chars > 0).then_some(chars / CHARS_PER_TOKEN);
        facts.needs.max_output_tokens = ["max_completion_tokens", "max_output_tokens", "max_tokens"]
            .iter()
            .find_map(|k| o.get(*k).and_then(Value::as_u64));
        facts
    }
}

/// `o[key]` is a non-empty array.
fn non_empty(o: &Map<String, Value>, key: &str) -> bool {
    o.get(key).and_then(Value::as_array).is_some_and(|a| !a.is_empty())
}

/// Counts the characters of every string under `v` and notes the media
/// parts it holds (whose payloads are not counted).
fn walk(v: &Value, chars: &mut u64, add: &mut dyn FnMut(&'static str)) {
    match v {
        Value::String(s) => *chars += s.chars().count() as u64,
        Value::Array(a) => a.iter().for_each(|x| walk(x, chars, add)),
        Value::Object(m) => {
            let kind = m.get("type").and_then(Value::as_str);
            if let Some((_, cap)) = kind.and_then(|k| MEDIA_PARTS.iter().find(|(p, _)| *p == k)) {
                add(cap);
                return;
            }
            for (k, x) in m {
                if k != "type" {
                    walk(x, chars, add);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(url: &str, body: &str) -> Vec<String> {
        RequestFacts::read(url, &[], body.as_bytes()).needs.capabilities
    }

    const CHAT: &str = "https://api.openai.com/v1/chat/completions";
    const RESPONSES: &str = "https://api.openai.com/v1/responses";
    const MESSAGES: &str = "https://api.anthropic.com/v1/messages";

    #[test]
    fn openai_chat_needs() {
        assert_eq!(
            caps(CHAT, r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#),
            Vec::<String>::new()
        );
        assert_eq!(
            caps(
                CHAT,
                r#"{"functions":[{"name":"f"}],"response_format":{"type":"json_object"},"messages":[]}"#
            ),
            ["tool_calling", "json_mode"]
        );
        assert_eq!(
            caps(
                CHAT,
                r#"{"tools":[],"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}}"#
            ),
            ["json_schema"]
        );
        assert_eq!(
            caps(
                CHAT,
                r#"{"modalities":["text","audio"],"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAA","format":"wav"}},{"type":"file","file":{"file_id":"f"}}]}]}"#
            ),
            ["audio", "file_input"]
        );
        assert_eq!(caps(CHAT, r#"{"stream":false,"text":"x"}"#), Vec::<String>::new());
    }

    #[test]
    fn responses_and_anthropic_needs() {
        assert_eq!(
            caps(
                RESPONSES,
                r#"{"model":"m","stream":true,"tools":[{"type":"web_search"}],"text":{"format":{"type":"json_schema","name":"x","schema":{}}},
                "input":[{"role":"user","content":[{"type":"input_text","text":"x"},{"type":"input_image","image_url":"https://x/y.png"},{"type":"input_file","file_id":"f"}]}]}"#
            ),
            ["streaming", "tool_calling", "json_schema", "vision", "file_input"]
        );
        assert_eq!(
            caps(
                MESSAGES,
                r#"{"model":"claude","max_tokens":100,"output_config":{"format":{"type":"json_schema","schema":{}}},
                "messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]},
                {"type":"document","source":{"type":"text","media_type":"text/plain","data":"doc"}}]}]}"#
            ),
            ["json_schema", "vision", "file_input"]
        );
        assert_eq!(
            caps(
                MESSAGES,
                r#"{"output_format":{"type":"json_schema","schema":{}},"messages":[]}"#
            ),
            ["json_schema"]
        );
    }

    #[test]
    fn sizes_family_and_model() {
        let big = "x".repeat(40_000);
        let body = format!(
            r#"{{"model":"claude","max_tokens":2048,"system":"{big}","messages":[{{"role":"user","content":[{{"type":"image","source":{{"type":"base64","data":"{big}"}}}}]}}]}}"#
        );
        let f = RequestFacts::read(MESSAGES, &[], body.as_bytes());
        assert_eq!(f.family, ApiFamily::Anthropic);
        assert_eq!(f.endpoint, Some(Endpoint::Messages));
        assert_eq!(f.model.as_deref(), Some("claude"));
        // The system text and the role count (40 004 characters: 10 001 tokens); the image's payload does not.
        assert_eq!(f.needs.input_tokens, Some(10_001));
        assert_eq!(f.needs.max_output_tokens, Some(2048));
        assert_eq!(f.needs.api, Some(ApiFamily::Anthropic));
        let f = RequestFacts::read(
            RESPONSES,
            &[],
            br#"{"model":"o3","max_output_tokens":9,"max_tokens":1,"input":"abcdefgh"}"#,
        );
        assert_eq!((f.needs.max_output_tokens, f.needs.input_tokens), (Some(9), Some(2)));
        let f = RequestFacts::read(CHAT, &[], br#"{"max_completion_tokens":7,"max_tokens":3}"#);
        assert_eq!(f.needs.max_output_tokens, Some(7));
    }

    #[test]
    fn bodies_that_are_not_json_objects_give_the_family_only() {
        for body in [&b""[..], b"[1,2]", b"{not json", b"\x00\xff", b"  "] {
            let f = RequestFacts::read(CHAT, &[], body);
            assert_eq!(f.model, None);
            assert_eq!(
                f.needs,
                Needs {
                    api: Some(ApiFamily::OpenAi),
                    ..Needs::default()
                }
            );
        }
        let h = vec![("Anthropic-Version".to_string(), "2023-06-01".to_string())];
        let f = RequestFacts::read("http://127.0.0.1:9/v1/chat/completions", &h, b"{}");
        assert_eq!(f.family, ApiFamily::Anthropic);
    }
}
