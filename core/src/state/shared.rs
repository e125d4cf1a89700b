//! What every call of an engine reaches, across policy versions: the
//! clock, the seed, the kill switch, the registries of shared cells, the
//! counters, the event bus, the idempotency ledger and the reconcile list.

use crate::clock::EngineClock;
use crate::guards::breaker::BreakerCell;
use crate::guards::budget::BudgetCell;
use crate::guards::gate::{GateCell, PoolCell};
use crate::guards::throttle::ThrottleCell;
use crate::idempotency::Ledger;
use crate::policy::Mode;
use crate::state::first_token::FirstTokenCell;
use crate::state::fleet::Outbox;
use crate::state::ratelimit::RateLimits;
use crate::state::registry::Registry;
use crate::stats::{CounterSet, Counters, VersionTable};
use crate::telemetry::EventBus;
use crate::types::{ErrorClass, Reason};
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

/// State every call reaches, across policy versions: clock, registries, telemetry.
pub(crate) struct Shared {
    /// The engine's id for per-thread state ([`crate::hot`]).
    pub(crate) engine_id: u64,
    pub(crate) clock: EngineClock,
    pub(crate) seed: u64,
    pub(crate) id_prefix: u32,
    pub(crate) mode: AtomicU8,
    pub(crate) breakers: Registry<BreakerCell>,
    pub(crate) budgets: Registry<BudgetCell>,
    pub(crate) throttles: Registry<ThrottleCell>,
    pub(crate) gates: Registry<GateCell>,
    pub(crate) pools: Registry<PoolCell>,
    pub(crate) upstream_stats: Registry<CounterSet>,
    /// Each upstream's time to first token, learned (`timeouts.learn`).
    pub(crate) first_tokens: Registry<FirstTokenCell>,
    pub(crate) tenant_stats: Registry<Counters>,
    pub(crate) versions: VersionTable,
    pub(crate) bus: EventBus,
    pub(crate) ledger: Ledger,
    pub(crate) reconcile: Mutex<VecDeque<ReconcileItem>>,
    pub(crate) reconcile_dropped: AtomicU64,
    /// Provider rate limits by scope (`scope::rate_scope`), read from every response.
    pub(crate) ratelimits: Arc<RateLimits>,
    /// Calls may take the fast lane (off only in differential tests).
    pub(crate) lane: bool,
    /// Where breaker transitions go when a fleet is attached (`state/fleet/`).
    pub(crate) fleet: OnceLock<Arc<Outbox>>,
}

impl Shared {
    pub(crate) fn mode(&self) -> Mode {
        Mode::from_bits(self.mode.load(Ordering::Acquire))
    }
}

/// An item in the reconcile list: a call whose effect is unknown.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReconcileItem {
    /// Logical request id.
    pub logical_request_id: String,
    /// The attempt whose effect is unknown.
    pub attempt: u32,
    /// Upstream of that attempt.
    pub upstream: String,
    /// Business idempotency key, when the call had one.
    pub idempotency_key: Option<String>,
    /// Tenant.
    pub tenant: Option<String>,
    /// Error class of the failure.
    pub class: Option<ErrorClass>,
    /// Reason (`effect_unknown`, `effect_pending`).
    pub reason: Reason,
    /// Monotonic time, ms.
    pub at_ms: u64,
    /// Policy version the call ran under.
    pub policy_version: String,
}
