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
//!
//! Cost model: a call reads the clock once per step, finds its upstream's
//! shared state once (`upstream.rs`) and borrows its thread's
//! reference to it, touches the breaker cell without locks while it is
//! closed, counts its request into its thread's own budget shard (a retry's
//! budget check takes the cell's short lock to add the threads' shards up)
//! and everything else into its thread's own counter
//! block (`local.rs`) and records events as compact records into its
//! thread's own event ring (`ring.rs`). The common call (one named
//! upstream, a plain policy, a success) takes straight-line steps
//! (`engine/lane.rs`); everything else, the general ones below.

use crate::backoff::{jitter_ms, wait_hint, HintProblem, ABSURD};
use crate::breaker::{Admit, BreakerCell, BreakerParams, BreakerState, Record, Transition};
use crate::budget::{BudgetCell, BudgetParams, Refusal};
use crate::classify::{Classifier, Disposition};
use crate::clock::{Clock, EngineClock, Nanos, SystemClock};
use crate::deadline::{
    attempt_timeouts, AttemptTimeouts, Inbound, TimeoutsMs, Timer, TokenEstimate, H_ATTEMPT, H_DEADLINE,
    H_IDEMPOTENCY_KEY, H_REQUEST_ID,
};
use crate::fallback::{match_candidates, Exclusion, MatchResult, Needs};
use crate::few::Few;
use crate::gate::{GateCell, PoolCell};
use crate::id::RequestId;
use crate::idempotency::Ledger;
use crate::local::{thread_up, Begin, EngineLocal, Lent, Start, ThreadUp};
use crate::name::IntoName;
use crate::outcome::Outcome;
use crate::policy::{
    BreakerOverride, FallbackMode, OnExceed, OnFailure, Policy, PolicyError, PolicyErrors, Route, ScopeDim,
};
use crate::registry::{Registry, Slot};
use crate::stats::{CounterSet, Counters, Ctr, Stats, VersionStats, VersionTable};
use crate::telemetry::{header_allowed, BreakerChange, Event, EventBus, EventKind, Hot, Rec, Sink, Then};
use crate::throttle::{self, ThrottleCell, ThrottleParams};
use crate::types::{Action, ErrorClass, ErrorKind, Idempotency, Phase, Reason, WaitSource};
use crate::upstream::{breaker_seed, BreakerRef, BudgetScope, UpstreamState};
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;
use smallvec::SmallVec;
use smol_str::SmolStr;
use std::collections::{BTreeMap, VecDeque};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod lane;

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

/// State every call reaches, across policy versions: clock, registries, telemetry.
pub(crate) struct Shared {
    /// The engine's id for per-thread state ([`crate::local`]).
    engine_id: u64,
    pub(crate) clock: EngineClock,
    seed: u64,
    pub(crate) id_prefix: u32,
    mode: AtomicU8,
    pub(crate) breakers: Registry<BreakerCell>,
    pub(crate) budgets: Registry<BudgetCell>,
    throttles: Registry<ThrottleCell>,
    gates: Registry<GateCell>,
    pools: Registry<PoolCell>,
    pub(crate) upstream_stats: Registry<CounterSet>,
    tenant_stats: Registry<Counters>,
    versions: VersionTable,
    pub(crate) bus: EventBus,
    ledger: Ledger,
    reconcile: Mutex<VecDeque<ReconcileItem>>,
    reconcile_dropped: AtomicU64,
    /// Calls may take the fast lane (off only in differential tests).
    lane: bool,
}

impl Shared {
    fn mode(&self) -> Mode {
        Mode::from_bits(self.mode.load(Ordering::Acquire))
    }
}

/// A policy compiled for the hot path, with the per-upstream state resolved under it.
pub(crate) struct Compiled {
    pub(crate) policy: Policy,
    pub(crate) shared: Arc<Shared>,
    pub(crate) generation: u64,
    version: Arc<str>,
    /// Index of `version` in the event bus's name table.
    version_idx: u32,
    pub(crate) version_stats: Arc<VersionStats>,
    classifier: Classifier,
    pub(crate) budget: BudgetParams,
    breaker: BreakerParams,
    throttle: ThrottleParams,
    min_attempt: Nanos,
    /// The policy's `deadline_ms`.
    deadline: Nanos,
    /// Any concurrency gate or priority pool configured.
    gated: bool,
    /// Propagation safety margin, ms.
    margin_ms: u32,
    /// `timeouts` (connect, first byte, idle; ms), for attempts without a token-based timeout.
    fixed_timeouts_ms: [u64; 3],
    /// `timeouts.attempt_ms`; `u64::MAX` when unset.
    attempt_cap_ms: u64,
    /// The route of a call whose `route` names an upstream rather than a policy route.
    adhoc: Route,
    /// Per-upstream state under this version.
    upstreams: Registry<UpstreamState>,
    /// No policy feature this version uses keeps calls off the fast lane (see [`lane`]).
    lane: bool,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("version", &self.version)
            .field("generation", &self.generation)
            .finish()
    }
}

impl Compiled {
    fn new(policy: Policy, shared: Arc<Shared>, generation: u64) -> Self {
        Compiled {
            adhoc: Route {
                fallback: FallbackMode::Forbidden,
                attempts_per_upstream: policy.max_attempts,
                ..Route::default()
            },
            version_stats: shared.versions.get(&policy.version),
            version_idx: shared.bus.version_index(&policy.version),
            version: Arc::from(policy.version.as_str()),
            classifier: Classifier::new(&policy.classify, &policy.retry),
            budget: BudgetParams::new(&policy.budget),
            breaker: BreakerParams::new(&policy.breaker),
            throttle: ThrottleParams::new(&policy.throttle),
            min_attempt: Nanos::from_ms(policy.min_attempt_ms),
            deadline: Nanos::from_ms(policy.deadline_ms),
            gated: policy.concurrency.max_first_attempts.is_some()
                || policy.concurrency.max_retries.is_some()
                || !policy.concurrency.pools.is_empty(),
            margin_ms: policy.propagation.safety_margin_ms.min(u32::MAX as u64) as u32,
            fixed_timeouts_ms: [
                policy.timeouts.connect_ms,
                policy.timeouts.first_byte_ms,
                policy.timeouts.idle_ms,
            ],
            attempt_cap_ms: policy.timeouts.attempt_ms.unwrap_or(u64::MAX),
            upstreams: Registry::new(),
            lane: shared.lane
                && !policy.throttle.enabled
                && !(policy.concurrency.max_first_attempts.is_some()
                    || policy.concurrency.max_retries.is_some()
                    || !policy.concurrency.pools.is_empty())
                && policy.testing.panic_on_vendor_code.is_none()
                && policy.budget.max_concurrent_retries.is_none(),
            generation,
            shared,
            policy,
        }
    }

    /// Whether calls to an upstream with state `up` may take the fast lane:
    /// the policy allows it, and the upstream's breaker and budget cells are
    /// resolved once for every call (no override, no per-call scope).
    pub(crate) fn lane_for(&self, up: &UpstreamState) -> bool {
        self.lane
            && matches!(up.breaker, BreakerRef::None | BreakerRef::Fixed(_, None))
            && up.budgets.iter().all(|b| matches!(b, BudgetScope::Fixed(_)))
    }

    /// One attempt's timeouts (see [`attempt_timeouts`]), without recomputing the policy's durations.
    #[inline(always)]
    fn timeouts(&self, remaining: Nanos, tokens: TokenEstimate) -> TimeoutsMs {
        if self.policy.timeouts.dynamic.is_some() && (tokens.input.is_some() || tokens.max_output.is_some()) {
            return TimeoutsMs::of(&attempt_timeouts(&self.policy.timeouts, remaining.dur(), tokens));
        }
        TimeoutsMs::clamped(&self.fixed_timeouts_ms, remaining.ms().min(self.attempt_cap_ms))
    }

    /// The shared state of `upstream` under this version.
    pub(crate) fn upstream(&self, upstream: &str, now_ms: u64) -> Up {
        let l = &self.policy.limits;
        let s = self
            .upstreams
            .get_or_insert(upstream, now_ms, l.max_keys, l.idle_ms, || {
                UpstreamState::resolve(self, upstream, now_ms)
            });
        if !s.value.is_stale() {
            s.value.touch(now_ms);
            return s;
        }
        let fresh = UpstreamState::resolve(self, upstream, now_ms);
        self.upstreams.replace(upstream, now_ms, l.max_keys, l.idle_ms, fresh)
    }

    /// The breaker cell for registry key `key`; a cell whose window cannot
    /// hold this version's window is replaced, keeping its state.
    pub(crate) fn breaker_cell(&self, key: &str, now_ms: u64) -> Arc<Slot<BreakerCell>> {
        let l = &self.policy.limits;
        let sh = &self.shared;
        let cell = sh.breakers.get_or_insert(key, now_ms, l.max_keys, l.idle_ms, || {
            BreakerCell::new(self.breaker.clone(), breaker_seed(sh.seed, display_key(key)))
        });
        if cell.value.fits(&self.breaker) {
            return cell;
        }
        let next = cell.value.carry_over(self.breaker.clone(), now_ms);
        sh.breakers.replace(key, now_ms, l.max_keys, l.idle_ms, next)
    }

    /// The budget cell for registry key `key`; a cell with another bucket count restarts fresh.
    pub(crate) fn budget_cell(&self, key: &str, now_ms: u64) -> Arc<Slot<BudgetCell>> {
        let l = &self.policy.limits;
        let sh = &self.shared;
        let cell = sh
            .budgets
            .get_or_insert(key, now_ms, l.max_keys, l.idle_ms, || BudgetCell::new(self.budget));
        if cell.value.fits(&self.budget) {
            return cell;
        }
        sh.budgets
            .replace(key, now_ms, l.max_keys, l.idle_ms, BudgetCell::new(self.budget))
    }
}

/// An upstream's shared state, as a call holds it.
pub(crate) type Up = Arc<Slot<UpstreamState>>;

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
    shared: Arc<Shared>,
    policy: ArcSwap<Compiled>,
    /// Generation of the policy in `policy` (bumped by every reload).
    generation: AtomicU64,
    local: EngineLocal,
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
    lane: bool,
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

    /// Whether calls may take the fast lane (default true). Decisions,
    /// counters and events are the same either way: the switch exists for
    /// the tests that prove it.
    #[doc(hidden)]
    pub fn fast_lane(mut self, yes: bool) -> Self {
        self.lane = yes;
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
        let local = EngineLocal::new();
        let shared = Arc::new(Shared {
            engine_id: local.id,
            clock: match self.clock {
                Some(c) => EngineClock::Injected(c),
                None => EngineClock::System(SystemClock::new()),
            },
            seed,
            id_prefix: (splitmix(seed) >> 32) as u32,
            mode: AtomicU8::new(mode.bits()),
            breakers: Registry::new(),
            budgets: Registry::new(),
            throttles: Registry::new(),
            gates: Registry::new(),
            pools: Registry::new(),
            upstream_stats: Registry::new(),
            tenant_stats: Registry::new(),
            versions: VersionTable::default(),
            bus: EventBus::new(self.policy.telemetry.ring_size),
            ledger: Ledger::default(),
            reconcile: Mutex::new(VecDeque::new()),
            reconcile_dropped: AtomicU64::new(0),
            lane: self.lane,
        });
        let compiled = Compiled::new(self.policy, shared.clone(), 1);
        Ok(Engine {
            inner: Arc::new(Inner {
                shared,
                policy: ArcSwap::from_pointee(compiled),
                generation: AtomicU64::new(1),
                local,
            }),
        })
    }
}

pub(crate) fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// FNV-1a: a stable (process-independent) hash for per-key seeds.
pub(crate) fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Whole milliseconds, saturating (u64 arithmetic: cheaper than `as_millis`'s u128).
fn ms(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1000)
        .saturating_add(u64::from(d.subsec_millis()))
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
    pub route: SmolStr,
    /// End-to-end deadline from now; the policy's `deadline_ms` when absent.
    pub deadline: Option<Duration>,
    /// Whether repeating is safe. Default `Safe` (pure generation).
    pub idempotency: Idempotency,
    /// Tenant (budgets, gates, counters).
    pub tenant: Option<SmolStr>,
    /// Task (route lookup when `route` names none, eval scores, operation scope).
    pub task: Option<SmolStr>,
    /// Priority pool (e.g. `interactive`, `batch`).
    pub priority: Option<SmolStr>,
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
    /// Nothing but the route, deadline, idempotency, tenant, task and key is set.
    #[inline]
    fn is_plain(&self) -> bool {
        self.priority.is_none()
            && self.params_digest.is_none()
            && self.inbound.is_none()
            && self.needs.capabilities.is_empty()
            && self.needs.input_tokens.is_none()
            && self.needs.max_output_tokens.is_none()
            && self.needs.data_boundary.is_none()
            && self.needs.max_cost.is_none()
    }

    /// A spec for `route` with every other field at its default.
    #[inline]
    pub fn new(route: impl IntoName) -> Self {
        CallSpec {
            route: route.into_name(),
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
    pub fn tenant(mut self, t: impl IntoName) -> Self {
        self.tenant = Some(t.into_name());
        self
    }
    /// Sets the task.
    pub fn task(mut self, t: impl IntoName) -> Self {
        self.task = Some(t.into_name());
        self
    }
    /// Sets the priority.
    pub fn priority(mut self, p: impl IntoName) -> Self {
        self.priority = Some(p.into_name());
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
///
/// Kept under 128 bytes, so handing it back (`next_attempt()?`) moves it in
/// a few vector stores rather than a `memcpy` call: times are stored as
/// integers and read through [`Attempt::timeouts`], [`Attempt::remaining`]
/// and [`Attempt::started_at`].
#[derive(Clone, PartialEq)]
pub struct Attempt {
    /// 1-based attempt number (hedges and fallbacks included).
    pub number: u32,
    /// Attempt number sent downstream: the owner's attempt number for a non-owner call.
    wire_number: u32,
    /// Propagation safety margin, ms.
    margin_ms: u32,
    /// True for a hedged (parallel) attempt.
    pub hedge: bool,
    /// True when this attempt goes to another upstream than the first one.
    pub fallback: bool,
    propagate: bool,
    /// Upstream to call.
    pub upstream: SmolStr,
    timeouts: TimeoutsMs,
    remaining: Nanos,
    started: Nanos,
    /// Logical request id.
    pub request_id: RequestId,
    /// Business idempotency key, unchanged across attempts.
    pub idempotency_key: Option<SmolStr>,
}

impl std::fmt::Debug for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attempt")
            .field("number", &self.number)
            .field("upstream", &self.upstream)
            .field("timeouts", &self.timeouts())
            .field("remaining", &self.remaining())
            .field("request_id", &self.request_id)
            .field("idempotency_key", &self.idempotency_key)
            .field("hedge", &self.hedge)
            .field("fallback", &self.fallback)
            .field("started_at", &self.started_at())
            .finish()
    }
}

impl Attempt {
    /// Timeouts for this attempt, clamped to the deadline, in whole
    /// milliseconds (floored: never past the deadline).
    ///
    /// ```
    /// use retrywise::{CallSpec, Engine, Policy};
    /// let engine = Engine::new(Policy::default()).unwrap();
    /// let mut call = engine.begin(CallSpec::new("openai/gpt-4o"));
    /// let attempt = call.next_attempt().unwrap();
    /// let t = attempt.timeouts();
    /// assert!(t.connect <= t.total && t.total <= attempt.remaining());
    /// ```
    #[inline]
    pub fn timeouts(&self) -> AttemptTimeouts {
        self.timeouts.timeouts()
    }

    /// Time left before the deadline when the attempt started.
    #[inline]
    pub fn remaining(&self) -> Duration {
        self.remaining.dur()
    }

    /// The engine clock's reading when the attempt was granted (see
    /// [`Engine::now`]): bindings time the attempt from it without reading
    /// a clock of their own.
    #[inline]
    pub fn started_at(&self) -> Duration {
        self.started.dur()
    }

    /// Outbound propagation headers (`retrywise-deadline-ms`, `retrywise-request-id`,
    /// `retrywise-attempt`, `idempotency-key`); empty when propagation is off.
    /// Allocates the values; transports use [`Attempt::for_each_header`].
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::with_capacity(4);
        self.for_each_header(|name, value| v.push((name, value.to_string())));
        v
    }

    /// Hands each outbound propagation header (the same as
    /// [`Attempt::headers`], in the same order) to `f`, numbers formatted on
    /// the stack: no allocation per attempt.
    ///
    /// ```
    /// use retrywise::{CallSpec, Engine, Policy};
    /// let engine = Engine::new(Policy::default()).unwrap();
    /// let mut call = engine.begin(CallSpec::new("openai/gpt-4o"));
    /// let attempt = call.next_attempt().unwrap();
    /// let mut names = Vec::new();
    /// attempt.for_each_header(|name, _value| names.push(name));
    /// assert_eq!(names, ["retrywise-deadline-ms", "retrywise-request-id", "retrywise-attempt"]);
    /// ```
    pub fn for_each_header(&self, mut f: impl FnMut(&'static str, &str)) {
        if self.propagate {
            let mut n = itoa::Buffer::new();
            f(
                H_DEADLINE,
                n.format(self.remaining.ms().saturating_sub(u64::from(self.margin_ms))),
            );
            self.request_id.with_str(|id| f(H_REQUEST_ID, id));
            f(H_ATTEMPT, n.format(self.wire_number));
        }
        if let Some(k) = &self.idempotency_key {
            f(H_IDEMPOTENCY_KEY, k);
        }
    }

    /// The error to report when one of this attempt's timers expired (see
    /// [`crate::deadline::timer_error`]); `body_started`: the response's
    /// headers had arrived.
    ///
    /// ```
    /// use retrywise::{CallSpec, Engine, ErrorKind, Policy, Timer};
    /// let engine = Engine::new(Policy::default()).unwrap();
    /// let mut call = engine.begin(CallSpec::new("openai/gpt-4o").deadline_ms(2_000));
    /// let attempt = call.next_attempt().unwrap();
    /// // Given all the time left, the attempt's own timer is the deadline's.
    /// assert_eq!(attempt.timer_error(Timer::Total, false), ErrorKind::DeadlineExceeded);
    /// assert_eq!(attempt.timer_error(Timer::FirstByte, false), ErrorKind::FirstByteTimeout);
    /// ```
    pub fn timer_error(&self, timer: Timer, body_started: bool) -> ErrorKind {
        let t = self.timeouts;
        crate::deadline::timer_error(timer, t.total_ms(), self.remaining.ms(), body_started)
    }

    /// What a call started inside this attempt (same process) inherits: the
    /// deadline, ids and key. Such a call is a non-owner: one attempt per outer attempt.
    pub fn inbound(&self) -> Inbound {
        Inbound {
            deadline: Some(self.remaining()),
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
    pub upstream: Option<SmolStr>,
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

    /// A success of attempt `attempt` on `upstream`.
    #[inline(always)]
    fn success(attempt: u32, hedge: bool, upstream: SmolStr) -> Decision {
        Decision {
            action: Action::Succeeded,
            delay: Duration::ZERO,
            class: None,
            reason: Reason::Success,
            upstream: Some(upstream),
            wait_source: WaitSource::None,
            retry_after: None,
            on_failure: None,
            detail: None,
            attempt,
            hedge,
            excluded: Vec::new(),
        }
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
type BudgetHold = Few<Arc<Slot<BudgetCell>>>;

/// A budget cell, borrowed from the upstream's state or looked up for the call.
enum CellRef<'a> {
    Borrowed(&'a Arc<Slot<BudgetCell>>),
    Owned(Arc<Slot<BudgetCell>>),
}

impl CellRef<'_> {
    fn to_arc(&self) -> Arc<Slot<BudgetCell>> {
        match self {
            CellRef::Borrowed(c) => Arc::clone(c),
            CellRef::Owned(c) => c.clone(),
        }
    }
}

impl std::ops::Deref for CellRef<'_> {
    type Target = Slot<BudgetCell>;
    fn deref(&self) -> &Slot<BudgetCell> {
        match self {
            CellRef::Borrowed(c) => c,
            CellRef::Owned(c) => c,
        }
    }
}

/// The breaker cell an attempt holds.
enum Held {
    None,
    /// The cell of the attempt's upstream state.
    Fixed,
    /// A cell whose scope depends on the call.
    PerCall(Arc<Slot<BreakerCell>>, Option<BreakerOverride>),
}

/// Concurrency-gate and priority-pool slots an attempt holds (opt-in features).
struct Slots {
    gate: Option<Arc<Slot<GateCell>>>,
    pool: Option<Arc<Slot<PoolCell>>>,
}

impl Slots {
    fn leave(&self, retry: bool) {
        if let Some(g) = &self.gate {
            g.value.leave(retry);
        }
        if let Some(p) = &self.pool {
            p.value.leave();
        }
    }
}

/// An attempt in flight. Its upstream is the call's target, unless
/// `more` names another (a hedge to another upstream).
struct InFlight {
    number: u32,
    probe: bool,
    retry: bool,
    hedge: bool,
    /// Monotonic start, ns.
    started_ns: u64,
    /// Time left before the deadline at the start, ms.
    remaining_ms: u64,
    /// Index of the attempt's start record in this thread's ring, for writing its end into it.
    start_rec: Option<u64>,
    breaker: Held,
    /// What a plain attempt does not hold, boxed so it stays small.
    more: Option<Box<FlightMore>>,
}

/// An attempt's holdings besides its breaker cell (hedges, gates, retry grants).
#[derive(Default)]
struct FlightMore {
    /// The attempt's upstream when it is not the call's (a hedge to another upstream).
    tu: Option<Arc<ThreadUp>>,
    slots: Option<Slots>,
    budget_hold: BudgetHold,
}

impl InFlight {
    /// The upstream state of a hedge to another upstream.
    #[inline]
    fn tu(&self) -> Option<&Arc<ThreadUp>> {
        self.more.as_ref().and_then(|m| m.tu.as_ref())
    }

    /// Gives back what the attempt holds besides its breaker cell.
    fn leave(&self, budget: &BudgetParams) {
        if let Some(m) = &self.more {
            if let Some(sl) = &m.slots {
                sl.leave(self.retry);
            }
            for h in &m.budget_hold {
                h.value.release(budget);
            }
        }
    }
}

/// The parts of a call most calls leave at their defaults (routes, needs,
/// priority pools, inbound owners, held retry grants), boxed so a call stays
/// small and a plain call builds, moves and drops none of them.
#[derive(Default)]
struct Ext {
    /// The policy route the call runs on (none: it names an upstream).
    route_key: Option<SmolStr>,
    /// The upstream the call started on.
    first_upstream: SmolStr,
    /// Upstreams tried so far (routed calls).
    tried: Few<SmolStr>,
    /// Retry grants held for the next attempt (`max_concurrent_retries`).
    pending_hold: BudgetHold,
    /// Every candidate was ineligible at `begin`: the first attempt stops.
    fallback_pending: bool,
    needs: Needs,
    priority: Option<SmolStr>,
    conflict: Option<String>,
    /// The owner's attempt number, for a call running under an inbound owner.
    inbound_attempt: Option<u32>,
}

static NO_NEEDS: Needs = Needs {
    capabilities: Vec::new(),
    input_tokens: None,
    max_output_tokens: None,
    data_boundary: None,
    max_cost: None,
};

/// A call's final decision; a success (the common end) is kept without a copy of the decision.
enum Final {
    Succeeded {
        attempt: u32,
        hedge: bool,
        /// `None`: the call's own upstream (kept apart only for a hedge that won elsewhere).
        upstream: Option<SmolStr>,
    },
    Other(Box<Decision>),
}

impl Final {
    fn of(d: &Decision) -> Final {
        match d {
            Decision {
                action: Action::Succeeded,
                delay: Duration::ZERO,
                class: None,
                reason: Reason::Success,
                wait_source: WaitSource::None,
                retry_after: None,
                on_failure: None,
                detail: None,
                excluded,
                attempt,
                hedge,
                upstream,
            } if excluded.is_empty() => Final::Succeeded {
                attempt: *attempt,
                hedge: *hedge,
                upstream: upstream.clone(),
            },
            d => Final::Other(Box::new(d.clone())),
        }
    }

    /// The decision; `own` is the call's upstream.
    fn decision(&self, own: &SmolStr) -> Decision {
        match self {
            Final::Succeeded {
                attempt,
                hedge,
                upstream,
            } => Decision::success(*attempt, *hedge, upstream.as_ref().unwrap_or(own).clone()),
            Final::Other(d) => (**d).clone(),
        }
    }

    fn stopped(&self) -> Stopped {
        match self {
            Final::Succeeded { .. } => Stopped {
                reason: Reason::CallFinished,
                class: None,
                on_failure: None,
                detail: None,
            },
            Final::Other(d) => d.stopped(),
        }
    }
}

/// What the breaker's slow path decided for an attempt.
enum Verdict {
    /// Go to the planned upstream.
    Go { probe: bool },
    /// Go to this fallback instead.
    Moved { target: SmolStr, held: Held, probe: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    First,
    Retry,
}

/// One logical request. Owned by one thread at a time (`Send`, not `Sync`).
pub struct Call {
    /// The call's target upstream (its key names it) as this thread sees
    /// it; through it, the policy handle.
    tu: Lent,
    id: RequestId,
    /// The id's text, printed when [`Call::id`] first asks.
    id_text: std::cell::OnceCell<SmolStr>,
    tenant: Option<SmolStr>,
    task: Option<SmolStr>,
    idem: Idempotency,
    key: Option<SmolStr>,
    deadline_at: Nanos,
    owner: bool,
    /// The call may take the fast lane ([`lane`]) while it has no [`Ext`].
    lane: bool,
    next: Next,
    last_class: Option<ErrorClass>,
    max_attempts: u32,
    attempts: u32,
    target_attempts: u32,
    retries: u32,
    prev_wait_ms: u64,
    /// The call's sequence number: its id, and the seed of its random stream.
    seq: u64,
    in_flight: Few<InFlight>,
    /// The call's random stream, seeded from `seq` when first drawn from (most calls never wait).
    rng: Option<Pcg64Mcg>,
    final_decision: Option<Final>,
    tenant_counters: Option<Arc<Slot<Counters>>>,
    /// The attempt-end record this call wrote last, while it is the newest of the thread's ring.
    last_end: std::cell::Cell<Option<EndMark>>,
    /// Dropped by hand (`Drop for Call`): `None`, the usual case, then costs
    /// one inline check instead of a call to the drop of `Ext`.
    x: ManuallyDrop<Option<Box<Ext>>>,
}

/// Where an attempt's end was recorded, so the decision that follows can fold into it.
struct EndMark {
    index: u64,
    attempt: u32,
    hedge: bool,
    upstream: Option<SmolStr>,
}

impl EndMark {
    /// Attempt end `h`, recorded as (or into) record `index`.
    #[inline(always)]
    fn of(index: u64, h: &Hot) -> EndMark {
        EndMark {
            index,
            attempt: h.attempt,
            hedge: h.hedge,
            upstream: Some(h.upstream.clone()),
        }
    }
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("id", &self.id)
            .field("target", &self.tu.up.key)
            .field("attempts", &self.attempts)
            .field("finished", &self.final_decision.is_some())
            .finish()
    }
}

/// What `begin` settles about a call before building it.
struct Begun {
    id: RequestId,
    seq: u64,
    tenant: Option<SmolStr>,
    task: Option<SmolStr>,
    idem: Idempotency,
    key: Option<SmolStr>,
    deadline_at: Nanos,
    owner: bool,
    max_attempts: u32,
    tenant_counters: Option<Arc<Slot<Counters>>>,
}

impl Call {
    /// A call about to make its first attempt.
    #[inline(always)]
    fn assemble(tu: Arc<ThreadUp>, b: Begun, x: Option<Box<Ext>>) -> Call {
        Call {
            id: b.id,
            id_text: std::cell::OnceCell::new(),
            tenant: b.tenant,
            task: b.task,
            idem: b.idem,
            key: b.key,
            deadline_at: b.deadline_at,
            owner: b.owner,
            lane: tu.lane && b.owner,
            next: Next::First,
            last_class: None,
            max_attempts: b.max_attempts,
            attempts: 0,
            target_attempts: 0,
            retries: 0,
            prev_wait_ms: 0,
            seq: b.seq,
            in_flight: Few::new(),
            rng: None,
            final_decision: None,
            tenant_counters: b.tenant_counters,
            last_end: std::cell::Cell::new(None),
            x: ManuallyDrop::new(x),
            tu: Lent::new(tu),
        }
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
            lane: true,
        }
    }

    /// The engine clock's current reading (monotonic; a manual clock's time
    /// under test), on the same scale as [`Attempt::started_at`].
    pub fn now(&self) -> Duration {
        self.inner.shared.clock.now()
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
        self.inner.shared.mode()
    }

    /// Flips the kill switch; takes effect for every decision made after it, in-flight calls included.
    pub fn set_mode(&self, mode: Mode) {
        let sh = &self.inner.shared;
        sh.mode.store(mode.bits(), Ordering::Release);
        let pol = self.inner.policy.load();
        if sh.bus.active() {
            let mut e = Event::new(EventKind::ModeChange, ms(self.now()), pol.version.clone());
            e.detail = Some(format!(
                "retries={} fallback={} hedging={}",
                mode.retries, mode.fallback, mode.hedging
            ));
            sh.bus.emit(e);
        }
    }

    /// Swaps the policy atomically. Calls already begun finish under the
    /// version they started with; an invalid policy leaves the old one in force.
    pub fn reload(&self, policy: Policy) -> Result<(), PolicyErrors> {
        policy.validate()?;
        let ring = policy.telemetry.ring_size;
        let sh = &self.inner.shared;
        // Reloads are rare: one at a time keeps generations in order.
        let generation = self.inner.generation.load(Ordering::Acquire) + 1;
        let compiled = Arc::new(Compiled::new(policy, sh.clone(), generation));
        let version = compiled.version.clone();
        self.inner.policy.store(compiled);
        self.inner.generation.store(generation, Ordering::Release);
        sh.bus.set_capacity(ring);
        if sh.bus.active() {
            sh.bus.emit(Event::new(EventKind::Reload, ms(self.now()), version));
        }
        Ok(())
    }

    /// Registers an event sink; returns an id for [`Engine::remove_sink`].
    /// Sinks run on the deciding thread, outside engine locks: keep them fast.
    pub fn on_event(&self, sink: Sink) -> u64 {
        self.inner.shared.bus.add_sink(sink)
    }

    /// Removes a sink.
    pub fn remove_sink(&self, id: u64) -> bool {
        self.inner.shared.bus.remove_sink(id)
    }

    /// The events in the ring buffer, oldest first.
    pub fn events(&self) -> Vec<Event> {
        self.inner.shared.bus.snapshot()
    }

    /// Takes the events out of the ring buffer.
    pub fn drain_events(&self) -> Vec<Event> {
        self.inner.shared.bus.drain()
    }

    /// Calls whose effect is unknown, oldest first.
    pub fn reconcile_list(&self) -> Vec<ReconcileItem> {
        self.inner.shared.reconcile.lock().iter().cloned().collect()
    }

    /// Takes the reconcile list (the caller now owns reconciling them).
    pub fn drain_reconcile(&self) -> Vec<ReconcileItem> {
        self.inner.shared.reconcile.lock().drain(..).collect()
    }

    /// The breaker state of an upstream (by upstream name), for dashboards and tests.
    pub fn breaker_state(&self, upstream: &str) -> BreakerState {
        let pol = self.inner.policy.load();
        let key = scope_key(&pol.policy.breaker.scope, upstream, &pol.policy, None, None, None);
        let ovr = breaker_override(&pol.policy, display_key(&key), upstream);
        if !pol.policy.breaker.enabled {
            return BreakerState::Disabled;
        }
        match self.inner.shared.breakers.get(&key) {
            Some(cell) => cell.value.state(&pol.breaker, ovr, ms(self.now())),
            None => ovr.map_or(BreakerState::Closed, BreakerState::from),
        }
    }

    /// A snapshot of every counter.
    pub fn stats(&self) -> Stats {
        let i = &self.inner.shared;
        let pol = self.inner.policy.load();
        let now = ms(self.now());
        let collect = |r: &Registry<Counters>| {
            let mut m = BTreeMap::new();
            r.for_each(|s| {
                m.insert(s.key.to_string(), s.value.snapshot());
            });
            m
        };
        let mut per_upstream = BTreeMap::new();
        i.upstream_stats.for_each(|s| {
            per_upstream.insert(s.key.to_string(), s.value.upstream_snapshot());
        });
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
                let key = scope_key(&pol.policy.breaker.scope, name, &pol.policy, None, None, None);
                (display_key(&key).to_string(), *o)
            })
            .collect();
        let mut breakers: BTreeMap<String, String> = BTreeMap::new();
        i.breakers.for_each(|s| {
            let key = display_key(&s.key);
            let st = s.value.state(&pol.breaker, overrides.get(key).copied(), now);
            if st != BreakerState::Closed {
                breakers.insert(key.to_string(), st.as_str().to_string());
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
            overall: i.versions.overall(),
            per_upstream,
            per_tenant: collect(&i.tenant_stats),
            per_policy_version: i.versions.per_version(),
            mode: i.mode(),
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
    #[inline(always)]
    pub fn begin(&self, mut spec: CallSpec) -> Call {
        self.begin_at(&mut spec, self.inner.shared.clock.now_ns())
    }

    /// Begins one logical request and asks for its first attempt, with one
    /// clock reading for both: exactly `begin` followed at once by
    /// [`Call::next_attempt`]. The returned pair is built and then copied
    /// (a call is about 400 bytes), which costs more than the clock reading
    /// it saves: a binding that stores the call does better to store what
    /// `begin` returns and ask for the attempt on it (as the Node binding does).
    ///
    /// ```
    /// use retrywise::{CallSpec, Engine, Outcome, Policy, Action};
    /// let engine = Engine::new(Policy::default()).unwrap();
    /// let (mut call, attempt) = engine.begin_attempt(CallSpec::new("openai/gpt-4o"));
    /// assert_eq!(attempt.unwrap().number, 1);
    /// assert_eq!(call.report(&Outcome::success()).action, Action::Succeeded);
    /// ```
    #[inline]
    pub fn begin_attempt(&self, mut spec: CallSpec) -> (Call, Result<Attempt, Stopped>) {
        let now = self.inner.shared.clock.now_ns();
        let mut call = self.begin_at(&mut spec, now);
        let a = call.next_attempt_at(now);
        (call, a)
    }

    /// Takes what the call keeps out of `spec` in place (moving a whole spec copies it).
    #[inline(always)]
    fn begin_at(&self, spec: &mut CallSpec, now: Nanos) -> Call {
        let inner = &self.inner;
        let direct = (!spec.route.is_empty()).then_some(spec.route.as_str());
        let lb = inner.local.begin(
            inner.generation.load(Ordering::Acquire),
            || inner.policy.load_full(),
            direct,
        );
        match lb.start {
            // The common call: it names an upstream this thread used recently, and nothing else.
            Start::Cached(tu) if inner.shared.lane && spec.is_plain() => self.begin_cached(spec, tu, lb.seq, now),
            start => self.begin_resolved(std::mem::take(spec), lb.seq, start, now),
        }
    }

    /// [`Engine::begin_at`] once the thread has given the call its sequence
    /// number and either its upstream's state or the policy handle.
    #[inline(never)]
    fn begin_resolved(&self, spec: CallSpec, seq: u64, start: Start, now: Nanos) -> Call {
        let CallSpec {
            mut route,
            deadline: spec_deadline,
            idempotency,
            tenant,
            task,
            priority,
            idempotency_key,
            params_digest,
            inbound,
            needs,
        } = spec;
        let now_ms = now.ms();
        let lb = Begin { seq, start };
        let pol = &*lb.start.handle().pol;
        let sh = &*pol.shared;
        let id = match inbound.as_ref().and_then(|b| b.request_id.as_deref()) {
            Some(parent) => RequestId::remote(parent),
            None => RequestId::local(sh.id_prefix, lb.seq),
        };
        let mut deadline = spec_deadline.unwrap_or(Duration::from_millis(pol.policy.deadline_ms));
        if let Some(d) = inbound.as_ref().and_then(|b| b.deadline) {
            deadline = deadline.min(d);
        }
        let owner = inbound.is_none();
        let routes = &pol.policy.routes;
        let route_key = if routes.is_empty() {
            None
        } else if routes.contains_key(route.as_str()) {
            Some(route.clone())
        } else {
            task.as_ref()
                .filter(|t| route.is_empty() && routes.contains_key(t.as_str()))
                .cloned()
        };
        let max_attempts = if owner {
            route_key
                .as_ref()
                .and_then(|k| routes.get(k.as_str()))
                .and_then(|r| r.max_attempts)
                .unwrap_or(pol.policy.max_attempts)
        } else {
            1
        };
        let key: Option<SmolStr> = idempotency_key
            .or_else(|| inbound.as_ref().and_then(|b| b.idempotency_key.clone()))
            .map(SmolStr::from);
        let conflict = match (&key, &params_digest) {
            (Some(k), Some(d)) => sh
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
        // A call that names an upstream goes there; a routed call goes to the
        // first eligible candidate (capabilities, boundary, cost, breaker).
        let routed = route_key.as_ref().and_then(|k| routes.get(k.as_str())).map(|route| {
            let who = Who {
                tenant: tenant.as_deref(),
                priority: priority.as_deref(),
                task: task.as_deref(),
            };
            // A call that may not fall back starts where its route starts,
            // whatever the breakers say: an open breaker then stops it (with
            // the route's on_failure) instead of moving it to another upstream.
            let may_fall_back = route.fallback == FallbackMode::Allowed && owner && sh.mode().fallback;
            let m = if may_fall_back {
                match_route(pol, route, &who, &needs, &[], None, now_ms, None)
            } else {
                match_candidates(&pol.policy, route, who.task, &needs, &[], &|_| false)
            };
            let target = m
                .eligible
                .first()
                .or_else(|| route.candidates.first())
                .map(|t| SmolStr::from(t.as_str()))
                .unwrap_or_default();
            (target, m)
        });
        let tenant_counters = tenant.as_ref().map(|t| {
            let l = &pol.policy.limits;
            sh.tenant_stats
                .get_or_insert(t, now_ms, l.max_keys, l.idle_ms, Counters::default)
        });
        let seq = lb.seq;
        let engine_id = sh.engine_id;
        let target = match &routed {
            Some((t, _)) => t.clone(),
            None => std::mem::take(&mut route),
        };
        let tu = match lb.start {
            Start::Cached(tu) => {
                tu.touch(now_ms);
                tu
            }
            Start::Fresh(h) => thread_up(engine_id, &h, &target, now_ms),
        };
        let pol = &*tu.handle.pol;
        let sh = &*pol.shared;
        let inbound_attempt = inbound.as_ref().and_then(|b| b.attempt);
        let plain = route_key.is_none()
            && priority.is_none()
            && conflict.is_none()
            && inbound_attempt.is_none()
            && needs == NO_NEEDS;
        let deadline_at = now.saturating_add(Nanos::of(deadline));
        // Counted, and the initial fallback choice recorded, before the call
        // is built: it is built in place, as the return value.
        tu.handle.sink().bump(Ctr::Begun);
        if let Some(t) = &tenant_counters {
            t.value.bump(Ctr::Begun);
        }
        let mut fallback_pending = false;
        if let Some((target, m)) = routed {
            if sh.bus.active() && !m.excluded.is_empty() {
                let mut e = rec_for(
                    pol.version_idx,
                    &id,
                    &tenant,
                    &task,
                    deadline_at,
                    EventKind::Fallback,
                    now,
                );
                e.upstream = Some(target);
                let x = e.extra();
                x.excluded = m.exclusion_strings();
                x.detail = Some("initial_selection".into());
                sh.bus.write(tu.handle.ring_here(), &mut e);
            }
            fallback_pending = m.eligible.is_empty();
        }
        let x = (!plain).then(|| {
            Box::new(Ext {
                route_key,
                first_upstream: target,
                tried: Few::new(),
                pending_hold: Few::new(),
                fallback_pending,
                needs,
                priority,
                conflict,
                inbound_attempt,
            })
        });
        Call::assemble(
            tu,
            Begun {
                id,
                seq,
                tenant,
                task,
                idem: crate::idempotency::effective(idempotency, key.is_some()),
                key,
                deadline_at,
                owner,
                max_attempts,
                tenant_counters,
            },
            x,
        )
    }
}

/// A record with a call's common fields.
#[inline(always)]
fn rec_for(
    version_idx: u32,
    id: &RequestId,
    tenant: &Option<SmolStr>,
    task: &Option<SmolStr>,
    deadline_at: Nanos,
    kind: EventKind,
    now: Nanos,
) -> Rec {
    Rec {
        id: Some(id.raw().clone()),
        tenant: tenant.clone(),
        task: task.clone(),
        remaining_ms: Some(deadline_at.saturating_sub(now).ms()),
        ..Rec::new(kind, now.0, version_idx)
    }
}

/// The call's dimensions that scope keys may use besides the upstream.
struct Who<'a> {
    tenant: Option<&'a str>,
    priority: Option<&'a str>,
    task: Option<&'a str>,
}

/// Whether the breaker of `tu`'s upstream refuses every attempt now, when
/// that breaker depends on the upstream only (`None`: it depends on the call).
#[inline]
fn fixed_open(tu: &ThreadUp, now_ms: u64) -> Option<bool> {
    match &tu.up.value.breaker {
        BreakerRef::None => Some(false),
        BreakerRef::Fixed(c, ovr) => Some(match ovr {
            Some(BreakerOverride::ForceOpen) => true,
            Some(_) => false,
            None => c.value.is_open(now_ms),
        }),
        BreakerRef::PerCall => None,
    }
}

/// Whether `upstream`'s breaker refuses every attempt now. `current` is the
/// call's own upstream, whose cell is at hand.
fn upstream_open(pol: &Compiled, upstream: &str, who: &Who, now_ms: u64, current: Option<&ThreadUp>) -> bool {
    let p = &pol.policy;
    if !p.breaker.enabled {
        return false;
    }
    if let Some(open) = current
        .filter(|tu| tu.up.key == upstream)
        .and_then(|tu| fixed_open(tu, now_ms))
    {
        return open;
    }
    let key = scope_key(&p.breaker.scope, upstream, p, who.tenant, who.priority, who.task);
    match breaker_override(p, display_key(&key), upstream) {
        Some(BreakerOverride::ForceOpen) => return true,
        Some(_) => return false,
        None => {}
    }
    pol.shared.breakers.get(&key).is_some_and(|c| c.value.is_open(now_ms))
}

/// The route's eligible candidates now, with every exclusion; `larger_than`
/// also drops candidates whose context window is not above that many tokens.
#[allow(clippy::too_many_arguments)]
fn match_route(
    pol: &Compiled,
    route: &Route,
    who: &Who,
    needs: &Needs,
    tried: &[&str],
    larger_than: Option<u64>,
    now_ms: u64,
    current: Option<&ThreadUp>,
) -> MatchResult {
    let mut m = match_candidates(&pol.policy, route, who.task, needs, tried, &|u| {
        upstream_open(pol, u, who, now_ms, current)
    });
    if let Some(min_ctx) = larger_than {
        let mut keep = Vec::new();
        for u in m.eligible.drain(..) {
            let ctx = pol.policy.upstreams.get(&u).and_then(|x| x.context_tokens);
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

pub(crate) fn breaker_override(p: &Policy, key: &str, upstream: &str) -> Option<BreakerOverride> {
    if p.breaker.overrides.is_empty() {
        return None;
    }
    p.breaker
        .overrides
        .get(key)
        .or_else(|| p.breaker.overrides.get(upstream))
        .copied()
}

/// Separates a registry key's dimension tag from the key as users see it.
const TAG_END: char = '\u{1f}';

fn dim_tag(d: ScopeDim) -> char {
    match d {
        ScopeDim::Global => 'g',
        ScopeDim::Upstream => 'u',
        ScopeDim::Provider => 'p',
        ScopeDim::Model => 'm',
        ScopeDim::Region => 'r',
        ScopeDim::Tenant => 't',
        ScopeDim::Priority => 'q',
        ScopeDim::Operation => 'o',
    }
}

/// The registry key of scope `dims` for `upstream` and the call's tenant,
/// priority and task: a tag naming the dimensions, then their values joined
/// by `/` (the upstream name alone when nothing else applies). The tag keeps
/// scopes of different dimensions apart, so a tenant named like an upstream
/// never shares that upstream's budget. [`display_key`] strips it.
pub(crate) fn scope_key(
    dims: &[ScopeDim],
    upstream: &str,
    p: &Policy,
    tenant: Option<&str>,
    priority: Option<&str>,
    task: Option<&str>,
) -> String {
    let mut k = String::with_capacity(dims.len() + 1 + upstream.len());
    k.extend(dims.iter().map(|d| dim_tag(*d)));
    k.push(TAG_END);
    let cat = p.upstreams.get(upstream);
    let upstream_only = dims.iter().all(|d| {
        matches!(
            d,
            ScopeDim::Provider | ScopeDim::Model | ScopeDim::Region | ScopeDim::Upstream
        )
    });
    if upstream_only && cat.is_none_or(|u| u.provider.is_empty() && u.model.is_empty()) {
        k.push_str(upstream);
        return k;
    }
    let mut first = true;
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
            if !first {
                k.push('/');
            }
            k.push_str(v);
            first = false;
        }
    }
    k
}

/// A registry key as users see it (in details, events and stats): without its dimension tag.
pub(crate) fn display_key(key: &str) -> &str {
    key.split_once(TAG_END).map_or(key, |(_, d)| d)
}

impl Call {
    /// Logical request id.
    pub fn id(&self) -> &str {
        self.id_text.get_or_init(|| self.id.to_smol_str())
    }

    /// Physical attempts started so far (hedges and fallbacks included).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Time left before the deadline.
    pub fn remaining(&self) -> Duration {
        self.deadline_at.saturating_sub(self.now()).dur()
    }

    /// True once a final decision was made.
    pub fn is_finished(&self) -> bool {
        self.final_decision.is_some()
    }

    /// True when dropping the call gives nothing back: no attempt is in
    /// flight and no budget hold is pending, so no probe permit, gate slot or
    /// retry token waits on the drop. A binding may then free the call later
    /// (a batch at a time) without changing any decision.
    ///
    /// ```
    /// use retrywise::{CallSpec, Engine, Outcome, Policy};
    /// let e = Engine::new(Policy::default()).unwrap();
    /// let mut c = e.begin(CallSpec::new("openai/gpt-4o"));
    /// c.next_attempt().unwrap();
    /// assert!(!c.holds_nothing(), "an attempt is in flight");
    /// c.report(&Outcome::success());
    /// assert!(c.holds_nothing());
    /// ```
    #[inline]
    pub fn holds_nothing(&self) -> bool {
        self.in_flight.is_empty() && self.x.as_ref().is_none_or(|e| e.pending_hold.is_empty())
    }

    /// The final decision, once the call is over.
    pub fn final_decision(&self) -> Option<Decision> {
        self.final_decision.as_ref().map(|f| f.decision(&self.tu.up.key))
    }

    /// False when an upstream retrywise layer owns retries for this call.
    pub fn is_owner(&self) -> bool {
        self.owner
    }

    /// The policy version this call runs under.
    pub fn policy_version(&self) -> &str {
        &self.tu.handle.pol.version
    }

    /// The upstream the next attempt will go to.
    pub fn target(&self) -> &str {
        &self.tu.up.key
    }

    fn needs(&self) -> &Needs {
        self.x.as_ref().map_or(&NO_NEEDS, |e| &e.needs)
    }

    fn priority(&self) -> Option<&str> {
        self.x.as_ref().and_then(|e| e.priority.as_deref())
    }

    /// The policy route the call runs on, when it names one.
    #[inline]
    fn route_key(&self) -> Option<&SmolStr> {
        self.x.as_ref().and_then(|e| e.route_key.as_ref())
    }

    /// The call's [`Ext`], made when first needed (its fields' defaults are a plain call's).
    fn ext_mut(&mut self) -> &mut Ext {
        let first_upstream = &self.tu.up.key;
        self.x.get_or_insert_with(|| {
            Box::new(Ext {
                first_upstream: first_upstream.clone(),
                ..Ext::default()
            })
        })
    }

    /// Takes the retry grants held for the next attempt.
    #[inline]
    fn take_pending_hold(&mut self) -> BudgetHold {
        match &mut *self.x {
            Some(e) => std::mem::take(&mut e.pending_hold),
            None => Few::new(),
        }
    }

    /// Releases the retry grants held for an attempt that will not start.
    fn release_pending_hold(&mut self) {
        let held = self.take_pending_hold();
        for h in held.iter() {
            h.value.release(&self.tu.handle.pol.budget);
        }
    }

    fn rng(&mut self) -> &mut Pcg64Mcg {
        let seed = splitmix(self.sh().seed ^ splitmix(self.seq));
        self.rng.get_or_insert_with(|| Pcg64Mcg::seed_from_u64(seed))
    }

    #[inline]
    fn pol(&self) -> &Compiled {
        &self.tu.handle.pol
    }

    #[inline]
    fn sh(&self) -> &Shared {
        &self.tu.handle.pol.shared
    }

    #[inline(always)]
    fn now(&self) -> Nanos {
        self.tu.clock.now_ns()
    }

    #[inline]
    fn active(&self) -> bool {
        self.sh().bus.active()
    }

    #[inline]
    fn route(&self) -> &Route {
        let pol = self.pol();
        self.route_key()
            .and_then(|k| pol.policy.routes.get(k.as_str()))
            .unwrap_or(&pol.adhoc)
    }

    #[inline]
    fn count(&self, c: Ctr) {
        self.tu.handle.sink().bump(c);
        if let Some(t) = &self.tenant_counters {
            t.value.bump(c);
        }
    }

    fn count_stop(&self, r: Reason) {
        self.tu.handle.sink().stop(r);
        if let Some(t) = &self.tenant_counters {
            t.value.stop(r);
        }
    }

    /// The upstream an attempt in flight went to.
    #[inline]
    fn tu_of<'a>(&'a self, f: &'a InFlight) -> &'a ThreadUp {
        f.tu().map_or(&self.tu, |t| &**t)
    }

    /// The thread's state of `upstream` under this call's policy version.
    fn thread_up(&self, upstream: &str, now_ms: u64) -> Arc<ThreadUp> {
        thread_up(self.sh().engine_id, &self.tu.handle, upstream, now_ms)
    }

    /// A record with the call's common fields.
    #[inline(always)]
    fn rec(&self, kind: EventKind, now: Nanos) -> Rec {
        rec_for(
            self.pol().version_idx,
            &self.id,
            &self.tenant,
            &self.task,
            self.deadline_at,
            kind,
            now,
        )
    }

    /// Records an event built in place by `fill` (records are large: never copied).
    #[inline(always)]
    fn emit_with(&self, kind: EventKind, now: Nanos, fill: impl FnOnce(&mut Rec)) {
        let mut e = self.rec(kind, now);
        fill(&mut e);
        self.emit(&mut e);
    }

    /// Records an event: into this thread's ring (or the shared one), and to the sinks.
    #[inline(always)]
    fn emit(&self, e: &mut Rec) {
        let end = e.kind == EventKind::AttemptEnd;
        let at = self.sh().bus.write(self.tu.handle.ring_here(), e);
        // An attempt's end is remembered so that the decision right after it can fold into it.
        self.last_end.set(match (end, at) {
            (true, Some(index)) => Some(EndMark {
                index,
                attempt: e.attempt.unwrap_or(0),
                hedge: e.hedge,
                upstream: e.upstream.take(),
            }),
            _ => None,
        });
    }

    /// An attempt event of this call with only the common fields set.
    #[inline(always)]
    fn hot<'a>(&'a self, kind: EventKind, now: Nanos, tu: &'a ThreadUp, attempt: u32) -> Hot<'a> {
        Hot {
            kind,
            at_ns: now.0,
            version: self.pol().version_idx,
            id: self.id.raw(),
            upstream: &tu.up.key,
            up_packed: tu.up.value.packed,
            tenant: self.tenant.as_ref(),
            task: self.task.as_ref(),
            attempt,
            start: false,
            hedge: false,
            status: None,
            error_class: None,
            reason: None,
            phase: None,
            error_kind: None,
            delay_ms: None,
            remaining_ms: 0,
        }
    }

    /// Records an attempt's start or end (see [`Call::emit`]).
    /// Returns the record's index in this thread's ring, when it went there.
    #[inline(always)]
    fn emit_hot(&self, h: &Hot) -> Option<u64> {
        let at = self.sh().bus.write_hot(self.tu.handle.ring_here(), h);
        self.last_end.set(match (h.kind == EventKind::AttemptEnd, at) {
            (true, Some(index)) => Some(EndMark::of(index, h)),
            _ => None,
        });
        at
    }

    /// Records an attempt's end, written into its start record when that is
    /// still the newest of this thread's ring, with `then` (the decision
    /// right after it) folded in too. True when `then` was recorded.
    #[inline(always)]
    fn emit_end(&self, start_rec: Option<u64>, h: &Hot, then: Option<Then>) -> bool {
        if let Some(index) = start_rec {
            if self.sh().bus.end_in_place(self.tu.handle.ring_here(), index, h, then) {
                self.last_end.set(then.is_none().then(|| EndMark::of(index, h)));
                return then.is_some();
            }
        }
        self.emit_hot(h);
        false
    }

    /// Folds a decision into the attempt-end record written just before it,
    /// when that is the last record of this thread's ring.
    #[inline]
    fn fold(&self, attempt: u32, hedge: bool, upstream: Option<&SmolStr>, then: Then) -> bool {
        let Some(m) = self.last_end.take() else {
            return false;
        };
        if m.attempt != attempt || m.hedge != hedge || m.upstream.as_ref() != upstream {
            return false;
        }
        match self.tu.handle.ring_here() {
            Some(ring) => ring.fold(m.index, then),
            None => false,
        }
    }

    /// The registry key of `dims` for this call's tenant, priority and task.
    fn scope(&self, dims: &[ScopeDim], upstream: &str) -> String {
        scope_key(
            dims,
            upstream,
            &self.pol().policy,
            self.tenant.as_deref(),
            self.priority(),
            self.task.as_deref(),
        )
    }

    /// Which breaker cell an attempt to `up` holds.
    #[inline]
    fn hold_breaker(&self, up: &UpstreamState, upstream: &str, now_ms: u64) -> Held {
        match &up.breaker {
            BreakerRef::None => Held::None,
            BreakerRef::Fixed(..) => Held::Fixed,
            BreakerRef::PerCall => {
                let p = &self.pol().policy;
                let key = self.scope(&p.breaker.scope, upstream);
                match breaker_override(p, display_key(&key), upstream) {
                    Some(BreakerOverride::Disabled) => Held::None,
                    ovr => Held::PerCall(self.pol().breaker_cell(&key, now_ms), ovr),
                }
            }
        }
    }

    /// The cell and override behind a [`Held`].
    #[inline]
    fn held_cell<'a>(held: &'a Held, tu: &'a ThreadUp) -> Option<(&'a Slot<BreakerCell>, Option<BreakerOverride>)> {
        match held {
            Held::None => None,
            Held::Fixed => match &tu.up.value.breaker {
                BreakerRef::Fixed(c, o) => Some((c, *o)),
                _ => None,
            },
            Held::PerCall(c, o) => Some((c, *o)),
        }
    }

    fn who(&self) -> Who<'_> {
        Who {
            tenant: self.tenant.as_deref(),
            priority: self.priority(),
            task: self.task.as_deref(),
        }
    }

    fn is_open(&self, upstream: &str, now_ms: u64) -> bool {
        upstream_open(self.pol(), upstream, &self.who(), now_ms, Some(&self.tu))
    }

    fn match_now(&self, tried: &[&str], larger_than: Option<u64>, now_ms: u64) -> MatchResult {
        match_route(
            self.pol(),
            self.route(),
            &self.who(),
            self.needs(),
            tried,
            larger_than,
            now_ms,
            Some(&self.tu),
        )
    }

    #[inline]
    fn finish(&mut self, d: Decision, now: Nanos) -> Decision {
        match d.action {
            Action::Succeeded => {}
            Action::Reconcile => {
                self.count(Ctr::Reconciles);
                self.count_stop(d.reason);
            }
            _ => self.count_stop(d.reason),
        }
        self.release_pending_hold();
        if self.active() {
            self.record_decision(&d, now);
        }
        self.final_decision = Some(Final::of(&d));
        d
    }

    /// Records the decision event, folded into the attempt-end record it follows when it can be.
    fn record_decision(&self, d: &Decision, now: Nanos) {
        let remaining_ms = self.deadline_at.saturating_sub(now).ms();
        let plain = d.detail.is_none() && d.excluded.is_empty();
        let then = Then {
            action: d.action,
            reason: d.reason,
            error_class: d.class,
            remaining_ms,
            delay_ms: 0,
            wait_source: WaitSource::None,
        };
        // The usual end: the decision right after its attempt's end, folded into that record.
        if !(plain && self.fold(d.attempt, d.hedge, d.upstream.as_ref(), then)) {
            self.emit_with(EventKind::Decision, now, |e| {
                e.action = Some(d.action);
                e.reason = Some(d.reason);
                e.error_class = d.class;
                e.upstream = d.upstream.clone();
                e.attempt = Some(d.attempt).filter(|n| *n > 0);
                e.attempt_id = e.attempt;
                e.resend_count = e.attempt.map(|n| n.saturating_sub(1));
                e.delay_ms = Some(0);
                e.wait_source = Some(WaitSource::None);
                e.hedge = d.hedge;
                if !plain {
                    let x = e.extra();
                    x.detail = d.detail.clone();
                    x.excluded = d.excluded.clone();
                }
            });
        }
    }

    fn stop_decision(&self, reason: Reason, class: Option<ErrorClass>, attempt: u32) -> Decision {
        Decision {
            action: Action::Stop,
            delay: Duration::ZERO,
            class,
            reason,
            upstream: Some(self.tu.up.key.clone()),
            wait_source: WaitSource::None,
            retry_after: None,
            on_failure: Some(self.route().on_failure),
            detail: None,
            attempt,
            hedge: false,
            excluded: Vec::new(),
        }
    }

    /// Why no attempt may start with `remaining` left (less than
    /// `min_attempt`, or nothing), as the stop's detail; `None` when one may.
    #[inline]
    fn too_late(&self, remaining: Nanos) -> Option<String> {
        (remaining < self.pol().min_attempt || remaining.is_zero()).then(|| {
            format!(
                "{} ms left, min_attempt is {} ms",
                remaining.ms(),
                self.pol().policy.min_attempt_ms
            )
        })
    }

    fn stop_now(&mut self, reason: Reason, detail: Option<String>, now: Nanos) -> Stopped {
        let mut d = self.stop_decision(reason, self.last_class, self.attempts);
        d.detail = detail;
        if reason == Reason::DeadlineExceeded && d.class.is_none() {
            d.class = Some(ErrorClass::DeadlineExceeded);
        }
        self.finish(d, now).stopped()
    }

    /// The next attempt to make, or why none may start. Checks, in order: the
    /// call is not finished; an idempotency conflict; the deadline minus
    /// `min_attempt`; attempts left; adaptive throttling; the target's breaker
    /// (moving to an eligible fallback when it is open); concurrency gates.
    #[inline]
    pub fn next_attempt(&mut self) -> Result<Attempt, Stopped> {
        self.next_attempt_in()
    }

    #[inline]
    fn next_attempt_in(&mut self) -> Result<Attempt, Stopped> {
        let now = self.now();
        self.next_attempt_at(now)
    }

    /// The lane's attempt when it may grant one (inlined into the caller),
    /// else the general path's (kept out of line).
    #[inline(always)]
    fn next_attempt_at(&mut self, now: Nanos) -> Result<Attempt, Stopped> {
        if self.lane {
            if let Some(a) = self.lane_attempt(now) {
                return Ok(a);
            }
        }
        self.next_attempt_general(now)
    }

    #[inline(never)]
    fn next_attempt_general(&mut self, now: Nanos) -> Result<Attempt, Stopped> {
        if let Some(f) = &self.final_decision {
            return Err(f.stopped());
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
        if let Some(c) = self.x.as_mut().and_then(|e| e.conflict.take()) {
            return Err(self.stop_now(Reason::IdempotencyConflict, Some(c), now));
        }
        let remaining = self.deadline_at.saturating_sub(now);
        if let Some(detail) = self.too_late(remaining) {
            return Err(self.stop_now(Reason::DeadlineExceeded, Some(detail), now));
        }
        if self.attempts >= self.max_attempts {
            return Err(self.stop_now(Reason::MaxAttempts, None, now));
        }
        if let Some(e) = self.x.as_mut().filter(|e| e.fallback_pending) {
            e.fallback_pending = false;
            let m = self.match_now(&[], None, now.ms());
            if m.eligible.is_empty() {
                let all_open = !m.excluded.is_empty() && m.excluded.iter().all(|(_, e)| *e == Exclusion::BreakerOpen);
                let reason = if all_open {
                    Reason::BreakerOpen
                } else {
                    Reason::NoEligibleUpstream
                };
                let mut d = self.stop_decision(reason, self.last_class, self.attempts);
                d.excluded = m.exclusion_strings();
                return Err(self.finish(d, now).stopped());
            }
        }
        let retry = self.next == Next::Retry;
        self.admit(None, retry, now, remaining)
    }

    /// Throttle, breaker (with fallback when open), gates; then starts the
    /// attempt. `hedge` names the hedge's upstream and its state; without
    /// it the attempt goes to the call's target.
    #[inline]
    fn admit(
        &mut self,
        hedge: Option<(SmolStr, Arc<ThreadUp>)>,
        retry: bool,
        now: Nanos,
        remaining: Nanos,
    ) -> Result<Attempt, Stopped> {
        let now_ms = now.ms();
        let is_hedge = hedge.is_some();
        let (mut target, mut hedge_tu) = match hedge {
            Some((t, u)) => (t, Some(u)),
            None => (self.tu.up.key.clone(), None),
        };
        if self.pol().policy.throttle.enabled {
            self.throttle(&target, is_hedge, now)?;
        }
        // Breaker: one atomic load while closed; anything else takes the slow path.
        let mut probe = false;
        let (mut held, refused) = match &hedge_tu.as_deref().unwrap_or(&self.tu).up.value.breaker {
            BreakerRef::Fixed(cell, ovr) => match cell.value.acquire(&self.pol().breaker, *ovr, now_ms) {
                (Admit::Allowed { probe: p }, None) => {
                    probe = p;
                    (Held::Fixed, None)
                }
                (a, t) => (Held::Fixed, Some((a, t, cell.key.clone()))),
            },
            BreakerRef::PerCall => self.acquire_per_call(&target, now_ms, &mut probe),
            BreakerRef::None => (Held::None, None),
        };
        if let Some((admit, t, key)) = refused {
            match self.breaker_verdict(admit, t, &key, &target, is_hedge, now)? {
                Verdict::Go { probe: p } => probe = p,
                Verdict::Moved {
                    target: u,
                    held: h,
                    probe: p,
                } => {
                    probe = p;
                    target = u;
                    held = h;
                    hedge_tu = None;
                }
            }
        }
        // Concurrency gates: per scope (first attempts and retries apart) and per priority pool.
        let slots = if self.pol().gated {
            match self.enter_gates(&target, retry, now_ms) {
                Ok(g) => Some(g),
                Err(detail) => {
                    if let Some((c, _)) = Self::held_cell(&held, hedge_tu.as_deref().unwrap_or(&self.tu)) {
                        c.value.release(&self.pol().breaker, probe);
                    }
                    return Err(self.gate_refusal(is_hedge, detail, now));
                }
            }
        } else {
            None
        };
        let number = self.attempts + 1;
        let c = Ctr::attempt(number);
        self.count(c);
        {
            let tu = hedge_tu.as_deref().unwrap_or(&self.tu);
            tu.sink().bump(c);
            // The budget counts requests: one per first attempt, in every scope of the call.
            if !retry && !is_hedge {
                self.deposit(&tu.up.value, &target, now_ms);
            }
        }
        self.attempts = number;
        self.target_attempts += 1;
        if let Some(e) = self.x.as_mut().filter(|e| e.route_key.is_some()) {
            if !e.tried.contains(&target) {
                e.tried.push(target.clone());
            }
        }
        let budget_hold = if is_hedge { Few::new() } else { self.take_pending_hold() };
        let start_rec = if self.active() {
            let mut h = self.hot(
                if is_hedge {
                    EventKind::Hedge
                } else {
                    EventKind::AttemptStart
                },
                now,
                hedge_tu.as_deref().unwrap_or(&self.tu),
                number,
            );
            h.start = true;
            h.hedge = is_hedge;
            // Every caller passes `remaining` as the deadline minus `now`.
            h.remaining_ms = remaining.ms();
            self.emit_hot(&h)
        } else {
            None
        };
        let more = (hedge_tu.is_some() || slots.is_some() || !budget_hold.is_empty()).then(|| {
            Box::new(FlightMore {
                tu: hedge_tu,
                slots,
                budget_hold,
            })
        });
        self.in_flight.push(InFlight {
            number,
            probe,
            retry,
            hedge: is_hedge,
            started_ns: now.0,
            remaining_ms: remaining.ms(),
            start_rec,
            breaker: held,
            more,
        });
        let pol = &self.tu.handle.pol;
        let tokens = match &*self.x {
            Some(e) => TokenEstimate {
                input: e.needs.input_tokens,
                max_output: e.needs.max_output_tokens,
            },
            None => TokenEstimate::default(),
        };
        Ok(Attempt {
            number,
            fallback: self
                .x
                .as_ref()
                .is_some_and(|e| e.route_key.is_some() && target != e.first_upstream),
            upstream: target,
            timeouts: pol.timeouts(remaining, tokens),
            remaining,
            request_id: self.id.clone(),
            idempotency_key: self.key.clone(),
            hedge: is_hedge,
            started: now,
            margin_ms: pol.margin_ms,
            propagate: pol.policy.propagation.enabled,
            wire_number: self.x.as_ref().and_then(|e| e.inbound_attempt).unwrap_or(number),
        })
    }

    /// The breaker of a scope that depends on the call: resolve it, then ask it.
    #[cold]
    #[inline(never)]
    #[allow(clippy::type_complexity)]
    fn acquire_per_call(
        &self,
        target: &str,
        now_ms: u64,
        probe: &mut bool,
    ) -> (Held, Option<(Admit, Option<Transition>, SmolStr)>) {
        let p = &self.pol().policy;
        let key = self.scope(&p.breaker.scope, target);
        let (cell, ovr) = match breaker_override(p, display_key(&key), target) {
            Some(BreakerOverride::Disabled) => return (Held::None, None),
            ovr => (self.pol().breaker_cell(&key, now_ms), ovr),
        };
        let refused = match cell.value.acquire(&self.pol().breaker, ovr, now_ms) {
            (Admit::Allowed { probe: p }, None) => {
                *probe = p;
                None
            }
            (a, t) => Some((a, t, cell.key.clone())),
        };
        (Held::PerCall(cell, ovr), refused)
    }

    /// Deposits one request into every budget scope of `up` for this call.
    #[inline]
    fn deposit(&self, up: &UpstreamState, target: &str, now_ms: u64) {
        let pol = self.pol();
        for s in up.budgets.iter() {
            match s {
                BudgetScope::Fixed(cell) => cell.value.deposit(&pol.budget, now_ms),
                BudgetScope::PerCall(i) => {
                    let key = self.scope(&pol.policy.budget.scopes[*i], target);
                    pol.budget_cell(&key, now_ms).value.deposit(&pol.budget, now_ms);
                }
            }
        }
    }

    /// The breaker did not simply admit: record its transition, and on a
    /// refusal move to an eligible fallback (or stop).
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn breaker_verdict(
        &mut self,
        admit: Admit,
        t: Option<Transition>,
        key: &str,
        target: &SmolStr,
        is_hedge: bool,
        now: Nanos,
    ) -> Result<Verdict, Stopped> {
        self.on_transition(key, t, now);
        match admit {
            Admit::Allowed { probe } => Ok(Verdict::Go { probe }),
            Admit::Rejected { .. } if is_hedge => Err(Stopped {
                reason: Reason::BreakerOpen,
                class: None,
                on_failure: None,
                detail: None,
            }),
            Admit::Rejected { retry_in_ms } => {
                let (u, held, probe) = self.breaker_fallback(target, key, retry_in_ms, now)?;
                Ok(Verdict::Moved { target: u, held, probe })
            }
        }
    }

    /// Adaptive throttling: a rejected attempt stops the call (or the hedge) without touching the network.
    fn throttle(&mut self, target: &str, is_hedge: bool, now: Nanos) -> Result<(), Stopped> {
        let now_ms = now.ms();
        let tu = self.tu.clone();
        let pol = &tu.handle.pol;
        let p = &pol.policy;
        let key = self.scope(&p.throttle.scope, target);
        let params = pol.throttle;
        let cell = pol
            .shared
            .throttles
            .get_or_insert(&key, now_ms, p.limits.max_keys, p.limits.idle_ms, || {
                ThrottleCell::new(params)
            });
        let draw: f64 = self.rng().gen();
        let Err(prob) = cell.value.admit(&params, now_ms, draw) else {
            return Ok(());
        };
        self.count(Ctr::Throttled);
        if is_hedge {
            return Err(Stopped {
                reason: Reason::Throttled,
                class: None,
                on_failure: None,
                detail: None,
            });
        }
        Err(self.stop_now(Reason::Throttled, Some(format!("p_reject={prob:.3}")), now))
    }

    /// The target's breaker refused: switch to the next eligible candidate
    /// (if the route and mode allow and its breaker admits), else stop.
    /// Returns the new target, its breaker hold and whether the attempt is a probe.
    fn breaker_fallback(
        &mut self,
        target: &SmolStr,
        key: &str,
        retry_in_ms: u64,
        now: Nanos,
    ) -> Result<(SmolStr, Held, bool), Stopped> {
        let now_ms = now.ms();
        let no_tried = Few::new();
        let tried: Vec<&str> = self
            .x
            .as_ref()
            .map_or(&no_tried, |e| &e.tried)
            .iter()
            .map(|s| s.as_str())
            .chain(std::iter::once(target.as_str()))
            .collect();
        let m = self.match_now(&tried, None, now_ms);
        let alt = if self.fallback_allowed() {
            m.eligible.first().cloned()
        } else {
            None
        };
        let Some(u) = alt else {
            let mut d = self.stop_decision(Reason::BreakerOpen, self.last_class, self.attempts);
            d.detail = Some(format!("breaker {} open for {retry_in_ms} ms more", display_key(key)));
            d.excluded = m.exclusion_strings();
            return Err(self.finish(d, now).stopped());
        };
        let u = SmolStr::from(u);
        let tu2 = self.thread_up(&u, now_ms);
        let held2 = self.hold_breaker(&tu2.up.value, &u, now_ms);
        let mut probe = false;
        let mut ok = true;
        if let Some((c2, o2)) = Self::held_cell(&held2, &tu2) {
            let (a2, t2) = c2.value.acquire(&self.pol().breaker, o2, now_ms);
            self.on_transition(&c2.key, t2, now);
            match a2 {
                Admit::Allowed { probe: pr } => probe = pr,
                Admit::Rejected { .. } => ok = false,
            }
        }
        if !ok {
            let detail = format!("{target} and {u} refuse traffic");
            return Err(self.stop_now(Reason::BreakerOpen, Some(detail), now));
        }
        self.count(Ctr::Fallbacks);
        if self.active() {
            self.emit_with(EventKind::Fallback, now, |e| {
                e.upstream = Some(u.clone());
                e.reason = Some(Reason::BreakerOpen);
                e.extra().excluded = m.exclusion_strings();
            });
        }
        self.switch_target(u.clone(), tu2);
        Ok((u, held2, probe))
    }

    /// Takes a concurrency-gate slot for the target's scope and a priority-pool slot, or says which refused.
    fn enter_gates(&self, target: &str, retry: bool, now_ms: u64) -> Result<Slots, String> {
        let pol = self.pol();
        let p = &pol.policy;
        let c = &p.concurrency;
        let mut gate = None;
        if c.max_first_attempts.is_some() || c.max_retries.is_some() {
            let key = self.scope(&c.scope, target);
            let cell =
                pol.shared
                    .gates
                    .get_or_insert(&key, now_ms, p.limits.max_keys, p.limits.idle_ms, GateCell::default);
            let limit = if retry { c.max_retries } else { c.max_first_attempts };
            if !cell.value.try_enter(retry, limit) {
                return Err(format!("scope {}", display_key(&key)));
            }
            gate = Some(cell);
        }
        let mut pool = None;
        if !c.pools.is_empty() {
            let name = self.priority().unwrap_or("default");
            if let Some(limit) = c.pools.get(name) {
                let cell = pol
                    .shared
                    .pools
                    .get_or_insert(name, now_ms, 1_024, u64::MAX, PoolCell::default);
                if !cell.value.try_enter(*limit) {
                    if let Some(g) = &gate {
                        g.value.leave(retry);
                    }
                    return Err(format!("pool {name}"));
                }
                pool = Some(cell);
            }
        }
        Ok(Slots { gate, pool })
    }

    fn gate_refusal(&mut self, hedge: bool, detail: String, now: Nanos) -> Stopped {
        if hedge {
            return Stopped {
                reason: Reason::ConcurrencyLimit,
                class: None,
                on_failure: None,
                detail: Some(detail),
            };
        }
        self.stop_now(Reason::ConcurrencyLimit, Some(detail), now)
    }

    fn switch_target(&mut self, u: SmolStr, tu: Arc<ThreadUp>) {
        if u != self.tu.up.key {
            self.tu = Lent::new(tu);
            self.target_attempts = 0;
        }
    }

    fn on_transition(&self, key: &str, t: Option<Transition>, now: Nanos) {
        let Some(t) = t else { return };
        if t.to == BreakerState::Open {
            self.count(Ctr::BreakerOpens);
        }
        if self.active() {
            self.emit_with(EventKind::BreakerTransition, now, |e| {
                e.extra().breaker = Some(BreakerChange {
                    key: display_key(key).to_string(),
                    from: t.from.as_str(),
                    to: t.to.as_str(),
                    reason: t.reason,
                    open_for_ms: t.open_for_ms,
                });
            });
        }
    }

    fn hedging_allowed(&self) -> bool {
        self.route().hedge_after_ms.is_some()
            && self.idem != Idempotency::Unsafe
            && self.owner
            && self.sh().mode().hedging
    }

    fn fallback_allowed(&self) -> bool {
        self.route().fallback == FallbackMode::Allowed && self.sh().mode().fallback && self.owner
    }

    /// Reports the outcome of the most recent attempt in flight.
    #[inline]
    pub fn report(&mut self, outcome: &Outcome) -> Decision {
        let n = self.in_flight.last().map(|f| f.number).unwrap_or(0);
        self.report_attempt(n, outcome)
    }

    /// Reports the outcome of attempt `number` (needed only with hedging, when
    /// two attempts are in flight). The decision is final once the call
    /// succeeded, stopped or must reconcile; later reports of sibling attempts
    /// return that final decision.
    #[inline]
    pub fn report_attempt(&mut self, number: u32, outcome: &Outcome) -> Decision {
        self.report_in(number, outcome)
    }

    /// The lane's decision when it may make it (inlined into the caller),
    /// else the general path's (kept out of line).
    #[inline(always)]
    fn report_in(&mut self, number: u32, outcome: &Outcome) -> Decision {
        if self.lane {
            if let Some(d) = self.lane_report(number, outcome) {
                return d;
            }
        }
        self.report_general(number, outcome)
    }

    #[inline(never)]
    fn report_general(&mut self, number: u32, outcome: &Outcome) -> Decision {
        if let Some(hook) = &self.pol().policy.testing.panic_on_vendor_code {
            if outcome.vendor_code.as_deref() == Some(hook.as_str()) {
                panic!("retrywise test hook: forced panic inside a decision");
            }
        }
        let Some(f) = self.in_flight.take(|f| f.number == number) else {
            if let Some(f) = &self.final_decision {
                return f.decision(&self.tu.up.key);
            }
            let mut d = self.stop_decision(Reason::InvalidState, None, number);
            d.detail = Some(format!("attempt {number} is not in flight"));
            d.on_failure = None;
            return d;
        };
        let now = self.now();
        let now_ms = now.ms();
        let elapsed_ms = now.0.saturating_sub(f.started_ns) / 1_000_000;
        let pol = self.pol();
        f.leave(&pol.budget);
        let f_up = self.tu_of(&f).up.key.clone();
        let cls = pol.classifier.classify(outcome, self.idem);
        // Breaker, throttle and per-upstream counters see every attempt.
        let transition = Self::held_cell(&f.breaker, self.tu_of(&f)).and_then(|(cell, ovr)| {
            // Upstream health, not the caller's idempotency or what its consumer saw.
            let rec = match (cls.disposition, cls.evidence) {
                (Disposition::Succeeded, _) => Record::Success,
                (_, Some(c)) if pol.breaker.counts(c) => Record::Failure,
                _ => Record::Ignored,
            };
            let t = cell
                .value
                .record(&pol.breaker, ovr, now_ms, f.probe, rec, pol.breaker.is_slow(elapsed_ms));
            t.map(|t| (cell.key.clone(), t))
        });
        if pol.policy.throttle.enabled {
            let key = self.scope(&pol.policy.throttle.scope, &f_up);
            if let Some(cell) = pol.shared.throttles.get(&key) {
                cell.value.settle(now_ms, throttle::verdict(cls.class));
            }
        }
        let hint = if pol.policy.retry_after.enabled && (!outcome.headers.is_empty() || outcome.retry_delay.is_some()) {
            wait_hint(outcome, || pol.shared.clock.wall())
        } else {
            Default::default()
        };
        self.last_class = cls.class;
        if let Some((key, t)) = transition {
            self.on_transition(&key, Some(t), now);
        }
        // True once the success decision is recorded with the attempt's end.
        let mut decided = false;
        if self.active() {
            let mut h = self.hot(EventKind::AttemptEnd, now, self.tu_of(&f), f.number);
            h.error_class = cls.class;
            h.reason = Some(cls.reason);
            h.phase = if cls.class.is_some() { Some(cls.phase) } else { None };
            h.status = outcome.status;
            h.error_kind = outcome.error;
            h.hedge = f.hedge;
            h.remaining_ms = f.remaining_ms;
            h.delay_ms = Some(elapsed_ms);
            let allow = &self.pol().policy.telemetry.header_allowlist;
            let headers: Vec<(String, String)> = match outcome.headers.is_empty() {
                true => Vec::new(),
                false => outcome
                    .headers
                    .iter()
                    .filter(|(k, _)| header_allowed(k, allow))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            };
            if headers.is_empty() {
                // A success ends the call: its decision goes into the same record.
                let then = (cls.disposition == Disposition::Succeeded && self.final_decision.is_none())
                    .then(|| Then::success(self.deadline_at.saturating_sub(now).ms()));
                decided = self.emit_end(f.start_rec, &h, then);
            } else {
                let mut e = h.to_rec();
                e.extra().headers = headers;
                self.emit(&mut e);
            }
        }
        if let Some(f) = &self.final_decision {
            // A sibling already ended the call (hedging).
            return f.decision(&self.tu.up.key);
        }
        let base = |s: &Self| Decision {
            action: Action::Stop,
            delay: Duration::ZERO,
            class: cls.class,
            reason: cls.reason,
            upstream: Some(f_up.clone()),
            wait_source: WaitSource::None,
            retry_after: hint.wait,
            on_failure: Some(s.route().on_failure),
            detail: hint.problem.map(|p| p.as_str().to_string()),
            attempt: f.number,
            hedge: f.hedge,
            excluded: Vec::new(),
        };
        match cls.disposition {
            Disposition::Succeeded => {
                let c = Ctr::success(f.number);
                self.count(c);
                self.tu_of(&f).sink().bump(c);
                self.release_pending_hold();
                let d = Decision::success(f.number, f.hedge, f_up.clone());
                if !decided && self.active() {
                    self.record_decision(&d, now);
                }
                self.final_decision = Some(Final::Succeeded {
                    attempt: f.number,
                    hedge: f.hedge,
                    upstream: Some(f_up),
                });
                d
            }
            Disposition::Reconcile => {
                let d = Decision {
                    action: Action::Reconcile,
                    ..base(self)
                };
                self.push_reconcile(&d, &f, now_ms);
                self.finish(d, now)
            }
            Disposition::Stop => {
                let switch = if cls.larger_context {
                    let real = outcome.input_tokens.or(self.needs().input_tokens);
                    if let Some(n) = outcome.input_tokens {
                        self.ext_mut().needs.input_tokens = Some(n);
                    }
                    let cur_ctx = self
                        .pol()
                        .policy
                        .upstreams
                        .get(f_up.as_str())
                        .and_then(|u| u.context_tokens);
                    let floor = match (real, cur_ctx) {
                        (Some(r), _) => Some(
                            r.saturating_add(self.needs().max_output_tokens.unwrap_or(0))
                                .saturating_sub(1),
                        ),
                        (None, Some(c)) => Some(c),
                        (None, None) => None,
                    };
                    Some(floor)
                } else if cls.class == Some(ErrorClass::PartialStream)
                    && !self.route().forbid_after_stream_started
                    && self.idem == Idempotency::Safe
                    && self.route_key().is_some()
                {
                    Some(None)
                } else {
                    None
                };
                match switch {
                    Some(larger_than) if self.fallback_allowed() && self.sh().mode().retries => {
                        let d = base(self);
                        self.continue_call(d, &f, now, true, larger_than, &hint)
                    }
                    _ => {
                        let d = base(self);
                        self.finish(d, now)
                    }
                }
            }
            Disposition::Retryable => {
                let d = base(self);
                self.continue_call(d, &f, now, false, None, &hint)
            }
        }
    }

    /// The budget cell of scope `i` (`dims`) for `target`: the upstream's
    /// own when the scope depends only on it (borrowed, no reference count
    /// touched), otherwise looked up for this call.
    fn budget_scope<'a>(
        &self,
        i: usize,
        dims: &[ScopeDim],
        target: &str,
        fixed: Option<&'a ThreadUp>,
        now_ms: u64,
    ) -> CellRef<'a> {
        match fixed.and_then(|u| u.up.value.budgets.get(i)) {
            Some(BudgetScope::Fixed(c)) => CellRef::Borrowed(c),
            _ => CellRef::Owned(self.pol().budget_cell(&self.scope(dims, target), now_ms)),
        }
    }

    /// Takes one retry from every budget scope `target` belongs to. On a
    /// refusal, earlier grants are refunded, the refusal is counted, and the
    /// refusing scope key is returned. Retries and hedges share this path.
    /// The granted cells are held (to free their in-flight slot when the
    /// attempt ends) only when the policy caps retries in flight.
    fn withdraw_budget(
        &self,
        target: &str,
        tu: Option<&ThreadUp>,
        now_ms: u64,
    ) -> Result<BudgetHold, (Refusal, String)> {
        let pol = self.pol();
        let p = &pol.policy;
        let mut held: BudgetHold = Few::new();
        if !p.budget.enabled {
            return Ok(held);
        }
        let params = pol.budget;
        let fixed = tu.filter(|u| u.up.key == target);
        let mut granted: Few<CellRef<'_>> = Few::new();
        for (i, dims) in p.budget.scopes.iter().enumerate() {
            let cell = self.budget_scope(i, dims, target, fixed, now_ms);
            if let Err(r) = cell.value.try_withdraw(&params, now_ms) {
                for h in &granted {
                    h.value.refund(&params, now_ms);
                }
                self.count(Ctr::BudgetRefusals);
                return Err((r, display_key(&cell.key).to_string()));
            }
            granted.push(cell);
        }
        if params.max_in_flight.is_some() {
            for c in &granted {
                held.push(c.to_arc());
            }
        }
        Ok(held)
    }

    /// The upstream whose budget scopes a retry or hedge of this call draws
    /// from: the one its first attempt went to, where its request was counted.
    fn budget_origin(&self) -> SmolStr {
        self.x
            .as_ref()
            .and_then(|e| e.tried.first().cloned())
            .unwrap_or_else(|| self.tu.up.key.clone())
    }

    /// Gives back the retry `withdraw_budget` granted for `target` (the wait did not fit).
    fn refund_budget(&self, target: &str, held: &BudgetHold, now_ms: u64) {
        self.refund_budget_for(target, held, Some(&self.tu), now_ms)
    }

    fn refund_budget_for(&self, target: &str, held: &BudgetHold, tu: Option<&ThreadUp>, now_ms: u64) {
        let pol = self.pol();
        if !held.is_empty() {
            for h in held {
                h.value.refund(&pol.budget, now_ms);
            }
            return;
        }
        if !pol.policy.budget.enabled {
            return;
        }
        let fixed = tu.filter(|u| u.up.key == target);
        for (i, dims) in pol.policy.budget.scopes.iter().enumerate() {
            self.budget_scope(i, dims, target, fixed, now_ms)
                .value
                .refund(&pol.budget, now_ms);
        }
    }

    fn push_reconcile(&self, d: &Decision, f: &InFlight, now_ms: u64) {
        let item = ReconcileItem {
            logical_request_id: self.id.to_string(),
            attempt: f.number,
            upstream: self.tu_of(f).up.key.to_string(),
            idempotency_key: self.key.as_deref().map(str::to_string),
            tenant: self.tenant.as_deref().map(str::to_string),
            class: d.class,
            reason: d.reason,
            at_ms: now_ms,
            policy_version: self.pol().version.to_string(),
        };
        let cap = self.pol().policy.limits.max_keys as usize;
        let sh = self.sh();
        let mut q = sh.reconcile.lock();
        if q.len() >= cap {
            q.pop_front();
            sh.reconcile_dropped.fetch_add(1, Ordering::Relaxed);
        }
        q.push_back(item);
    }

    /// Steps 3–6 of the order of checks: kill switch and ownership, attempts
    /// left, deadline, route, budget, wait.
    #[allow(clippy::too_many_arguments)]
    fn continue_call(
        &mut self,
        base: Decision,
        f: &InFlight,
        now: Nanos,
        force_switch: bool,
        larger_than: Option<u64>,
        hint: &crate::backoff::RetryHint,
    ) -> Decision {
        let now_ms = now.ms();
        let stop = |s: &mut Self, reason: Reason, detail: Option<String>| {
            let mut d = base.clone();
            d.action = Action::Stop;
            d.reason = reason;
            if detail.is_some() {
                d.detail = detail;
            }
            s.finish(d, now)
        };
        if !self.sh().mode().retries {
            return stop(self, Reason::RetriesDisabled, None);
        }
        if !self.owner {
            let detail = format!("upstream owner decides; evidence: {}", base.reason);
            return stop(self, Reason::NotOwner, Some(detail));
        }
        if !self.in_flight.is_empty() {
            // A sibling (hedge) is still running: wait for its outcome rather than add load.
            let mut d = base.clone();
            d.action = Action::Wait;
            d.reason = Reason::SiblingInFlight;
            d.upstream = Some(self.tu.up.key.clone());
            d.detail = Some(format!("evidence: {}", base.reason));
            d.on_failure = None;
            self.next = Next::Retry;
            return d;
        }
        if self.attempts >= self.max_attempts {
            return stop(self, Reason::MaxAttempts, None);
        }
        let remaining = self.deadline_at.saturating_sub(now);
        if let Some(detail) = self.too_late(remaining) {
            return stop(self, Reason::DeadlineExceeded, Some(detail));
        }
        let room = remaining.saturating_sub(self.pol().min_attempt).dur();

        // The server's wait hint, as the rules read it: capped when the
        // policy caps it; an absurd one (beyond a year) is a very long wait.
        let ra = &self.pol().policy.retry_after;
        let (max_ms, on_exceed, ra_jitter) = (ra.max_ms, ra.on_exceed, ra.jitter_ms);
        let max = Duration::from_millis(max_ms);
        let hint_wait = hint
            .wait
            .or((hint.problem == Some(HintProblem::Absurd)).then_some(ABSURD))
            .map(|w| if w > max && on_exceed == OnExceed::Cap { max } else { w });
        // A hint the call cannot honour keeps it off that upstream, not off every upstream.
        let hint_blocks = hint_wait.is_some_and(|w| w > room || w > max);

        // Route: same upstream while it has attempts left, its breaker is not
        // open and its hint fits; otherwise the next eligible candidate (when
        // none is, a blocking hint stops the call below, with its own reason).
        let route = self.route();
        let forbidden = route.fallback == FallbackMode::Forbidden;
        let per_upstream_cap = if forbidden {
            self.max_attempts
        } else {
            route.attempts_per_upstream
        };
        let max_up = route.max_upstreams.unwrap_or(u32::MAX);
        // The call's target, not the reported attempt's upstream: a hedge to another upstream does not move the call.
        // `tu` is the target's state: its breaker is at hand.
        let same_possible = !force_switch
            && self.target_attempts < per_upstream_cap
            && !fixed_open(&self.tu, now_ms).unwrap_or_else(|| self.is_open(&self.tu.up.key, now_ms));
        let mut excluded = Vec::new();
        let (target, is_fallback) = if same_possible && !hint_blocks {
            (self.tu.up.key.clone(), false)
        } else {
            let no_tried = Few::new();
            let tried_upstreams = self.x.as_ref().map_or(&no_tried, |e| &e.tried);
            let tried: Vec<&str> = tried_upstreams.iter().map(|s| s.as_str()).collect();
            let m = self.match_now(&tried, larger_than, now_ms);
            excluded = m.exclusion_strings();
            let distinct = tried_upstreams.len() as u32;
            let current_open = self.is_open(&self.tu.up.key, now_ms);
            let alternative = if forbidden || self.route_key().is_none() {
                Err((
                    if force_switch {
                        base.reason
                    } else if current_open {
                        Reason::BreakerOpen
                    } else {
                        Reason::FallbackForbidden
                    },
                    None,
                ))
            } else if !self.sh().mode().fallback {
                Err((
                    if force_switch {
                        base.reason
                    } else if current_open {
                        Reason::BreakerOpen
                    } else {
                        Reason::FallbackForbidden
                    },
                    Some("fallback switched off (kill switch)".to_string()),
                ))
            } else if distinct >= max_up {
                Err((Reason::MaxUpstreams, None))
            } else {
                match m.eligible.first() {
                    Some(u) => Ok(SmolStr::from(u.as_str())),
                    None => Err((
                        if force_switch {
                            base.reason
                        } else {
                            Reason::NoEligibleUpstream
                        },
                        None,
                    )),
                }
            };
            match alternative {
                Ok(u) => (u, true),
                // Nowhere else to go: the same upstream, whose hint then decides.
                Err(_) if same_possible => {
                    excluded.clear();
                    (self.tu.up.key.clone(), false)
                }
                Err((reason, detail)) => {
                    let mut d = base.clone();
                    d.action = Action::Stop;
                    d.reason = reason;
                    if detail.is_some() {
                        d.detail = detail;
                    } else {
                        d.excluded = excluded;
                    }
                    return self.finish(d, now);
                }
            }
        };

        // Budget: every scope of the upstream the request started on must
        // grant (its requests were counted there, whoever serves the retry).
        let origin = self.budget_origin();
        let held = match self.withdraw_budget(&origin, Some(&self.tu), now_ms) {
            Ok(held) => held,
            Err((r, key)) => {
                let reason = match r {
                    Refusal::Exhausted => Reason::BudgetExhausted,
                    Refusal::Concurrency => Reason::RetryConcurrency,
                };
                let detail = format!("scope {key}");
                if self.active() {
                    self.emit_with(EventKind::BudgetRefusal, now, |e| {
                        e.upstream = Some(target.clone());
                        e.reason = Some(reason);
                        e.extra().detail = Some(detail.clone());
                        e.attempt = Some(f.number);
                        e.attempt_id = Some(f.number);
                    });
                }
                return stop(self, reason, Some(detail));
            }
        };
        let refund = |s: &Self, held: &BudgetHold| s.refund_budget(&origin, held, now_ms);

        // Wait: a retry waits for the upstream that failed (a valid, capped
        // Retry-After wins over jitter and must fit the deadline); a fallback
        // goes to another upstream now, whatever the first one asked for.
        let (delay, source) = match hint_wait {
            _ if is_fallback => (Duration::ZERO, WaitSource::None),
            Some(w) => {
                // The user's deadline comes first: a hint that cannot fit stops at once.
                if w > room {
                    refund(self, &held);
                    let detail = format!("retry-after {} ms, {} ms usable before the deadline", ms(w), ms(room));
                    return stop(self, Reason::RetryAfterExceedsDeadline, Some(detail));
                }
                if w > max {
                    refund(self, &held);
                    let detail = format!("retry-after {} ms > max {} ms", ms(w), max_ms);
                    return stop(self, Reason::RetryAfterTooLarge, Some(detail));
                }
                let mut w = w;
                if ra_jitter > 0 {
                    let extra = Duration::from_millis(self.rng().gen_range(0..=ra_jitter));
                    w = (w + extra).min(room);
                }
                (w, WaitSource::RetryAfter)
            }
            None => {
                let cfg = self.pol().policy.backoff.clone();
                let j = jitter_ms(&cfg, self.retries, self.prev_wait_ms, self.rng());
                (Duration::from_millis(j).min(room), WaitSource::Jitter)
            }
        };
        self.prev_wait_ms = ms(delay);
        self.retries += 1;
        if !held.is_empty() {
            self.ext_mut().pending_hold = held;
        }
        self.next = Next::Retry;
        self.count(Ctr::Retries);
        self.tu_of(f).sink().bump(Ctr::Retries);
        if is_fallback {
            self.count(Ctr::Fallbacks);
            self.tu_of(f).sink().bump(Ctr::Fallbacks);
            let tu = self.thread_up(&target, now_ms);
            self.switch_target(target.clone(), tu);
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
        if self.active() {
            let plain = !is_fallback && !f.hedge && d.detail.is_none() && d.excluded.is_empty();
            let then = Then {
                action: d.action,
                reason: d.reason,
                error_class: d.class,
                remaining_ms: self.deadline_at.saturating_sub(now).ms(),
                delay_ms: ms(delay),
                wait_source: source,
            };
            // A plain retry right after its attempt's end: folded into that record.
            if !(plain && self.fold(f.number, false, Some(&target), then)) {
                self.emit_with(
                    if is_fallback {
                        EventKind::Fallback
                    } else {
                        EventKind::Decision
                    },
                    now,
                    |e| {
                        e.action = Some(d.action);
                        e.reason = Some(d.reason);
                        e.error_class = d.class;
                        e.upstream = Some(target);
                        e.attempt = Some(f.number);
                        e.attempt_id = Some(f.number);
                        e.resend_count = Some(f.number - 1);
                        e.delay_ms = Some(ms(delay));
                        e.wait_source = Some(source);
                        if d.detail.is_some() || !d.excluded.is_empty() {
                            let x = e.extra();
                            x.detail = d.detail.clone();
                            x.excluded = d.excluded.clone();
                        }
                    },
                );
            }
        }
        d
    }

    /// Whether a hedged (parallel) attempt may start now. Hedges are opt-in
    /// per route (`hedge_after_ms`), never issued for `Unsafe` calls, count
    /// against `max_attempts` and draw from the retry budget, and go to a
    /// different eligible upstream when one exists.
    pub fn next_hedge(&mut self) -> HedgePlan {
        self.next_hedge_in()
    }

    fn next_hedge_in(&mut self) -> HedgePlan {
        if self.final_decision.is_some() || !self.hedging_allowed() || self.in_flight.len() != 1 {
            return HedgePlan::No(Reason::HedgeNotAllowed);
        }
        let Some(after) = self.route().hedge_after_ms else {
            return HedgePlan::No(Reason::HedgeNotAllowed);
        };
        let now = self.now();
        let now_ms = now.ms();
        let Some(primary) = self.in_flight.first() else {
            return HedgePlan::No(Reason::HedgeNotAllowed);
        };
        let due = Nanos(primary.started_ns).saturating_add(Nanos::from_ms(after));
        if now < due {
            return HedgePlan::After(due.saturating_sub(now).dur());
        }
        if self.attempts >= self.max_attempts {
            return HedgePlan::No(Reason::MaxAttempts);
        }
        let remaining = self.deadline_at.saturating_sub(now);
        if remaining < self.pol().min_attempt {
            return HedgePlan::No(Reason::DeadlineExceeded);
        }
        let primary = self.tu_of(primary).up.key.clone();
        let target = if self.fallback_allowed() {
            let m = self.match_now(&[primary.as_str()], None, now_ms);
            m.eligible
                .first()
                .map(|s| SmolStr::from(s.as_str()))
                .unwrap_or(primary.clone())
        } else {
            primary.clone()
        };
        let target_up = self.thread_up(&target, now_ms);
        let origin = self.budget_origin();
        let Ok(held) = self.withdraw_budget(&origin, Some(&self.tu), now_ms) else {
            return HedgePlan::No(Reason::BudgetExhausted);
        };
        let saved_target_attempts = self.target_attempts;
        match self.admit(Some((target.clone(), target_up.clone())), true, now, remaining) {
            Ok(mut a) => {
                let own = &self.tu.up.key;
                if let Some(last) = self.in_flight.last_mut() {
                    let more = last.more.get_or_insert_with(Default::default);
                    more.budget_hold = held;
                    // A hedge to the call's own target uses the call's upstream state.
                    if more.tu.as_ref().is_some_and(|t| t.up.key == *own) {
                        more.tu = None;
                    }
                }
                self.target_attempts = saved_target_attempts;
                self.count(Ctr::Hedges);
                self.count(Ctr::Retries);
                a.fallback = self.x.as_ref().is_some_and(|e| target != e.first_upstream);
                HedgePlan::Start(a)
            }
            Err(s) => {
                self.refund_budget(&origin, &held, now_ms);
                HedgePlan::No(s.reason)
            }
        }
    }

    /// Cancels the call: every attempt in flight is reported as cancelled and
    /// the call stops with `cancelled`.
    pub fn cancel(&mut self) -> Decision {
        if let Some(f) = &self.final_decision {
            return f.decision(&self.tu.up.key);
        }
        let numbers: SmallVec<[u32; 2]> = self.in_flight.iter().map(|f| f.number).collect();
        let mut last = None;
        for n in numbers {
            last = Some(self.report_attempt(n, &Outcome::error(ErrorKind::Cancelled).phase(Phase::Sent)));
        }
        match last {
            Some(d) if d.is_final() => d,
            _ => {
                let mut d = self.stop_decision(Reason::Cancelled, Some(ErrorClass::Cancelled), self.attempts);
                d.on_failure = None;
                self.finish(d, self.now())
            }
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        // Abandoned attempts give back their probe permits, gate slots and budget holds.
        if !self.holds_nothing() {
            self.release_holds();
        }
        if self.x.is_some() {
            drop_ext(&mut self.x);
        }
    }
}

#[cold]
#[inline(never)]
fn drop_ext(x: &mut Option<Box<Ext>>) {
    drop(x.take());
}

impl Call {
    #[cold]
    #[inline(never)]
    fn release_holds(&mut self) {
        let pol = &self.tu.handle.pol;
        for f in self.in_flight.iter() {
            if let Some((c, _)) = Self::held_cell(&f.breaker, f.tu().map_or(&self.tu, |t| &**t)) {
                c.value.release(&pol.breaker, f.probe);
            }
            f.leave(&pol.budget);
        }
        for h in self.x.iter().flat_map(|e| e.pending_hold.iter()) {
            h.value.release(&pol.budget);
        }
    }
}
