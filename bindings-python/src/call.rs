//! `retrywise._retrywise.Call`: one logical request and its per-attempt
//! methods (`next_attempt`, `report`, `cancel`, `next_hedge`, the getters),
//! with the ownership protocol that lets them decide with the GIL held.

use crate::attempt::PyAttempt;
use crate::convert::{body_view, bool_arg, int_arg, name_arg, secs_arg, str_arg, to_headers};
use crate::decision::{PyDecision, PyHedgePlan};
use crate::engine::PyEngine;
use crate::errors::{held, stopped_error};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyString;
use retrywise::{Call, HedgePlan, Outcome};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex as StdMutex};

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
    pub(crate) fn new(call: Box<Call>, engine: Py<PyEngine>) -> Self {
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
    /// `first_token_s`: a streamed answer's first visible output came this long
    /// after its request was sent (the core learns each upstream's time to first token).
    #[pyo3(signature = (status=None, error=None, headers=None, phase=None, vendor_code=None, effect=None, input_tokens=None, body=None, *, ok=None, attempt=None, resumable=None, continuation=None, first_token_s=None))]
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
        first_token_s: Option<&Bound<'_, PyAny>>,
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
            first_token: secs_arg("first_token_s", first_token_s)?,
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
