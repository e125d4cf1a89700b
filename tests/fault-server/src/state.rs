//! Request recording and per-logical-request fault counters.
//!
//! End-to-end tests assert on what reached the upstream (how many physical attempts
//! one logical request cost per model, which propagation headers each attempt
//! carried, when each exchange ended and how), so every API request is recorded
//! here, and a running response reports its deltas and ending through a [`Tracker`]. The record list is bounded so a long
//! soak cannot grow the server without limit; cumulative counts stay exact even when
//! old records have been dropped.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::answer::Continuation;
use crate::ratelimit::{Limiter, Mode, Slot};

/// How many records are kept; older ones are dropped and counted in `dropped`.
pub const MAX_RECORDS: usize = 100_000;

/// How many distinct (spec, logical id) counters `flaky` / `then-ok` keep. When full
/// the map is cleared: losing a counter only restarts a fault sequence, which is
/// preferable to unbounded growth in a soak run.
pub const MAX_COUNTERS: usize = 100_000;

/// One request as the fault server saw it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    /// 1-based arrival order since start or the last reset.
    pub seq: u64,
    /// Monotonic milliseconds since the server started (not reset by `reset`), so
    /// tests can measure the waits a client took between attempts.
    pub at_ms: f64,
    pub method: String,
    /// Full request path (without query), including any `/s/<spec>` prefix.
    pub path: String,
    /// The path after the `/s/<spec>` prefix: what the SDK thinks it called.
    pub api_path: String,
    /// The fault spec in force (`ok` for paths without `/s/`).
    pub spec: String,
    /// `retrywise-request-id` header: the logical request this attempt belongs to.
    pub logical_id: Option<String>,
    /// `retrywise-attempt` header, when it parses as an integer.
    pub attempt: Option<i64>,
    /// `retrywise-deadline-ms` header, when it parses as an integer.
    pub deadline_ms: Option<i64>,
    /// `idempotency-key` header.
    pub idempotency_key: Option<String>,
    /// `x-stainless-retry-count` header, verbatim: shows whether an SDK's own retry
    /// loop is still running underneath retrywise.
    pub x_stainless_retry_count: Option<String>,
    /// Every `retrywise-*` request header, verbatim, for headers added later.
    pub retrywise_headers: BTreeMap<String, String>,
    /// Whether the request body asked for `"stream": true`.
    pub stream: bool,
    /// The request body's `model`.
    pub model: Option<String>,
    /// The fault model's table name (`fb-stream-cut`) when the model chose the
    /// fault; `null` when the path did (see `spec`).
    pub fault: Option<String>,
    /// A continuation the request asked for (prefill or quoted prefix).
    pub continuation: Option<Continuation>,
    /// Status the server answered with; `null` when it sent no response.
    pub status: Option<u16>,
    /// How the exchange ended; `pending` while the response is still going.
    pub end: Ending,
    /// When it ended (same clock as `at_ms`).
    pub ended_at_ms: Option<f64>,
    /// Visible content deltas handed to the connection.
    pub deltas: u32,
    /// The answer text sent: the deltas so far, or a JSON body's whole answer.
    pub text: String,
}

/// How one exchange ended, as the server saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// Still answering (a pause, a hang or a stall in progress).
    Pending,
    /// The whole response was handed to the connection, terminators included.
    Complete,
    /// The server aborted the connection mid-body (a cut, or a stall's cap).
    Cut,
    /// The server reset the connection (TCP RST) before any response byte.
    Reset,
    /// The server closed the connection without a response (`drop`, `hang`'s cap).
    Closed,
    /// The server closed while the request body was still arriving (`write-cut`).
    WriteCut,
    /// The client went away before the server finished (gave up on a hang, a
    /// pause or a stall): `ended_at_ms` is when the client's timeout fired.
    ClientClosed,
}

/// Cumulative counts, exact even after records were dropped.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counts {
    pub total: u64,
    pub by_logical_id: BTreeMap<String, u64>,
    pub by_spec: BTreeMap<String, u64>,
    pub by_model: BTreeMap<String, u64>,
    /// Records evicted from the bounded record list.
    pub dropped: u64,
}

/// A request's identity before it is recorded; the state fills in `seq`, `at_ms`
/// and the outcome.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub method: String,
    pub path: String,
    pub api_path: String,
    pub spec: String,
    pub logical_id: Option<String>,
    pub attempt: Option<i64>,
    pub deadline_ms: Option<i64>,
    pub idempotency_key: Option<String>,
    pub x_stainless_retry_count: Option<String>,
    pub retrywise_headers: BTreeMap<String, String>,
    pub stream: bool,
    pub model: Option<String>,
    pub fault: Option<String>,
    pub continuation: Option<Continuation>,
}

#[derive(Default)]
struct Inner {
    /// Bumped by every reset, so a response still running from before a reset
    /// cannot write into a new record that reuses its seq.
    epoch: u64,
    seq: u64,
    records: VecDeque<Record>,
    counts: Counts,
    /// Requests seen so far per (spec, logical id or none).
    seen: HashMap<(String, Option<String>), u32>,
    /// First request per flapping model: its down window starts there.
    first_seen: HashMap<String, Instant>,
    /// Requests so far per model name asking for `after=` (any logical request).
    arrivals: HashMap<String, u32>,
    /// `fb-ratelimit`'s limit per exact model name.
    limiters: HashMap<String, Limiter>,
}

/// Which record a running response reports to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef {
    epoch: u64,
    seq: u64,
}

impl RecordRef {
    pub fn seq(self) -> u64 {
        self.seq
    }
}

/// Shared server state: records, counters and connection gauges.
pub struct State {
    started: Instant,
    inner: Mutex<Inner>,
    open_connections: AtomicU64,
    in_flight: AtomicU64,
}

impl Default for State {
    fn default() -> Self {
        Self::new()
    }
}

impl State {
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            inner: Mutex::new(Inner::default()),
            open_connections: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere must not take the recorder down with it: the data is
        // plain counters and records, valid at every step.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Milliseconds since the server started.
    pub fn now_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1000.0
    }

    /// How many requests with this (spec, logical id) key were counted so far,
    /// without counting one (to see whether the next is a write cut).
    pub fn prior(&self, spec: &str, logical_id: Option<&str>) -> u32 {
        let inner = self.lock();
        inner.seen.get(&counter_key(spec, logical_id)).copied().unwrap_or(0)
    }

    /// Counts this arrival against its (spec, logical id) key and returns how many
    /// requests with that key came *before* it. `flaky` and `then-ok` decide from
    /// this number, under the same lock, so concurrent attempts cannot both be
    /// "the first".
    pub fn admit(&self, spec: &str, logical_id: Option<&str>) -> u32 {
        let mut inner = self.lock();
        if inner.seen.len() >= MAX_COUNTERS {
            inner.seen.clear();
        }
        let n = inner.seen.entry(counter_key(spec, logical_id)).or_insert(0);
        let before = *n;
        *n = n.saturating_add(1);
        before
    }

    /// Records one request with the status it is answered with.
    pub fn record(&self, arrival: Arrival, status: Option<u16>) -> RecordRef {
        let at_ms = self.now_ms();
        let mut inner = self.lock();
        inner.seq += 1;
        let seq = inner.seq;
        let counts = &mut inner.counts;
        counts.total += 1;
        *counts.by_spec.entry(arrival.spec.clone()).or_insert(0) += 1;
        if let Some(id) = &arrival.logical_id {
            *counts.by_logical_id.entry(id.clone()).or_insert(0) += 1;
        }
        if let Some(model) = &arrival.model {
            *counts.by_model.entry(model.clone()).or_insert(0) += 1;
        }
        if inner.records.len() >= MAX_RECORDS {
            inner.records.pop_front();
            inner.counts.dropped += 1;
        }
        inner.records.push_back(Record {
            seq,
            at_ms,
            method: arrival.method,
            path: arrival.path,
            api_path: arrival.api_path,
            spec: arrival.spec,
            logical_id: arrival.logical_id,
            attempt: arrival.attempt,
            deadline_ms: arrival.deadline_ms,
            idempotency_key: arrival.idempotency_key,
            x_stainless_retry_count: arrival.x_stainless_retry_count,
            retrywise_headers: arrival.retrywise_headers,
            stream: arrival.stream,
            model: arrival.model,
            fault: arrival.fault,
            continuation: arrival.continuation,
            status,
            end: Ending::Pending,
            ended_at_ms: None,
            deltas: 0,
            text: String::new(),
        });
        RecordRef {
            epoch: inner.epoch,
            seq,
        }
    }

    /// Updates a record if it is still kept (and not from before a reset).
    fn update(&self, at: RecordRef, f: impl FnOnce(&mut Record)) {
        let mut inner = self.lock();
        if inner.epoch != at.epoch {
            return;
        }
        let Some(first) = inner.records.front().map(|r| r.seq) else {
            return;
        };
        let index = at.seq.checked_sub(first).and_then(|i| usize::try_from(i).ok());
        if let Some(record) = index.and_then(|i| inner.records.get_mut(i)) {
            f(record);
        }
    }

    /// Time since the first request of `model` (since start or the last reset);
    /// the first call starts the clock and returns zero.
    pub fn since_first(&self, model: &str) -> Duration {
        let mut inner = self.lock();
        if inner.first_seen.len() >= MAX_COUNTERS {
            inner.first_seen.clear();
        }
        inner
            .first_seen
            .entry(model.to_owned())
            .or_insert_with(Instant::now)
            .elapsed()
    }

    /// Counts this arrival against its model name, whatever its logical request,
    /// and returns how many requests to that name came before it (`after=`).
    pub fn admit_model(&self, model: &str) -> u32 {
        let mut inner = self.lock();
        if inner.arrivals.len() >= MAX_COUNTERS {
            inner.arrivals.clear();
        }
        let n = inner.arrivals.entry(model.to_owned()).or_insert(0);
        let before = *n;
        *n = n.saturating_add(1);
        before
    }

    /// Counts a request of `model` against its rate limit (`limit` per `window`,
    /// fixed, sliding or a bucket) if there is room, under the lock so concurrent requests
    /// never both take the last slot.
    pub fn rate_slot(&self, model: &str, limit: u32, window: Duration, mode: Mode) -> Slot {
        let now = Instant::now();
        let mut inner = self.lock();
        if inner.limiters.len() >= MAX_COUNTERS {
            inner.limiters.clear();
        }
        inner
            .limiters
            .entry(model.to_owned())
            .or_insert_with(|| Limiter::new(now))
            .take(now, limit, window, mode)
    }

    /// Records, oldest first, optionally filtered by exact spec and/or logical id.
    pub fn records(&self, spec: Option<&str>, logical_id: Option<&str>) -> Vec<Record> {
        self.find(&Filter {
            spec,
            logical_id,
            ..Filter::default()
        })
    }

    /// Records, oldest first, matching every field the filter sets.
    pub fn find(&self, filter: &Filter<'_>) -> Vec<Record> {
        self.lock()
            .records
            .iter()
            .filter(|r| filter.matches(r))
            .cloned()
            .collect()
    }

    pub fn counts(&self) -> Counts {
        self.lock().counts.clone()
    }

    /// Forgets records, counts and fault counters so one server can serve many
    /// independent tests. `at_ms` keeps counting from server start.
    pub fn reset(&self) {
        let mut inner = self.lock();
        let epoch = inner.epoch + 1;
        *inner = Inner {
            epoch,
            ..Inner::default()
        };
    }

    pub fn open_connections(&self) -> u64 {
        self.open_connections.load(Ordering::Relaxed)
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Counts an open connection until the guard is dropped.
    pub fn connection_guard(&self) -> Gauge<'_> {
        Gauge::new(&self.open_connections)
    }

    /// Counts a fault request being handled until the guard is dropped; lets tests
    /// check that `hang` does not keep work alive after the client gave up.
    pub fn in_flight_guard(&self) -> Gauge<'_> {
        Gauge::new(&self.in_flight)
    }
}

/// Exact-match filter over records; unset fields match anything.
#[derive(Debug, Clone, Copy, Default)]
pub struct Filter<'a> {
    pub spec: Option<&'a str>,
    pub logical_id: Option<&'a str>,
    pub model: Option<&'a str>,
    pub fault: Option<&'a str>,
}

impl Filter<'_> {
    fn matches(&self, r: &Record) -> bool {
        let opt = |want: Option<&str>, have: &Option<String>| want.is_none_or(|w| have.as_deref() == Some(w));
        self.spec.is_none_or(|s| r.spec == s)
            && opt(self.logical_id, &r.logical_id)
            && opt(self.model, &r.model)
            && opt(self.fault, &r.fault)
    }
}

/// Reports a running response's deltas and ending to its record. Dropped before
/// an ending was reported means the connection went away first: the client closed.
pub struct Tracker {
    state: Arc<State>,
    at: RecordRef,
    done: AtomicBool,
}

impl Tracker {
    pub fn new(state: Arc<State>, at: RecordRef) -> Self {
        Self {
            state,
            at,
            done: AtomicBool::new(false),
        }
    }

    /// A visible delta was handed to the connection.
    pub fn delta(&self, text: &str) {
        self.state.update(self.at, |r| {
            r.deltas += 1;
            r.text.push_str(text);
        });
    }

    /// The whole answer text of a one-piece body.
    pub fn text(&self, text: &str) {
        self.state.update(self.at, |r| text.clone_into(&mut r.text));
    }

    /// Records how the exchange ended; only the first ending counts.
    pub fn finish(&self, end: Ending) {
        if self.done.swap(true, Ordering::Relaxed) {
            return;
        }
        let at_ms = self.state.now_ms();
        self.state.update(self.at, |r| {
            r.end = end;
            r.ended_at_ms = Some(at_ms);
        });
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.finish(Ending::ClientClosed);
    }
}

/// Increments a gauge on creation and decrements it on drop, so every exit path
/// (including cancellation when a connection closes) is accounted for.
pub struct Gauge<'a>(&'a AtomicU64);

impl<'a> Gauge<'a> {
    fn new(counter: &'a AtomicU64) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(counter)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The key `prior` and `admit` count a request under: its spec and logical id.
fn counter_key(spec: &str, logical_id: Option<&str>) -> (String, Option<String>) {
    (spec.to_owned(), logical_id.map(str::to_owned))
}
