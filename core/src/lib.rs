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
//!     }
//! }
//! assert_eq!(call.attempts(), 2);
//! ```
//!
//! Modules, one concept each: [`classify`] (outcome → class), [`deadline`]
//! (timeouts, propagation), [`backoff`] (jitter, Retry-After), [`budget`],
//! [`breaker`], [`throttle`], [`gate`], [`fallback`] (capability matcher),
//! [`stream`] (a streamed answer's phase from its bytes),
//! [`policy`], [`engine`] (Engine and Call), [`telemetry`] and [`stats`].

#![deny(missing_docs)]

pub mod backoff;
pub mod breaker;
pub mod budget;
pub mod classify;
pub mod clock;
pub mod deadline;
pub mod engine;
pub mod fallback;
mod few;
pub mod gate;
pub mod id;
pub mod idempotency;
mod local;
pub mod name;
pub mod outcome;
pub mod policy;
pub mod ratelimit;
pub mod registry;
mod ring;
pub mod stats;
pub mod stream;
mod sync;
pub mod telemetry;
pub mod throttle;
pub mod types;
mod upstream;

pub use breaker::BreakerState;
pub use clock::{Clock, ManualClock, SystemClock};
pub use deadline::{AttemptTimeouts, Inbound, InboundError};
pub use engine::{Attempt, Call, CallSpec, Decision, Engine, EngineBuilder, HedgePlan, Mode, ReconcileItem, Stopped};
pub use fallback::Needs;
pub use id::RequestId;
pub use name::IntoName;
pub use outcome::{json_media_type, vendor_code_from_body, Headers, Outcome};
pub use policy::{Format, OnFailure, Policy, PolicyError, PolicyErrors};
pub use ratelimit::{AdaptiveConcurrency, RateLimits};
/// Inline small strings, used for upstream names, tenants, tasks and ids (re-exported for bindings).
pub use smol_str::SmolStr;
pub use stats::{KeyStats, Stats};
pub use stream::StreamGate;
pub use telemetry::{AttemptId, Event, EventKind};
pub use types::{Action, EffectState, ErrorClass, ErrorKind, Idempotency, Phase, Reason, WaitSource};

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
