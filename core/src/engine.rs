//! [`Engine`]: shared (`Send + Sync`, `Clone` is cheap), one per process.
//! It holds the policy in force (swapped by [`Engine::reload`]), the kill
//! switch, the shared state every call reaches, the reconcile list and the
//! counters; [`Engine::begin`] starts a [`Call`] (`call/`).

use crate::call::{Attempt, Call, CallSpec, Stopped};
use crate::clock::{ms, Clock, EngineClock, Nanos, SystemClock};
use crate::guards::breaker::BreakerState;
use crate::hash::splitmix;
use crate::hot::{EngineLocal, Start};
use crate::idempotency::Ledger;
use crate::policy::{BreakerOverride, Mode, Policy, PolicyErrors};
use crate::state::fleet::{Fleet, FleetConfig, FleetError};
use crate::state::registry::Registry;
use crate::state::scope::{breaker_override, display_key, scope_key};
use crate::state::shared::{ReconcileItem, Shared};
use crate::state::version::Version;
use crate::stats::{Counters, Stats, VersionTable};
use crate::telemetry::{Event, EventBus, EventKind, Sink};
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

struct Inner {
    shared: Arc<Shared>,
    policy: ArcSwap<Version>,
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
            first_tokens: Registry::new(),
            tenant_stats: Registry::new(),
            versions: VersionTable::default(),
            bus: EventBus::new(self.policy.telemetry.ring_size),
            ledger: Ledger::default(),
            reconcile: Mutex::new(VecDeque::new()),
            reconcile_dropped: AtomicU64::new(0),
            ratelimits: Arc::new(crate::ratelimit::RateLimits::default()),
            lane: self.lane,
            fleet: std::sync::OnceLock::new(),
        });
        let compiled = Version::new(self.policy, shared.clone(), 1);
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
        let compiled = Arc::new(Version::new(policy, sh.clone(), generation));
        let version = compiled.version.clone();
        self.inner.policy.store(compiled);
        self.inner.generation.store(generation, Ordering::Release);
        sh.bus.set_capacity(ring);
        if sh.bus.active() {
            sh.bus.emit(Event::new(EventKind::Reload, ms(self.now()), version));
        }
        Ok(())
    }

    /// Shares this engine's breakers with the other processes of a fleet
    /// through a store: the returned [`Fleet`] plans each sync cycle for an
    /// adapter to run (see [`crate::fleet`]). One per engine.
    pub fn fleet(&self, cfg: FleetConfig) -> Result<Fleet, FleetError> {
        let inner = self.inner.clone();
        Fleet::attach(
            self.inner.shared.clone(),
            Arc::new(move || inner.policy.load_full()),
            cfg,
        )
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

    /// The route (or upstream) that serves requests for `model` (see
    /// [`crate::rules::route::route_for_model`]): what a transport that serves
    /// many models begins each call on.
    pub fn route_for_model(&self, model: &str) -> Result<String, crate::PolicyError> {
        crate::rules::route::route_for_model(&self.inner.policy.load().policy, model)
    }

    /// How to reach `upstream` (from the policy catalog): what a transport
    /// rewrites a request with for an attempt there ([`crate::wire::rewrite`]).
    pub fn reach(&self, upstream: &str) -> crate::wire::Reach {
        let pol = self.inner.policy.load();
        crate::wire::Reach::of(upstream, pol.policy.upstreams.get(upstream))
    }

    /// A stream gate for one attempt's response body of `content_type`, as
    /// the policy reads streams (`streams.malformed_event`).
    pub fn stream_gate(&self, content_type: Option<&str>) -> crate::StreamGate {
        let pol = self.inner.policy.load();
        crate::StreamGate::new(content_type).on_malformed(pol.policy.streams.malformed_event)
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
            rate_limits: i.ratelimits.counters().named().into_iter().collect(),
            first_token: {
                let mut m = BTreeMap::new();
                i.first_tokens.for_each(|s| {
                    let st = s.value.stats();
                    if st.samples > 0 {
                        m.insert(s.key.to_string(), st);
                    }
                });
                m
            },
        }
    }

    /// Every provider rate-limit scope's limit, remaining allowance and
    /// reservations per kind now, with the counters (`rate_limits` policy).
    pub fn rate_limits(&self) -> crate::ratelimit::RateLimitSnapshot {
        self.inner.shared.ratelimits.snapshot(self.now().as_nanos() as u64)
    }

    /// Prometheus text exposition of [`Engine::stats`], and of
    /// [`Engine::rate_limits`] once a response said anything about limits.
    pub fn prometheus(&self) -> String {
        let mut out = self.stats().prometheus();
        let limits = self.rate_limits();
        if limits.counters.observed > 0 || !limits.scopes.is_empty() {
            out.push_str(&limits.prometheus());
        }
        out
    }

    /// Begins one logical request.
    #[inline(always)]
    pub fn begin(&self, mut spec: CallSpec) -> Call {
        self.begin_at(&mut spec, self.inner.shared.clock.now_ns())
    }

    /// Exactly [`Engine::begin`], for a spec the caller built in place: what
    /// the call keeps is taken out of `spec`, the rest stays there. A spec is
    /// about 340 bytes, and passing one by value copies it at each step: a
    /// binding that begins many calls builds its spec once and lends it.
    ///
    /// ```
    /// use retrywise::{CallSpec, Engine, Policy};
    /// let engine = Engine::new(Policy::default()).unwrap();
    /// let mut spec = CallSpec::new("openai/gpt-4o").tenant("acme");
    /// let mut call = engine.begin_from(&mut spec);
    /// assert_eq!(call.attempts(), 0);
    /// assert_eq!(call.next_attempt().unwrap().number, 1);
    /// ```
    #[inline]
    pub fn begin_from(&self, spec: &mut CallSpec) -> Call {
        self.begin_at(spec, self.inner.shared.clock.now_ns())
    }

    /// [`Engine::begin`], or a `PolicyError` when the policy has no route
    /// of that name ([`crate::rules::route::check_route`]: with routes
    /// declared, a name must be a route or a catalog upstream). What the
    /// bindings call, so a misspelt route is an error before any I/O; plain
    /// `begin` instead returns a call whose first attempt stops with
    /// `no_eligible_upstream` and the same message.
    ///
    /// ```
    /// use retrywise::{CallSpec, Engine, Policy};
    /// let p = Policy::from_str_any("upstreams: {a: {}}\nroutes: {chat: {candidates: [a]}}").unwrap();
    /// let engine = Engine::new(p).unwrap();
    /// assert!(engine.try_begin(CallSpec::new("chat")).is_ok());
    /// let e = engine.try_begin(CallSpec::new("chta")).unwrap_err();
    /// assert!(e.message.contains("known routes: chat"));
    /// ```
    #[inline]
    pub fn try_begin(&self, mut spec: CallSpec) -> Result<Call, crate::PolicyError> {
        self.try_begin_from(&mut spec)
    }

    /// [`Engine::try_begin`] for a spec lent in place, as [`Engine::begin_from`].
    #[inline]
    pub fn try_begin_from(&self, spec: &mut CallSpec) -> Result<Call, crate::PolicyError> {
        self.begin_checked(spec, self.inner.shared.clock.now_ns(), true)
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
        match self.begin_checked(spec, now, false) {
            Ok(call) => call,
            // Never taken: nothing is checked.
            Err(_) => unreachable!("begin without a route check"),
        }
    }

    /// Begins a call; with `check`, a route the policy does not know is a
    /// `PolicyError` instead ([`crate::rules::route::check_route`]), decided
    /// on the policy the thread already holds: a name this thread used
    /// recently as an upstream was checked when it first came.
    #[inline(always)]
    fn begin_checked(&self, spec: &mut CallSpec, now: Nanos, check: bool) -> Result<Call, crate::PolicyError> {
        let inner = &self.inner;
        let direct = (!spec.route.is_empty()).then_some(spec.route.as_str());
        let lb = inner.local.begin(
            inner.generation.load(Ordering::Acquire),
            || inner.policy.load_full(),
            direct,
        );
        Ok(match lb.start {
            // The common call: it names an upstream this thread used recently, and nothing else.
            Start::Cached(tu) if inner.shared.lane && spec.is_plain() => Call::begin_cached(spec, tu, lb.seq, now),
            start => {
                if check {
                    if let Start::Fresh(h) = &start {
                        let p = &h.pol.policy;
                        if !p.routes.is_empty() {
                            crate::rules::route::check_route(p, &spec.route)?;
                        }
                    }
                }
                Call::begin_resolved(std::mem::take(spec), lb.seq, start, now)
            }
        })
    }
}
