//! [`Engine`] (shared, `Send + Sync`, one per process) and [`Call`] (one
//! logical request): the decision loop every binding exposes.
//!
//! ```text
//! call = engine.begin(spec)
//! loop:
//!   a = call.next_attempt()?   // Attempt{number, upstream, timeouts, headers} or Stopped{reason}
//!   ... caller performs the I/O with a.timeouts and a.headers() ...
//!   d = call.report(&outcome)  // Decision{action, delay, class, reason}
//!   Succeeded → done; Retry/Fallback → sleep d.delay, loop; Stop/Reconcile → surface it
//! ```

use crate::backoff::{jitter_ms, parse_retry_after};
use crate::breaker::{Admit, BreakerCell, BreakerParams, BreakerState, Record, Transition};
use crate::budget::{BudgetCell, BudgetParams, Refusal};
use crate::classify::{Classifier, Disposition};
use crate::clock::{Clock, SystemClock};
use crate::deadline::{attempt_timeouts, outbound_headers, AttemptTimeouts, Inbound, TokenEstimate};
use crate::fallback::{match_candidates, Exclusion, MatchResult, Needs};
use crate::gate::{GateCell, PoolCell};
use crate::idempotency::Ledger;
use crate::outcome::Outcome;
use crate::policy::{
    BreakerOverride, FallbackMode, OnExceed, OnFailure, Policy, PolicyError, PolicyErrors, Route, ScopeDim,
};
use crate::registry::{Registry, Slot};
use crate::stats::{Counters, Ctr, Stats, Striped};
use crate::telemetry::{header_allowed, AttemptId, BreakerChange, Event, EventBus, EventKind, Sink};
use crate::throttle::{ThrottleCell, ThrottleParams};
use crate::types::{Action, ErrorClass, ErrorKind, Idempotency, Phase, Reason, WaitSource};
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;
use smallvec::SmallVec;
use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The kill switch: what the engine may do beyond a single attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Mode {
    /// Retries (and fallbacks) allowed.
    pub retries: bool,
    /// Fallback to other upstreams allowed.
    pub fallback: bool,
    /// Hedged attempts allowed.
    pub hedging: bool,
}

impl Default for Mode {
    fn default() -> Self {
        Mode {
            retries: true,
            fallback: true,
            hedging: true,
        }
    }
}

impl Mode {
    /// Parses a `RETRYWISE_DISABLE` value: a comma-separated list of
    /// `retries`, `fallback`, `hedging` or `all` (empty = nothing disabled).
    pub fn from_disable_list(list: &str) -> Result<Mode, PolicyError> {
        let mut m = Mode::default();
        for part in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match part.to_ascii_lowercase().as_str() {
                "retries" | "retry" => m.retries = false,
                "fallback" | "fallbacks" => m.fallback = false,
                "hedging" | "hedges" | "hedge" => m.hedging = false,
                "all" => {
                    m = Mode {
                        retries: false,
                        fallback: false,
                        hedging: false,
                    }
                }
                other => {
                    return Err(PolicyError {
                        path: "RETRYWISE_DISABLE".into(),
                        message: format!("unknown switch {other:?}; expected retries, fallback, hedging or all"),
                    })
                }
            }
        }
        Ok(m)
    }

    fn bits(self) -> u8 {
        self.retries as u8 | (self.fallback as u8) << 1 | (self.hedging as u8) << 2
    }

    fn from_bits(b: u8) -> Mode {
        Mode {
            retries: b & 1 != 0,
            fallback: b & 2 != 0,
            hedging: b & 4 != 0,
        }
    }
}

/// A policy compiled for the hot path.
#[derive(Debug)]
pub(crate) struct Compiled {
    pub(crate) policy: Policy,
    version: Arc<str>,
    classifier: Classifier,
    budget: BudgetParams,
    breaker: BreakerParams,
    throttle: ThrottleParams,
    /// The route of a call whose `route` names an upstream rather than a policy route.
    adhoc: Route,
    /// Counters of this policy version (shared by every policy with the same version string).
    counters: Arc<Slot<Counters>>,
}

impl Compiled {
    fn new(policy: Policy, versions: &Registry<Counters>) -> Self {
        Compiled {
            adhoc: Route {
                fallback: FallbackMode::Forbidden,
                attempts_per_upstream: policy.max_attempts,
                ..Route::default()
            },
            counters: versions.get_or_insert(&policy.version, 0, 64, u64::MAX, Counters::default),
            version: Arc::from(policy.version.as_str()),
            classifier: Classifier::new(&policy.classify, &policy.retry),
            budget: BudgetParams::new(&policy.budget),
            breaker: BreakerParams::new(&policy.breaker),
            throttle: ThrottleParams::new(&policy.throttle),
            policy,
        }
    }

    fn min_attempt(&self) -> Duration {
        Duration::from_millis(self.policy.min_attempt_ms)
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

struct Inner {
    policy: ArcSwap<Compiled>,
    clock: Arc<dyn Clock>,
    seed: u64,
    id_prefix: u32,
    next_seq: AtomicU64,
    mode: AtomicU8,
    breakers: Registry<BreakerCell>,
    budgets: Registry<BudgetCell>,
    throttles: Registry<ThrottleCell>,
    gates: Registry<GateCell>,
    pools: Registry<PoolCell>,
    upstream_stats: Registry<Counters>,
    tenant_stats: Registry<Counters>,
    version_stats: Registry<Counters>,
    stats: Striped,
    bus: EventBus,
    ledger: Ledger,
    reconcile: Mutex<VecDeque<ReconcileItem>>,
    reconcile_dropped: AtomicU64,
    /// Placeholder upstream name before a routed call is matched.
    empty: Arc<str>,
}

/// The retry owner: shared by every call in the process (`Clone` is cheap).
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

// A panic inside a decision (only possible through a bug or the test hook)
// leaves shared state consistent: locks do not poison, counters are atomic and
// the panicking call's own state is discarded with it. Bindings rely on this
// to keep an engine usable after turning a panic into an error.
impl std::panic::UnwindSafe for Engine {}
impl std::panic::RefUnwindSafe for Engine {}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("policy_version", &self.policy_version())
            .field("mode", &self.mode())
            .finish()
    }
}

/// Builds an [`Engine`] with an injected clock, seed and mode.
#[derive(Debug)]
pub struct EngineBuilder {
    policy: Policy,
    clock: Option<Arc<dyn Clock>>,
    seed: Option<u64>,
    mode: Option<Mode>,
    read_env: bool,
}

impl EngineBuilder {
    /// Uses this clock (e.g. a [`crate::ManualClock`]) instead of the system clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Seeds every random choice (jitter, breaker open jitter, throttling, ids), making decisions reproducible.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Starts in this mode (the environment's `RETRYWISE_DISABLE` is then ignored).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Whether to read `RETRYWISE_DISABLE` (default true).
    pub fn read_env(mut self, yes: bool) -> Self {
        self.read_env = yes;
        self
    }

    /// Validates the policy and builds the engine.
    pub fn build(self) -> Result<Engine, PolicyErrors> {
        self.policy.validate()?;
        let mode = match self.mode {
            Some(m) => m,
            None if self.read_env => match std::env::var("RETRYWISE_DISABLE") {
                Ok(v) => Mode::from_disable_list(&v).map_err(|e| PolicyErrors(vec![e]))?,
                Err(_) => Mode::default(),
            },
            None => Mode::default(),
        };
        let seed = match self.seed {
            Some(s) => s,
            None => {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0);
                splitmix(t ^ (std::process::id() as u64) << 32 ^ (&t as *const u64 as u64))
            }
        };
        let ring = self.policy.telemetry.ring_size;
        let version_stats = Registry::new();
        let compiled = Compiled::new(self.policy, &version_stats);
        Ok(Engine {
            inner: Arc::new(Inner {
                policy: ArcSwap::from_pointee(compiled),
                clock: self.clock.unwrap_or_else(|| Arc::new(SystemClock::new())),
                seed,
                id_prefix: (splitmix(seed) >> 32) as u32,
                next_seq: AtomicU64::new(0),
                mode: AtomicU8::new(mode.bits()),
                breakers: Registry::new(),
                budgets: Registry::new(),
                throttles: Registry::new(),
                gates: Registry::new(),
                pools: Registry::new(),
                upstream_stats: Registry::new(),
                tenant_stats: Registry::new(),
                version_stats,
                stats: Striped::default(),
                bus: EventBus::new(ring),
                ledger: Ledger::default(),
                reconcile: Mutex::new(VecDeque::new()),
                reconcile_dropped: AtomicU64::new(0),
                empty: Arc::from(""),
            }),
        })
    }
}

/// `prefix` and `seq` as 24 lower-case hex digits, without going through `format!`.
fn hex_id(prefix: u32, seq: u64) -> Arc<str> {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 24];
    let v = ((prefix as u128) << 64) | seq as u128;
    for (i, b) in buf.iter_mut().enumerate() {
        *b = D[((v >> (4 * (23 - i))) & 15) as usize];
    }
    Arc::from(std::str::from_utf8(&buf).unwrap_or("0"))
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// FNV-1a: a stable (process-independent) hash for per-key seeds.
fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What one logical request is, as given to [`Engine::begin`].
///
/// ```
/// use retrywise::{CallSpec, Idempotency};
/// let spec = CallSpec::new("openai/gpt-4o")
///     .deadline_ms(10_000)
///     .idempotency(Idempotency::Safe)
///     .tenant("acme");
/// # let _ = spec;
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallSpec {
    /// A route name from the policy, or an upstream name.
    pub route: String,
    /// End-to-end deadline from now; the policy's `deadline_ms` when absent.
    pub deadline: Option<Duration>,
    /// Whether repeating is safe. Default `Safe` (pure generation).
    pub idempotency: Idempotency,
    /// Tenant (budgets, gates, counters).
    pub tenant: Option<String>,
    /// Task (route lookup when `route` names none, eval scores, operation scope).
    pub task: Option<String>,
    /// Priority pool (e.g. `interactive`, `batch`).
    pub priority: Option<String>,
    /// Business idempotency key, carried unchanged on every attempt.
    pub idempotency_key: Option<String>,
    /// Digest of the normalized parameters ([`crate::idempotency::params_digest`]); a key reused with another digest is a conflict.
    pub params_digest: Option<String>,
    /// Propagation from an upstream owner (inbound headers or an enclosing call).
    pub inbound: Option<Inbound>,
    /// What any upstream must offer.
    pub needs: Needs,
}

impl CallSpec {
    /// A spec for `route` with every other field at its default.
    pub fn new(route: impl Into<String>) -> Self {
        CallSpec {
            route: route.into(),
            ..CallSpec::default()
        }
    }
    /// Sets the deadline.
    pub fn deadline(mut self, d: Duration) -> Self {
        self.deadline = Some(d);
        self
    }
    /// Sets the deadline in ms.
    pub fn deadline_ms(self, ms: u64) -> Self {
        self.deadline(Duration::from_millis(ms))
    }
    /// Sets the idempotency.
    pub fn idempotency(mut self, i: Idempotency) -> Self {
        self.idempotency = i;
        self
    }
    /// Sets the tenant.
    pub fn tenant(mut self, t: impl Into<String>) -> Self {
        self.tenant = Some(t.into());
        self
    }
    /// Sets the task.
    pub fn task(mut self, t: impl Into<String>) -> Self {
        self.task = Some(t.into());
        self
    }
    /// Sets the priority.
    pub fn priority(mut self, p: impl Into<String>) -> Self {
        self.priority = Some(p.into());
        self
    }
    /// Sets the idempotency key.
    pub fn idempotency_key(mut self, k: impl Into<String>) -> Self {
        self.idempotency_key = Some(k.into());
        self
    }
    /// Sets the parameter digest.
    pub fn params_digest(mut self, d: impl Into<String>) -> Self {
        self.params_digest = Some(d.into());
        self
    }
    /// Marks the call as running under an upstream owner.
    pub fn inbound(mut self, i: Inbound) -> Self {
        self.inbound = Some(i);
        self
    }
    /// Sets the needs.
    pub fn needs(mut self, n: Needs) -> Self {
        self.needs = n;
        self
    }
}

/// One physical attempt the caller should make now.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    /// 1-based attempt number (hedges and fallbacks included).
    pub number: u32,
    /// Upstream to call.
    pub upstream: Arc<str>,
    /// Timeouts for this attempt, clamped to the deadline.
    pub timeouts: AttemptTimeouts,
    /// Time left before the deadline when the attempt started.
    pub remaining: Duration,
    /// Logical request id.
    pub request_id: Arc<str>,
    /// Business idempotency key, unchanged across attempts.
    pub idempotency_key: Option<Arc<str>>,
    /// True for a hedged (parallel) attempt.
    pub hedge: bool,
    /// True when this attempt goes to another upstream than the first one.
    pub fallback: bool,
    margin: Duration,
    propagate: bool,
    /// Attempt number sent downstream: the owner's attempt number for a non-owner call.
    wire_number: u32,
}

impl Attempt {
    /// Outbound propagation headers (`retrywise-deadline-ms`, `retrywise-request-id`,
    /// `retrywise-attempt`, `idempotency-key`); empty when propagation is off.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        if !self.propagate {
            return match &self.idempotency_key {
                Some(k) => vec![(crate::deadline::H_IDEMPOTENCY_KEY, k.to_string())],
                None => Vec::new(),
            };
        }
        outbound_headers(
            self.remaining,
            self.margin,
            &self.request_id,
            self.wire_number,
            self.idempotency_key.as_deref(),
        )
    }

    /// What a call started inside this attempt (same process) inherits: the
    /// deadline, ids and key. Such a call is a non-owner: one attempt per outer attempt.
    pub fn inbound(&self) -> Inbound {
        Inbound {
            deadline: Some(self.remaining),
            request_id: Some(self.request_id.to_string()),
            attempt: Some(self.number),
            idempotency_key: self.idempotency_key.as_deref().map(str::to_string),
        }
    }
}

/// Why no attempt may start (from [`Call::next_attempt`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Stopped {
    /// Stable reason code.
    pub reason: Reason,
    /// Error class of the last failure, when any.
    pub class: Option<ErrorClass>,
    /// Route's instruction for failures.
    pub on_failure: Option<OnFailure>,
    /// Extra detail (refusing scope, conflicting digest, ...).
    pub detail: Option<String>,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stopped: {}", self.reason)?;
        if let Some(c) = self.class {
            write!(f, " (class {c})")?;
        }
        if let Some(d) = &self.detail {
            write!(f, ": {d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Stopped {}

/// What the caller must do after reporting an attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The action.
    pub action: Action,
    /// Wait before the next attempt (Retry / Fallback only).
    pub delay: Duration,
    /// Error class of the reported outcome (`None` on success).
    pub class: Option<ErrorClass>,
    /// Stable reason code.
    pub reason: Reason,
    /// Upstream of the next attempt (Retry / Fallback), or of the reported attempt otherwise.
    pub upstream: Option<Arc<str>>,
    /// Where the wait came from.
    pub wait_source: WaitSource,
    /// The server's wait hint, as evidence for an upstream owner.
    pub retry_after: Option<Duration>,
    /// Route's instruction for failures (`fail` or `manual_review`), on stops.
    pub on_failure: Option<OnFailure>,
    /// Extra detail: the refusing budget scope, an ignored Retry-After, ...
    pub detail: Option<String>,
    /// The reported attempt's number.
    pub attempt: u32,
    /// The reported attempt was a hedge.
    pub hedge: bool,
    /// Candidates the matcher excluded for a fallback, with why.
    pub excluded: Vec<(String, String)>,
}

impl Decision {
    /// True when the call is over (Succeeded, Stop, Reconcile).
    pub fn is_final(&self) -> bool {
        matches!(self.action, Action::Succeeded | Action::Stop | Action::Reconcile)
    }

    /// The delay in whole milliseconds.
    pub fn delay_ms(&self) -> u64 {
        ms(self.delay)
    }

    fn stopped(&self) -> Stopped {
        Stopped {
            reason: if self.action == Action::Succeeded {
                Reason::CallFinished
            } else {
                self.reason
            },
            class: self.class,
            on_failure: self.on_failure,
            detail: self.detail.clone(),
        }
    }
}

/// Whether and when a hedged attempt may start (from [`Call::next_hedge`]).
#[derive(Debug, Clone, PartialEq)]
pub enum HedgePlan {
    /// Start this parallel attempt now.
    Start(Attempt),
    /// Ask again after this long.
    After(Duration),
    /// No hedge for this call now.
    No(Reason),
}

/// Budget cells holding one granted retry each, released when its attempt is reported.
type BudgetHold = Vec<Arc<Slot<BudgetCell>>>;

struct InFlight {
    number: u32,
    upstream: Arc<str>,
    started: Duration,
    remaining_at_start: Duration,
    probe: bool,
    breaker: Option<(Arc<Slot<BreakerCell>>, Option<BreakerOverride>)>,
    gate: Option<Arc<Slot<GateCell>>>,
    pool: Option<Arc<Slot<PoolCell>>>,
    budget_hold: Vec<Arc<Slot<BudgetCell>>>,
    counters: Arc<Slot<Counters>>,
    retry: bool,
    hedge: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    First,
    Retry,
}

/// One logical request. Owned by one thread at a time (`Send`, not `Sync`).
pub struct Call {
    engine: Engine,
    pol: Arc<Compiled>,
    id: Arc<str>,
    route_key: Option<String>,
    tenant: Option<Arc<str>>,
    task: Option<Arc<str>>,
    priority: Option<Arc<str>>,
    idem: Idempotency,
    key: Option<Arc<str>>,
    needs: Needs,
    deadline_at: Duration,
    owner: bool,
    max_attempts: u32,
    attempts: u32,
    target: Arc<str>,
    first_upstream: Arc<str>,
    target_attempts: u32,
    tried: SmallVec<[Arc<str>; 2]>,
    next: Next,
    in_flight: SmallVec<[InFlight; 1]>,
    /// Counters of `target`, when already looked up.
    target_counters: Option<Arc<Slot<Counters>>>,
    retries: u32,
    prev_wait_ms: u64,
    rng: Pcg64Mcg,
    pending_hold: Vec<Arc<Slot<BudgetCell>>>,
    final_decision: Option<Decision>,
    conflict: Option<String>,
    tenant_counters: Option<Arc<Slot<Counters>>>,
    last_class: Option<ErrorClass>,
    fallback_pending: bool,
    /// The owner's attempt number, for a call running under an inbound owner.
    inbound_attempt: Option<u32>,
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("id", &self.id)
            .field("target", &self.target)
            .field("attempts", &self.attempts)
            .field("finished", &self.final_decision.is_some())
            .finish()
    }
}

impl Engine {
    /// An engine with the system clock, a random seed and `RETRYWISE_DISABLE` honoured.
    pub fn new(policy: Policy) -> Result<Engine, PolicyErrors> {
        Engine::builder(policy).build()
    }

    /// A builder (clock, seed, mode).
    pub fn builder(policy: Policy) -> EngineBuilder {
        EngineBuilder {
            policy,
            clock: None,
            seed: None,
            mode: None,
            read_env: true,
        }
    }

    fn now(&self) -> Duration {
        self.inner.clock.now()
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        self.inner.policy.load().policy.clone()
    }

    /// The version string of the policy in force.
    pub fn policy_version(&self) -> String {
        self.inner.policy.load().version.to_string()
    }

    /// The current kill-switch mode.
    pub fn mode(&self) -> Mode {
        Mode::from_bits(self.inner.mode.load(Ordering::Acquire))
    }

    /// Flips the kill switch; takes effect for every decision made after it, in-flight calls included.
    pub fn set_mode(&self, mode: Mode) {
        self.inner.mode.store(mode.bits(), Ordering::Release);
        let pol = self.inner.policy.load();
        if self.inner.bus.active() {
            let mut e = Event::new(EventKind::ModeChange, ms(self.now()), pol.version.clone());
            e.detail = Some(format!(
                "retries={} fallback={} hedging={}",
                mode.retries, mode.fallback, mode.hedging
            ));
            self.inner.bus.emit(e);
        }
    }

    /// Swaps the policy atomically. Calls already begun finish under the
    /// version they started with; an invalid policy leaves the old one in force.
    pub fn reload(&self, policy: Policy) -> Result<(), PolicyErrors> {
        policy.validate()?;
        let ring = policy.telemetry.ring_size;
        let compiled = Arc::new(Compiled::new(policy, &self.inner.version_stats));
        let version = compiled.version.clone();
        self.inner.policy.store(compiled);
        self.inner.bus.set_capacity(ring);
        if self.inner.bus.active() {
            self.inner
                .bus
                .emit(Event::new(EventKind::Reload, ms(self.now()), version));
        }
        Ok(())
    }

    /// Registers an event sink; returns an id for [`Engine::remove_sink`].
    /// Sinks run on the deciding thread, outside engine locks: keep them fast.
    pub fn on_event(&self, sink: Sink) -> u64 {
        self.inner.bus.add_sink(sink)
    }

    /// Removes a sink.
    pub fn remove_sink(&self, id: u64) -> bool {
        self.inner.bus.remove_sink(id)
    }

    /// The events in the ring buffer, oldest first.
    pub fn events(&self) -> Vec<Event> {
        self.inner.bus.snapshot()
    }

    /// Takes the events out of the ring buffer.
    pub fn drain_events(&self) -> Vec<Event> {
        self.inner.bus.drain()
    }

    /// Calls whose effect is unknown, oldest first.
    pub fn reconcile_list(&self) -> Vec<ReconcileItem> {
        self.inner.reconcile.lock().iter().cloned().collect()
    }

    /// Takes the reconcile list (the caller now owns reconciling them).
    pub fn drain_reconcile(&self) -> Vec<ReconcileItem> {
        self.inner.reconcile.lock().drain(..).collect()
    }

    /// The breaker state of an upstream (by upstream name), for dashboards and tests.
    pub fn breaker_state(&self, upstream: &str) -> BreakerState {
        let pol = self.inner.policy.load();
        let key = scope_key(&pol.policy.breaker.scope, upstream, &pol.policy, None, None, None);
        let ovr = breaker_override(&pol.policy, &key, upstream);
        if !pol.policy.breaker.enabled {
            return BreakerState::Disabled;
        }
        match self.inner.breakers.get(&key) {
            Some(cell) => cell.value.state(&pol.breaker, ovr, ms(self.now())),
            None => ovr.map_or(BreakerState::Closed, BreakerState::from),
        }
    }

    /// A snapshot of every counter.
    pub fn stats(&self) -> Stats {
        let i = &self.inner;
        let pol = i.policy.load();
        let now = ms(self.now());
        let collect = |r: &Registry<Counters>| {
            let mut m = BTreeMap::new();
            r.for_each(|s| {
                m.insert(s.key.to_string(), s.value.snapshot());
            });
            m
        };
        let mut tracked = BTreeMap::new();
        let mut evicted = BTreeMap::new();
        for (name, len, ev) in [
            ("breakers", i.breakers.len(), i.breakers.evicted()),
            ("budgets", i.budgets.len(), i.budgets.evicted()),
            ("throttles", i.throttles.len(), i.throttles.evicted()),
            ("gates", i.gates.len(), i.gates.evicted()),
            ("tenants", i.tenant_stats.len(), i.tenant_stats.evicted()),
            ("upstreams", i.upstream_stats.len(), i.upstream_stats.evicted()),
        ] {
            tracked.insert(name.to_string(), len as u64);
            evicted.insert(name.to_string(), ev);
        }
        tracked.insert("idempotency_keys".into(), i.ledger.len() as u64);
        // Overrides may name a breaker key or an upstream; report them under the breaker key.
        let overrides: BTreeMap<String, BreakerOverride> = pol
            .policy
            .breaker
            .overrides
            .iter()
            .map(|(name, o)| {
                (
                    scope_key(&pol.policy.breaker.scope, name, &pol.policy, None, None, None).into_owned(),
                    *o,
                )
            })
            .collect();
        let mut breakers: BTreeMap<String, String> = BTreeMap::new();
        i.breakers.for_each(|s| {
            let st = s.value.state(&pol.breaker, overrides.get(&*s.key).copied(), now);
            if st != BreakerState::Closed {
                breakers.insert(s.key.to_string(), st.as_str().to_string());
            }
        });
        if pol.policy.breaker.enabled {
            for (key, o) in &overrides {
                breakers
                    .entry(key.clone())
                    .or_insert_with(|| BreakerState::from(*o).as_str().to_string());
            }
        }
        Stats {
            policy_version: pol.version.to_string(),
            overall: i.stats.snapshot(),
            per_upstream: collect(&i.upstream_stats),
            per_tenant: collect(&i.tenant_stats),
            per_policy_version: collect(&i.version_stats),
            mode: self.mode(),
            events_dropped: i.bus.dropped(),
            sink_panics: i.bus.sink_panics(),
            tracked_keys: tracked,
            evicted_keys: evicted,
            reconcile_pending: i.reconcile.lock().len() as u64,
            reconcile_dropped: i.reconcile_dropped.load(Ordering::Relaxed),
            breakers,
        }
    }

    /// Prometheus text exposition of [`Engine::stats`].
    pub fn prometheus(&self) -> String {
        self.stats().prometheus()
    }

    /// Begins one logical request.
    pub fn begin(&self, spec: CallSpec) -> Call {
        let i = &self.inner;
        let pol = i.policy.load_full();
        let now = self.now();
        let now_ms = ms(now);
        let seq = i.next_seq.fetch_add(1, Ordering::Relaxed) + 1;
        let inbound = spec.inbound;
        let id: Arc<str> = match inbound.as_ref().and_then(|b| b.request_id.as_deref()) {
            Some(parent) => Arc::from(parent),
            None => hex_id(i.id_prefix, seq),
        };
        let mut deadline = spec.deadline.unwrap_or(Duration::from_millis(pol.policy.deadline_ms));
        if let Some(d) = inbound.as_ref().and_then(|b| b.deadline) {
            deadline = deadline.min(d);
        }
        let owner = inbound.is_none();
        let route_key = if pol.policy.routes.contains_key(&spec.route) {
            Some(spec.route.clone())
        } else {
            spec.task
                .as_ref()
                .filter(|t| spec.route.is_empty() && pol.policy.routes.contains_key(*t))
                .cloned()
        };
        let max_attempts = {
            let r = route_key.as_ref().and_then(|k| pol.policy.routes.get(k));
            let m = r.and_then(|r| r.max_attempts).unwrap_or(pol.policy.max_attempts);
            if owner {
                m
            } else {
                1
            }
        };
        let key = spec
            .idempotency_key
            .or_else(|| inbound.as_ref().and_then(|b| b.idempotency_key.clone()))
            .map(|k| Arc::from(k.as_str()));
        let conflict = match (&key, &spec.params_digest) {
            (Some(k), Some(d)) => i
                .ledger
                .check(
                    k,
                    d,
                    now_ms,
                    pol.policy.idempotency.ttl_ms,
                    pol.policy.idempotency.max_keys as usize,
                )
                .err()
                .map(|prev| format!("idempotency key {k} was used with parameters {prev}, now {d}")),
            _ => None,
        };
        // A call that names an upstream goes there; a routed call is matched below.
        let (target, target_counters) = if route_key.is_none() {
            let l = &pol.policy.limits;
            let slot = i
                .upstream_stats
                .get_or_insert(&spec.route, now_ms, l.max_keys, l.idle_ms, Counters::default);
            (slot.key.clone(), Some(slot))
        } else {
            (i.empty.clone(), None)
        };
        let tenant: Option<Arc<str>> = spec.tenant.as_deref().map(Arc::from);
        let max_keys = pol.policy.limits.max_keys;
        let idle = pol.policy.limits.idle_ms;
        let tenant_counters = tenant.as_ref().map(|t| {
            i.tenant_stats
                .get_or_insert(t, now_ms, max_keys, idle, Counters::default)
        });
        let mut call = Call {
            engine: self.clone(),
            id,
            route_key,
            tenant,
            task: spec.task.as_deref().map(Arc::from),
            priority: spec.priority.as_deref().map(Arc::from),
            idem: spec.idempotency,
            key,
            needs: spec.needs,
            deadline_at: now.saturating_add(deadline),
            owner,
            max_attempts,
            attempts: 0,
            first_upstream: target.clone(),
            target,
            target_attempts: 0,
            tried: SmallVec::new(),
            next: Next::First,
            in_flight: SmallVec::new(),
            target_counters,
            retries: 0,
            prev_wait_ms: 0,
            rng: Pcg64Mcg::seed_from_u64(splitmix(i.seed ^ splitmix(seq))),
            pending_hold: Vec::new(),
            final_decision: None,
            conflict,
            tenant_counters,
            last_class: None,
            fallback_pending: false,
            inbound_attempt: inbound.as_ref().and_then(|b| b.attempt),
            pol,
        };
        call.count(Ctr::Logical);
        if call.route_key.is_none() {
            return call;
        }
        // First target: the first eligible candidate (capabilities, boundary, cost, breaker).
        let m = call.match_now(&[], None);
        let target = m
            .eligible
            .first()
            .cloned()
            .or_else(|| call.route().candidates.first().cloned())
            .unwrap_or_default();
        call.target = Arc::from(target.as_str());
        call.first_upstream = call.target.clone();
        if call.engine.inner.bus.active() && !m.excluded.is_empty() {
            let mut e = call.event(EventKind::Fallback, now_ms);
            e.upstream = Some(call.target.clone());
            e.excluded = m.exclusion_strings();
            e.detail = Some("initial_selection".into());
            call.engine.inner.bus.emit(e);
        }
        call.fallback_pending = m.eligible.is_empty();
        call
    }
}

fn breaker_override(p: &Policy, key: &str, upstream: &str) -> Option<BreakerOverride> {
    if p.breaker.overrides.is_empty() {
        return None;
    }
    p.breaker
        .overrides
        .get(key)
        .or_else(|| p.breaker.overrides.get(upstream))
        .copied()
}

/// The scope key for `dims`: the upstream name itself when that is all the
/// scope needs (no allocation), otherwise the dimensions joined by `/`.
fn scope_key<'a>(
    dims: &[ScopeDim],
    upstream: &'a str,
    p: &Policy,
    tenant: Option<&str>,
    priority: Option<&str>,
    task: Option<&str>,
) -> Cow<'a, str> {
    if dims == [ScopeDim::Upstream] {
        return Cow::Borrowed(upstream);
    }
    let cat = p.upstreams.get(upstream);
    let upstream_only = dims.iter().all(|d| {
        matches!(
            d,
            ScopeDim::Provider | ScopeDim::Model | ScopeDim::Region | ScopeDim::Upstream
        )
    });
    if upstream_only && cat.map_or(true, |u| u.provider.is_empty() && u.model.is_empty()) {
        return Cow::Borrowed(upstream);
    }
    let mut parts: Vec<&str> = Vec::with_capacity(dims.len());
    for d in dims {
        let v = match d {
            ScopeDim::Global => "*",
            ScopeDim::Upstream => upstream,
            ScopeDim::Provider => cat
                .map(|u| u.provider.as_str())
                .filter(|s| !s.is_empty())
                .unwrap_or(upstream),
            ScopeDim::Model => cat.map(|u| u.model.as_str()).unwrap_or(""),
            ScopeDim::Region => cat.map(|u| u.region.as_str()).unwrap_or(""),
            ScopeDim::Tenant => tenant.unwrap_or("-"),
            ScopeDim::Priority => priority.unwrap_or("-"),
            ScopeDim::Operation => task.unwrap_or("-"),
        };
        if !v.is_empty() {
            parts.push(v);
        }
    }
    Cow::Owned(parts.join("/"))
}

impl Call {
    /// Logical request id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Physical attempts started so far (hedges and fallbacks included).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Time left before the deadline.
    pub fn remaining(&self) -> Duration {
        self.deadline_at.saturating_sub(self.engine.now())
    }

    /// True once a final decision was made.
    pub fn is_finished(&self) -> bool {
        self.final_decision.is_some()
    }

    /// The final decision, once the call is over.
    pub fn final_decision(&self) -> Option<&Decision> {
        self.final_decision.as_ref()
    }

    /// False when an upstream retrywise layer owns retries for this call.
    pub fn is_owner(&self) -> bool {
        self.owner
    }

    /// The policy version this call runs under.
    pub fn policy_version(&self) -> &str {
        &self.pol.version
    }

    /// The upstream the next attempt will go to.
    pub fn target(&self) -> &str {
        &self.target
    }

    fn route(&self) -> &Route {
        self.route_key
            .as_ref()
            .and_then(|k| self.pol.policy.routes.get(k))
            .unwrap_or(&self.pol.adhoc)
    }

    fn count(&self, c: Ctr) {
        self.engine.inner.stats.local().bump(c);
        self.pol.counters.value.bump(c);
        if let Some(t) = &self.tenant_counters {
            t.value.bump(c);
        }
    }

    fn count_stop(&self, r: Reason) {
        self.engine.inner.stats.local().stop(r);
        self.pol.counters.value.stop(r);
        if let Some(t) = &self.tenant_counters {
            t.value.stop(r);
        }
    }

    fn upstream_counters(&self, upstream: &str, now_ms: u64) -> Arc<Slot<Counters>> {
        let l = &self.pol.policy.limits;
        self.engine
            .inner
            .upstream_stats
            .get_or_insert(upstream, now_ms, l.max_keys, l.idle_ms, Counters::default)
    }

    fn event(&self, kind: EventKind, now_ms: u64) -> Event {
        let mut e = Event::new(kind, now_ms, self.pol.version.clone());
        e.logical_request_id = Some(self.id.clone());
        e.tenant = self.tenant.clone();
        e.task = self.task.clone();
        e.remaining_ms = Some(
            self.deadline_at
                .saturating_sub(Duration::from_millis(now_ms))
                .as_millis() as u64,
        );
        e
    }

    fn attempt_id(&self, n: u32) -> AttemptId {
        AttemptId {
            logical: self.id.clone(),
            attempt: n,
        }
    }

    /// The scope key of `dims` for this call's tenant, priority and task.
    fn scope<'a>(&self, dims: &[ScopeDim], upstream: &'a str) -> Cow<'a, str> {
        scope_key(
            dims,
            upstream,
            &self.pol.policy,
            self.tenant.as_deref(),
            self.priority.as_deref(),
            self.task.as_deref(),
        )
    }

    fn breaker_cell(&self, upstream: &str, now_ms: u64) -> Option<(Arc<Slot<BreakerCell>>, Option<BreakerOverride>)> {
        let p = &self.pol.policy;
        if !p.breaker.enabled {
            return None;
        }
        let key = self.scope(&p.breaker.scope, upstream);
        let ovr = breaker_override(p, &key, upstream);
        if ovr == Some(BreakerOverride::Disabled) {
            return None;
        }
        let engine_seed = self.engine.inner.seed;
        let params = &self.pol.breaker;
        let cell = self
            .engine
            .inner
            .breakers
            .get_or_insert(&key, now_ms, p.limits.max_keys, p.limits.idle_ms, || {
                BreakerCell::new(params.clone(), splitmix(engine_seed ^ fnv(&key)))
            });
        Some((cell, ovr))
    }

    fn is_open(&self, upstream: &str, now_ms: u64) -> bool {
        let p = &self.pol.policy;
        if !p.breaker.enabled {
            return false;
        }
        let key = self.scope(&p.breaker.scope, upstream);
        let ovr = breaker_override(p, &key, upstream);
        match ovr {
            Some(BreakerOverride::ForceOpen) => return true,
            Some(_) => return false,
            None => {}
        }
        match self.engine.inner.breakers.get(&key) {
            Some(c) => c.value.state(&self.pol.breaker, None, now_ms) == BreakerState::Open,
            None => false,
        }
    }

    fn match_now(&self, tried: &[&str], larger_than: Option<u64>) -> MatchResult {
        let route = self.route();
        let now_ms = ms(self.engine.now());
        let mut m = match_candidates(
            &self.pol.policy,
            route,
            self.task.as_deref(),
            &self.needs,
            tried,
            &|u| self.is_open(u, now_ms),
        );
        if let Some(min_ctx) = larger_than {
            let mut keep = Vec::new();
            for u in m.eligible.drain(..) {
                let ctx = self.pol.policy.upstreams.get(&u).and_then(|x| x.context_tokens);
                match ctx {
                    Some(c) if c > min_ctx => keep.push(u),
                    Some(c) => m.excluded.push((
                        u,
                        Exclusion::ContextTooSmall {
                            have: c,
                            need: min_ctx + 1,
                        },
                    )),
                    None => m.excluded.push((
                        u,
                        Exclusion::ContextTooSmall {
                            have: 0,
                            need: min_ctx + 1,
                        },
                    )),
                }
            }
            m.eligible = keep;
        }
        m
    }

    fn finish(&mut self, d: Decision) -> Decision {
        match d.action {
            Action::Succeeded => {}
            Action::Reconcile => {
                self.count(Ctr::Reconciles);
                self.count_stop(d.reason);
            }
            _ => self.count_stop(d.reason),
        }
        for b in self.pending_hold.drain(..) {
            b.value.release(&self.pol.budget);
        }
        if self.engine.inner.bus.active() {
            let now_ms = ms(self.engine.now());
            let mut e = self.event(EventKind::Decision, now_ms);
            e.action = Some(d.action);
            e.reason = Some(d.reason);
            e.error_class = d.class;
            e.upstream = d.upstream.clone();
            e.attempt = Some(d.attempt).filter(|n| *n > 0);
            e.attempt_id = e.attempt.map(|n| self.attempt_id(n));
            e.resend_count = e.attempt.map(|n| n.saturating_sub(1));
            e.delay_ms = Some(0);
            e.wait_source = Some(WaitSource::None);
            e.detail = d.detail.clone();
            e.hedge = d.hedge;
            e.excluded = d.excluded.clone();
            self.engine.inner.bus.emit(e);
        }
        self.final_decision = Some(d.clone());
        d
    }

    fn stop_decision(&self, reason: Reason, class: Option<ErrorClass>, attempt: u32) -> Decision {
        Decision {
            action: Action::Stop,
            delay: Duration::ZERO,
            class,
            reason,
            upstream: Some(self.target.clone()),
            wait_source: WaitSource::None,
            retry_after: None,
            on_failure: Some(self.route().on_failure),
            detail: None,
            attempt,
            hedge: false,
            excluded: Vec::new(),
        }
    }

    fn stop_now(&mut self, reason: Reason, detail: Option<String>) -> Stopped {
        let mut d = self.stop_decision(reason, self.last_class, self.attempts);
        d.detail = detail;
        if reason == Reason::DeadlineExceeded && d.class.is_none() {
            d.class = Some(ErrorClass::DeadlineExceeded);
        }
        self.finish(d).stopped()
    }

    /// The next attempt to make, or why none may start. Checks, in order: the
    /// call is not finished; an idempotency conflict; the deadline minus
    /// `min_attempt`; attempts left; adaptive throttling; the target's breaker
    /// (moving to an eligible fallback when it is open); concurrency gates.
    pub fn next_attempt(&mut self) -> Result<Attempt, Stopped> {
        if let Some(d) = &self.final_decision {
            return Err(d.stopped());
        }
        // Parallel attempts start only through `next_hedge`: after a failure with a
        // sibling still in flight, the caller waits for the sibling.
        if !self.in_flight.is_empty() {
            return Err(Stopped {
                reason: Reason::InvalidState,
                class: None,
                on_failure: None,
                detail: Some("an attempt is still in flight: report it first".into()),
            });
        }
        if let Some(c) = self.conflict.take() {
            return Err(self.stop_now(Reason::IdempotencyConflict, Some(c)));
        }
        let now = self.engine.now();
        let remaining = self.deadline_at.saturating_sub(now);
        if remaining < self.pol.min_attempt() || remaining.is_zero() {
            return Err(self.stop_now(
                Reason::DeadlineExceeded,
                Some(format!(
                    "{} ms left, min_attempt is {} ms",
                    ms(remaining),
                    self.pol.policy.min_attempt_ms
                )),
            ));
        }
        if self.attempts >= self.max_attempts {
            return Err(self.stop_now(Reason::MaxAttempts, None));
        }
        if self.fallback_pending {
            self.fallback_pending = false;
            let m = self.match_now(&[], None);
            if m.eligible.is_empty() {
                let all_open = !m.excluded.is_empty() && m.excluded.iter().all(|(_, e)| *e == Exclusion::BreakerOpen);
                let reason = if all_open {
                    Reason::BreakerOpen
                } else {
                    Reason::NoEligibleUpstream
                };
                let excluded = m.exclusion_strings();
                let mut d = self.stop_decision(reason, self.last_class, self.attempts);
                d.excluded = excluded;
                return Err(self.finish(d).stopped());
            }
        }
        let retry = self.next == Next::Retry;
        let target = self.target.clone();
        self.admit(target, retry, false, now, remaining)
    }

    /// Throttle, breaker (with fallback when open), gates; then starts the attempt.
    fn admit(
        &mut self,
        mut target: Arc<str>,
        retry: bool,
        hedge: bool,
        now: Duration,
        remaining: Duration,
    ) -> Result<Attempt, Stopped> {
        let now_ms = ms(now);
        let pol = self.pol.clone();
        let p = &pol.policy;
        if p.throttle.enabled {
            let key = self.scope(&p.throttle.scope, &target).into_owned();
            let params = self.pol.throttle;
            let cell =
                self.engine
                    .inner
                    .throttles
                    .get_or_insert(&key, now_ms, p.limits.max_keys, p.limits.idle_ms, || {
                        ThrottleCell::new(params)
                    });
            let draw: f64 = self.rng.gen();
            if let Err(prob) = cell.value.admit(&params, now_ms, draw) {
                self.count(Ctr::Throttled);
                if hedge {
                    return Err(Stopped {
                        reason: Reason::Throttled,
                        class: None,
                        on_failure: None,
                        detail: None,
                    });
                }
                return Err(self.stop_now(Reason::Throttled, Some(format!("p_reject={prob:.3}"))));
            }
        }
        let mut breaker = self.breaker_cell(&target, now_ms);
        let mut probe = false;
        if let Some((cell, ovr)) = &breaker {
            let (admit, t) = cell.value.acquire(&self.pol.breaker, *ovr, now_ms);
            self.on_transition(&cell.key, t, now_ms);
            match admit {
                Admit::Allowed { probe: pr } => probe = pr,
                Admit::Rejected { retry_in_ms } => {
                    if hedge {
                        return Err(Stopped {
                            reason: Reason::BreakerOpen,
                            class: None,
                            on_failure: None,
                            detail: None,
                        });
                    }
                    // Open breaker: move to the next eligible candidate, if the route and mode allow.
                    let tried: Vec<&str> = self
                        .tried
                        .iter()
                        .map(|s| &**s)
                        .chain(std::iter::once(&*target))
                        .collect();
                    let m = self.match_now(&tried, None);
                    let alt = if self.fallback_allowed() {
                        m.eligible.first().cloned()
                    } else {
                        None
                    };
                    match alt {
                        Some(u) => {
                            let u: Arc<str> = Arc::from(u.as_str());
                            let b2 = self.breaker_cell(&u, now_ms);
                            let mut ok = true;
                            if let Some((c2, o2)) = &b2 {
                                let (a2, t2) = c2.value.acquire(&self.pol.breaker, *o2, now_ms);
                                self.on_transition(&c2.key, t2, now_ms);
                                match a2 {
                                    Admit::Allowed { probe: pr } => probe = pr,
                                    Admit::Rejected { .. } => ok = false,
                                }
                            }
                            if !ok {
                                return Err(self
                                    .stop_now(Reason::BreakerOpen, Some(format!("{target} and {u} refuse traffic"))));
                            }
                            self.count(Ctr::Fallbacks);
                            if self.engine.inner.bus.active() {
                                let mut e = self.event(EventKind::Fallback, now_ms);
                                e.upstream = Some(u.clone());
                                e.reason = Some(Reason::BreakerOpen);
                                e.excluded = m.exclusion_strings();
                                self.engine.inner.bus.emit(e);
                            }
                            self.switch_target(u.clone());
                            target = u;
                            breaker = b2;
                        }
                        None => {
                            let mut d = self.stop_decision(Reason::BreakerOpen, self.last_class, self.attempts);
                            d.detail = Some(format!("breaker {} open for {retry_in_ms} ms more", cell.key));
                            d.excluded = m.exclusion_strings();
                            return Err(self.finish(d).stopped());
                        }
                    }
                }
            }
        }
        // Concurrency gates: per scope (first attempts and retries apart) and per priority pool.
        let c = &p.concurrency;
        let mut gate = None;
        if c.max_first_attempts.is_some() || c.max_retries.is_some() {
            let key = self.scope(&c.scope, &target).into_owned();
            let cell = self.engine.inner.gates.get_or_insert(
                &key,
                now_ms,
                p.limits.max_keys,
                p.limits.idle_ms,
                GateCell::default,
            );
            let limit = if retry { c.max_retries } else { c.max_first_attempts };
            if !cell.value.try_enter(retry, limit) {
                if let Some((b, _)) = &breaker {
                    b.value.release(&self.pol.breaker, probe);
                }
                return Err(self.gate_refusal(hedge, format!("scope {key}")));
            }
            gate = Some(cell);
        }
        let mut pool = None;
        if !c.pools.is_empty() {
            let name = self.priority.as_deref().unwrap_or("default");
            if let Some(limit) = c.pools.get(name) {
                let cell = self
                    .engine
                    .inner
                    .pools
                    .get_or_insert(name, now_ms, 1_024, u64::MAX, PoolCell::default);
                if !cell.value.try_enter(*limit) {
                    if let Some((b, _)) = &breaker {
                        b.value.release(&self.pol.breaker, probe);
                    }
                    if let Some(g) = &gate {
                        g.value.leave(retry);
                    }
                    return Err(self.gate_refusal(hedge, format!("pool {name}")));
                }
                pool = Some(cell);
            }
        }
        // The budget counts requests: one per first attempt, in every scope of the call.
        if !retry && !hedge && p.budget.enabled {
            for dims in &p.budget.scopes {
                let key = self.scope(dims, &target);
                let params = self.pol.budget;
                let cell =
                    self.engine
                        .inner
                        .budgets
                        .get_or_insert(&key, now_ms, p.limits.max_keys, p.limits.idle_ms, || {
                            BudgetCell::new(params)
                        });
                cell.value.deposit(&params, now_ms);
            }
        }
        self.attempts += 1;
        self.target_attempts += 1;
        if !self.tried.contains(&target) {
            self.tried.push(target.clone());
        }
        let number = self.attempts;
        let counters = match self.target_counters.take() {
            Some(c) if *c.key == *target => c,
            _ => self.upstream_counters(&target, now_ms),
        };
        self.count(Ctr::Attempts);
        counters.value.bump(Ctr::Attempts);
        if number == 1 {
            counters.value.bump(Ctr::Logical);
        }
        let tokens = TokenEstimate {
            input: self.needs.input_tokens,
            max_output: self.needs.max_output_tokens,
        };
        let timeouts = attempt_timeouts(&p.timeouts, remaining, tokens);
        let budget_hold = if hedge {
            Vec::new()
        } else {
            std::mem::take(&mut self.pending_hold)
        };
        self.in_flight.push(InFlight {
            number,
            upstream: target.clone(),
            started: now,
            remaining_at_start: remaining,
            probe,
            breaker,
            gate,
            pool,
            budget_hold,
            counters,
            retry,
            hedge,
        });
        if self.engine.inner.bus.active() {
            let mut e = self.event(
                if hedge {
                    EventKind::Hedge
                } else {
                    EventKind::AttemptStart
                },
                now_ms,
            );
            e.attempt = Some(number);
            e.attempt_id = Some(self.attempt_id(number));
            e.parent_attempt_id = (number > 1).then(|| self.attempt_id(number - 1));
            e.resend_count = Some(number - 1);
            e.upstream = Some(target.clone());
            e.hedge = hedge;
            self.engine.inner.bus.emit(e);
        }
        Ok(Attempt {
            number,
            fallback: *target != *self.first_upstream,
            upstream: target,
            timeouts,
            remaining,
            request_id: self.id.clone(),
            idempotency_key: self.key.clone(),
            hedge,
            margin: Duration::from_millis(p.propagation.safety_margin_ms),
            propagate: p.propagation.enabled,
            wire_number: self.inbound_attempt.unwrap_or(number),
        })
    }

    fn gate_refusal(&mut self, hedge: bool, detail: String) -> Stopped {
        if hedge {
            return Stopped {
                reason: Reason::ConcurrencyLimit,
                class: None,
                on_failure: None,
                detail: Some(detail),
            };
        }
        self.stop_now(Reason::ConcurrencyLimit, Some(detail))
    }

    fn switch_target(&mut self, u: Arc<str>) {
        if *u != *self.target {
            self.target = u;
            self.target_attempts = 0;
        }
    }

    fn on_transition(&self, key: &str, t: Option<Transition>, now_ms: u64) {
        let Some(t) = t else { return };
        if t.to == BreakerState::Open {
            self.count(Ctr::BreakerOpens);
        }
        if self.engine.inner.bus.active() {
            let mut e = self.event(EventKind::BreakerTransition, now_ms);
            e.breaker = Some(BreakerChange {
                key: key.to_string(),
                from: t.from.as_str(),
                to: t.to.as_str(),
                reason: t.reason,
                open_for_ms: t.open_for_ms,
            });
            self.engine.inner.bus.emit(e);
        }
    }

    fn hedging_allowed(&self) -> bool {
        self.route().hedge_after_ms.is_some()
            && self.idem != Idempotency::Unsafe
            && self.owner
            && self.engine.mode().hedging
    }

    fn fallback_allowed(&self) -> bool {
        self.route().fallback == FallbackMode::Allowed && self.engine.mode().fallback && self.owner
    }

    /// Reports the outcome of the most recent attempt in flight.
    pub fn report(&mut self, outcome: &Outcome) -> Decision {
        let n = self.in_flight.last().map(|f| f.number).unwrap_or(0);
        self.report_attempt(n, outcome)
    }

    /// Reports the outcome of attempt `number` (needed only with hedging, when
    /// two attempts are in flight). The decision is final once the call
    /// succeeded, stopped or must reconcile; later reports of sibling attempts
    /// return that final decision.
    pub fn report_attempt(&mut self, number: u32, outcome: &Outcome) -> Decision {
        if let Some(hook) = &self.pol.policy.testing.panic_on_vendor_code {
            if outcome.vendor_code.as_deref() == Some(hook.as_str()) {
                panic!("retrywise test hook: forced panic inside a decision");
            }
        }
        let Some(pos) = self.in_flight.iter().position(|f| f.number == number) else {
            if let Some(d) = &self.final_decision {
                return d.clone();
            }
            let mut d = self.stop_decision(Reason::InvalidState, None, number);
            d.detail = Some(format!("attempt {number} is not in flight"));
            d.on_failure = None;
            return d;
        };
        let f = self.in_flight.remove(pos);
        let now = self.engine.now();
        let now_ms = ms(now);
        let elapsed_ms = ms(now.saturating_sub(f.started));
        if let Some(g) = &f.gate {
            g.value.leave(f.retry);
        }
        if let Some(pl) = &f.pool {
            pl.value.leave();
        }
        for b in &f.budget_hold {
            b.value.release(&self.pol.budget);
        }
        let cls = self.pol.classifier.classify(outcome, self.idem);
        self.last_class = cls.class;
        // Breaker, throttle and per-upstream counters see every attempt.
        if let Some((cell, ovr)) = &f.breaker {
            let rec = match (cls.disposition, cls.class) {
                (Disposition::Succeeded, _) => Record::Success,
                (_, Some(c)) if self.pol.breaker.counts(c) => Record::Failure,
                _ => Record::Ignored,
            };
            let t = cell.value.record(
                &self.pol.breaker,
                *ovr,
                now_ms,
                f.probe,
                rec,
                self.pol.breaker.is_slow(elapsed_ms),
            );
            self.on_transition(&cell.key, t, now_ms);
        }
        if self.pol.policy.throttle.enabled
            && !matches!(
                cls.class,
                Some(ErrorClass::RateLimit | ErrorClass::Overloaded | ErrorClass::Transient)
            )
        {
            let p = &self.pol.policy;
            let key = self.scope(&p.throttle.scope, &f.upstream);
            if let Some(cell) = self.engine.inner.throttles.get(&key) {
                cell.value.accepted(now_ms);
            }
        }
        let hint = if self.pol.policy.retry_after.enabled {
            parse_retry_after(&outcome.headers, self.engine.inner.clock.wall())
        } else {
            Default::default()
        };
        if self.engine.inner.bus.active() {
            let mut e = self.event(EventKind::AttemptEnd, now_ms);
            e.attempt = Some(f.number);
            e.attempt_id = Some(self.attempt_id(f.number));
            e.resend_count = Some(f.number - 1);
            e.upstream = Some(f.upstream.clone());
            e.error_class = cls.class;
            e.reason = Some(cls.reason);
            e.phase = if cls.class.is_some() { Some(cls.phase) } else { None };
            e.status = outcome.status;
            e.error_kind = outcome.error;
            e.hedge = f.hedge;
            e.remaining_ms = Some(ms(f.remaining_at_start));
            e.delay_ms = Some(elapsed_ms);
            let allow = &self.pol.policy.telemetry.header_allowlist;
            e.headers = outcome
                .headers
                .iter()
                .filter(|(k, _)| header_allowed(k, allow))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            self.engine.inner.bus.emit(e);
        }
        if let Some(d) = &self.final_decision {
            // A sibling already ended the call (hedging).
            return d.clone();
        }
        let base = Decision {
            action: Action::Stop,
            delay: Duration::ZERO,
            class: cls.class,
            reason: cls.reason,
            upstream: Some(f.upstream.clone()),
            wait_source: WaitSource::None,
            retry_after: hint.wait,
            on_failure: Some(self.route().on_failure),
            detail: hint.problem.map(|p| p.as_str().to_string()),
            attempt: f.number,
            hedge: f.hedge,
            excluded: Vec::new(),
        };
        match cls.disposition {
            Disposition::Succeeded => {
                self.count(Ctr::Successes);
                f.counters.value.bump(Ctr::Successes);
                if f.number == 1 {
                    self.count(Ctr::FirstSuccesses);
                    f.counters.value.bump(Ctr::FirstSuccesses);
                } else {
                    self.count(Ctr::RetrySuccesses);
                    f.counters.value.bump(Ctr::RetrySuccesses);
                }
                let d = Decision {
                    action: Action::Succeeded,
                    on_failure: None,
                    detail: None,
                    retry_after: None,
                    ..base
                };
                self.finish(d)
            }
            Disposition::Reconcile => {
                let d = Decision {
                    action: Action::Reconcile,
                    ..base
                };
                self.push_reconcile(&d, &f, now_ms);
                self.finish(d)
            }
            Disposition::Stop => {
                let switch = if cls.larger_context {
                    let real = outcome.input_tokens.or(self.needs.input_tokens);
                    if let Some(n) = outcome.input_tokens {
                        self.needs.input_tokens = Some(n);
                    }
                    let cur_ctx = self
                        .pol
                        .policy
                        .upstreams
                        .get(&*f.upstream)
                        .and_then(|u| u.context_tokens);
                    let floor = match (real, cur_ctx) {
                        (Some(r), _) => Some(
                            r.saturating_add(self.needs.max_output_tokens.unwrap_or(0))
                                .saturating_sub(1),
                        ),
                        (None, Some(c)) => Some(c),
                        (None, None) => None,
                    };
                    Some(floor)
                } else if cls.class == Some(ErrorClass::PartialStream)
                    && !self.route().forbid_after_stream_started
                    && self.idem == Idempotency::Safe
                    && self.route_key.is_some()
                {
                    Some(None)
                } else {
                    None
                };
                match switch {
                    Some(larger_than) if self.fallback_allowed() && self.engine.mode().retries => {
                        self.continue_call(base, &f, now, true, larger_than, &hint)
                    }
                    _ => self.finish(base),
                }
            }
            Disposition::Retryable => self.continue_call(base, &f, now, false, None, &hint),
        }
    }

    /// Takes one retry from every budget scope `target` belongs to. On a
    /// refusal, earlier grants are refunded, the refusal is counted, and the
    /// refusing scope key is returned. Retries and hedges share this path.
    fn withdraw_budget(&self, target: &str, now_ms: u64) -> Result<BudgetHold, (Refusal, Arc<str>)> {
        let p = &self.pol.policy;
        let mut held: Vec<Arc<Slot<BudgetCell>>> = Vec::new();
        if !p.budget.enabled {
            return Ok(held);
        }
        let params = self.pol.budget;
        for dims in &p.budget.scopes {
            let key = self.scope(dims, target);
            let cell =
                self.engine
                    .inner
                    .budgets
                    .get_or_insert(&key, now_ms, p.limits.max_keys, p.limits.idle_ms, || {
                        BudgetCell::new(params)
                    });
            if let Err(r) = cell.value.try_withdraw(&params, now_ms) {
                for h in &held {
                    h.value.refund(&params, now_ms);
                }
                self.count(Ctr::BudgetRefusals);
                return Err((r, cell.key.clone()));
            }
            held.push(cell);
        }
        Ok(held)
    }

    fn push_reconcile(&self, d: &Decision, f: &InFlight, now_ms: u64) {
        let item = ReconcileItem {
            logical_request_id: self.id.to_string(),
            attempt: f.number,
            upstream: f.upstream.to_string(),
            idempotency_key: self.key.as_deref().map(str::to_string),
            tenant: self.tenant.as_deref().map(str::to_string),
            class: d.class,
            reason: d.reason,
            at_ms: now_ms,
            policy_version: self.pol.version.to_string(),
        };
        let cap = self.pol.policy.limits.max_keys as usize;
        let mut q = self.engine.inner.reconcile.lock();
        if q.len() >= cap {
            q.pop_front();
            self.engine.inner.reconcile_dropped.fetch_add(1, Ordering::Relaxed);
        }
        q.push_back(item);
    }

    /// Steps 3–6 of the order of checks: kill switch and ownership, attempts
    /// left, deadline, route, budget, wait.
    fn continue_call(
        &mut self,
        base: Decision,
        f: &InFlight,
        now: Duration,
        force_switch: bool,
        larger_than: Option<u64>,
        hint: &crate::backoff::RetryHint,
    ) -> Decision {
        let now_ms = ms(now);
        let stop = |s: &mut Self, reason: Reason, detail: Option<String>| {
            let mut d = base.clone();
            d.action = Action::Stop;
            d.reason = reason;
            if detail.is_some() {
                d.detail = detail;
            }
            s.finish(d)
        };
        if !self.engine.mode().retries {
            return stop(self, Reason::RetriesDisabled, None);
        }
        if !self.owner {
            return stop(
                self,
                Reason::NotOwner,
                Some(format!("upstream owner decides; evidence: {}", base.reason)),
            );
        }
        if !self.in_flight.is_empty() {
            // A sibling (hedge) is still running: let it finish rather than add load.
            let mut d = base.clone();
            d.action = Action::Retry;
            d.upstream = Some(self.target.clone());
            d.detail = Some("sibling attempt in flight".into());
            self.next = Next::Retry;
            return d;
        }
        if self.attempts >= self.max_attempts {
            return stop(self, Reason::MaxAttempts, None);
        }
        let remaining = self.deadline_at.saturating_sub(now);
        let min_attempt = self.pol.min_attempt();
        if remaining < min_attempt || remaining.is_zero() {
            return stop(
                self,
                Reason::DeadlineExceeded,
                Some(format!(
                    "{} ms left, min_attempt is {} ms",
                    ms(remaining),
                    self.pol.policy.min_attempt_ms
                )),
            );
        }
        let room = remaining - min_attempt;

        // Route: same upstream while it has attempts left and its breaker is not open; otherwise the next eligible candidate.
        let route = self.route().clone();
        let per_upstream_cap = if route.fallback == FallbackMode::Forbidden {
            self.max_attempts
        } else {
            route.attempts_per_upstream
        };
        let same_ok = !force_switch && self.target_attempts < per_upstream_cap && !self.is_open(&f.upstream, now_ms);
        let mut excluded = Vec::new();
        let (target, is_fallback) = if same_ok {
            (f.upstream.clone(), false)
        } else {
            let tried: Vec<&str> = self.tried.iter().map(|s| &**s).collect();
            let m = self.match_now(&tried, larger_than);
            excluded = m.exclusion_strings();
            let distinct = self.tried.len() as u32;
            let max_up = route.max_upstreams.unwrap_or(u32::MAX);
            let current_open = self.is_open(&f.upstream, now_ms);
            if route.fallback == FallbackMode::Forbidden || self.route_key.is_none() {
                // Only one upstream is allowed; it has attempts left, so it is refused by its breaker or the failure demands another upstream.
                let reason = if force_switch {
                    base.reason
                } else if current_open {
                    Reason::BreakerOpen
                } else {
                    Reason::FallbackForbidden
                };
                let mut d = base.clone();
                d.action = Action::Stop;
                d.reason = reason;
                d.excluded = excluded;
                return self.finish(d);
            }
            if !self.engine.mode().fallback {
                let mut d = base.clone();
                d.action = Action::Stop;
                d.reason = if force_switch {
                    base.reason
                } else if current_open {
                    Reason::BreakerOpen
                } else {
                    Reason::FallbackForbidden
                };
                d.detail = Some("fallback switched off (kill switch)".into());
                return self.finish(d);
            }
            if distinct >= max_up {
                let mut d = base.clone();
                d.action = Action::Stop;
                d.reason = Reason::MaxUpstreams;
                d.excluded = excluded;
                return self.finish(d);
            }
            match m.eligible.first() {
                Some(u) => (Arc::from(u.as_str()), true),
                None => {
                    let mut d = base.clone();
                    d.action = Action::Stop;
                    d.reason = if force_switch {
                        base.reason
                    } else {
                        Reason::NoEligibleUpstream
                    };
                    d.excluded = excluded;
                    return self.finish(d);
                }
            }
        };

        // Budget: every scope of the target must grant.
        let held = match self.withdraw_budget(&target, now_ms) {
            Ok(held) => held,
            Err((r, key)) => {
                let reason = match r {
                    Refusal::Exhausted => Reason::BudgetExhausted,
                    Refusal::Concurrency => Reason::RetryConcurrency,
                };
                let detail = format!("scope {key}");
                if self.engine.inner.bus.active() {
                    let mut e = self.event(EventKind::BudgetRefusal, now_ms);
                    e.upstream = Some(target.clone());
                    e.reason = Some(reason);
                    e.detail = Some(detail.clone());
                    e.attempt = Some(f.number);
                    e.attempt_id = Some(self.attempt_id(f.number));
                    self.engine.inner.bus.emit(e);
                }
                return stop(self, reason, Some(detail));
            }
        };
        let refund = |s: &Self, held: &[Arc<Slot<BudgetCell>>]| {
            for h in held {
                h.value.refund(&s.pol.budget, now_ms);
            }
        };

        // Wait: a valid, capped Retry-After wins over jitter and must fit the deadline.
        let ra = &self.pol.policy.retry_after;
        let (delay, source) = match hint.wait {
            Some(w) => {
                let max = Duration::from_millis(ra.max_ms);
                let mut w = w;
                if w > max && ra.on_exceed == OnExceed::Cap {
                    w = max;
                }
                // The user's deadline comes first: a hint that cannot fit stops at once.
                if w > room {
                    refund(self, &held);
                    return stop(
                        self,
                        Reason::RetryAfterExceedsDeadline,
                        Some(format!(
                            "retry-after {} ms, {} ms usable before the deadline",
                            ms(w),
                            ms(room)
                        )),
                    );
                }
                if w > max {
                    refund(self, &held);
                    return stop(
                        self,
                        Reason::RetryAfterTooLarge,
                        Some(format!("retry-after {} ms > max {} ms", ms(w), ra.max_ms)),
                    );
                }
                if ra.jitter_ms > 0 {
                    let extra = Duration::from_millis(self.rng.gen_range(0..=ra.jitter_ms));
                    w = (w + extra).min(room);
                }
                (w, WaitSource::RetryAfter)
            }
            None => {
                let j = jitter_ms(&self.pol.policy.backoff, self.retries, self.prev_wait_ms, &mut self.rng);
                (Duration::from_millis(j).min(room), WaitSource::Jitter)
            }
        };
        self.prev_wait_ms = ms(delay);
        self.retries += 1;
        self.pending_hold = held;
        self.next = Next::Retry;
        self.count(Ctr::Retries);
        f.counters.value.bump(Ctr::Retries);
        if is_fallback {
            self.count(Ctr::Fallbacks);
            f.counters.value.bump(Ctr::Fallbacks);
            self.switch_target(target.clone());
        }
        let d = Decision {
            action: if is_fallback { Action::Fallback } else { Action::Retry },
            delay,
            upstream: Some(target.clone()),
            wait_source: source,
            on_failure: None,
            excluded,
            ..base
        };
        if self.engine.inner.bus.active() {
            let mut e = self.event(
                if is_fallback {
                    EventKind::Fallback
                } else {
                    EventKind::Decision
                },
                now_ms,
            );
            e.action = Some(d.action);
            e.reason = Some(d.reason);
            e.error_class = d.class;
            e.upstream = Some(target);
            e.attempt = Some(f.number);
            e.attempt_id = Some(self.attempt_id(f.number));
            e.resend_count = Some(f.number - 1);
            e.delay_ms = Some(ms(delay));
            e.wait_source = Some(source);
            e.detail = d.detail.clone();
            e.excluded = d.excluded.clone();
            self.engine.inner.bus.emit(e);
        }
        d
    }

    /// Whether a hedged (parallel) attempt may start now. Hedges are opt-in
    /// per route (`hedge_after_ms`), never issued for `Unsafe` calls, count
    /// against `max_attempts` and draw from the retry budget, and go to a
    /// different eligible upstream when one exists.
    pub fn next_hedge(&mut self) -> HedgePlan {
        if self.final_decision.is_some() || !self.hedging_allowed() || self.in_flight.len() != 1 {
            return HedgePlan::No(Reason::HedgeNotAllowed);
        }
        let Some(after) = self.route().hedge_after_ms else {
            return HedgePlan::No(Reason::HedgeNotAllowed);
        };
        let now = self.engine.now();
        let now_ms = ms(now);
        let started = self.in_flight[0].started;
        let due = started + Duration::from_millis(after);
        if now < due {
            return HedgePlan::After(due - now);
        }
        if self.attempts >= self.max_attempts {
            return HedgePlan::No(Reason::MaxAttempts);
        }
        let remaining = self.deadline_at.saturating_sub(now);
        if remaining < self.pol.min_attempt() {
            return HedgePlan::No(Reason::DeadlineExceeded);
        }
        let primary = self.in_flight[0].upstream.clone();
        let target = if self.fallback_allowed() {
            let m = self.match_now(&[&primary], None);
            m.eligible
                .first()
                .map(|s| Arc::from(s.as_str()))
                .unwrap_or(primary.clone())
        } else {
            primary.clone()
        };
        let Ok(held) = self.withdraw_budget(&target, now_ms) else {
            return HedgePlan::No(Reason::BudgetExhausted);
        };
        let saved_target = self.target.clone();
        let saved_target_attempts = self.target_attempts;
        match self.admit(target.clone(), true, true, now, remaining) {
            Ok(mut a) => {
                if let Some(last) = self.in_flight.last_mut() {
                    last.budget_hold = held;
                }
                self.target = saved_target;
                self.target_attempts = saved_target_attempts;
                self.count(Ctr::Hedges);
                self.count(Ctr::Retries);
                a.fallback = *target != *self.first_upstream;
                HedgePlan::Start(a)
            }
            Err(s) => {
                for h in &held {
                    h.value.refund(&self.pol.budget, now_ms);
                }
                HedgePlan::No(s.reason)
            }
        }
    }

    /// Cancels the call: every attempt in flight is reported as cancelled and
    /// the call stops with `cancelled`.
    pub fn cancel(&mut self) -> Decision {
        if let Some(d) = &self.final_decision {
            return d.clone();
        }
        let numbers: Vec<u32> = self.in_flight.iter().map(|f| f.number).collect();
        let mut last = None;
        for n in numbers {
            last = Some(self.report_attempt(n, &Outcome::error(ErrorKind::Cancelled).phase(Phase::Sent)));
        }
        match last {
            Some(d) if d.is_final() => d,
            _ => {
                let mut d = self.stop_decision(Reason::Cancelled, Some(ErrorClass::Cancelled), self.attempts);
                d.on_failure = None;
                self.finish(d)
            }
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        // Abandoned attempts give back their probe permits, gate slots and budget holds.
        for f in self.in_flight.drain(..) {
            if let Some((b, _)) = &f.breaker {
                b.value.release(&self.pol.breaker, f.probe);
            }
            if let Some(g) = &f.gate {
                g.value.leave(f.retry);
            }
            if let Some(pl) = &f.pool {
                pl.value.leave();
            }
            for h in &f.budget_hold {
                h.value.release(&self.pol.budget);
            }
        }
        for h in self.pending_hold.drain(..) {
            h.value.release(&self.pol.budget);
        }
    }
}
