//! # retrywise — one retry owner for model-API calls
//!
//! A synchronous, transport-agnostic decision engine. The caller performs the
//! I/O; retrywise decides, for every attempt, whether to stop, wait and retry,
//! fall back to another upstream, or reconcile an unknown result — and says
//! why with a stable reason code. It never sleeps and never reads a clock it
//! was not given.
//!
//! ```
//! use retrywise::{Action, CallSpec, Engine, Outcome, Policy};
//!
//! let engine = Engine::new(Policy::default()).unwrap();
//! let mut call = engine.begin(CallSpec::new("openai/gpt-4o").deadline_ms(10_000));
//! let mut statuses = vec![200, 503].into_iter().rev(); // a 503, then a 200
//! loop {
//!     let attempt = match call.next_attempt() {
//!         Ok(a) => a,
//!         Err(stopped) => panic!("gave up: {stopped}"),
//!     };
//!     // ... send the request with attempt.timeouts and attempt.headers() ...
//!     let status = statuses.next().unwrap();
//!     let decision = call.report(&Outcome::status(status));
//!     match decision.action {
//!         Action::Succeeded => break,
//!         Action::Retry | Action::Fallback => { /* sleep decision.delay */ }
//!         Action::Stop | Action::Reconcile => panic!("{:?}", decision.reason),
//!         Action::Wait => unreachable!("only while a hedge is in flight"),
//!     }
//! }
//! assert_eq!(call.attempts(), 2);
//! ```
//!
//! Where each decision lives (the map: `docs/architecture.md`): [`rules`]
//! (classify, deadline, route, wait; `rules/mod.rs` orders the checks after
//! a failure), the guards (breaker, budget, throttle, gates), [`policy`]
//! (every knob and its default), [`Call`] (one logical request) and
//! [`Engine`]; [`telemetry`] and [`stats`] say what happened; [`stream`]
//! reads a streamed answer's phase from its bytes, and [`wire`] moves a
//! request or a broken stream to another upstream (continuations spliced
//! in). This file holds only these docs and the re-exports.

#![deny(missing_docs)]
#![deny(unreachable_pub)]

pub mod bodies;
mod call;
pub mod clock;
pub mod engine;
mod few;
mod guards;
mod hash;
mod hot;
pub mod id;
pub mod idempotency;
pub mod name;
pub mod outcome;
pub mod policy;
pub mod rules;
mod state;
pub mod stats;
pub mod stream;
mod sync;
pub mod telemetry;
pub mod types;
pub mod wire;

/// The shared-state cells and the registry, for the crate's own tests,
/// benchmarks, loom models and examples: not part of the API.
#[doc(hidden)]
pub mod internals {
    pub use crate::guards::breaker::{Admit, BreakerCell, BreakerParams, Record, Transition};
    pub use crate::guards::budget::{BudgetCell, BudgetParams, Refusal};
    pub use crate::state::registry::{Registry, Slot};
}

pub use call::{Attempt, Call, CallSpec, Decision, HedgePlan, Stopped};
pub use clock::{Clock, ManualClock, SystemClock};
pub use engine::{Engine, EngineBuilder};
pub use guards::breaker::BreakerState;
pub use id::RequestId;
pub use name::IntoName;
pub use outcome::{json_media_type, vendor_code_from_body, Headers, Outcome};
pub use policy::{Format, Mode, OnFailure, Policy, PolicyError, PolicyErrors};
pub use rules::deadline::{AttemptTimeouts, Inbound, InboundError, Timer};
pub use rules::route::Needs;
pub use state::fleet;
pub use state::fleet::{Fleet, FleetConfig};
pub use state::ratelimit;
pub use state::ratelimit::{AdaptiveConcurrency, RateLimits};
pub use state::shared::ReconcileItem;
pub use stats::{FirstTokenStats, KeyStats, Stats};
pub use stream::StreamGate;
pub use telemetry::{AttemptId, Event, EventKind};
pub use types::{
    Action, ApiFamily, Continuation, EffectState, ErrorClass, ErrorKind, Idempotency, MalformedEvent, Phase, Reason,
    WaitSource,
};

/// The README's Rust quickstart, compiled and run as a doc test.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// Crate version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The crate version as a string.
pub fn version() -> &'static str {
    VERSION
}
