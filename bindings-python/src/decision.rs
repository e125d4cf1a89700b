//! `retrywise._retrywise.Decision` and `HedgePlan`: what the caller must do
//! after a report, and whether a hedge may start, with the interned
//! vocabulary strings their getters return.

use crate::attempt::{ms_of, PyAttempt};
use crate::engine::PyEngine;
use crate::errors::on_failure_str;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString};
use retrywise::{Action, Attempt, Decision, ErrorClass, Reason, WaitSource};
use std::time::Duration;

/// Interned Python strings for a vocabulary enum, indexed by its code and made
/// once: a getter returns the same `str` object every time (no allocation per
/// read), and it is the very object Python interns for the same literal, so
/// `d.reason == "max_attempts"` compares by identity first.
struct Vocab(PyOnceLock<Vec<Option<Py<PyString>>>>);

impl Vocab {
    const fn new() -> Self {
        Vocab(PyOnceLock::new())
    }

    fn get<'py, T: Copy>(
        &self,
        py: Python<'py>,
        all: &'static [T],
        code: fn(T) -> u8,
        name: fn(T) -> &'static str,
        v: T,
    ) -> Bound<'py, PyString> {
        let table = self.0.get_or_init(py, || {
            let n = all.iter().map(|&x| usize::from(code(x)) + 1).max().unwrap_or(0);
            (0..n)
                .map(|i| {
                    all.iter()
                        .find(|&&x| usize::from(code(x)) == i)
                        .map(|&x| PyString::intern(py, name(x)).unbind())
                })
                .collect()
        });
        match table.get(usize::from(code(v))) {
            Some(Some(s)) => s.bind(py).clone(),
            _ => PyString::intern(py, name(v)),
        }
    }
}

static ACTIONS: Vocab = Vocab::new();
static REASONS: Vocab = Vocab::new();
static CLASSES: Vocab = Vocab::new();
static WAIT_SOURCES: Vocab = Vocab::new();

fn reason_str(py: Python<'_>, r: Reason) -> Bound<'_, PyString> {
    REASONS.get(py, Reason::ALL, Reason::code, Reason::as_str, r)
}

fn class_str(py: Python<'_>, c: ErrorClass) -> Bound<'_, PyString> {
    CLASSES.get(py, ErrorClass::ALL, ErrorClass::code, ErrorClass::as_str, c)
}

/// What the caller must do after reporting an attempt.
#[pyclass(module = "retrywise._retrywise", name = "Decision", frozen)]
pub struct PyDecision {
    /// "succeeded" | "retry" | "fallback" | "stop" | "reconcile".
    // A struct member: read straight from the object, without a call (every
    // caller reads it once per decision).
    #[pyo3(get)]
    action: Py<PyString>,
    d: Decision,
}

impl PyDecision {
    pub(crate) fn new(py: Python<'_>, d: Decision) -> Self {
        PyDecision {
            action: ACTIONS
                .get(py, Action::ALL, Action::code, Action::as_str, d.action)
                .unbind(),
            d,
        }
    }
}

#[pymethods]
impl PyDecision {
    /// Seconds to wait before the next attempt (retry / fallback).
    #[getter]
    fn delay_s(&self) -> f64 {
        self.d.delay.as_secs_f64()
    }
    /// The delay in whole milliseconds.
    #[getter]
    fn delay_ms(&self) -> u64 {
        self.d.delay_ms()
    }
    /// Error class of the reported outcome; None on success.
    #[getter]
    fn error_class<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyString>> {
        self.d.class.map(|c| class_str(py, c))
    }
    /// Stable reason code.
    #[getter]
    fn reason<'py>(&self, py: Python<'py>) -> Bound<'py, PyString> {
        reason_str(py, self.d.reason)
    }
    /// Upstream of the next attempt (retry / fallback) or of the reported one.
    #[getter]
    fn upstream(&self) -> Option<&str> {
        self.d.upstream.as_deref()
    }
    /// "none" | "retry_after" | "jitter".
    #[getter]
    fn wait_source<'py>(&self, py: Python<'py>) -> Bound<'py, PyString> {
        WAIT_SOURCES.get(
            py,
            WaitSource::ALL,
            WaitSource::code,
            WaitSource::as_str,
            self.d.wait_source,
        )
    }
    /// The server's wait hint, seconds, when it sent one.
    #[getter]
    fn retry_after_s(&self) -> Option<f64> {
        self.d.retry_after.map(|d| d.as_secs_f64())
    }
    /// The server's wait hint in whole milliseconds (truncated), when it sent one.
    #[getter]
    fn retry_after_ms(&self) -> Option<u64> {
        self.d.retry_after.map(ms_of)
    }
    /// "fail" | "manual_review" on stops.
    #[getter]
    fn on_failure(&self) -> Option<&'static str> {
        on_failure_str(self.d.on_failure)
    }
    /// Extra detail (refusing scope, ignored Retry-After, ...).
    #[getter]
    fn detail(&self) -> Option<&str> {
        self.d.detail.as_deref()
    }
    /// The reported attempt's number.
    #[getter]
    fn attempt(&self) -> u32 {
        self.d.attempt
    }
    /// The reported attempt was a hedge.
    #[getter]
    fn hedge(&self) -> bool {
        self.d.hedge
    }
    /// Candidates excluded for a fallback: `[(upstream, why), ...]`.
    #[getter]
    fn excluded(&self) -> Vec<(String, String)> {
        self.d.excluded.clone()
    }
    /// The next attempt continues a streamed answer that already showed text,
    /// and how: "prefill" | "instruction"; None: it sends the request as it is.
    #[getter]
    fn continuation(&self) -> Option<&'static str> {
        self.d.continuation.map(|c| c.as_str())
    }
    /// True when the call is over (succeeded, stop, reconcile).
    #[getter]
    fn is_final(&self) -> bool {
        self.d.is_final()
    }
    /// Every field as a dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("action", self.d.action.as_str())?;
        d.set_item("delay_s", self.delay_s())?;
        d.set_item("delay_ms", self.delay_ms())?;
        d.set_item("error_class", self.error_class(py))?;
        d.set_item("reason", self.reason(py))?;
        d.set_item("upstream", self.upstream())?;
        d.set_item("wait_source", self.wait_source(py))?;
        d.set_item("retry_after_s", self.retry_after_s())?;
        d.set_item("retry_after_ms", self.retry_after_ms())?;
        d.set_item("on_failure", self.on_failure())?;
        d.set_item("detail", self.detail())?;
        d.set_item("attempt", self.d.attempt)?;
        d.set_item("hedge", self.d.hedge)?;
        d.set_item("excluded", self.excluded())?;
        d.set_item("continuation", self.continuation())?;
        Ok(d)
    }
    fn __repr__(&self) -> String {
        format!(
            "<retrywise.Decision action={} reason={} delay_s={:.3} error_class={}>",
            self.d.action,
            self.d.reason,
            self.delay_s(),
            self.d.class.map(ErrorClass::as_str).unwrap_or("None")
        )
    }
}

/// Whether a hedged attempt may start (`call.next_hedge()`).
#[pyclass(module = "retrywise._retrywise", name = "HedgePlan", frozen)]
pub struct PyHedgePlan {
    pub(crate) action: &'static str,
    pub(crate) attempt: Option<(Attempt, Py<PyEngine>)>,
    pub(crate) after: Option<Duration>,
    pub(crate) reason: Option<&'static str>,
}

#[pymethods]
impl PyHedgePlan {
    /// "start" (make `attempt` now) | "after" (ask again in `after_s`) | "no" (see `reason`).
    #[getter]
    fn action(&self) -> &'static str {
        self.action
    }
    /// The hedged attempt to start, when `action == "start"`.
    #[getter]
    fn attempt(&self, py: Python<'_>) -> Option<PyAttempt> {
        self.attempt.as_ref().map(|(attempt, engine)| PyAttempt {
            attempt: attempt.clone(),
            engine: Some(engine.clone_ref(py)),
        })
    }
    /// Seconds until a hedge may start, when `action == "after"`.
    #[getter]
    fn after_s(&self) -> Option<f64> {
        self.after.map(|d| d.as_secs_f64())
    }
    /// Whole milliseconds (truncated) until a hedge may start, when `action == "after"`.
    #[getter]
    fn after_ms(&self) -> Option<u64> {
        self.after.map(ms_of)
    }
    /// Why no hedge, when `action == "no"`.
    #[getter]
    fn reason(&self) -> Option<&'static str> {
        self.reason
    }
    fn __repr__(&self) -> String {
        format!("<retrywise.HedgePlan action={}>", self.action)
    }
}
