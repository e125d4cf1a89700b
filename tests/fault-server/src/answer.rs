//! Deterministic answers of fault models, and continuations of them.
//!
//! The answer of model `m` is `answer from m: w1 w2 … wN`, sent as the content deltas
//! `"answer from m:"`, `" w1"`, …, `" wN"`. An end-to-end test can therefore assert
//! the exact final content and see which model produced it; a break "after `k`
//! deltas" is a precise prefix; and because the prefix names its model, any fault
//! model asked to continue it (by assistant prefill, or by quoting it in the last
//! user message) can return exactly the rest, so a spliced stream is checked byte
//! for byte. No delta ends in whitespace, so a prefix is also a valid Anthropic
//! prefill.

use serde::Serialize;
use serde_json::Value;

use crate::model::ModelFault;
use crate::shapes::Shape;

/// Every answer starts with this.
pub const LEAD: &str = "answer from ";

/// The content deltas of `model`'s answer.
pub fn deltas(model: &str, words: u32) -> Vec<String> {
    let mut out = Vec::with_capacity(words as usize + 1);
    out.push(format!("{LEAD}{model}:"));
    out.extend((1..=words).map(|i| format!(" w{i}")));
    out
}

/// One message of the request's conversation, reduced to its role and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    pub role: String,
    pub text: String,
}

/// Text of a message `content`: a string, or the text of its text parts.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// The request's conversation, in order: chat and Anthropic `messages`, or the
/// Responses API's `input` (a string is one user turn).
pub fn conversation(shape: Shape, request: &Value) -> Vec<Turn> {
    let turn = |m: &Value| Turn {
        role: m.get("role").and_then(Value::as_str).unwrap_or("user").to_owned(),
        text: m.get("content").map(content_text).unwrap_or_default(),
    };
    let list = match shape {
        Shape::Chat | Shape::Anthropic => request.get("messages"),
        Shape::Responses => match request.get("input") {
            Some(Value::String(s)) => {
                return vec![Turn {
                    role: "user".into(),
                    text: s.clone(),
                }]
            }
            other => other,
        },
    };
    list.and_then(Value::as_array)
        .map(|messages| messages.iter().map(turn).collect())
        .unwrap_or_default()
}

/// Whitespace-separated words in the conversation: the fault models' input tokens.
pub fn input_words(turns: &[Turn]) -> u64 {
    turns.iter().map(|t| t.text.split_whitespace().count() as u64).sum()
}

/// How a request asked to continue an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// The last message is the assistant's, holding the delivered prefix.
    Prefill,
    /// The last user message quotes the delivered prefix.
    Instruction,
}

/// A continuation the server recognised, as recorded in the request log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Continuation {
    pub via: Via,
    /// The delivered prefix found in the request.
    pub prefix: String,
    /// The model whose answer the prefix starts (named in the prefix itself).
    pub of_model: String,
    /// The deltas still to send: the rest of that answer.
    #[serde(skip)]
    pub rest: Vec<String>,
}

/// The longest prefix of a fault model's answer at the start of `text`, ending at
/// a delta boundary and holding at least the header delta: (model, deltas, count).
/// The model name may contain `:`, so every split of the name is tried.
fn answer_prefix(text: &str) -> Option<(String, Vec<String>, usize)> {
    let after = text.strip_prefix(LEAD)?;
    let token = after.split(char::is_whitespace).next().unwrap_or_default();
    let mut best: Option<(String, Vec<String>, usize, usize)> = None;
    for (at, _) in token.match_indices(':') {
        let model = &token[..at];
        let Ok(fault) = ModelFault::parse(model) else { continue };
        let all = deltas(model, fault.words);
        let (mut len, mut count) = (0, 0);
        for d in &all {
            if text[len..].starts_with(d.as_str()) {
                len += d.len();
                count += 1;
            } else {
                break;
            }
        }
        if count > 0 && best.as_ref().is_none_or(|b| len > b.3) {
            best = Some((model.to_owned(), all, count, len));
        }
    }
    best.map(|(model, all, count, _)| (model, all, count))
}

/// Why a prefill could not be continued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch(pub String);

/// Finds a continuation request. A trailing assistant message must be exactly a
/// delta-aligned prefix of some fault model's answer (else `Err`: a splice that
/// would duplicate or drop text fails loudly); in the last user message, the longest
/// quoted prefix wins. `Ok(None)`: an ordinary request.
pub fn continuation(turns: &[Turn]) -> Result<Option<Continuation>, Mismatch> {
    let Some(last) = turns.last() else { return Ok(None) };
    if last.role == "assistant" {
        let found = answer_prefix(&last.text).filter(|(_, all, n)| all[..*n].concat() == last.text);
        return match found {
            Some((of_model, all, n)) => Ok(Some(Continuation {
                via: Via::Prefill,
                prefix: last.text.clone(),
                of_model,
                rest: all[n..].to_vec(),
            })),
            None => Err(Mismatch(last.text.clone())),
        };
    }
    let text = &last.text;
    let best = text
        .match_indices(LEAD)
        .filter_map(|(at, _)| answer_prefix(&text[at..]))
        .max_by_key(|(_, all, n)| all[..*n].concat().len());
    Ok(best.map(|(of_model, all, n)| Continuation {
        via: Via::Instruction,
        prefix: all[..n].concat(),
        of_model,
        rest: all[n..].to_vec(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn user(text: &str) -> Turn {
        Turn {
            role: "user".into(),
            text: text.into(),
        }
    }

    fn assistant(text: &str) -> Turn {
        Turn {
            role: "assistant".into(),
            text: text.into(),
        }
    }

    #[test]
    fn answers_are_deltas_of_words() {
        assert_eq!(deltas("fb-ok", 2), ["answer from fb-ok:", " w1", " w2"]);
        assert_eq!(deltas("fb-ok", 3).concat(), "answer from fb-ok: w1 w2 w3");
    }

    #[test]
    fn conversations_of_each_shape() {
        let chat = json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi there"}]},
        ]});
        let turns = conversation(Shape::Chat, &chat);
        assert_eq!(
            turns,
            [
                Turn {
                    role: "system".into(),
                    text: "be brief".into()
                },
                user("hi there")
            ]
        );
        assert_eq!(input_words(&turns), 4);
        assert_eq!(
            conversation(Shape::Responses, &json!({"input": "hello"})),
            [user("hello")]
        );
        let items = json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]});
        assert_eq!(conversation(Shape::Responses, &items), [user("x")]);
        assert!(conversation(Shape::Anthropic, &json!({})).is_empty());
    }

    #[test]
    fn prefill_continues_the_named_answer() {
        let turns = [user("q"), assistant("answer from fb-stream-cut:k=2: w1")];
        let c = continuation(&turns).unwrap().unwrap();
        assert_eq!(c.via, Via::Prefill);
        assert_eq!(c.of_model, "fb-stream-cut:k=2");
        assert_eq!(c.rest, [" w2", " w3", " w4", " w5", " w6"]);
        // The header alone is a prefix too; words= of the named model counts.
        let c = continuation(&[assistant("answer from fb-ok:words=2:")])
            .unwrap()
            .unwrap();
        assert_eq!(c.rest, [" w1", " w2"]);
    }

    #[test]
    fn prefill_that_is_not_an_exact_prefix_is_a_mismatch() {
        for bad in [
            "answer from fb-ok: w1 w1",
            "answer from fb-ok: w",
            "answer from fb-ok: w1 ",
            "answer from gpt-4o: w1",
            "hello",
            "",
        ] {
            assert_eq!(continuation(&[assistant(bad)]), Err(Mismatch(bad.into())), "{bad:?}");
        }
    }

    #[test]
    fn instruction_quotes_the_prefix() {
        let turns = [user(
            "Continue exactly after: «answer from fb-stream-stall:id=4: w1 w2»",
        )];
        let c = continuation(&turns).unwrap().unwrap();
        assert_eq!(c.via, Via::Instruction);
        assert_eq!(c.prefix, "answer from fb-stream-stall:id=4: w1 w2");
        assert_eq!(c.rest, [" w3", " w4", " w5", " w6"]);
        // Text right after the prefix that happens to start like the next delta
        // does not extend it past a delta boundary.
        let c = continuation(&[user("answer from fb-ok: w1 w")]).unwrap().unwrap();
        assert_eq!(c.prefix, "answer from fb-ok: w1");
        assert_eq!(continuation(&[user("answer from nobody: w1")]), Ok(None));
        assert_eq!(continuation(&[user("plain question")]), Ok(None));
    }
}
