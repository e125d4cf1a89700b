//! Request recording and per-logical-request fault counters.
//!
//! End-to-end tests assert on what reached the upstream (how many physical attempts
//! one logical request cost, which propagation headers each attempt carried), so
//! every fault-path request is recorded here. The record list is bounded so a long
//! soak cannot grow the server without limit; cumulative counts stay exact even when
//! old records have been dropped.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use serde::Serialize;

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
    /// Status the server answered with; `null` for `hang` and `drop`.
    pub status: Option<u16>,
}

/// Cumulative counts, exact even after records were dropped.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counts {
    pub total: u64,
    pub by_logical_id: BTreeMap<String, u64>,
    pub by_spec: BTreeMap<String, u64>,
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
}

#[derive(Default)]
struct Inner {
    seq: u64,
    records: VecDeque<Record>,
    counts: Counts,
    /// Requests seen so far per (spec, logical id or none).
    seen: HashMap<(String, Option<String>), u32>,
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

    /// Records one request with the status it is answered with and returns its seq.
    pub fn record(&self, arrival: Arrival, status: Option<u16>) -> u64 {
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
            status,
        });
        seq
    }

    /// Records, oldest first, optionally filtered by exact spec and/or logical id.
    pub fn records(&self, spec: Option<&str>, logical_id: Option<&str>) -> Vec<Record> {
        self.lock()
            .records
            .iter()
            .filter(|r| spec.is_none_or(|s| r.spec == s))
            .filter(|r| logical_id.is_none_or(|id| r.logical_id.as_deref() == Some(id)))
            .cloned()
            .collect()
    }

    pub fn counts(&self) -> Counts {
        self.lock().counts.clone()
    }

    /// Forgets records, counts and fault counters so one server can serve many
    /// independent tests. `at_ms` keeps counting from server start.
    pub fn reset(&self) {
        *self.lock() = Inner::default();
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
