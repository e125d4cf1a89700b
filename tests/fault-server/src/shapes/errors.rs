//! Vendor error bodies: generic injected statuses and the three 400s a fallback
//! must not retry (context length, content filter, prefill rejected).

use serde_json::{json, Value};

use super::Shape;
use crate::model::{Family, FilterCode};

fn openai_error_type(status: u16, vendor_code: Option<&str>) -> &'static str {
    match (status, vendor_code) {
        // The real API reports an exhausted quota with this type as well as code.
        (429, Some("insufficient_quota")) => "insufficient_quota",
        (400 | 404 | 409 | 422, _) => "invalid_request_error",
        (401, _) => "authentication_error",
        (403, _) => "permission_error",
        (429, _) => "rate_limit_error",
        (500..=599, _) => "server_error",
        _ => "api_error",
    }
}

/// Anthropic carries its machine-readable code in `error.type`.
fn anthropic_error_type(status: u16) -> &'static str {
    match status {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

/// A vendor-shaped error body; `vendor_code` becomes OpenAI's `error.code` or
/// Anthropic's `error.type`.
pub fn error_body(shape: Shape, status: u16, vendor_code: Option<&str>, message: &str) -> Value {
    match shape {
        Shape::Chat | Shape::Responses => json!({
            "error": {
                "message": message,
                "type": openai_error_type(status, vendor_code),
                "param": null,
                "code": vendor_code,
            }
        }),
        Shape::Anthropic => anthropic_invalid(vendor_code.unwrap_or(anthropic_error_type(status)), message),
    }
}

fn anthropic_invalid(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

fn openai_invalid(message: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": code,
        }
    })
}

/// 400: the conversation does not fit the model (the real APIs' wording).
pub fn context_length_body(shape: Shape) -> Value {
    match shape {
        Shape::Chat => openai_invalid(
            "This model's maximum context length is 128000 tokens. However, your messages resulted \
             in 128001 tokens. Please reduce the length of the messages.",
            Some("messages"),
            Some("context_length_exceeded"),
        ),
        Shape::Responses => openai_invalid(
            "Your input exceeds the context window of this model. Please adjust your input and try again.",
            Some("input"),
            Some("context_length_exceeded"),
        ),
        Shape::Anthropic => anthropic_invalid(
            "invalid_request_error",
            "prompt is too long: 200001 tokens > 200000 maximum",
        ),
    }
}

/// 400: the provider's content filter refused; the message names its `reason`.
pub fn content_filter_body(shape: Shape, code: FilterCode, reason: &str) -> Value {
    match (shape, code) {
        (Shape::Anthropic, _) => anthropic_invalid(
            "invalid_request_error",
            &format!("Output blocked by content filtering policy (reason: {reason})"),
        ),
        // Azure OpenAI's shape: no `type`, the category verdicts in `innererror`.
        (_, FilterCode::ContentFilter) => json!({
            "error": {
                "message": format!(
                    "The response was filtered due to the prompt triggering Azure OpenAI's content \
                     management policy (reason: {reason}, severity: high). Please modify your prompt and retry."
                ),
                "type": null,
                "param": "prompt",
                "code": "content_filter",
                "status": 400,
                "innererror": {
                    "code": "ResponsibleAIPolicyViolation",
                    "content_filter_result": {reason: {"filtered": true, "severity": "high"}},
                },
            }
        }),
        (_, FilterCode::ContentPolicyViolation) => openai_invalid(
            &format!("Your request was rejected as a result of our safety system (reason: {reason})."),
            None,
            Some("content_policy_violation"),
        ),
    }
}

/// The message Anthropic's models without prefill support send.
pub const PREFILL_REJECTED: &str =
    "This model does not support assistant message prefill. The conversation must end with a user message.";

/// 400: the conversation ends with an assistant message this model cannot continue.
pub fn prefill_rejected_body(shape: Shape) -> Value {
    match shape {
        Shape::Anthropic => anthropic_invalid("invalid_request_error", PREFILL_REJECTED),
        Shape::Chat => openai_invalid(PREFILL_REJECTED, Some("messages"), None),
        Shape::Responses => openai_invalid(PREFILL_REJECTED, Some("input"), None),
    }
}

/// Over a request limit, in the provider's words: OpenAI's `rate_limit_exceeded`
/// (type `requests`, as the real API sends for RPM), Anthropic's `rate_limit_error`.
pub fn rate_limit_body(shape: Shape, limit: u32, retry_after_s: u64, family: Family) -> Value {
    let message = format!(
        "Rate limit reached for requests: Limit {limit}, Used {limit}, Requested 1. \
         Please try again in {retry_after_s}s. (retrywise-fault-server)"
    );
    if family == Family::Gemini {
        // Gemini's per-minute refusal: RESOURCE_EXHAUSTED with the quota and when to come back.
        return json!({"error": {
            "code": 429,
            "message": message,
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                 "violations": [{"quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
                                 "quotaId": "GenerateRequestsPerMinutePerProjectPerModel"}]},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": format!("{retry_after_s}s")}
            ]
        }});
    }
    match shape {
        Shape::Anthropic => anthropic_invalid("rate_limit_error", &message),
        Shape::Chat | Shape::Responses => json!({
            "error": {"message": message, "type": "requests", "param": null, "code": "rate_limit_exceeded"}
        }),
    }
}
