//! `retrywise._retrywise`: the native half of the Python package. It only
//! translates types between Python and the `retrywise` core; every decision
//! is the core's. Every entry point that enters the core runs inside a panic
//! boundary (a core panic surfaces as `retrywise.InternalError`, and the
//! engine stays usable).
//!
//! # The GIL
//!
//! The per-call hot path (`begin`, `next_attempt`, `report`,
//! `cancel`, `next_hedge` and the `Call` getters) runs with the GIL *held*:
//! in the common case the core decides there with atomics and thread-local
//! state, no waits, in a few hundred nanoseconds, while releasing and
//! re-taking the GIL costs about as much again on one thread and, with other
//! Python threads waiting for it, a GIL hand-off (the thread that let go must
//! queue to get it back) for every crossing; with four threads on one engine
//! releasing it made a cycle about 4x slower than holding it. Holding it cannot
//! deadlock: the only locks that path can meet in the core (a registry shard or
//! name table on the first sight of a key, a thread's first counter block, a
//! telemetry ring stripe, the reconcile queue, the sink list) are held by other
//! threads only around short, pure-Rust sections, and the core calls event
//! sinks (which need the GIL) after letting go of every engine lock. The one lock
//! that *is* held while Python runs is a call's own lock, around a decision
//! whose event callback runs Python code; `PyCall::with` therefore waits for
//! a contended call lock with the GIL released.
//!
//! Everything that can block or does more than constant work — building an
//! engine, parsing and reloading policies, `stats()` / `prometheus()` (which
//! iterate every registry), `events()` / `drain_events()` (every telemetry
//! stripe), the reconcile list, sink registration (a write lock), the policy
//! snapshot — still runs with the GIL released, so other threads keep
//! running while it does.

mod convert;
mod fleet;
mod wire;

use convert::{
    body_bytes, body_view, bool_arg, from_json, int_arg, name_arg, req_smol, req_str, smol_arg, str_arg, to_headers,
    to_json, to_needs, to_py, type_name,
};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyType};
use retrywise::telemetry::Sink;
use retrywise::HedgePlan;
use retrywise::{
    Action, Attempt, Call, CallSpec, Decision, Engine, ErrorClass, Event, Inbound, ManualClock, Mode, OnFailure,
    Outcome, Policy, PolicyErrors, Reason, Stopped, WaitSource,
};
use smol_str::SmolStr;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex as StdMutex};
use std::time::Duration;

// ---------------------------------------------------------------- errors --

/// The Python exception classes live in `retrywise/_errors.py` (plain Python,
/// so they carry typed attributes and docstrings); looked up once.
pub(crate) fn err_class<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
) -> PyResult<&'py Bound<'py, PyType>> {
    cell.import(py, "retrywise._errors", name)
}

static INTERNAL_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static POLICY_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static STOPPED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static NOT_YET: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn internal_error(py: Python<'_>, message: String) -> PyErr {
    match err_class(py, &INTERNAL_ERROR, "InternalError").and_then(|c| c.call1((message.clone(),))) {
        Ok(e) => PyErr::from_value(e),
        Err(_) => PyRuntimeError::new_err(message),
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    format!("retrywise internal error (a bug; the engine is still usable): {what}")
}

fn policy_error(py: Python<'_>, errs: &PolicyErrors) -> PyErr {
    let first = errs.first();
    let build = || -> PyResult<Bound<'_, PyAny>> {
        let list = PyList::empty(py);
        for e in &errs.0 {
            list.append((e.path.as_str(), e.message.as_str()))?;
        }
        let kw = PyDict::new(py);
        kw.set_item("path", first.path.as_str())?;
        kw.set_item("message", first.message.as_str())?;
        kw.set_item("errors", list)?;
        err_class(py, &POLICY_ERROR, "PolicyError")?.call((errs.to_string(),), Some(&kw))
    };
    match build() {
        Ok(e) => PyErr::from_value(e),
        Err(e) => e,
    }
}

fn on_failure_str(o: Option<OnFailure>) -> Option<&'static str> {
    o.map(OnFailure::as_str)
}

fn stopped_error(py: Python<'_>, s: &Stopped) -> PyErr {
    let build = || -> PyResult<Bound<'_, PyAny>> {
        let kw = PyDict::new(py);
        kw.set_item("reason", s.reason.as_str())?;
        kw.set_item("error_class", s.class.map(ErrorClass::as_str))?;
        kw.set_item("detail", s.detail.as_deref())?;
        kw.set_item("on_failure", on_failure_str(s.on_failure))?;
        // Not a stop but "not yet": ask again after `wait_s`.
        let class = match s.wait {
            Some(w) => {
                kw.set_item("wait_s", w.as_secs_f64())?;
                err_class(py, &NOT_YET, "NotYet")?
            }
            None => err_class(py, &STOPPED, "Stopped")?,
        };
        class.call((s.to_string(),), Some(&kw))
    };
    match build() {
        Ok(e) => PyErr::from_value(e),
        Err(e) => e,
    }
}

/// Runs `f` with the GIL released and inside a panic boundary.
fn guarded<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> PyResult<T> {
    py.detach(|| catch_unwind(AssertUnwindSafe(f)).map_err(|p| panic_message(&*p)))
        .map_err(|m| internal_error(py, m))
}

/// Same boundary, GIL held: for calls that need Python objects inside.
fn guarded_gil<T>(py: Python<'_>, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(internal_error(py, panic_message(&*p))),
    }
}

/// Same boundary, GIL held, for the hot path (see "The GIL" above). When
/// nothing panics `catch_unwind` costs nothing but the call.
#[inline]
pub(crate) fn held<T>(py: Python<'_>, f: impl FnOnce() -> T) -> PyResult<T> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| internal_error(py, panic_message(&*p)))
}

// ---------------------------------------------------------------- policy --

/// A policy argument: `None` (defaults), a dict, or a JSON/YAML/TOML string.
fn policy_from(py: Python<'_>, obj: Option<&Bound<'_, PyAny>>) -> PyResult<Policy> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Policy::default());
    };
    let parsed = if let Ok(s) = obj.cast::<PyString>() {
        let text = s.to_str()?.to_owned();
        guarded(py, move || Policy::from_str_any(&text))?
    } else if let Ok(b) = obj.cast::<PyBytes>() {
        let text = std::str::from_utf8(b.as_bytes())
            .map_err(|e| PyValueError::new_err(format!("argument 'policy': not UTF-8: {e}")))?
            .to_owned();
        guarded(py, move || Policy::from_str_any(&text))?
    } else if obj.is_instance_of::<PyDict>() || obj.hasattr(pyo3::intern!(py, "items"))? {
        let value = to_json(obj, "policy")?;
        guarded(py, move || Policy::from_json_value(value))?
    } else {
        return Err(PyTypeError::new_err(format!(
            "argument 'policy': expected a dict or a JSON/YAML/TOML string (use Engine.from_file for a path), got {}",
            type_name(obj)
        )));
    };
    parsed.map_err(|e| policy_error(py, &e))
}

// ---------------------------------------------------------------- engine --

/// The shared retry owner: one per process, safe to share across threads.
#[pyclass(module = "retrywise._retrywise", name = "Engine", subclass, frozen)]
pub struct PyEngine {
    engine: Engine,
    clock: Option<ManualClock>,
    routes: RouteCache,
}

/// The last few route strings `begin` saw, with their `SmolStr`: callers pass
/// the same `str` object (a literal, a transport's attribute) for every call,
/// so the usual route is found by identity, without reading or copying the text.
/// Used only with the GIL held and without running Python code (exact `str`
/// objects only: dropping an evicted one runs no finalizer), so it needs no lock.
struct RouteCache(UnsafeCell<RouteSlots>);

const ROUTE_SLOTS: usize = 4;

#[derive(Default)]
struct RouteSlots {
    slots: [Option<(Py<PyString>, SmolStr)>; ROUTE_SLOTS],
    next: usize,
}

// SAFETY: only touched in `RouteCache::name`, which needs the GIL (the
// `Python` token) and runs no Python code while it holds the slots.
unsafe impl Sync for RouteCache {}

impl RouteCache {
    fn new() -> Self {
        RouteCache(UnsafeCell::new(RouteSlots::default()))
    }

    #[inline]
    fn name(&self, _py: Python<'_>, route: &Bound<'_, PyAny>) -> PyResult<SmolStr> {
        // SAFETY: see `impl Sync`; the reference ends before anything is dropped.
        let cache = unsafe { &mut *self.0.get() };
        for (obj, name) in cache.slots.iter().flatten() {
            if obj.as_ptr() == route.as_ptr() {
                return Ok(name.clone());
            }
        }
        let name = req_smol("route", route)?;
        let evicted = match route.cast_exact::<PyString>() {
            Ok(s) => {
                let i = cache.next % ROUTE_SLOTS;
                cache.next = cache.next.wrapping_add(1);
                cache.slots[i].replace((s.clone().unbind(), name.clone()))
            }
            Err(_) => None,
        };
        drop(evicted);
        Ok(name)
    }
}

/// The context variable holding the attempt in progress in this context:
/// a call begun while it is set is nested under that attempt.
static CURRENT_ATTEMPT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn current_attempt(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    CURRENT_ATTEMPT
        .get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            let kw = PyDict::new(py);
            kw.set_item("default", py.None())?;
            Ok(py
                .import("contextvars")?
                .getattr("ContextVar")?
                .call(("retrywise_current_attempt",), Some(&kw))?
                .unbind())
        })
        .map(|v| v.bind(py))
}

fn mode_dict<'py>(py: Python<'py>, m: Mode) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("retries", m.retries)?;
    d.set_item("fallback", m.fallback)?;
    d.set_item("hedging", m.hedging)?;
    Ok(d)
}

impl PyEngine {
    fn build(py: Python<'_>, policy: Policy, seed: Option<u64>, manual_clock: bool) -> PyResult<Self> {
        let clock = manual_clock.then(ManualClock::new);
        let mut b = Engine::builder(policy);
        if let Some(s) = seed {
            b = b.seed(s);
        }
        if let Some(c) = &clock {
            b = b.clock(Arc::new(c.clone()));
        }
        let engine = guarded(py, move || b.build())?.map_err(|e| policy_error(py, &e))?;
        Ok(PyEngine {
            engine,
            clock,
            routes: RouteCache::new(),
        })
    }
}

/// The bound `get` of the `current_attempt` context variable, looked up once.
static CURRENT_ATTEMPT_GET: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The `CallSpec` for `begin`: `[deadline_ms, idempotency,
/// tenant, task, idempotency_key, priority]` and `[params, needs,
/// inbound_headers, parent]`. Names are borrowed from the Python strings
/// (short ones are stored inline by `SmolStr`, no allocation).
#[inline(always)]
fn call_spec(
    py: Python<'_>,
    routes: &RouteCache,
    spec: &mut CallSpec,
    route: &Bound<'_, PyAny>,
    [deadline_ms, idempotency, tenant, task, idempotency_key, priority]: [Option<&Bound<'_, PyAny>>; 6],
    [params, needs, inbound_headers, parent]: [Option<&Bound<'_, PyAny>>; 4],
) -> PyResult<()> {
    spec.route = routes.name(py, route)?;
    spec.deadline = int_arg::<u64>("deadline_ms", deadline_ms)?.map(Duration::from_millis);
    if let Some(i) = name_arg("idempotency", idempotency)? {
        spec.idempotency = i;
    }
    spec.tenant = smol_arg("tenant", tenant)?;
    spec.task = smol_arg("task", task)?;
    spec.idempotency_key = str_arg("idempotency_key", idempotency_key)?;
    spec.priority = smol_arg("priority", priority)?;
    if let Some(p) = params.filter(|p| !p.is_none()) {
        let v = to_json(p, "params")?;
        spec.params_digest = Some(retrywise::idempotency::params_digest(&v));
    }
    if let Some(n) = needs.filter(|n| !n.is_none()) {
        spec.needs = to_needs(n)?;
    }
    // Nesting: explicit inbound headers, else an explicit parent attempt,
    // else the attempt active in this context (`retrywise.current_attempt`).
    if let Some(h) = inbound_headers.filter(|h| !h.is_none()) {
        let h = to_headers(h, "inbound_headers")?;
        spec.inbound =
            Inbound::from_headers(&h).map_err(|e| PyValueError::new_err(format!("argument 'inbound_headers': {e}")))?;
    }
    if spec.inbound.is_none() {
        let p = match parent.filter(|p| !p.is_none()) {
            Some(p) => p.clone(),
            None => CURRENT_ATTEMPT_GET
                .get_or_try_init(py, || {
                    current_attempt(py)?
                        .getattr(pyo3::intern!(py, "get"))
                        .map(Bound::unbind)
                })?
                .bind(py)
                .call0()?,
        };
        if !p.is_none() {
            let a = p.cast::<PyAttempt>().map_err(|_| {
                PyTypeError::new_err(format!("argument 'parent': expected Attempt, got {}", type_name(&p)))
            })?;
            spec.inbound = Some(a.get().attempt.inbound());
        }
    }
    Ok(())
}

#[pymethods]
impl PyEngine {
    #[new]
    #[pyo3(signature = (policy=None, *, seed=None, manual_clock=None))]
    fn new(
        py: Python<'_>,
        policy: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
        manual_clock: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let seed = int_arg::<u64>("seed", seed)?;
        let manual_clock = bool_arg("manual_clock", manual_clock)?.unwrap_or(false);
        let policy = policy_from(py, policy)?;
        Self::build(py, policy, seed, manual_clock)
    }

    /// An engine whose policy is read from a file (`.json`, `.yaml`/`.yml`, `.toml`).
    #[classmethod]
    #[pyo3(signature = (path, *, seed=None, manual_clock=None))]
    fn from_file<'py>(
        cls: &Bound<'py, PyType>,
        path: &Bound<'py, PyAny>,
        seed: Option<&Bound<'py, PyAny>>,
        manual_clock: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = cls.py();
        let path: std::path::PathBuf = path.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "argument 'path': expected str or os.PathLike, got {}",
                type_name(path)
            ))
        })?;
        let seed = int_arg::<u64>("seed", seed)?;
        let manual_clock = bool_arg("manual_clock", manual_clock)?.unwrap_or(false);
        let policy = guarded(py, move || Policy::from_file(&path))?.map_err(|e| policy_error(py, &e))?;
        // Built through `cls` so subclasses (the package's `Engine`) come back as themselves.
        let text = serde_json::to_string(&policy).map_err(|e| internal_error(py, e.to_string()))?;
        let kw = PyDict::new(py);
        kw.set_item("seed", seed)?;
        kw.set_item("manual_clock", manual_clock)?;
        cls.call((text,), Some(&kw))
    }

    /// Begins one logical request.
    #[pyo3(signature = (route, *, deadline_ms=None, idempotency=None, tenant=None, task=None, idempotency_key=None, priority=None,
                        params=None, needs=None, inbound_headers=None, parent=None))]
    #[allow(clippy::too_many_arguments)]
    fn begin(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        route: &Bound<'_, PyAny>,
        deadline_ms: Option<&Bound<'_, PyAny>>,
        idempotency: Option<&Bound<'_, PyAny>>,
        tenant: Option<&Bound<'_, PyAny>>,
        task: Option<&Bound<'_, PyAny>>,
        idempotency_key: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
        params: Option<&Bound<'_, PyAny>>,
        needs: Option<&Bound<'_, PyAny>>,
        inbound_headers: Option<&Bound<'_, PyAny>>,
        parent: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyCall> {
        let this = slf.get();
        let mut spec = CallSpec::default();
        call_spec(
            py,
            &this.routes,
            &mut spec,
            route,
            [deadline_ms, idempotency, tenant, task, idempotency_key, priority],
            [params, needs, inbound_headers, parent],
        )?;
        let engine = &this.engine;
        let call = held(py, || Box::new(engine.begin(spec)))?;
        Ok(PyCall::new(call, slf.clone().unbind()))
    }

    /// The route (or upstream) that serves requests for `model`: the
    /// `models` map, a route or upstream named like it, an upstream whose
    /// model it is. Anything else raises `PolicyError` naming the keys to add.
    fn route_for_model(&self, py: Python<'_>, model: &Bound<'_, PyAny>) -> PyResult<String> {
        let model = req_str("model", model)?;
        let engine = &self.engine;
        guarded(py, move || engine.route_for_model(&model))?
            .map_err(|e| policy_error(py, &retrywise::PolicyErrors(vec![e])))
    }

    /// How to reach `upstream` (from the policy catalog).
    fn reach(&self, py: Python<'_>, upstream: &Bound<'_, PyAny>) -> PyResult<wire::PyReach> {
        let upstream = req_str("upstream", upstream)?;
        let engine = &self.engine;
        let reach = guarded(py, move || engine.reach(&upstream))?;
        Ok(wire::PyReach { reach })
    }

    /// A stream gate for one attempt's body of `content_type`, reading
    /// malformed events as the policy says (`streams.malformed_event`);
    /// `end_at_error`: an error event after output ends the stream before it.
    #[pyo3(signature = (content_type=None, *, end_at_error=false))]
    fn stream_gate(
        &self,
        py: Python<'_>,
        content_type: Option<&Bound<'_, PyAny>>,
        end_at_error: bool,
    ) -> PyResult<wire::PyStreamGate> {
        let ct = str_arg("content_type", content_type)?;
        let engine = &self.engine;
        let gate = guarded(py, move || engine.stream_gate(ct.as_deref()))?;
        Ok(wire::PyStreamGate {
            gate: if end_at_error { gate.end_at_error() } else { gate },
        })
    }

    /// Attaches this engine to a fleet (`instance`, `namespace`, `quorum`,
    /// `quorum_window_ms`, `interval_ms`, `timeout_ms`, `probe_lease_ms`;
    /// see `retrywise.fleet`). At most one fleet per engine.
    #[pyo3(signature = (**config))]
    fn fleet(&self, py: Python<'_>, config: Option<&Bound<'_, PyDict>>) -> PyResult<fleet::PyFleet> {
        fleet::attach(py, &self.engine, config)
    }

    /// A snapshot of every counter (logical vs physical, stops by reason, per upstream/tenant/version).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let engine = &self.engine;
        let s = guarded(py, move || engine.stats())?;
        to_py(py, &s)
    }

    /// Prometheus text exposition of `stats()`.
    fn prometheus(&self, py: Python<'_>) -> PyResult<String> {
        let engine = &self.engine;
        guarded(py, move || engine.prometheus())
    }

    /// Registers `callback(event: dict)`; returns an id for `remove_sink`.
    /// The callback runs on the deciding thread; an exception in it is
    /// reported through `sys.unraisablehook` and never reaches the decision.
    fn on_event(&self, py: Python<'_>, callback: Bound<'_, PyAny>) -> PyResult<u64> {
        if !callback.is_callable() {
            return Err(PyTypeError::new_err("argument 'callback': expected a callable"));
        }
        let cb: Py<PyAny> = callback.unbind();
        let sink: Sink = Arc::new(move |ev: &Event| {
            Python::attach(|py| {
                let f = cb.bind(py);
                if let Err(e) = to_py(py, ev).and_then(|d| f.call1((d,)).map(|_| ())) {
                    e.write_unraisable(py, Some(f));
                }
            })
        });
        let engine = &self.engine;
        guarded(py, move || engine.on_event(sink))
    }

    /// Removes an event callback; true when it existed.
    fn remove_sink(&self, py: Python<'_>, id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = int_arg::<u64>("id", Some(id))?.unwrap_or(0);
        let engine = &self.engine;
        guarded(py, move || engine.remove_sink(id))
    }

    /// The events in the ring buffer, oldest first, as dicts.
    fn events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let engine = &self.engine;
        let ev = guarded(py, move || engine.events())?;
        to_py(py, &ev)
    }

    /// Takes the events out of the ring buffer.
    fn drain_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let engine = &self.engine;
        let ev = guarded(py, move || engine.drain_events())?;
        to_py(py, &ev)
    }

    /// Swaps the policy atomically; calls already begun keep theirs. An invalid policy raises `PolicyError` and changes nothing.
    fn reload(&self, py: Python<'_>, policy: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let policy = policy_from(py, policy)?;
        let engine = &self.engine;
        guarded_gil(py, || engine.reload(policy).map_err(|e| policy_error(py, &e)))
    }

    /// Flips the kill switch; unspecified switches keep their state.
    #[pyo3(signature = (*, retries=None, fallback=None, hedging=None))]
    fn set_mode(
        &self,
        py: Python<'_>,
        retries: Option<&Bound<'_, PyAny>>,
        fallback: Option<&Bound<'_, PyAny>>,
        hedging: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (retries, fallback, hedging) = (
            bool_arg("retries", retries)?,
            bool_arg("fallback", fallback)?,
            bool_arg("hedging", hedging)?,
        );
        let engine = &self.engine;
        guarded_gil(py, || {
            let mut m = engine.mode();
            m.retries = retries.unwrap_or(m.retries);
            m.fallback = fallback.unwrap_or(m.fallback);
            m.hedging = hedging.unwrap_or(m.hedging);
            engine.set_mode(m);
            Ok(())
        })
    }

    /// The kill-switch state: `{"retries": bool, "fallback": bool, "hedging": bool}`.
    fn mode<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        mode_dict(py, guarded_gil(py, || Ok(self.engine.mode()))?)
    }

    /// Calls whose effect is unknown, oldest first.
    fn reconcile_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let engine = &self.engine;
        let v = guarded(py, move || engine.reconcile_list())?;
        to_py(py, &v)
    }

    /// Takes the reconcile list (the caller now owns reconciling them).
    fn drain_reconcile<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let engine = &self.engine;
        let v = guarded(py, move || engine.drain_reconcile())?;
        to_py(py, &v)
    }

    /// Breaker state of an upstream: closed, open, half_open, forced_open, forced_closed, disabled, metrics_only.
    fn breaker_state(&self, py: Python<'_>, upstream: &Bound<'_, PyAny>) -> PyResult<&'static str> {
        let upstream = req_str("upstream", upstream)?;
        let engine = &self.engine;
        guarded(py, move || engine.breaker_state(&upstream).as_str())
    }

    /// The policy in force, as a dict.
    fn policy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let engine = &self.engine;
        let p = guarded(py, move || engine.policy())?;
        to_py(py, &p)
    }

    /// Version string of the policy in force.
    #[getter]
    fn policy_version(&self, py: Python<'_>) -> PyResult<String> {
        guarded_gil(py, || Ok(self.engine.policy_version()))
    }

    /// True when built with `manual_clock=True`.
    #[getter]
    fn manual_clock(&self) -> bool {
        self.clock.is_some()
    }

    /// Moves the manual clock forward (testing hook for conformance vectors).
    fn advance_clock(&self, ms: &Bound<'_, PyAny>) -> PyResult<()> {
        let ms = int_arg::<u64>("ms", Some(ms))?.unwrap_or(0);
        match &self.clock {
            Some(c) => {
                c.advance_ms(ms);
                Ok(())
            }
            None => Err(PyRuntimeError::new_err(
                "advance_clock needs an engine built with manual_clock=True",
            )),
        }
    }

    fn __repr__(&self) -> String {
        format!("<retrywise.Engine policy_version={:?}>", self.engine.policy_version())
    }
}

// ------------------------------------------------------------------ call --

/// One logical request. Its methods take it (and decide) with the GIL held.
///
/// Who may touch the core's `Call` is `owner`, the token of the thread deciding
/// on it (0 = nobody). `owner` is only read and written with the GIL held, so
/// taking a free call is a load and a store, not an atomic read-modify-write:
/// the GIL already orders every thread that takes or gives back a call. The
/// owner may let the GIL go while it holds the call (an event callback runs
/// Python code during the decision); a thread that then finds the call taken
/// waits for it with the GIL released, so two threads touching one call never
/// deadlock with an event callback, and a callback that reaches back into the
/// call being decided on its own thread gets an error instead of a self-deadlock.
/// (abi3 extensions only load into CPython builds that have a GIL.)
#[pyclass(module = "retrywise._retrywise", name = "Call", frozen)]
pub struct PyCall {
    /// Boxed: the core's `Call` is a few hundred bytes, moved once into the
    /// box instead of through every layer between the core and the Python object.
    call: UnsafeCell<Box<Call>>,
    /// The engine that began it: its attempts say how to reach their upstream.
    engine: Py<PyEngine>,
    owner: AtomicUsize,
    /// Threads waiting for `owner` to become 0 (changed with the GIL held).
    waiters: AtomicUsize,
    /// Where waiters sleep, with the GIL released (touched only when there are waiters).
    wait_lock: StdMutex<()>,
    wait_cv: Condvar,
}

// SAFETY: `Call` is `Send`; the `owner` protocol (see above) gives one thread at
// a time, and only while it is the owner, access to it.
unsafe impl Sync for PyCall {}

thread_local! {
    static THREAD_TOKEN: u8 = const { 0 };
}

fn thread_token() -> usize {
    THREAD_TOKEN.with(|t| t as *const u8 as usize)
}

/// Gives the call back when the decision ends (also when it panicked).
struct Owned<'a>(&'a PyCall);

impl Drop for Owned<'_> {
    fn drop(&mut self) {
        let c = self.0;
        // The GIL is held: a thread that registered as a waiter did so before this.
        c.owner.store(0, Ordering::Relaxed);
        if c.waiters.load(Ordering::Relaxed) != 0 {
            let _g = c.wait_lock.lock().unwrap_or_else(|e| e.into_inner());
            c.wait_cv.notify_all();
        }
    }
}

impl PyCall {
    fn new(call: Box<Call>, engine: Py<PyEngine>) -> Self {
        PyCall {
            call: UnsafeCell::new(call),
            engine,
            owner: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            wait_lock: StdMutex::new(()),
            wait_cv: Condvar::new(),
        }
    }

    #[inline]
    fn with<T>(&self, py: Python<'_>, f: impl FnOnce(&mut Call) -> T) -> PyResult<T> {
        let me = thread_token();
        loop {
            match self.owner.load(Ordering::Relaxed) {
                0 => break,
                o if o == me => {
                    return Err(PyRuntimeError::new_err(
                        "this call is deciding on this thread: an event callback cannot use it",
                    ))
                }
                _ => self.wait_for_owner(py),
            }
        }
        // Nothing between the check and this store lets the GIL go.
        self.owner.store(me, Ordering::Relaxed);
        let _owned = Owned(self);
        // SAFETY: this thread is the owner until `_owned` is dropped.
        let call = unsafe { &mut **self.call.get() };
        held(py, || f(call))
    }

    /// Another thread is deciding on this call (its event callback may be
    /// running Python and need the GIL back): sleep until it is given back.
    #[cold]
    fn wait_for_owner(&self, py: Python<'_>) {
        self.waiters.fetch_add(1, Ordering::Relaxed);
        py.detach(|| {
            let mut g = self.wait_lock.lock().unwrap_or_else(|e| e.into_inner());
            while self.owner.load(Ordering::Relaxed) != 0 {
                g = self.wait_cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
        });
        self.waiters.fetch_sub(1, Ordering::Relaxed);
    }
}

#[pymethods]
impl PyCall {
    /// The next attempt to make, or raises `retrywise.Stopped` saying why none may start.
    fn next_attempt<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAttempt>> {
        // The Python object is made where the core returns the attempt (one move
        // of the attempt instead of one per layer); `Stopped` is raised outside the lock.
        match self.with(py, |c| {
            c.next_attempt().map(|attempt| {
                Bound::new(
                    py,
                    PyAttempt {
                        attempt,
                        engine: Some(self.engine.clone_ref(py)),
                    },
                )
            })
        })? {
            Ok(attempt) => attempt,
            Err(s) => Err(stopped_error(py, &s)),
        }
    }

    /// Reports the outcome of the attempt in flight (or of `attempt`, with hedging) and returns the decision.
    #[pyo3(signature = (status=None, error=None, headers=None, phase=None, vendor_code=None, effect=None, input_tokens=None, body=None, *, ok=None, attempt=None, resumable=None, continuation=None))]
    #[allow(clippy::too_many_arguments)]
    fn report<'py>(
        &self,
        py: Python<'py>,
        status: Option<&Bound<'_, PyAny>>,
        error: Option<&Bound<'_, PyAny>>,
        headers: Option<&Bound<'_, PyAny>>,
        phase: Option<&Bound<'_, PyAny>>,
        vendor_code: Option<&Bound<'_, PyAny>>,
        effect: Option<&Bound<'_, PyAny>>,
        input_tokens: Option<&Bound<'_, PyAny>>,
        body: Option<&Bound<'_, PyAny>>,
        ok: Option<&Bound<'_, PyAny>>,
        attempt: Option<&Bound<'_, PyAny>>,
        resumable: Option<&Bound<'_, PyAny>>,
        continuation: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyDecision>> {
        let mut o = Outcome {
            status: int_arg::<u16>("status", status)?,
            error: name_arg("error", error)?,
            phase: name_arg("phase", phase)?,
            effect: name_arg("effect", effect)?,
            vendor_code: str_arg("vendor_code", vendor_code)?,
            input_tokens: int_arg::<u64>("input_tokens", input_tokens)?,
            ok: bool_arg("ok", ok)?.unwrap_or(false),
            resumable: bool_arg("resumable", resumable)?.unwrap_or(false),
            continuation: name_arg("continuation", continuation)?,
            ..Outcome::default()
        };
        let attempt = int_arg::<u32>("attempt", attempt)?;
        if let Some(h) = headers.filter(|h| !h.is_none()) {
            o.headers = to_headers(h, "headers")?;
        }
        // Read in place: the core scans an error body for a vendor code and
        // checks that a JSON success body parses.
        let body = match body.filter(|b| !b.is_none()) {
            Some(b) => Some(body_view(b)?),
            None => None,
        };
        self.with(py, |c| {
            if let Some(b) = &body {
                o.read_body(b);
            }
            let d = match attempt {
                Some(n) => c.report_attempt(n, &o),
                None => c.report(&o),
            };
            Bound::new(py, PyDecision::new(py, d))
        })?
    }

    /// Cancels the call: attempts in flight are reported as cancelled; returns the final decision.
    fn cancel(&self, py: Python<'_>) -> PyResult<PyDecision> {
        Ok(PyDecision::new(py, self.with(py, |c| c.cancel())?))
    }

    /// Whether a hedged attempt may start now (`action` start / after / no).
    fn next_hedge(&self, py: Python<'_>) -> PyResult<PyHedgePlan> {
        Ok(match self.with(py, |c| c.next_hedge())? {
            HedgePlan::Start(a) => PyHedgePlan {
                action: "start",
                attempt: Some((a, self.engine.clone_ref(py))),
                after: None,
                reason: None,
            },
            HedgePlan::After(d) => PyHedgePlan {
                action: "after",
                attempt: None,
                after: Some(d),
                reason: None,
            },
            HedgePlan::No(r) => PyHedgePlan {
                action: "no",
                attempt: None,
                after: None,
                reason: Some(r.as_str()),
            },
        })
    }

    /// Logical request id.
    #[getter]
    fn id<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyString>> {
        self.with(py, |c| PyString::new(py, c.id()))
    }

    /// Physical attempts started so far.
    #[getter]
    fn attempts(&self, py: Python<'_>) -> PyResult<u32> {
        self.with(py, |c| c.attempts())
    }

    /// Seconds left before the deadline.
    #[getter]
    fn remaining_s(&self, py: Python<'_>) -> PyResult<f64> {
        self.with(py, |c| c.remaining().as_secs_f64())
    }

    /// True once a final decision was made.
    #[getter]
    fn is_finished(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, |c| c.is_finished())
    }

    /// False when an enclosing retrywise call owns retries.
    #[getter]
    fn is_owner(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, |c| c.is_owner())
    }

    /// Upstream the next attempt goes to.
    #[getter]
    fn target<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyString>> {
        self.with(py, |c| PyString::new(py, c.target()))
    }

    /// Policy version this call runs under.
    #[getter]
    fn policy_version<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyString>> {
        self.with(py, |c| PyString::new(py, c.policy_version()))
    }

    /// The final decision, once the call is over.
    #[getter]
    fn final_decision(&self, py: Python<'_>) -> PyResult<Option<PyDecision>> {
        Ok(self.with(py, |c| c.final_decision())?.map(|d| PyDecision::new(py, d)))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let (id, n, fin) = self.with(py, |c| (c.id().to_string(), c.attempts(), c.is_finished()))?;
        Ok(format!("<retrywise.Call id={id} attempts={n} finished={fin}>"))
    }
}

// --------------------------------------------------------------- attempt --

/// Per-attempt timeouts, each clamped to what is left of the deadline.
#[pyclass(module = "retrywise._retrywise", name = "Timeouts", frozen)]
pub struct PyTimeouts {
    t: retrywise::AttemptTimeouts,
}

fn ms_of(d: Duration) -> u64 {
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
    attempt: Attempt,
    /// The engine whose call made it (for `reach`).
    engine: Option<Py<PyEngine>>,
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
    /// `body_started`: the response's headers had arrived. (A first-token
    /// expiry is a first-byte timeout: the stream was silent.)
    fn timer_error(&self, timer: &Bound<'_, PyAny>, body_started: bool) -> PyResult<&'static str> {
        use retrywise::Timer;
        let t = match req_str("timer", timer)?.as_str() {
            "connect" => Timer::Connect,
            "first_byte" | "first_token" => Timer::FirstByte,
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

// -------------------------------------------------------------- decision --

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
    fn new(py: Python<'_>, d: Decision) -> Self {
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
    action: &'static str,
    attempt: Option<(Attempt, Py<PyEngine>)>,
    after: Option<Duration>,
    reason: Option<&'static str>,
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

// ---------------------------------------------------------------- module --

/// SHA-256 (hex) of the canonical JSON form of `params` (key order does not matter).
#[pyfunction]
fn params_digest(py: Python<'_>, params: &Bound<'_, PyAny>) -> PyResult<String> {
    let v = to_json(params, "params")?;
    guarded(py, move || retrywise::idempotency::params_digest(&v))
}

/// A stable idempotency key (`rw1_...`) for tenant + operation + params digest.
#[pyfunction]
fn derive_idempotency_key(
    py: Python<'_>,
    tenant: &Bound<'_, PyAny>,
    operation: &Bound<'_, PyAny>,
    digest: &Bound<'_, PyAny>,
) -> PyResult<String> {
    let tenant = req_str("tenant", tenant)?;
    let operation = req_str("operation", operation)?;
    let digest = req_str("digest", digest)?;
    guarded(py, move || {
        retrywise::idempotency::derive_key(&tenant, &operation, &digest)
    })
}

/// Vendor error code from an OpenAI- or Anthropic-style error body, if any.
#[pyfunction]
fn vendor_code_from_body(py: Python<'_>, body: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    let b = body_bytes(body)?;
    guarded(py, move || retrywise::vendor_code_from_body(&b))
}

/// Whether a `content-type` names JSON (`application/json`, `+json`): the
/// success bodies `Call.report(body=...)` checks for being malformed.
#[pyfunction]
fn json_media_type(content_type: &str) -> bool {
    retrywise::json_media_type(content_type)
}

/// The JSON Schema of the policy document.
#[pyfunction]
fn policy_schema(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let v = guarded(py, Policy::json_schema)?;
    from_json(py, &v)
}

#[pymodule]
fn _retrywise(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyEngine>()?;
    m.add_class::<PyCall>()?;
    m.add_class::<PyAttempt>()?;
    m.add_class::<PyTimeouts>()?;
    m.add_class::<PyDecision>()?;
    m.add_class::<PyHedgePlan>()?;
    wire::register(m)?;
    fleet::register(m)?;
    m.add_function(wrap_pyfunction!(params_digest, m)?)?;
    m.add_function(wrap_pyfunction!(derive_idempotency_key, m)?)?;
    m.add_function(wrap_pyfunction!(vendor_code_from_body, m)?)?;
    m.add_function(wrap_pyfunction!(policy_schema, m)?)?;
    m.add_function(wrap_pyfunction!(json_media_type, m)?)?;
    m.add("__version__", retrywise::version())?;
    m.add("current_attempt", current_attempt(py)?)?;
    Ok(())
}
