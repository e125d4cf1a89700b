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

pub(crate) mod ring;

use ring::ThreadRing;

use crate::id::CallId;
use crate::types::{Action, ErrorClass, ErrorKind, Phase, Reason, WaitSource};
use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use smol_str::SmolStr;
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

/// The rarely present parts of an event, boxed so a record stays small.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Extra {
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) breaker: Option<BreakerChange>,
    pub(crate) detail: Option<String>,
    pub(crate) excluded: Vec<(String, String)>,
}

/// A decision folded into the attempt-end record it directly follows: one
/// record, two events (the common end of an attempt costs one ring slot).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Then {
    pub(crate) action: Action,
    pub(crate) reason: Reason,
    pub(crate) error_class: Option<ErrorClass>,
    pub(crate) remaining_ms: u64,
    pub(crate) delay_ms: u64,
    pub(crate) wait_source: WaitSource,
}

impl Then {
    /// The call succeeded, `remaining_ms` before its deadline.
    #[inline(always)]
    pub(crate) fn success(remaining_ms: u64) -> Then {
        Then {
            action: Action::Succeeded,
            reason: Reason::Success,
            error_class: None,
            remaining_ms,
            delay_ms: 0,
            wait_source: WaitSource::None,
        }
    }
}

/// An attempt's start or end borrowed from its call: the two events every
/// attempt records, encoded into the ring without building a [`Rec`].
#[derive(Debug, Clone)]
pub(crate) struct Hot<'a> {
    /// `AttemptStart`, `Hedge` or `AttemptEnd`.
    pub(crate) kind: EventKind,
    pub(crate) at_ns: u64,
    pub(crate) version: u32,
    pub(crate) id: &'a CallId,
    pub(crate) upstream: &'a SmolStr,
    /// `upstream` as a ring slot stores it (`None`: too long for one), packed once per upstream.
    pub(crate) up_packed: Option<ring::Packed>,
    pub(crate) tenant: Option<&'a SmolStr>,
    pub(crate) task: Option<&'a SmolStr>,
    pub(crate) attempt: u32,
    /// A start names the attempt before it (`parent_attempt`); an end does not.
    pub(crate) start: bool,
    pub(crate) hedge: bool,
    pub(crate) status: Option<u16>,
    pub(crate) error_class: Option<ErrorClass>,
    pub(crate) reason: Option<Reason>,
    pub(crate) phase: Option<Phase>,
    pub(crate) error_kind: Option<ErrorKind>,
    pub(crate) delay_ms: Option<u64>,
    pub(crate) remaining_ms: u64,
}

impl Hot<'_> {
    /// The fields an attempt's end writes into its start record.
    #[inline(always)]
    pub(crate) fn end(&self) -> ring::End {
        ring::End {
            at_ns: self.at_ns,
            status: self.status,
            error_class: self.error_class,
            reason: self.reason,
            phase: self.phase,
            error_kind: self.error_kind,
            hedge: self.hedge,
            remaining_ms: self.remaining_ms,
            delay_ms: self.delay_ms.unwrap_or(0),
        }
    }

    /// The same event as a record (sinks, the shared ring, the side list).
    pub(crate) fn to_rec(&self) -> Rec {
        let n = self.attempt;
        Rec {
            id: Some(self.id.clone()),
            upstream: Some(self.upstream.clone()),
            tenant: self.tenant.cloned(),
            task: self.task.cloned(),
            attempt: Some(n),
            attempt_id: Some(n),
            parent_attempt: (self.start && n > 1).then(|| n - 1),
            resend_count: Some(n.saturating_sub(1)),
            status: self.status,
            error_class: self.error_class,
            reason: self.reason,
            phase: self.phase,
            error_kind: self.error_kind,
            hedge: self.hedge,
            delay_ms: self.delay_ms,
            remaining_ms: Some(self.remaining_ms),
            ..Rec::new(self.kind, self.at_ns, self.version)
        }
    }
}

/// An event as the ring stores it: fixed-size fields, names inline (see
/// [`SmolStr`]), the policy version as an index into the bus's name table.
#[derive(Debug, Clone)]
pub(crate) struct Rec {
    pub(crate) at_ns: u64,
    pub(crate) seq: u64,
    pub(crate) kind: EventKind,
    pub(crate) version: u32,
    pub(crate) id: Option<CallId>,
    pub(crate) upstream: Option<SmolStr>,
    pub(crate) tenant: Option<SmolStr>,
    pub(crate) task: Option<SmolStr>,
    pub(crate) attempt: Option<u32>,
    /// Attempt number of `attempt_id` (`<id>.<n>`).
    pub(crate) attempt_id: Option<u32>,
    pub(crate) parent_attempt: Option<u32>,
    pub(crate) resend_count: Option<u32>,
    pub(crate) status: Option<u16>,
    pub(crate) error_class: Option<ErrorClass>,
    pub(crate) reason: Option<Reason>,
    pub(crate) action: Option<Action>,
    pub(crate) wait_source: Option<WaitSource>,
    pub(crate) phase: Option<Phase>,
    pub(crate) error_kind: Option<ErrorKind>,
    pub(crate) hedge: bool,
    pub(crate) delay_ms: Option<u64>,
    pub(crate) remaining_ms: Option<u64>,
    pub(crate) extra: Option<Box<Extra>>,
    /// A `Decision` event that directly follows this `AttemptEnd`.
    pub(crate) then: Option<Then>,
    /// Only the folded decision is left to deliver (a drain took the rest).
    pub(crate) only_then: bool,
}

impl Rec {
    /// A record with only the common fields set.
    #[inline(always)]
    pub(crate) fn new(kind: EventKind, at_ns: u64, version: u32) -> Self {
        Rec {
            at_ns,
            seq: 0,
            kind,
            version,
            id: None,
            upstream: None,
            tenant: None,
            task: None,
            attempt: None,
            attempt_id: None,
            parent_attempt: None,
            resend_count: None,
            status: None,
            error_class: None,
            reason: None,
            action: None,
            wait_source: None,
            phase: None,
            error_kind: None,
            hedge: false,
            delay_ms: None,
            remaining_ms: None,
            extra: None,
            then: None,
            only_then: false,
        }
    }

    /// Events this record stands for (1, or 2 with a folded decision).
    pub(crate) fn events(&self) -> u64 {
        1 + self.then.is_some() as u64 - self.only_then as u64
    }

    fn push_events(&self, names: &[Arc<str>], out: &mut Vec<Event>) {
        let first = self.to_event(names);
        let then = self.then.map(|t| {
            let mut d = Event::new(EventKind::Decision, first.at_ms, first.policy_version.clone());
            d.seq = first.seq + 1;
            d.logical_request_id = first.logical_request_id.clone();
            d.attempt_id = first.attempt_id.clone();
            d.attempt = first.attempt;
            d.resend_count = first.resend_count;
            d.upstream = first.upstream.clone();
            d.tenant = first.tenant.clone();
            d.task = first.task.clone();
            d.error_class = t.error_class;
            d.reason = Some(t.reason);
            d.action = Some(t.action);
            d.delay_ms = Some(t.delay_ms);
            d.wait_source = Some(t.wait_source);
            d.remaining_ms = Some(t.remaining_ms);
            d.hedge = first.hedge;
            d
        });
        if !self.only_then {
            out.push(first);
        }
        out.extend(then);
    }

    /// The boxed rare fields, created on first use.
    pub(crate) fn extra(&mut self) -> &mut Extra {
        self.extra.get_or_insert_with(Default::default)
    }

    fn to_event(&self, names: &[Arc<str>]) -> Event {
        let logical: Option<Arc<str>> = self.id.as_ref().map(|i| Arc::from(i.text().as_str()));
        let aid = |n: Option<u32>| {
            n.zip(logical.clone())
                .map(|(attempt, logical)| AttemptId { logical, attempt })
        };
        let x = self.extra.as_deref();
        Event {
            seq: self.seq,
            at_ms: self.at_ns / 1_000_000,
            kind: self.kind,
            policy_version: names
                .get(self.version as usize)
                .cloned()
                .unwrap_or_else(|| Arc::from("")),
            attempt_id: aid(self.attempt_id),
            parent_attempt_id: aid(self.parent_attempt),
            logical_request_id: logical.clone(),
            attempt: self.attempt,
            resend_count: self.resend_count,
            upstream: self.upstream.as_deref().map(Arc::from),
            tenant: self.tenant.as_deref().map(Arc::from),
            task: self.task.as_deref().map(Arc::from),
            error_class: self.error_class,
            reason: self.reason,
            action: self.action,
            delay_ms: self.delay_ms,
            wait_source: self.wait_source,
            remaining_ms: self.remaining_ms,
            phase: self.phase,
            status: self.status,
            error_kind: self.error_kind,
            hedge: self.hedge,
            headers: x.map(|x| x.headers.clone()).unwrap_or_default(),
            breaker: x.and_then(|x| x.breaker.clone()),
            detail: x.and_then(|x| x.detail.clone()),
            excluded: x.map(|x| x.excluded.clone()).unwrap_or_default(),
        }
    }
}

/// The shared ring's records: a circular buffer that overwrites its oldest
/// record in place once full (no allocation after it filled up).
#[derive(Debug, Default)]
struct Ring {
    buf: Vec<Rec>,
    /// Index of the oldest record once `buf` is full.
    head: usize,
    seq: u64,
    dropped: u64,
}

impl Ring {
    fn push(&mut self, rec: Rec, cap: usize) {
        if self.buf.len() < cap {
            if self.head != 0 {
                // The ring grew (a reload raised the cap): put it back in order first.
                self.buf = self.take();
            }
            self.buf.push(rec);
        } else if !self.buf.is_empty() {
            let i = self.head % self.buf.len();
            self.dropped += self.buf[i].events();
            self.buf[i] = rec;
            self.head = (i + 1) % self.buf.len();
        }
    }

    fn held(&self) -> u64 {
        self.buf.iter().map(Rec::events).sum()
    }

    /// Records oldest first.
    fn iter(&self) -> impl Iterator<Item = &Rec> {
        let h = if self.buf.is_empty() {
            0
        } else {
            self.head % self.buf.len()
        };
        self.buf[h..].iter().chain(self.buf[..h].iter())
    }

    fn take(&mut self) -> Vec<Rec> {
        let h = if self.buf.is_empty() {
            0
        } else {
            self.head % self.buf.len()
        };
        let mut v = std::mem::take(&mut self.buf);
        v.rotate_left(h);
        self.head = 0;
        v
    }

    /// Keeps the newest `n` records.
    fn keep_newest(&mut self, n: usize) {
        if self.buf.len() > n {
            let mut v = self.take();
            let excess = v.len() - n;
            self.dropped += v.drain(..excess).map(|r| r.events()).sum::<u64>();
            self.buf = v;
        }
    }
}

/// Ring buffers + sinks.
pub struct EventBus {
    /// Records of calls used off their thread, reloads, mode changes, and
    /// the records of thread rings that were retired.
    shared: Mutex<Ring>,
    /// The rings of threads that run calls.
    rings: Mutex<Vec<Arc<ThreadRing>>>,
    next_ring: AtomicU64,
    cap: AtomicU64,
    /// Events a drain left out because the rings together held more than `cap`.
    hidden: AtomicU64,
    names: RwLock<Vec<Arc<str>>>,
    sinks: RwLock<Vec<(u64, Sink)>>,
    next_sink: AtomicU64,
    sink_panics: AtomicU64,
    active: AtomicBool,
    has_sinks: AtomicBool,
}

impl std::fmt::Debug for EventBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventBus")
            .field("cap", &self.cap)
            .field("dropped", &self.dropped())
            .finish()
    }
}

/// Policy version names kept for events at most; later ones share the last index.
const MAX_NAMES: usize = 4096;

impl EventBus {
    /// A bus keeping at most `cap` events.
    pub fn new(cap: u32) -> Self {
        EventBus {
            shared: Mutex::new(Ring::default()),
            rings: Mutex::new(Vec::new()),
            next_ring: AtomicU64::new(1),
            cap: AtomicU64::new(cap as u64),
            hidden: AtomicU64::new(0),
            names: RwLock::new(Vec::new()),
            sinks: RwLock::new(Vec::new()),
            next_sink: AtomicU64::new(1),
            sink_panics: AtomicU64::new(0),
            active: AtomicBool::new(cap > 0),
            has_sinks: AtomicBool::new(false),
        }
    }

    /// True when anyone will see events (skip building them otherwise).
    #[inline]
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    fn refresh_active(&self) {
        let sinks = !self.sinks.read().is_empty();
        self.has_sinks.store(sinks, Ordering::Relaxed);
        self.active
            .store(self.cap.load(Ordering::Relaxed) > 0 || sinks, Ordering::Relaxed);
    }

    /// The index events use for the policy version `name`.
    pub(crate) fn version_index(&self, name: &str) -> u32 {
        if let Some(i) = self.names.read().iter().position(|n| &**n == name) {
            return i as u32;
        }
        let mut names = self.names.write();
        if let Some(i) = names.iter().position(|n| &**n == name) {
            return i as u32;
        }
        if names.len() >= MAX_NAMES {
            let last = names.len() - 1;
            names[last] = Arc::from(name);
            return last as u32;
        }
        names.push(Arc::from(name));
        (names.len() - 1) as u32
    }

    /// Changes the ring size (on reload); excess old events are dropped and
    /// counted. Threads' rings take the new size when their calls move to the
    /// new policy version.
    pub fn set_capacity(&self, cap: u32) {
        self.cap.store(cap as u64, Ordering::Relaxed);
        self.shared.lock().keep_newest(cap as usize);
        self.refresh_active();
    }

    /// A ring for the current thread, when the bus keeps events.
    pub(crate) fn new_ring(&self) -> Option<Arc<ThreadRing>> {
        let cap = self.cap.load(Ordering::Relaxed) as usize;
        if cap == 0 {
            return None;
        }
        let id = self.next_ring.fetch_add(1, Ordering::Relaxed) as u32;
        let ring = Arc::new(ThreadRing::new(id, cap));
        self.rings.lock().push(ring.clone());
        Some(ring)
    }

    /// A thread stops writing `ring`: its records move to the shared ring.
    pub(crate) fn retire_ring(&self, ring: &Arc<ThreadRing>) {
        let mut recs = Vec::new();
        ring.read(true, &mut recs);
        let dropped = ring.dropped();
        self.rings.lock().retain(|r| !Arc::ptr_eq(r, ring));
        let cap = self.cap.load(Ordering::Relaxed) as usize;
        let mut sh = self.shared.lock();
        sh.dropped += dropped;
        for r in recs {
            sh.push(r, cap);
        }
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

    /// Publishes a full event (reloads, mode changes) through the shared ring.
    pub fn emit(&self, ev: Event) {
        let mut rec = Rec::new(
            ev.kind,
            ev.at_ms.saturating_mul(1_000_000),
            self.version_index(&ev.policy_version),
        );
        rec.id = ev
            .logical_request_id
            .as_deref()
            .map(|i| CallId::Remote(SmolStr::new(i)));
        rec.upstream = ev.upstream.as_deref().map(SmolStr::new);
        rec.tenant = ev.tenant.as_deref().map(SmolStr::new);
        rec.task = ev.task.as_deref().map(SmolStr::new);
        rec.attempt = ev.attempt;
        rec.attempt_id = ev.attempt_id.as_ref().map(|a| a.attempt);
        rec.parent_attempt = ev.parent_attempt_id.as_ref().map(|a| a.attempt);
        rec.resend_count = ev.resend_count;
        rec.status = ev.status;
        rec.error_class = ev.error_class;
        rec.reason = ev.reason;
        rec.action = ev.action;
        rec.wait_source = ev.wait_source;
        rec.phase = ev.phase;
        rec.error_kind = ev.error_kind;
        rec.hedge = ev.hedge;
        rec.delay_ms = ev.delay_ms;
        rec.remaining_ms = ev.remaining_ms;
        if !ev.headers.is_empty() || ev.breaker.is_some() || ev.detail.is_some() || !ev.excluded.is_empty() {
            rec.extra = Some(Box::new(Extra {
                headers: ev.headers,
                breaker: ev.breaker,
                detail: ev.detail,
                excluded: ev.excluded,
            }));
        }
        self.write(None, &mut rec);
    }

    /// Publishes a record: into `ring` (the calling thread's own, lock-free)
    /// or else the shared ring, then to the sinks (outside any engine lock; a
    /// panicking sink is counted and does not disturb the decision). Returns
    /// the record's index in `ring` when a following decision may fold into
    /// it (nobody has seen it yet: no sink).
    #[inline]
    pub(crate) fn write(&self, ring: Option<&ThreadRing>, rec: &mut Rec) -> Option<u64> {
        let cap = self.cap.load(Ordering::Relaxed) as usize;
        let at = match ring.filter(|_| cap > 0) {
            Some(ring) => Some(ring.push(rec)),
            None => {
                self.write_shared(rec, cap);
                None
            }
        };
        if self.has_sinks.load(Ordering::Relaxed) {
            self.to_sinks(std::slice::from_ref(rec));
            return None;
        }
        at
    }

    /// Publishes an attempt's start or end like [`EventBus::write`]; encoded
    /// straight into the thread's ring when nothing else needs a record.
    #[inline(always)]
    pub(crate) fn write_hot(&self, ring: Option<&ThreadRing>, h: &Hot) -> Option<u64> {
        if let Some(ring) = ring {
            if self.ring_only() {
                return Some(ring.push_hot(h));
            }
        }
        self.write_hot_rec(ring, h)
    }

    /// [`EventBus::write_hot`] when a record is needed (sinks, or the shared ring).
    #[cold]
    #[inline(never)]
    fn write_hot_rec(&self, ring: Option<&ThreadRing>, h: &Hot) -> Option<u64> {
        self.write(ring, &mut h.to_rec())
    }

    /// True when events are kept and no sink needs a record: a thread's
    /// ring then takes attempt events encoded (and changed) in place.
    #[inline(always)]
    pub(crate) fn ring_only(&self) -> bool {
        self.cap.load(Ordering::Relaxed) > 0 && !self.has_sinks.load(Ordering::Relaxed)
    }

    /// Writes attempt `end` into its start, record `index` of the thread's
    /// ring, when nothing else needs a record (see [`ThreadRing::end_in_place`]).
    #[inline]
    pub(crate) fn end_in_place(&self, ring: Option<&ThreadRing>, index: u64, end: &Hot, then: Option<Then>) -> bool {
        match ring {
            Some(ring) if self.ring_only() => ring.end_in_place(index, end, then),
            _ => false,
        }
    }

    #[cold]
    fn write_shared(&self, rec: &mut Rec, cap: usize) {
        let mut r = self.shared.lock();
        rec.seq = r.seq + 1;
        r.seq += rec.events();
        if cap > 0 {
            r.push(rec.clone(), cap);
        }
    }

    #[cold]
    fn to_sinks(&self, batch: &[Rec]) {
        let list: Vec<Sink> = self.sinks.read().iter().map(|(_, f)| f.clone()).collect();
        let names = self.names.read().clone();
        let mut events = Vec::with_capacity(batch.len() + 1);
        for rec in batch.iter() {
            rec.push_events(&names, &mut events);
        }
        for ev in &events {
            for f in &list {
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(ev))).is_err() {
                    self.sink_panics.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Every ring's events merged oldest first (time, then ring, then
    /// recording order), newest `cap` kept.
    fn merged(&self, take: bool) -> Vec<Event> {
        let cap = self.cap.load(Ordering::Relaxed) as usize;
        let names = self.names.read().clone();
        let mut all: Vec<(u64, u32, u64, Event)> = Vec::new();
        let mut out = Vec::new();
        let mut add = |src: u32, recs: &[Rec]| {
            for rec in recs {
                out.clear();
                rec.push_events(&names, &mut out);
                all.extend(out.drain(..).map(|e| (rec.at_ns, src, e.seq, e)));
            }
        };
        {
            let mut r = self.shared.lock();
            let recs: Vec<Rec> = if take { r.take() } else { r.iter().cloned().collect() };
            drop(r);
            add(0, &recs);
        }
        let rings: Vec<Arc<ThreadRing>> = self.rings.lock().clone();
        for ring in &rings {
            let mut recs = Vec::new();
            ring.read(take, &mut recs);
            add(ring.id, &recs);
        }
        all.sort_by_key(|(at, src, seq, _)| (*at, *src, *seq));
        let excess = all.len().saturating_sub(cap);
        if take && excess > 0 {
            self.hidden.fetch_add(excess as u64, Ordering::Relaxed);
        }
        all.drain(..excess);
        all.into_iter().map(|(_, _, _, e)| e).collect()
    }

    /// A copy of the ring, oldest first.
    pub fn snapshot(&self) -> Vec<Event> {
        self.merged(false)
    }

    /// Takes every event out of the ring, oldest first.
    pub fn drain(&self) -> Vec<Event> {
        self.merged(true)
    }

    /// Events dropped from the ring so far.
    pub fn dropped(&self) -> u64 {
        let (mut dropped, mut held) = {
            let r = self.shared.lock();
            (r.dropped, r.held())
        };
        for ring in self.rings.lock().iter() {
            let (d, h) = ring.counts();
            dropped += d;
            held += h;
        }
        let cap = self.cap.load(Ordering::Relaxed);
        // Held beyond the cap: a snapshot would not show them, so they count as dropped.
        dropped + self.hidden.load(Ordering::Relaxed) + held.saturating_sub(cap)
    }

    /// Sink calls that panicked.
    pub fn sink_panics(&self) -> u64 {
        self.sink_panics.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(at_ms: u64) -> Event {
        Event::new(EventKind::Decision, at_ms, Arc::from("v"))
    }

    #[test]
    fn ring_is_bounded_and_counts_drops() {
        let bus = EventBus::new(3);
        for i in 0..10 {
            bus.emit(ev(i));
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
    fn thread_rings_and_the_shared_ring_merge_in_time_order_within_the_cap() {
        let bus = EventBus::new(4);
        let r1 = bus.new_ring().unwrap();
        let r2 = bus.new_ring().unwrap();
        let rec = |at: u64| Rec::new(EventKind::AttemptStart, at * 1_000_000, 0);
        for (ring, at) in [
            (Some(&r1), 1),
            (Some(&r2), 2),
            (None, 3),
            (Some(&r1), 4),
            (Some(&r2), 5),
            (Some(&r1), 6),
        ] {
            bus.write(ring.map(|r| &**r), &mut rec(at));
        }
        let at: Vec<u64> = bus.snapshot().iter().map(|e| e.at_ms).collect();
        assert_eq!(at, vec![3, 4, 5, 6]);
        assert_eq!(bus.dropped(), 2);
        // A retired ring's records stay visible, now in the shared ring.
        bus.retire_ring(&r2);
        assert_eq!(
            bus.snapshot().iter().map(|e| e.at_ms).collect::<Vec<_>>(),
            vec![3, 4, 5, 6]
        );
        assert_eq!(bus.drain().len(), 4);
        assert!(bus.snapshot().is_empty());
        assert_eq!(bus.dropped(), 2);
        let v = bus.version_index("v");
        assert_eq!(bus.version_index("w"), v + 1);
        assert_eq!(bus.version_index("v"), v);
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
        bus.emit(ev(0));
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
