//! The request that asks a fallback to continue an answer the caller already
//! saw part of: the original request with the delivered text appended to its
//! conversation, either as the assistant's own unfinished turn (prefill: the
//! model extends it) or quoted in a user message that asks for the rest.
//! Every other member of the request (`stream`, `tools`, `max_tokens`, ...)
//! is kept as it was, in its place.

use super::body::{array_items, array_of, quote, Object};
use super::{Transcript, WireError};
use crate::types::{ApiFamily, Continuation};
use serde_json::Value;

/// The user message of an [`Continuation::Instruction`]: asks to continue
/// right after `delivered`, quoted verbatim between `«` and `»`.
///
/// ```
/// let m = retrywise::wire::instruction("The cat");
/// assert!(m.ends_with("\n«The cat»"));
/// ```
pub fn instruction(delivered: &str) -> String {
    format!(
        "Your previous reply was cut off. Continue it from exactly where it stopped: write only the text \
         that comes next, without repeating any of it and without any preamble. The reply so far, \
         between « and »:\n«{delivered}»"
    )
}

/// The body of the continuation request for the fallback: `original_body`
/// (a chat or Anthropic `messages` request, or a Responses API `input`
/// request) with the transcript's text appended, by `how`:
///
/// - [`Continuation::Prefill`]: a trailing assistant message holding the text
///   (extending the caller's own trailing assistant message, if it had one).
///   Anthropic rejects a prefill that ends in whitespace: it is trimmed (the
///   splicer drops the whitespace the model then sends again).
/// - [`Continuation::Instruction`]: a user message, [`instruction`].
///
/// A transcript with no text yet leaves the body as it was (nothing to
/// continue: the request is simply sent again). Rewrite the result for the
/// fallback afterwards ([`super::rewrite`]: its model, URL and key).
pub fn continuation_body(
    api: ApiFamily,
    original_body: &[u8],
    transcript: &Transcript,
    how: Continuation,
) -> Result<Vec<u8>, WireError> {
    let mut body = Object::parse(original_body)?;
    let delivered = transcript.text();
    let (key, items) = match (body.get("messages"), body.get("input")) {
        (Some(m), _) => ("messages", array_items(m)?.into_iter().map(str::to_owned).collect()),
        (None, Some(input)) => match serde_json::from_str::<Value>(input) {
            // A plain string input is one user message.
            Ok(Value::String(_)) => ("input", vec![message("user", input.to_owned())]),
            _ => ("input", array_items(input)?.into_iter().map(str::to_owned).collect()),
        },
        (None, None) => return Err(WireError::NoConversation),
    };
    if delivered.is_empty() {
        return Ok(original_body.to_vec());
    }
    let mut items: Vec<String> = items;
    match how {
        Continuation::Instruction => items.push(message("user", quote(&instruction(delivered)))),
        Continuation::Prefill => {
            let trim = |s: String| match api {
                ApiFamily::Anthropic => s.trim_end().to_owned(),
                _ => s,
            };
            match items.last().and_then(|m| extend_assistant(m, delivered, &trim)) {
                Some(merged) => *items.last_mut().expect("a last message") = merged,
                None => {
                    let text = trim(delivered.to_owned());
                    if text.is_empty() {
                        // Only whitespace so far: nothing a prefill may hold.
                        return Ok(original_body.to_vec());
                    }
                    items.push(message("assistant", quote(&text)));
                }
            }
        }
    }
    body.set(key, array_of(items.iter().map(String::as_str)));
    Ok(body.to_vec())
}

/// `{"role":…,"content":…}` with `content` given as JSON text.
fn message(role: &str, content: String) -> String {
    format!("{{\"role\":{},\"content\":{content}}}", quote(role))
}

/// The caller's own trailing assistant message with `delivered` appended to
/// its text, when the last message is the assistant's.
fn extend_assistant(last: &str, delivered: &str, trim: &dyn Fn(String) -> String) -> Option<String> {
    let mut m: Value = serde_json::from_str(last).ok()?;
    if m.get("role").and_then(Value::as_str) != Some("assistant") {
        return None;
    }
    match m.get_mut("content")? {
        Value::String(s) => *s = trim(format!("{s}{delivered}")),
        Value::Array(parts) => match parts.last_mut() {
            Some(Value::Object(p)) if p.get("type").and_then(Value::as_str) == Some("text") => {
                let text = p.get("text").and_then(Value::as_str).unwrap_or("");
                let joined = trim(format!("{text}{delivered}"));
                p.insert("text".into(), Value::String(joined));
            }
            _ => parts.push(serde_json::json!({"type": "text", "text": trim(delivered.to_owned())})),
        },
        _ => return None,
    }
    Some(m.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(api: ApiFamily, text: &str) -> Transcript {
        let mut t = Transcript::new(api);
        let chunk = serde_json::json!({"choices": [{"index": 0, "delta": {"content": text}}]});
        t.observe(format!("data: {chunk}\n\n").as_bytes());
        assert_eq!(t.text(), text);
        t
    }

    fn body(api: ApiFamily, original: &str, text: &str, how: Continuation) -> String {
        String::from_utf8(continuation_body(api, original.as_bytes(), &seen(api, text), how).unwrap()).unwrap()
    }

    const CHAT: &str = r#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Say hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}],"max_tokens":50}"#;

    #[test]
    fn prefill_appends_an_assistant_message_and_keeps_every_other_member() {
        let out = body(ApiFamily::OpenAi, CHAT, "Hello, wor", Continuation::Prefill);
        let want = CHAT.replace(
            r#"{"role":"user","content":"Say hi"}]"#,
            r#"{"role":"user","content":"Say hi"},{"role":"assistant","content":"Hello, wor"}]"#,
        );
        assert_eq!(out, want);
    }

    #[test]
    fn instruction_quotes_the_text_in_a_user_message() {
        let text = "a \"quoted\" «line»\nnext ";
        let out = body(ApiFamily::OpenAi, CHAT, text, Continuation::Instruction);
        let v: Value = serde_json::from_str(&out).unwrap();
        let last = v["messages"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["role"], "user");
        assert_eq!(last["content"].as_str().unwrap(), instruction(text));
        assert!(instruction(text).contains(&format!("«{text}»")), "verbatim");
        assert_eq!(v["stream"], true);
        assert_eq!(v["max_tokens"], 50);
    }

    #[test]
    fn anthropic_prefill_is_trimmed_and_extends_the_callers_own_prefill() {
        let msgs = r#"{"model":"claude","max_tokens":9,"stream":true,"system":"s","messages":[{"role":"user","content":"Q"}]}"#;
        let out = body(ApiFamily::Anthropic, msgs, "One two ", Continuation::Prefill);
        assert!(out.ends_with(r#"{"role":"assistant","content":"One two"}]}"#), "{out}");
        // Whitespace only: nothing to prefill.
        assert_eq!(body(ApiFamily::Anthropic, msgs, " \n", Continuation::Prefill), msgs);
        // The caller prefilled "{" itself: the answer continues that turn.
        let own = r#"{"messages":[{"role":"user","content":"Q"},{"role":"assistant","content":"{"}]}"#;
        let out = body(ApiFamily::Anthropic, own, "\"a\": ", Continuation::Prefill);
        assert_eq!(
            out,
            r#"{"messages":[{"role":"user","content":"Q"},{"content":"{\"a\":","role":"assistant"}]}"#
        );
        let parts = r#"{"messages":[{"role":"assistant","content":[{"type":"text","text":"A"}]}]}"#;
        let out = body(ApiFamily::Anthropic, parts, "B", Continuation::Prefill);
        assert!(out.contains(r#"{"text":"AB","type":"text"}"#), "{out}");
    }

    #[test]
    fn responses_input_strings_become_a_conversation() {
        let r = r#"{"model":"gpt-4.1","input":"Say hi","stream":true}"#;
        assert_eq!(
            body(ApiFamily::OpenAi, r, "Hi", Continuation::Prefill),
            r#"{"model":"gpt-4.1","input":[{"role":"user","content":"Say hi"},{"role":"assistant","content":"Hi"}],"stream":true}"#
        );
        let items = r#"{"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"x"}]}]}"#;
        let out = body(ApiFamily::OpenAi, items, "Hi", Continuation::Instruction);
        assert!(out.starts_with(r#"{"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"x"}]},{"role":"user","content":"Your previous reply"#));
    }

    #[test]
    fn nothing_to_continue_and_bodies_without_a_conversation() {
        assert_eq!(body(ApiFamily::OpenAi, CHAT, "", Continuation::Prefill), CHAT);
        let t = seen(ApiFamily::OpenAi, "x");
        for (b, code) in [
            (&br#"{"prompt":"x"}"#[..], "no_conversation"),
            (b"not json", "body_not_json"),
            (br#"{"messages":{}}"#, "body_not_json"),
        ] {
            let err = continuation_body(ApiFamily::OpenAi, b, &t, Continuation::Prefill).unwrap_err();
            assert_eq!(err.code(), code);
        }
    }
}
