//! `Engine.begin`'s arguments as the core's `CallSpec`: the route-name cache
//! and the `current_attempt` context variable that nests a call under the
//! attempt in progress. Separate from `engine` because it is the hot path's
//! argument translation, not engine state.

use crate::attempt::PyAttempt;
use crate::convert::{int_arg, name_arg, req_smol, smol_arg, str_arg, to_headers, to_json, to_needs, type_name};
use crate::wire::PyRequestFacts;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString};
use retrywise::{CallSpec, Inbound};
use smol_str::SmolStr;
use std::cell::UnsafeCell;
use std::time::Duration;

/// The last few route strings `begin` saw, with their `SmolStr`: callers pass
/// the same `str` object (a literal, a transport's attribute) for every call,
/// so the usual route is found by identity, without reading or copying the text.
/// Used only with the GIL held and without running Python code (exact `str`
/// objects only: dropping an evicted one runs no finalizer), so it needs no lock.
pub(crate) struct RouteCache(UnsafeCell<RouteSlots>);

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
    pub(crate) fn new() -> Self {
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

pub(crate) fn current_attempt(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
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

/// The bound `get` of the `current_attempt` context variable, looked up once.
static CURRENT_ATTEMPT_GET: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The `CallSpec` for `begin`: `[deadline_ms, idempotency,
/// tenant, task, idempotency_key, priority]` and `[params, needs,
/// inbound_headers, parent, request]` (`request`: a `RequestFacts`, whose
/// needs the caller's `needs` are laid over: the core's `Needs::merged`).
/// Names are borrowed from the Python strings (short ones are stored inline
/// by `SmolStr`, no allocation).
#[inline(always)]
pub(crate) fn call_spec(
    py: Python<'_>,
    routes: &RouteCache,
    spec: &mut CallSpec,
    route: &Bound<'_, PyAny>,
    [deadline_ms, idempotency, tenant, task, idempotency_key, priority]: [Option<&Bound<'_, PyAny>>; 6],
    [params, needs, inbound_headers, parent, request]: [Option<&Bound<'_, PyAny>>; 5],
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
    let given = match needs.filter(|n| !n.is_none()) {
        Some(n) => Some(to_needs(n)?),
        None => None,
    };
    spec.needs = match request.filter(|r| !r.is_none()) {
        Some(r) => {
            let facts = r.cast::<PyRequestFacts>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "argument 'request': expected RequestFacts (retrywise.read_request), got {}",
                    type_name(r)
                ))
            })?;
            let read = &facts.get().facts.needs;
            match given {
                Some(g) => read.merged(&g),
                None => read.clone(),
            }
        }
        None => given.unwrap_or_default(),
    };
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
