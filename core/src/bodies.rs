//! What a provider's error body says, in every shape retrywise meets:
//! OpenAI and Azure OpenAI (`{"error": {"code", "type", "message"}}`),
//! Anthropic (`{"type": "error", "error": {"type", "message"}}`) and Google
//! Gemini (`{"error": {"status", "details": [RetryInfo, QuotaFailure, ...]}}`).
//!
//! One reader for every binding, so a body means the same in every language:
//! the vendor code the classifier's tables match, a wait hint the body
//! carries (Gemini's `RetryInfo.retryDelay`) and the prompt's real size when
//! the body names it (a context-length refusal, re-matched to a larger
//! window). Conditions spelled differently by each provider are read into the
//! code the default tables already know: a context-length refusal in any
//! provider's words (Anthropic's "prompt is too long", vLLM's and Gemini's
//! messages, whatever their code) is `context_length_exceeded`, Gemini's per-day `QuotaFailure` is
//! `quota_exceeded` (waiting a minute does not help; a per-minute one stays a
//! rate limit).

use serde_json::Value;
use std::time::Duration;

/// Bodies larger than this are not parsed (an error body is a few hundred bytes).
const MAX_BODY: usize = 1 << 20;

/// What an error body says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BodyEvidence {
    /// The vendor error code or type.
    pub vendor_code: Option<String>,
    /// A wait the body asks for (Gemini `RetryInfo.retryDelay`).
    pub retry_delay: Option<Duration>,
    /// The prompt's size in tokens, when a context-length message names it.
    pub input_tokens: Option<u64>,
}

/// Reads an error body (JSON; anything else says nothing).
///
/// ```
/// use retrywise::bodies::read_error_body;
/// let e = read_error_body(br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210463 tokens > 200000 maximum"}}"#);
/// assert_eq!(e.vendor_code.as_deref(), Some("context_length_exceeded"));
/// assert_eq!(e.input_tokens, Some(210_463));
/// ```
pub fn read_error_body(body: &[u8]) -> BodyEvidence {
    let mut out = BodyEvidence::default();
    if body.len() > MAX_BODY {
        return out;
    }
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return out;
    };
    let Some(err) = v.get("error") else {
        return out;
    };
    let pick = |k: &str| {
        err.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    out.vendor_code = pick("code").or_else(|| pick("type")).or_else(|| pick("status"));
    let message = err.get("message").and_then(Value::as_str).unwrap_or("");
    let named = out.vendor_code.as_deref() == Some("context_length_exceeded");
    if named || too_long(message) {
        out.vendor_code = Some("context_length_exceeded".into());
        out.input_tokens = prompt_tokens(message);
    }
    if let Some(details) = err.get("details").and_then(Value::as_array) {
        for d in details {
            let kind = d.get("@type").and_then(Value::as_str).unwrap_or("");
            if kind.ends_with("google.rpc.RetryInfo") {
                out.retry_delay = d.get("retryDelay").and_then(Value::as_str).and_then(proto_duration);
            } else if kind.ends_with("google.rpc.QuotaFailure") && per_day(d) {
                out.vendor_code = Some("quota_exceeded".into());
            }
        }
    }
    out
}

/// A message that says the prompt does not fit the model's context window,
/// in any provider's words (the code may be only `invalid_request_error`,
/// `BadRequestError` or `INVALID_ARGUMENT`): Anthropic's "prompt is too
/// long", OpenAI's and vLLM's "maximum context length", the Responses API's
/// "exceeds the context window", Gemini's "input token count (N) exceeds the
/// maximum number of tokens", Mistral's "too large for model with N maximum
/// context length".
fn too_long(message: &str) -> bool {
    const SAYS: [&str; 6] = [
        "prompt is too long",
        "maximum context length",
        "context window",
        "context length exceeded",
        "exceeds the maximum number of tokens",
        "input is too long",
    ];
    let m = message.to_ascii_lowercase();
    SAYS.iter().any(|s| m.contains(s))
}

/// The prompt's size in tokens where the message names it: Anthropic
/// (`prompt is too long: 210463 tokens > 200000 maximum`), OpenAI (`your
/// messages resulted in 9000 tokens`, `you requested 10000 tokens (9000 in
/// the messages, ...`), Gemini (`The input token count (1234567) exceeds`),
/// Mistral (`Prompt contains 40000 tokens`).
fn prompt_tokens(message: &str) -> Option<u64> {
    let m = message.to_ascii_lowercase();
    let after = |marker: &str| {
        m.split_once(marker)
            .and_then(|(_, rest)| leading_number(rest.trim_start()))
    };
    after("prompt is too long:")
        .or_else(|| after("resulted in "))
        .or_else(|| {
            // "you requested 10000 tokens (9000 in the messages, 1000 in the completion)"
            let (_, rest) = m.split_once("you requested ")?;
            let (_, inner) = rest.split_once('(')?;
            leading_number(inner).filter(|_| inner.contains(" in the messages"))
        })
        .or_else(|| after("input token count ("))
        .or_else(|| after("input token count"))
        .or_else(|| after("prompt contains "))
}

fn leading_number(s: &str) -> Option<u64> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s[..end].parse().ok()
}

/// A protobuf JSON duration: decimal seconds with an `s` suffix (`"37s"`, `"0.5s"`).
fn proto_duration(s: &str) -> Option<Duration> {
    let secs: f64 = s.strip_suffix('s')?.parse().ok()?;
    (0.0..=365.0 * 24.0 * 3600.0)
        .contains(&secs)
        .then(|| Duration::from_secs_f64(secs))
}

/// A `QuotaFailure` whose violations name a per-day quota.
fn per_day(d: &Value) -> bool {
    d.get("violations").and_then(Value::as_array).is_some_and(|vs| {
        vs.iter().any(|v| {
            ["quotaId", "quotaMetric"]
                .iter()
                .filter_map(|k| v.get(*k).and_then(Value::as_str))
                .any(|s| s.contains("PerDay") || s.contains("per_day"))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(body: &str) -> Option<String> {
        read_error_body(body.as_bytes()).vendor_code
    }

    #[test]
    fn openai_anthropic_azure_codes() {
        assert_eq!(
            code(r#"{"error":{"code":"insufficient_quota","type":"x"}}"#).as_deref(),
            Some("insufficient_quota")
        );
        assert_eq!(
            code(r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#).as_deref(),
            Some("overloaded_error")
        );
        assert_eq!(
            code(r#"{"error":{"code":"content_filter","innererror":{"code":"ResponsibleAIPolicyViolation"}}}"#)
                .as_deref(),
            Some("content_filter")
        );
        assert_eq!(
            code(r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED"}}"#).as_deref(),
            Some("RESOURCE_EXHAUSTED")
        );
        assert_eq!(code("not json"), None);
        assert_eq!(code(r#"{"detail":"x"}"#), None);
        assert_eq!(code(r#"{"error":"plain string"}"#), None);
    }

    #[test]
    fn context_length_messages_name_the_prompt_size() {
        let e = read_error_body(
            br#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","code":"context_length_exceeded"}}"#,
        );
        assert_eq!(
            (e.vendor_code.as_deref(), e.input_tokens),
            (Some("context_length_exceeded"), Some(9000))
        );
        for (body, tokens) in [
            // Anthropic without the numbers: still the context window, size unknown.
            (
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long"}}"#,
                None,
            ),
            (
                r#"{"error":{"message":"Your input exceeds the context window of this model. Please adjust your input and try again.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}"#,
                None,
            ),
            // vLLM and other OpenAI-compatible servers: no code, the size in parentheses.
            (
                r#"{"object":"error","error":{"message":"This model's maximum context length is 32768 tokens. However, you requested 33000 tokens (32000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","code":400}}"#,
                Some(32_000),
            ),
            (
                r#"{"error":{"code":400,"message":"The input token count (1234567) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#,
                Some(1_234_567),
            ),
            (
                r#"{"error":{"message":"Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length","type":"invalid_request_error","code":"3051"}}"#,
                Some(40_000),
            ),
        ] {
            let e = read_error_body(body.as_bytes());
            assert_eq!(
                (e.vendor_code.as_deref(), e.input_tokens),
                (Some("context_length_exceeded"), tokens),
                "{body}"
            );
        }
        // Other bad requests stay what they are.
        let e = read_error_body(
            br#"{"error":{"message":"Invalid value for 'temperature': must be at most 2.","type":"invalid_request_error","code":"invalid_value"}}"#,
        );
        assert_eq!(e.vendor_code.as_deref(), Some("invalid_value"));
    }

    #[test]
    fn gemini_retry_info_and_quota_failure() {
        let minute = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerMinutePerProjectPerModel"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"37s"}]}}"#;
        let e = read_error_body(minute.as_bytes());
        assert_eq!(e.vendor_code.as_deref(), Some("RESOURCE_EXHAUSTED"));
        assert_eq!(e.retry_delay, Some(Duration::from_secs(37)));
        let day = minute.replace("PerMinute", "PerDay");
        assert_eq!(
            read_error_body(day.as_bytes()).vendor_code.as_deref(),
            Some("quota_exceeded")
        );
        for (v, want) in [
            ("0.5s", Some(500)),
            ("0s", Some(0)),
            ("-1s", None),
            ("37", None),
            ("1e9s", None),
            ("NaNs", None),
        ] {
            assert_eq!(proto_duration(v).map(|d| d.as_millis() as u64), want, "{v}");
        }
    }
}
