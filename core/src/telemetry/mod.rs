//! Structured events: one per attempt start and end, per decision, per breaker
//! transition, per budget refusal, per fallback choice, per reload and mode
//! change. Delivered to sinks the caller registers and kept in a bounded ring
//! buffer (drop-oldest, with a dropped counter). Only allow-listed response
//! headers are copied, and credentials never are.
//!
//! The ring stores compact records (no allocation for the common events):
//! each thread that runs calls records into a ring of its own, with plain
//! stores (`ring/`); calls used off their thread, reloads and mode
//! changes go to one shared ring under a lock. An [`Event`] is built from a
//! record only when a sink or a snapshot asks. Every ring keeps the last
//! `ring_size` records and a snapshot merges them in time order and keeps the
//! newest `ring_size` events: exactly the events one ring of that size would hold.

mod bus;
mod record;
mod recorder;
pub(crate) mod ring;

pub(crate) use bus::EventBus;
pub(crate) use record::{Extra, Hot, Rec, Then};
pub(crate) use recorder::{PlainStart, Recorder, StartMark};

use crate::types::{Action, ErrorClass, ErrorKind, Phase, Reason, WaitSource};
use serde::Serialize;
use std::sync::Arc;

/// What an event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// An attempt is about to be sent.
    AttemptStart,
    /// An attempt's outcome was reported.
    AttemptEnd,
    /// The engine decided what happens next.
    Decision,
    /// A breaker changed state.
    BreakerTransition,
    /// The retry budget refused a retry.
    BudgetRefusal,
    /// A fallback candidate was chosen (with every exclusion).
    Fallback,
    /// A hedged attempt was started.
    Hedge,
    /// A policy was swapped in.
    Reload,
    /// The kill switch changed.
    ModeChange,
    /// A fleet's store became unavailable (decisions stay local) or came back.
    Fleet,
    /// An attempt was held back before sending: its provider rate-limit
    /// window had no room (`delay_ms`: the wait; `detail`: the scope).
    Paced,
}

impl EventKind {
    /// Every kind, in a stable order (the ring stores an index into it).
    pub const ALL: &'static [EventKind] = &[
        EventKind::AttemptStart,
        EventKind::AttemptEnd,
        EventKind::Decision,
        EventKind::BreakerTransition,
        EventKind::BudgetRefusal,
        EventKind::Fallback,
        EventKind::Hedge,
        EventKind::Reload,
        EventKind::ModeChange,
        EventKind::Fleet,
        EventKind::Paced,
    ];
}

/// A breaker transition carried by an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BreakerChange {
    /// Breaker scope key.
    pub key: String,
    /// Previous state.
    pub from: &'static str,
    /// New state.
    pub to: &'static str,
    /// Why.
    pub reason: &'static str,
    /// Open duration, ms (0 unless opening).
    pub open_for_ms: u64,
}

/// An attempt's id, `<logical id>.<attempt number>`; formatted only when an
/// event is serialized or displayed, so building an event does not allocate it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptId {
    /// Logical request id.
    pub logical: Arc<str>,
    /// Attempt number.
    pub attempt: u32,
}

impl std::fmt::Display for AttemptId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.logical, self.attempt)
    }
}

impl Serialize for AttemptId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One structured event. Field names follow the project vocabulary; where an
/// OpenTelemetry HTTP attribute exists it is given too (`http.request.resend_count`, `error.type`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    /// Sequence number, increasing in recording order for the events one
    /// thread records (for a single-threaded engine: engine-wide); gaps mean dropped events.
    pub seq: u64,
    /// Monotonic time, ms.
    pub at_ms: u64,
    /// Event kind.
    pub kind: EventKind,
    /// Policy version in force for the call (or the new one, for reloads).
    pub policy_version: Arc<str>,
    /// Logical request id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logical_request_id: Option<Arc<str>>,
    /// `<logical id>.<attempt>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<AttemptId>,
    /// The attempt this one follows (retries) or shadows (hedges).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_attempt_id: Option<AttemptId>,
    /// Attempt number, 1-based.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// OpenTelemetry `http.request.resend_count` (attempt − 1).
    #[serde(rename = "http.request.resend_count", skip_serializing_if = "Option::is_none")]
    pub resend_count: Option<u32>,
    /// Upstream of the attempt (or the fallback target).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Arc<str>>,
    /// Tenant of the call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Arc<str>>,
    /// Task of the call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<Arc<str>>,
    /// Error class (OpenTelemetry `error.type`).
    #[serde(rename = "error.type", skip_serializing_if = "Option::is_none")]
    pub error_class: Option<ErrorClass>,
    /// Reason code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// Action decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    /// Planned wait, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Where the planned wait came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_source: Option<WaitSource>,
    /// Remaining deadline when the attempt started (or at the decision), ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining_ms: Option<u64>,
    /// Stream phase of the failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// HTTP status of the attempt.
    #[serde(rename = "http.response.status_code", skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Machine error of the attempt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<ErrorKind>,
    /// True for hedged attempts.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub hedge: bool,
    /// Allow-listed response headers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
    /// Breaker change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaker: Option<BreakerChange>,
    /// Scope that refused (budget refusals) or extra detail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Candidates excluded by the matcher, with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub excluded: Vec<(String, String)>,
}

impl Event {
    /// An event with only the common fields set.
    pub fn new(kind: EventKind, at_ms: u64, policy_version: Arc<str>) -> Self {
        Event {
            seq: 0,
            at_ms,
            kind,
            policy_version,
            logical_request_id: None,
            attempt_id: None,
            parent_attempt_id: None,
            attempt: None,
            resend_count: None,
            upstream: None,
            tenant: None,
            task: None,
            error_class: None,
            reason: None,
            action: None,
            delay_ms: None,
            wait_source: None,
            remaining_ms: None,
            phase: None,
            status: None,
            error_kind: None,
            hedge: false,
            headers: Vec::new(),
            breaker: None,
            detail: None,
            excluded: Vec::new(),
        }
    }
}

/// Headers that are never copied into events, whatever the allow-list says.
const NEVER: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "api-key",
    "x-api-key",
    "cookie",
    "set-cookie",
    "openai-organization",
    "x-goog-api-key",
    "anthropic-api-key",
];

/// True when a header may appear in an event.
pub fn header_allowed(name: &str, allowlist: &[String]) -> bool {
    if !allowlist.iter().any(|a| a.eq_ignore_ascii_case(name)) {
        return false;
    }
    let n = name.to_ascii_lowercase();
    if NEVER.contains(&n.as_str())
        || n.contains("token")
        || n.contains("secret")
        || n.contains("key") && n != "idempotency-key"
    {
        return false;
    }
    true
}

/// A registered event sink.
pub type Sink = Arc<dyn Fn(&Event) + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_allowed() {
        let allow: Vec<String> = [
            "authorization",
            "x-api-key",
            "cookie",
            "retry-after",
            "api-key",
            "x-auth-token",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for h in ["Authorization", "x-api-key", "Cookie", "api-key", "x-auth-token"] {
            assert!(!header_allowed(h, &allow), "{h}");
        }
        assert!(header_allowed("Retry-After", &allow));
        assert!(!header_allowed("x-request-id", &allow));
    }
}
