//! `retrywise._retrywise.Fleet`: the core's fleet attachment, translated.
//! The core plans each sync cycle and merges its answers; the Redis I/O is
//! `retrywise/fleet.py`'s, on a thread (or task) of its own, so no decision
//! ever waits on the store.

use crate::convert::{int_arg, str_arg, to_py, type_name};
use crate::errors::{guarded, guarded_gil};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use retrywise::fleet::{SyncReport, CLAIM_SCRIPT, MERGE_SCRIPT};
use retrywise::{Engine, Fleet, FleetConfig};
use std::time::Duration;

/// The keyword arguments of `Engine.fleet`, each optional (the core's defaults).
const KEYS: [&str; 7] = [
    "instance",
    "namespace",
    "quorum",
    "quorum_window_ms",
    "interval_ms",
    "timeout_ms",
    "probe_lease_ms",
];

/// `Engine.fleet(**config)`: attaches the engine to a fleet.
pub(crate) fn attach(py: Python<'_>, engine: &Engine, config: Option<&Bound<'_, PyDict>>) -> PyResult<PyFleet> {
    let mut cfg = FleetConfig::default();
    if let Some(config) = config {
        for k in config.keys() {
            let k = k.cast::<PyString>()?.to_str()?.to_owned();
            if !KEYS.contains(&k.as_str()) {
                return Err(PyTypeError::new_err(format!(
                    "fleet() got an unexpected keyword argument '{k}' (expected one of {})",
                    KEYS.join(", ")
                )));
            }
        }
        let get = |k: &str| config.get_item(k);
        let ms = |k: &str| -> PyResult<Option<Duration>> {
            Ok(int_arg::<u64>(k, get(k)?.as_ref())?.map(Duration::from_millis))
        };
        if let Some(v) = str_arg("instance", get("instance")?.as_ref())? {
            cfg.instance = v;
        }
        if let Some(v) = str_arg("namespace", get("namespace")?.as_ref())? {
            cfg.namespace = v;
        }
        if let Some(v) = int_arg::<u32>("quorum", get("quorum")?.as_ref())? {
            cfg.quorum = v;
        }
        cfg.quorum_window = ms("quorum_window_ms")?.unwrap_or(cfg.quorum_window);
        cfg.interval = ms("interval_ms")?.unwrap_or(cfg.interval);
        cfg.timeout = ms("timeout_ms")?.unwrap_or(cfg.timeout);
        cfg.probe_lease = ms("probe_lease_ms")?.unwrap_or(cfg.probe_lease);
    }
    let fleet = guarded(py, move || engine.fleet(cfg))?.map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(PyFleet { fleet })
}

/// An engine's attachment to a fleet: plans sync cycles and takes their answers.
#[pyclass(module = "retrywise._retrywise", name = "Fleet", frozen)]
pub struct PyFleet {
    fleet: Fleet,
}

/// A `str` or UTF-8 `bytes` from Redis (a client with or without `decode_responses`).
fn text(what: &str, o: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = o.cast::<PyString>() {
        return Ok(s.to_str()?.to_owned());
    }
    if let Ok(b) = o.cast::<PyBytes>() {
        return String::from_utf8(b.as_bytes().to_vec())
            .map_err(|e| PyValueError::new_err(format!("{what}: not UTF-8: {e}")));
    }
    Err(PyTypeError::new_err(format!(
        "{what}: expected str or bytes, got {}",
        type_name(o)
    )))
}

/// One `HGETALL` answer: a mapping (field → record), or `None` for no key.
fn fields(o: &Bound<'_, PyAny>) -> PyResult<Vec<(String, String)>> {
    if o.is_none() {
        return Ok(Vec::new());
    }
    let items = match o.cast::<PyDict>() {
        Ok(d) => d.items().into_any(),
        Err(_) => o.call_method0(pyo3::intern!(o.py(), "items"))?,
    };
    items
        .try_iter()?
        .map(|kv| {
            let kv = kv?;
            let kv = kv.cast::<PyTuple>()?;
            Ok((
                text("read field", &kv.get_item(0)?)?,
                text("read value", &kv.get_item(1)?)?,
            ))
        })
        .collect()
}

fn report_dict<'py>(py: Python<'py>, r: &SyncReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("opened", r.opened)?;
    d.set_item("extended", r.extended)?;
    d.set_item("recovered", r.recovered)?;
    d.set_item("leases_won", r.leases_won)?;
    d.set_item("leases_lost", r.leases_lost)?;
    d.set_item("limits", r.limits)?;
    Ok(d)
}

#[pymethods]
impl PyFleet {
    /// The next cycle's commands: `{"id", "writes": [(key, field, value, ttl_ms)],
    /// "reads": [key], "claims": [(key, value, now_ms, ttl_ms)]}`. A plan not yet
    /// answered is abandoned (its writes are planned again).
    fn plan<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let fleet = &self.fleet;
        let p = guarded(py, move || fleet.plan())?;
        let writes = PyList::empty(py);
        for w in &p.writes {
            writes.append((&w.key, &w.field, &w.value, w.ttl_ms))?;
        }
        let claims = PyList::empty(py);
        for c in &p.claims {
            claims.append((&c.key, &c.value, c.now_ms, c.ttl_ms))?;
        }
        let d = PyDict::new(py);
        d.set_item("id", p.id)?;
        d.set_item("writes", writes)?;
        d.set_item("reads", PyList::new(py, &p.reads)?)?;
        d.set_item("claims", claims)?;
        Ok(d)
    }

    /// Takes plan `id`'s answers: `reads[i]` the `HGETALL` of `plan["reads"][i]`,
    /// `claims[i]` the claim script's answer (`None`: the lease is ours). Returns
    /// what the cycle changed locally (`opened`, `extended`, `recovered`,
    /// `leases_won`, `leases_lost`, `limits`).
    fn complete<'py>(
        &self,
        py: Python<'py>,
        id: &Bound<'py, PyAny>,
        reads: &Bound<'py, PyAny>,
        claims: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let id = int_arg::<u64>("id", Some(id))?.unwrap_or(0);
        let reads = reads.try_iter()?.map(|r| fields(&r?)).collect::<PyResult<Vec<_>>>()?;
        let claims = claims
            .try_iter()?
            .map(|c| {
                let c = c?;
                if c.is_none() {
                    Ok(None)
                } else {
                    text("claim", &c).map(Some)
                }
            })
            .collect::<PyResult<Vec<_>>>()?;
        let fleet = &self.fleet;
        let r = guarded(py, move || fleet.complete(id, &reads, &claims))?;
        report_dict(py, &r)
    }

    /// Cycle `id` failed (store down, slow or refusing): decisions stay local,
    /// the failure is counted and evented, every record is written again next time.
    fn failed(&self, py: Python<'_>, id: &Bound<'_, PyAny>, error: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = int_arg::<u64>("id", Some(id))?.unwrap_or(0);
        let error = match error.cast::<PyString>() {
            Ok(s) => s.to_str()?.to_owned(),
            Err(_) => error.str()?.to_str()?.to_owned(),
        };
        let fleet = &self.fleet;
        guarded(py, move || fleet.failed(id, &error))
    }

    /// True while the last cycle succeeded.
    fn healthy(&self, py: Python<'_>) -> PyResult<bool> {
        let fleet = &self.fleet;
        guarded(py, move || fleet.healthy())
    }

    /// The counters, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let fleet = &self.fleet;
        let s = guarded(py, move || fleet.stats())?;
        to_py(py, &s)
    }

    /// The configuration in force (defaults filled in), durations in ms.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        guarded_gil(py, || {
            let c = self.fleet.config();
            let d = PyDict::new(py);
            d.set_item("instance", &c.instance)?;
            d.set_item("namespace", &c.namespace)?;
            d.set_item("quorum", c.quorum)?;
            d.set_item("quorum_window_ms", c.quorum_window.as_millis() as u64)?;
            d.set_item("interval_ms", c.interval.as_millis() as u64)?;
            d.set_item("timeout_ms", c.timeout.as_millis() as u64)?;
            d.set_item("probe_lease_ms", c.probe_lease.as_millis() as u64)?;
            Ok(d)
        })
    }

    /// Longest a change on one instance takes to reach another while the
    /// store is up, ms: `2 × (interval + timeout)`.
    #[getter]
    fn staleness_bound_ms(&self) -> u64 {
        self.fleet.config().staleness_bound().as_millis() as u64
    }

    fn __repr__(&self) -> String {
        let c = self.fleet.config();
        format!(
            "<retrywise.Fleet instance={:?} namespace={:?} quorum={}>",
            c.instance, c.namespace, c.quorum
        )
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyFleet>()?;
    m.add("MERGE_SCRIPT", MERGE_SCRIPT)?;
    m.add("CLAIM_SCRIPT", CLAIM_SCRIPT)?;
    Ok(())
}
