//! `retrywise._retrywise.Attempt` and `Timeouts`: one physical attempt to
//! make now, with its timeouts, propagation headers and upstream reach.
//! Read-only values handed out by `Call`, so separate from it.

use crate::convert::req_str;
use crate::engine::PyEngine;
use crate::errors::{guarded, held};
use crate::wire;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString};
use retrywise::Attempt;
use std::time::Duration;

/// Per-attempt timeouts, each clamped to what is left of the deadline.
#[pyclass(module = "retrywise._retrywise", name = "Timeouts", frozen)]
pub struct PyTimeouts {
    t: retrywise::AttemptTimeouts,
}

pub(crate) fn ms_of(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[pymethods]
impl PyTimeouts {
    /// Connect timeout, seconds.
    #[getter]
    fn connect(&self) -> f64 {
        self.t.connect.as_secs_f64()
    }
    /// Request sent → first byte, seconds.
    #[getter]
    fn first_byte(&self) -> f64 {
        self.t.first_byte.as_secs_f64()
    }
    /// Request sent → first visible output of a stream (pings do not count), seconds.
    #[getter]
    fn first_token(&self) -> f64 {
        self.t.first_token.as_secs_f64()
    }
    #[getter]
    fn first_token_ms(&self) -> u64 {
        ms_of(self.t.first_token)
    }
    /// Longest gap between stream chunks, seconds.
    #[getter]
    fn idle(&self) -> f64 {
        self.t.idle.as_secs_f64()
    }
    /// The whole attempt, seconds.
    #[getter]
    fn total(&self) -> f64 {
        self.t.total.as_secs_f64()
    }
    #[getter]
    fn connect_ms(&self) -> u64 {
        ms_of(self.t.connect)
    }
    #[getter]
    fn first_byte_ms(&self) -> u64 {
        ms_of(self.t.first_byte)
    }
    #[getter]
    fn idle_ms(&self) -> u64 {
        ms_of(self.t.idle)
    }
    #[getter]
    fn total_ms(&self) -> u64 {
        ms_of(self.t.total)
    }
    /// `{"connect": s, "first_byte": s, "first_token": s, "idle": s, "total": s}`.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("connect", self.connect())?;
        d.set_item("first_byte", self.first_byte())?;
        d.set_item("first_token", self.first_token())?;
        d.set_item("idle", self.idle())?;
        d.set_item("total", self.total())?;
        Ok(d)
    }
    fn __repr__(&self) -> String {
        format!(
            "<retrywise.Timeouts connect={:.3} first_byte={:.3} idle={:.3} total={:.3}>",
            self.connect(),
            self.first_byte(),
            self.idle(),
            self.total()
        )
    }
}

/// The propagation header names, interned once (a fresh dict per read, but
/// not fresh name strings).
static HEADER_NAMES: PyOnceLock<[Py<PyString>; 4]> = PyOnceLock::new();

fn header_name<'py>(py: Python<'py>, k: &'static str) -> Bound<'py, PyString> {
    use retrywise::rules::deadline::{H_ATTEMPT, H_DEADLINE, H_IDEMPOTENCY_KEY, H_REQUEST_ID};
    const NAMES: [&str; 4] = [H_DEADLINE, H_REQUEST_ID, H_ATTEMPT, H_IDEMPOTENCY_KEY];
    let names = HEADER_NAMES.get_or_init(py, || NAMES.map(|n| PyString::intern(py, n).unbind()));
    match NAMES.iter().position(|&n| n == k) {
        Some(i) => names[i].bind(py).clone(),
        None => PyString::new(py, k),
    }
}

/// One physical attempt to make now.
#[pyclass(module = "retrywise._retrywise", name = "Attempt", frozen)]
pub struct PyAttempt {
    pub(crate) attempt: Attempt,
    /// The engine whose call made it (for `reach`).
    pub(crate) engine: Option<Py<PyEngine>>,
}

#[pymethods]
impl PyAttempt {
    /// 1-based attempt number (hedges and fallbacks included).
    #[getter]
    fn number(&self) -> u32 {
        self.attempt.number
    }
    /// Upstream to call.
    #[getter]
    fn upstream(&self) -> &str {
        &self.attempt.upstream
    }
    /// Timeouts for this attempt.
    #[getter]
    fn timeouts(&self) -> PyTimeouts {
        PyTimeouts {
            t: self.attempt.timeouts(),
        }
    }
    /// Propagation headers to send with this attempt.
    #[getter]
    fn headers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let mut failed = Ok(());
        held(py, || {
            self.attempt.for_each_header(|k, v| {
                if failed.is_ok() {
                    failed = d.set_item(header_name(py, k), v);
                }
            })
        })?;
        failed.map(|()| d)
    }
    /// True for a hedged (parallel) attempt.
    #[getter]
    fn hedge(&self) -> bool {
        self.attempt.hedge
    }
    /// True when this attempt goes to another upstream than the first one.
    #[getter]
    fn fallback(&self) -> bool {
        self.attempt.fallback
    }
    /// Logical request id.
    #[getter]
    fn request_id<'py>(&self, py: Python<'py>) -> Bound<'py, PyString> {
        self.attempt.request_id.with_str(|id| PyString::new(py, id))
    }
    /// Business idempotency key, unchanged across attempts.
    #[getter]
    fn idempotency_key(&self) -> Option<&str> {
        self.attempt.idempotency_key.as_deref()
    }
    /// Seconds left before the deadline when the attempt started.
    #[getter]
    fn remaining_s(&self) -> f64 {
        self.attempt.remaining().as_secs_f64()
    }
    /// Milliseconds left before the deadline when the attempt started.
    #[getter]
    fn remaining_ms(&self) -> u64 {
        ms_of(self.attempt.remaining())
    }
    /// How to reach this attempt's upstream (base URL, model, api, key from
    /// its env var): a function driven by `engine.run` calls what the core chose.
    #[getter]
    fn reach(&self, py: Python<'_>) -> PyResult<Option<wire::PyReach>> {
        let Some(engine) = &self.engine else { return Ok(None) };
        let engine = &engine.get().engine;
        let upstream = &self.attempt.upstream;
        let reach = guarded(py, move || engine.reach(upstream))?;
        Ok(Some(wire::PyReach { reach }))
    }
    /// The ErrorKind to report when one of this attempt's timers expired:
    /// `timer` "connect" | "first_byte" | "first_token" | "idle" | "total";
    /// `body_started`: the response's headers had arrived.
    fn timer_error(&self, timer: &Bound<'_, PyAny>, body_started: bool) -> PyResult<&'static str> {
        use retrywise::Timer;
        let t = match req_str("timer", timer)?.as_str() {
            "connect" => Timer::Connect,
            "first_byte" => Timer::FirstByte,
            "first_token" => Timer::FirstToken,
            "idle" => Timer::Idle,
            "total" => Timer::Total,
            other => {
                return Err(PyValueError::new_err(format!(
                "argument 'timer': timer must be one of connect, first_byte, first_token, idle, total; got {other:?}"
            )))
            }
        };
        Ok(self.attempt.timer_error(t, body_started).as_str())
    }
    fn __repr__(&self) -> String {
        format!(
            "<retrywise.Attempt number={} upstream={:?} remaining_s={:.3}>",
            self.attempt.number,
            &*self.attempt.upstream,
            self.attempt.remaining().as_secs_f64()
        )
    }
}
