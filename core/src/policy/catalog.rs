//! The upstream catalog and the routes over it: how each upstream can be
//! reached and what it can do, and the rules for moving between candidates.

use crate::types::ApiFamily;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One upstream in the catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Upstream {
    /// e.g. `openai`.
    pub provider: String,
    /// e.g. `gpt-4o`: the breaker's scope key, and the request's `model` on
    /// the wire when the transport rewrites requests for this upstream
    /// (unless `request_model` says otherwise).
    pub model: String,
    /// e.g. `us-east`.
    pub region: String,
    /// What it can do, from [`CAPABILITIES`] (custom names start with `x-`).
    /// Null: unknown, so what a request needs (derived from its body, or
    /// given per call) never excludes it, though a route's `require` does;
    /// a list, even `[]`, is complete: a request that needs anything else
    /// skips it.
    pub capabilities: Option<Vec<String>>,
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
    /// Where to reach it, e.g. `https://api.openai.com/v1` (the request's
    /// endpoint path is appended). Null: the transports leave the caller's
    /// URL as it is (the upstream is the SDK's own).
    pub base_url: Option<String>,
    /// The protocol it speaks: `openai` (chat/completions, responses and the
    /// other OpenAI-compatible endpoints), `anthropic` (messages) or
    /// `azure_openai`. Null: the request's own.
    pub api: Option<ApiFamily>,
    /// The `model` sent in the request when it differs from `model`
    /// (e.g. a dated snapshot, an Azure deployment name).
    pub request_model: Option<String>,
    /// The NAME of the environment variable that holds its API key (a
    /// secret never sits in a policy). Null: the caller's credentials go
    /// along only while the request stays on the caller's own origin.
    pub api_key_env: Option<String>,
    /// Azure OpenAI's `api-version` query parameter.
    pub api_version: Option<String>,
}

impl Upstream {
    /// It declares capability `cap`.
    pub fn has(&self, cap: &str) -> bool {
        self.capabilities.iter().flatten().any(|c| c == cap)
    }

    /// Whether the transports rewrite requests for this upstream (it says where or how to reach it).
    pub fn reachable(&self) -> bool {
        self.base_url.is_some() || self.api_key_env.is_some() || self.request_model.is_some()
    }

    /// The `model` to send to it: `request_model`, else `model` (when set).
    pub fn wire_model(&self) -> Option<&str> {
        self.request_model
            .as_deref()
            .or((!self.model.is_empty()).then_some(self.model.as_str()))
    }
}

/// The capability vocabulary: every name a catalog's `capabilities` or a
/// route's `require` may use (besides custom names starting with `x-`),
/// with what a request that needs it looks like. The drop-in transports
/// derive a request's needs from its body in these terms
/// ([`crate::wire::RequestFacts`]).
pub const CAPABILITIES: &[(&str, &str)] = &[
    ("streaming", "answers as a server-sent event stream (`stream: true`)"),
    ("tool_calling", "takes tool or function definitions (`tools`, `functions`)"),
    (
        "json_schema",
        "structured output to a JSON schema (`response_format` / `text.format` / `output_config.format` of type json_schema)",
    ),
    ("json_mode", "JSON object output (`response_format` / `text.format` of type json_object)"),
    ("vision", "image input (`image_url`, `input_image`, `image` parts)"),
    ("audio", "audio input or output (`input_audio` parts, `audio`, `modalities: [audio]`)"),
    ("file_input", "file or document input (`file`, `input_file`, `document` parts)"),
    (
        "assistant_prefill",
        "accepts a trailing assistant message to continue (stream continuation by prefill)",
    ),
];

/// Whether `name` is a capability of [`CAPABILITIES`] or a custom one (`x-...`).
pub fn known_capability(name: &str) -> bool {
    (name.starts_with("x-") && name.len() > 2) || CAPABILITIES.iter().any(|(c, _)| *c == name)
}

impl ApiFamily {
    /// Whether an upstream of this family takes a request built for `request`
    /// as it is (only its URL, model and key rewritten): Azure OpenAI and
    /// OpenAI-compatible APIs share their bodies; Anthropic messages differ.
    pub fn takes(self, request: ApiFamily) -> bool {
        self.body_shape() == request.body_shape()
    }

    /// Families with the same request and response bodies share a shape.
    fn body_shape(self) -> u8 {
        match self {
            ApiFamily::OpenAi | ApiFamily::AzureOpenAi => 0,
            ApiFamily::Anthropic => 1,
        }
    }
}

/// What a route does when its upstream goes silent (no first byte, no
/// first token, a stall) before any output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnSilence {
    /// Try the next eligible candidate at once (default): a silent upstream
    /// is more likely to stay silent than to answer the same request again.
    Fallback,
    /// Retry the same upstream first (as for any transient failure).
    Retry,
}

/// What a route does when a stream breaks after its caller saw output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StreamRecovery {
    /// Stop with `stream_visible_output` (default): the caller's stream ends
    /// with a clean, typed error, never a truncated success.
    Never,
    /// The next eligible candidate continues the answer (assistant prefill
    /// where it declares `assistant_prefill`, else an instruction quoting
    /// what was shown), spliced into the same stream without a gap or a
    /// repeat. Safe calls only, and only text (never a tool-call delta).
    Continue,
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
    /// No replay from the start on another upstream once output was visible
    /// (default true; a continuation under `stream_recovery: continue` is not a replay).
    pub forbid_after_stream_started: bool,
    /// `fallback` (default) or `retry`: see [`OnSilence`].
    pub on_silence: OnSilence,
    /// `never` (default) or `continue`: see [`StreamRecovery`].
    pub stream_recovery: StreamRecovery,
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
            on_silence: OnSilence::Fallback,
            stream_recovery: StreamRecovery::Never,
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
