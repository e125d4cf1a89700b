//! Wire helpers for the drop-in transports: pure functions over the bytes an
//! SDK sends and receives (no I/O), written once here so no binding writes
//! its own request rewriting or SSE splicing.
//!
//! - [`RequestFacts`]: what a request needs from any upstream that serves
//!   it (tools, structured output, media, size, wire family), read from its
//!   body, and the model it names.
//! - [`rewrite`]: the request for the upstream the core chose — its URL, its
//!   `model`, its key (read from the environment variable the policy names;
//!   a key never travels to another provider).
//! - [`Transcript`]: what a streamed answer delivered to the caller so far —
//!   its text, whether it finished, whether it can be continued.
//! - [`continuation_body`]: the fallback's request that continues that text,
//!   by assistant prefill or by an instruction quoting it.
//! - [`Splicer`]: the fallback's stream turned into the rest of the caller's
//!   stream — no second opening, no restated text, indexes that continue.
//! - [`sse`]: the SSE event reader they (and the stream gate) share.
//!
//! A transport's continuation, end to end:
//!
//! ```
//! use retrywise::wire::{continuation_body, Splicer, Transcript};
//! use retrywise::{ApiFamily, Continuation};
//!
//! // The primary's stream, as the caller received it, broke after "Hello".
//! let mut seen = Transcript::new(ApiFamily::OpenAi);
//! seen.observe(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hello\"}}]}\n\n");
//! assert!(seen.resumable() && !seen.finished());
//!
//! let body = br#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"Hi"}]}"#;
//! let next = continuation_body(ApiFamily::OpenAi, body, &seen, Continuation::Prefill).unwrap();
//! assert!(next.ends_with(br#"{"role":"assistant","content":"Hello"}]}"#));
//!
//! // The fallback's stream opens again and restates the text: the caller sees only the rest.
//! let mut splice = Splicer::new(ApiFamily::OpenAi, &seen);
//! let mut out = splice.feed(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n");
//! out.extend(splice.feed(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n"));
//! out.extend(splice.feed(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"}}]}\n\ndata: [DONE]\n\n"));
//! out.extend(splice.finish());
//! seen.observe(&out); // the transcript follows what the caller now has
//! assert_eq!(seen.text(), "Hello world");
//! assert!(seen.finished());
//! ```

use std::fmt;

mod api;
mod body;
mod continuation;
mod quick;
mod request;
mod restate;
mod rewrite;
mod splice;
pub mod sse;
mod transcript;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod fixtures;

pub use api::Endpoint;
pub use continuation::{continuation_body, instruction};
pub use request::{RequestFacts, CHARS_PER_TOKEN};
pub use rewrite::{rewrite, Reach, WireRequest};
pub use splice::Splicer;
pub use transcript::{Transcript, Usage};

/// Why a request could not be rewritten or continued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The request's URL could not be read (shown without its query).
    InvalidUrl {
        /// The URL, up to its path.
        url: String,
    },
    /// The URL path names no endpoint that can move to another base URL.
    UnknownEndpoint {
        /// The path.
        path: String,
    },
    /// The environment variable that holds the upstream's key is unset or empty.
    EnvUnset {
        /// The variable's name (never its value).
        var: String,
        /// The upstream whose key it holds.
        upstream: String,
    },
    /// The body must be a JSON object (to set its `model` or its conversation) and is not.
    BodyNotJson {
        /// What the JSON parser said.
        detail: String,
    },
    /// An Azure OpenAI deployment URL needs the deployment's name, and no
    /// model was given (by the upstream or the request).
    NoDeployment {
        /// The upstream.
        upstream: String,
    },
    /// The request has no conversation to continue (`messages` or `input`).
    NoConversation,
}

impl WireError {
    /// A stable machine-readable code for bindings and telemetry.
    pub fn code(&self) -> &'static str {
        match self {
            WireError::InvalidUrl { .. } => "invalid_url",
            WireError::UnknownEndpoint { .. } => "unknown_endpoint",
            WireError::EnvUnset { .. } => "env_unset",
            WireError::BodyNotJson { .. } => "body_not_json",
            WireError::NoDeployment { .. } => "no_deployment",
            WireError::NoConversation => "no_conversation",
        }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::InvalidUrl { url } => write!(f, "cannot read the request URL {url:?}"),
            WireError::UnknownEndpoint { path } => write!(
                f,
                "cannot move {path:?} to another upstream: its path names none of /chat/completions, \
                 /responses, /completions, /embeddings, /messages"
            ),
            WireError::EnvUnset { var, upstream } => write!(
                f,
                "environment variable {var} (api_key_env of upstream {upstream:?}) is unset or empty"
            ),
            WireError::BodyNotJson { detail } => write!(f, "the request body is not a JSON object: {detail}"),
            WireError::NoDeployment { upstream } => write!(
                f,
                "upstream {upstream:?} is Azure OpenAI with an api_version: set its model (the deployment name)"
            ),
            WireError::NoConversation => f.write_str("the request has no `messages` or `input` to continue"),
        }
    }
}

impl std::error::Error for WireError {}
