//! The panic boundary every entry point into the core runs in (`guarded`,
//! `guarded_gil`, `held`) and the Python exceptions the core's failures become
//! (`InternalError`, `PolicyError`, `Stopped`, `NotYet`). Separate because every
//! other module raises through it.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyType};
use retrywise::{ErrorClass, OnFailure, PolicyErrors, Stopped};
use std::panic::{catch_unwind, AssertUnwindSafe};

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

pub(crate) fn internal_error(py: Python<'_>, message: String) -> PyErr {
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

pub(crate) fn policy_error(py: Python<'_>, errs: &PolicyErrors) -> PyErr {
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

pub(crate) fn on_failure_str(o: Option<OnFailure>) -> Option<&'static str> {
    o.map(OnFailure::as_str)
}

pub(crate) fn stopped_error(py: Python<'_>, s: &Stopped) -> PyErr {
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
pub(crate) fn guarded<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> PyResult<T> {
    py.detach(|| catch_unwind(AssertUnwindSafe(f)).map_err(|p| panic_message(&*p)))
        .map_err(|m| internal_error(py, m))
}

/// Same boundary, GIL held: for calls that need Python objects inside.
pub(crate) fn guarded_gil<T>(py: Python<'_>, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(internal_error(py, panic_message(&*p))),
    }
}

/// Same boundary, GIL held, for the hot path (see "The GIL" in the crate doc). When
/// nothing panics `catch_unwind` costs nothing but the call.
#[inline]
pub(crate) fn held<T>(py: Python<'_>, f: impl FnOnce() -> T) -> PyResult<T> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| internal_error(py, panic_message(&*p)))
}
