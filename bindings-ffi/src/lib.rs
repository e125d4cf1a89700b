//! # retrywise C ABI (`libretrywise`)
//!
//! The C entry points of retrywise: opaque `rw_engine` and `rw_call`
//! handles, a result enum, plain C structs, strings as pointer + length and
//! headers as arrays of name/value pairs. The header `include/retrywise.h` is
//! generated from this crate by cbindgen (`check-header.sh`).
//!
//! Every decision is made by the core crate `retrywise`; this crate only
//! converts types. Every exported function checks its pointers
//! (`RW_ERR_NULL`), runs inside a panic boundary (`RW_ERR_PANIC`, never
//! unwinding into C) and never aborts on bad input.
//!
//! The loop a C caller writes:
//!
//! ```text
//! engine = rw_engine_new(policy, len, &err)
//! rw_call_begin(engine, &spec, &call)
//! while rw_call_next_attempt(call, &attempt) == RW_OK:
//!     ... perform the I/O with attempt.total_timeout_ms and attempt.headers ...
//!     rw_call_report(call, &outcome, &decision)
//!     SUCCEEDED -> done; RETRY/FALLBACK -> sleep decision.delay_ms; STOP/RECONCILE -> surface it
//! rw_call_free(call)
//! ```
//!
//! Hedging (routes with `hedge_after_ms`): while an attempt is in flight,
//! `rw_call_next_hedge` says start / after N ms / no; a started hedge and the
//! primary are each reported with `rw_call_report_attempt(call, number, ...)`,
//! and the first answer decides. `rw_call_cancel` reports every attempt in
//! flight as cancelled.
//!
//! Streamed bodies: run each attempt's body through an `rw_stream_gate`
//! (`rw_stream_gate_feed` per chunk); it holds an event stream's preamble
//! back until the first meaningful event, and `rw_stream_gate_phase` is the
//! phase to report if the body fails. At the body's end,
//! `rw_stream_gate_end_outcome` (with an `rw_transcript` of the bytes the
//! caller received) gives the outcome to report: a cut when output was shown
//! without its finish, the failure an error event named, else the status.
//!
//! Timers: arm each attempt's `connect_timeout_ms`, `first_byte_timeout_ms`,
//! `first_token_timeout_ms` (streams), `idle_timeout_ms` and
//! `total_timeout_ms`; when one expires, report the error kind
//! `rw_attempt_timer_error` gives. A stop with `wait_ms >= 0` is "not yet":
//! sleep it and ask for the attempt again.
//!
//! Many models, many providers: `rw_engine_route_for_model` names the route
//! for a request's model; `rw_engine_reach` says how to reach the upstream
//! an attempt names (base URL, API family, wire model, key variable name).
//!
//! A relay's request: `rw_request_read` reads what the request it forwards
//! needs from any upstream (wire family, endpoint, model, capabilities,
//! sizes); `rw_call_spec.request` begins the call with those needs, so a
//! fallback never lands where the request cannot be served.

#![allow(non_camel_case_types)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

mod args;
pub mod call;
pub mod engine;
pub mod error;
pub mod names;
mod panic;
pub mod reach;
pub mod request;
mod spare;
pub mod stream;
pub mod timer;
pub mod transcript;
pub mod types;
pub mod vocab;

pub use call::*;
pub use engine::*;
pub use error::*;
pub use names::*;
pub use reach::*;
pub use request::*;
pub use stream::*;
pub use timer::*;
pub use transcript::*;
pub use types::*;
pub use vocab::*;

// The thread-safety contract in the header, checked: an engine is shared
// between threads, a call moves between them, an error and a request are
// read from any.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    const fn movable<T: Send>() {}
    shared::<rw_engine>();
    shared::<rw_error>();
    shared::<rw_request>();
    movable::<retrywise_core::Call>();
    movable::<rw_call>();
    movable::<rw_stream_gate>();
};
