//! Structured events: one per attempt start and end, per decision, per breaker
//! transition, per budget refusal, per fallback choice, per reload and mode
//! change. Delivered to sinks the caller registers and kept in a bounded ring
//! buffer (drop-oldest, with a dropped counter). Only allow-listed response
//! headers are copied, and credentials never are.

use crate::types::{Action, ErrorClass, ErrorKind, Phase, Reason, WaitSource};
use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// Engine-wide sequence number (gaps mean dropped events).
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
    let n = name.to_ascii_lowercase();
    if NEVER.contains(&n.as_str())
        || n.contains("token")
        || n.contains("secret")
        || n.contains("key") && n != "idempotency-key"
    {
        return false;
    }
    allowlist.iter().any(|a| a.eq_ignore_ascii_case(&n))
}

/// A registered event sink.
pub type Sink = Arc<dyn Fn(&Event) + Send + Sync>;

/// Ring buffer + sinks.
pub struct EventBus {
    ring: Mutex<VecDeque<Event>>,
    cap: AtomicU64,
    dropped: AtomicU64,
    seq: AtomicU64,
    sinks: RwLock<Vec<(u64, Sink)>>,
    next_sink: AtomicU64,
    sink_panics: AtomicU64,
    active: AtomicBool,
}

impl std::fmt::Debug for EventBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventBus")
            .field("cap", &self.cap)
            .field("dropped", &self.dropped)
            .finish()
    }
}

impl EventBus {
    /// A bus keeping at most `cap` events.
    pub fn new(cap: u32) -> Self {
        EventBus {
            ring: Mutex::new(VecDeque::new()),
            cap: AtomicU64::new(cap as u64),
            dropped: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            sinks: RwLock::new(Vec::new()),
            next_sink: AtomicU64::new(1),
            sink_panics: AtomicU64::new(0),
            active: AtomicBool::new(cap > 0),
        }
    }

    /// True when anyone will see events (skip building them otherwise).
    #[inline]
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    fn refresh_active(&self) {
        let on = self.cap.load(Ordering::Relaxed) > 0 || !self.sinks.read().is_empty();
        self.active.store(on, Ordering::Relaxed);
    }

    /// Changes the ring size (on reload); excess old events are dropped and counted.
    pub fn set_capacity(&self, cap: u32) {
        self.cap.store(cap as u64, Ordering::Relaxed);
        let mut r = self.ring.lock();
        while r.len() > cap as usize {
            r.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        drop(r);
        self.refresh_active();
    }

    /// Registers a sink; returns its id for [`EventBus::remove_sink`].
    pub fn add_sink(&self, sink: Sink) -> u64 {
        let id = self.next_sink.fetch_add(1, Ordering::Relaxed);
        self.sinks.write().push((id, sink));
        self.refresh_active();
        id
    }

    /// Removes a sink; true when it existed.
    pub fn remove_sink(&self, id: u64) -> bool {
        let mut s = self.sinks.write();
        let before = s.len();
        s.retain(|(i, _)| *i != id);
        let removed = s.len() != before;
        drop(s);
        self.refresh_active();
        removed
    }

    /// Publishes an event: sinks first (outside any engine lock), then the ring.
    /// A panicking sink is counted and does not disturb the decision.
    pub fn emit(&self, mut ev: Event) {
        ev.seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let sinks: Vec<Sink> = {
            let s = self.sinks.read();
            if s.is_empty() {
                Vec::new()
            } else {
                s.iter().map(|(_, f)| f.clone()).collect()
            }
        };
        for f in sinks {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&ev))).is_err() {
                self.sink_panics.fetch_add(1, Ordering::Relaxed);
            }
        }
        let cap = self.cap.load(Ordering::Relaxed) as usize;
        if cap == 0 {
            return;
        }
        let mut r = self.ring.lock();
        if r.len() >= cap {
            r.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        r.push_back(ev);
    }

    /// A copy of the ring, oldest first.
    pub fn snapshot(&self) -> Vec<Event> {
        self.ring.lock().iter().cloned().collect()
    }

    /// Takes every event out of the ring, oldest first.
    pub fn drain(&self) -> Vec<Event> {
        self.ring.lock().drain(..).collect()
    }

    /// Events dropped from the ring so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Sink calls that panicked.
    pub fn sink_panics(&self) -> u64 {
        self.sink_panics.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_is_bounded_and_counts_drops() {
        let bus = EventBus::new(3);
        for i in 0..10 {
            bus.emit(Event::new(EventKind::Decision, i, Arc::from("v")));
        }
        let evs = bus.snapshot();
        assert_eq!(evs.len(), 3);
        assert_eq!(evs.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![8, 9, 10]);
        assert_eq!(bus.dropped(), 7);
        bus.set_capacity(1);
        assert_eq!(bus.snapshot().len(), 1);
        assert_eq!(bus.dropped(), 9);
    }

    #[test]
    fn sinks_receive_and_panics_are_contained() {
        let bus = EventBus::new(0);
        assert!(!bus.active());
        let seen = Arc::new(AtomicU64::new(0));
        let s2 = seen.clone();
        let id = bus.add_sink(Arc::new(move |_e: &Event| {
            s2.fetch_add(1, Ordering::Relaxed);
        }));
        bus.add_sink(Arc::new(|_e: &Event| panic!("sink bug")));
        assert!(bus.active());
        bus.emit(Event::new(EventKind::Decision, 0, Arc::from("v")));
        assert_eq!(seen.load(Ordering::Relaxed), 1);
        assert_eq!(bus.sink_panics(), 1);
        assert!(bus.remove_sink(id));
        assert!(!bus.remove_sink(id));
    }

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
