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

mod attempt;
mod call;
mod convert;
mod decision;
mod engine;
mod errors;
mod fleet;
mod functions;
mod spec;
mod wire;

use attempt::{PyAttempt, PyTimeouts};
use call::PyCall;
use decision::{PyDecision, PyHedgePlan};
use engine::PyEngine;
use functions::{derive_idempotency_key, json_media_type, params_digest, policy_schema, vendor_code_from_body};
use pyo3::prelude::*;
use spec::current_attempt;

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
