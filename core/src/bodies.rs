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
//! code the default tables already know: Anthropic's "prompt is too long" is
//! `context_length_exceeded`, Gemini's per-day `QuotaFailure` is
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
    if let Some(n) = prompt_too_long(message) {
        out.vendor_code = Some("context_length_exceeded".into());
        out.input_tokens = Some(n);
    } else if out.vendor_code.as_deref() == Some("context_length_exceeded") {
        out.input_tokens = resulted_in_tokens(message);
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

/// Anthropic: `prompt is too long: 210463 tokens > 200000 maximum`.
fn prompt_too_long(message: &str) -> Option<u64> {
    let rest = message.strip_prefix("prompt is too long:")?;
    leading_number(rest.trim_start())
}

/// OpenAI: `... However, your messages resulted in 9000 tokens.`
fn resulted_in_tokens(message: &str) -> Option<u64> {
    let (_, rest) = message.split_once("resulted in ")?;
    leading_number(rest)
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
        let e = read_error_body(
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long"}}"#,
        );
        assert_eq!(
            (e.vendor_code.as_deref(), e.input_tokens),
            (Some("invalid_request_error"), None)
        );
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
