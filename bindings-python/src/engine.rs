//! `retrywise._retrywise.Engine`: the shared retry owner, built from a policy
//! argument, and its engine-wide methods (begin, reload, kill switch, stats,
//! events, sinks, the reconcile list). Per-call state lives in `call`, and the
//! translation of `begin`'s arguments in `spec`.

use crate::call::PyCall;
use crate::convert::{bool_arg, int_arg, req_str, str_arg, to_json, to_py, type_name};
use crate::errors::{guarded, guarded_gil, held, internal_error, policy_error};
use crate::spec::{call_spec, RouteCache};
use crate::{fleet, wire};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString, PyType};
use retrywise::telemetry::Sink;
use retrywise::{CallSpec, Engine, Event, ManualClock, Mode, Policy};
use std::sync::Arc;

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

/// The shared retry owner: one per process, safe to share across threads.
#[pyclass(module = "retrywise._retrywise", name = "Engine", subclass, frozen)]
pub struct PyEngine {
    pub(crate) engine: Engine,
    clock: Option<ManualClock>,
    routes: RouteCache,
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

    /// Begins one logical request. `request`: a `RequestFacts`
    /// (`retrywise.read_request`), whose needs the call keeps, with `needs`
    /// laid over them. A route the policy does not know raises `PolicyError`.
    #[pyo3(signature = (route, *, deadline_ms=None, idempotency=None, tenant=None, task=None, idempotency_key=None, priority=None,
                        params=None, needs=None, inbound_headers=None, parent=None, request=None))]
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
        request: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyCall> {
        let this = slf.get();
        let mut spec = CallSpec::default();
        call_spec(
            py,
            &this.routes,
            &mut spec,
            route,
            [deadline_ms, idempotency, tenant, task, idempotency_key, priority],
            [params, needs, inbound_headers, parent, request],
        )?;
        let engine = &this.engine;
        // `try_begin_from`: a route the policy does not know is a `PolicyError`
        // naming the known routes, before any I/O.
        let call = held(py, || engine.try_begin_from(&mut spec).map(Box::new))?
            .map_err(|e| policy_error(py, &retrywise::PolicyErrors(vec![e])))?;
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
