//! The upstream catalog and the routes over it: how each upstream can be
//! reached and what it can do, and the rules for moving between candidates.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One upstream in the catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Upstream {
    /// e.g. `openai`.
    pub provider: String,
    /// e.g. `gpt-4o`.
    pub model: String,
    /// e.g. `us-east`.
    pub region: String,
    /// Open set; well-known: `streaming`, `tool_calling`, `json_schema`, `json_mode`, `vision`, `audio`.
    pub capabilities: Vec<String>,
    /// Context window, tokens; null = unknown (never excluded for size).
    pub context_tokens: Option<u64>,
    /// Largest output, tokens; null = unknown.
    pub max_output_tokens: Option<u64>,
    /// Where data may be processed (e.g. `eu`, `us`); null = unknown.
    pub data_boundary: Option<String>,
    /// USD per million input tokens.
    pub cost_input_per_mtok: f64,
    /// USD per million output tokens.
    pub cost_output_per_mtok: f64,
    /// Eval scores by task.
    pub evals: BTreeMap<String, f64>,
}

/// Whether a route may move to another upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FallbackMode {
    /// Candidates after the first may be used.
    Allowed,
    /// Only the first eligible candidate; stops carry `on_failure`.
    Forbidden,
}

/// What the caller should do when a route gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// Surface the failure.
    Fail,
    /// Hand the request to a human queue.
    ManualReview,
}

impl OnFailure {
    /// Stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            OnFailure::Fail => "fail",
            OnFailure::ManualReview => "manual_review",
        }
    }

    /// Stable numeric code (0 fail, 1 manual_review), shared by the C ABI and Node.
    pub fn code(self) -> u8 {
        match self {
            OnFailure::Fail => 0,
            OnFailure::ManualReview => 1,
        }
    }

    /// Variant for a numeric code.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(OnFailure::Fail),
            1 => Some(OnFailure::ManualReview),
            _ => None,
        }
    }
}

/// A route: candidates in preference order and the rules for moving between them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Route {
    /// Upstream names in preference order.
    pub candidates: Vec<String>,
    /// `allowed` (default) or `forbidden`.
    pub fallback: FallbackMode,
    /// Capabilities every candidate must have.
    pub require: Vec<String>,
    /// No fallback once output was visible (default true).
    pub forbid_after_stream_started: bool,
    /// `fail` (default) or `manual_review`.
    pub on_failure: OnFailure,
    /// Distinct upstreams one logical request may use; null = all candidates.
    pub max_upstreams: Option<u32>,
    /// Attempts on one upstream before moving to the next candidate. Default 2.
    pub attempts_per_upstream: u32,
    /// Largest estimated cost of one call, USD; null = no cap.
    pub max_cost_per_call: Option<f64>,
    /// Required data boundary; null = any.
    pub data_boundary: Option<String>,
    /// Minimum eval score for the call's task; null = no minimum.
    pub min_eval: Option<f64>,
    /// Start a hedged attempt after this long without an answer, ms; null = no hedging.
    pub hedge_after_ms: Option<u64>,
    /// Overrides the policy's `max_attempts` for this route.
    pub max_attempts: Option<u32>,
}

impl Default for Route {
    fn default() -> Self {
        Route {
            candidates: Vec::new(),
            fallback: FallbackMode::Allowed,
            require: Vec::new(),
            forbid_after_stream_started: true,
            on_failure: OnFailure::Fail,
            max_upstreams: None,
            attempts_per_upstream: 2,
            max_cost_per_call: None,
            data_boundary: None,
            min_eval: None,
            hedge_after_ms: None,
            max_attempts: None,
        }
    }
}
