//! [`Call`]: one logical request, owned by one thread at a time — the
//! decision loop every binding exposes.
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
//! One file per step: `begin.rs`, `admit.rs` (`next_attempt`), `report.rs`
//! (`report`, `cancel`), `retry.rs` (going on after a failure, by the
//! order in `rules/mod.rs`), `hedge.rs`; `upstreams.rs` (which upstreams
//! the call may go to now); `effects.rs` holds what every path does
//! besides deciding (build, count, deposit, record), `lane.rs` the fast
//! lane's guards.
//!
//! Cost model: a call reads the clock once per step, finds its upstream's
//! shared state once (`state/upstream.rs`) and borrows its thread's
//! reference to it, touches the breaker cell without locks while it is
//! closed, counts its request into its thread's own budget shard (a retry's
//! budget check takes the cell's short lock to add the threads' shards up)
//! and everything else into its thread's own counter
//! block (`hot/`) and records events as compact records into its
//! thread's own event ring (`telemetry/ring/`). The common call (one named
//! upstream, a plain policy, a success) takes straight-line steps
//! (`lane.rs`); everything else, the general ones.

mod admit;
mod attempt;
mod begin;
mod decision;
mod effects;
mod hedge;
mod lane;
mod pace;
mod report;
mod retry;
mod spec;
mod upstreams;

pub use attempt::{Attempt, Stopped};
pub use decision::Decision;
use decision::Final;
pub use hedge::HedgePlan;
pub use spec::CallSpec;

use crate::clock::Nanos;
use crate::few::Few;
use crate::guards::breaker::{BreakerCell, BreakerState, Transition};
use crate::guards::budget::{BudgetCell, BudgetParams};
use crate::guards::gate::{GateCell, PoolCell};
use crate::hash::splitmix;
use crate::hot::{thread_up, Lent, ThreadUp};
use crate::id::RequestId;
use crate::policy::{BreakerOverride, FallbackMode, Route, ScopeDim};
use crate::rules::route::Needs;
use crate::state::ratelimit::{GatePermit, Reservation, Ticket};
use crate::state::registry::Slot;
use crate::state::scope::{breaker_override, display_key, scope_key};
use crate::state::shared::Shared;
use crate::state::upstream::{BreakerRef, UpstreamState};
use crate::state::version::Version;
use crate::stats::{Counters, Ctr};
use crate::telemetry::{BreakerChange, EventKind, Recorder, StartMark};
use crate::types::{ErrorClass, Idempotency, Reason};
use rand::SeedableRng;
use rand_pcg::Pcg64Mcg;
use smol_str::SmolStr;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::Duration;

/// Budget cells holding one granted retry each, released when its attempt is reported.
type BudgetHold = Few<Arc<Slot<BudgetCell>>>;

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
    /// Where the attempt's start was recorded, for writing its end into the same record.
    start_rec: StartMark,
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
    /// Units reserved in the upstream's provider rate-limit scope, settled by the attempt's report.
    rate: Option<Reservation>,
    /// The attempt's place in its rate-limit scope's adaptive concurrency
    /// limit, given back by its report (or, unreported, when dropped).
    permit: Option<GatePermit>,
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
    /// The first attempt stops for this reason, with this detail (an
    /// idempotency conflict, a route the policy does not know).
    refused: Option<(Reason, String)>,
    /// The owner's attempt number, for a call running under an inbound owner.
    inbound_attempt: Option<u32>,
    /// The place a paced wait promised the call in its rate-limit scope's windows to come.
    rate_ticket: Option<Ticket>,
    /// Why the attempt in flight has shorter silence limits than the rules
    /// gave it (`admit.rs`, `keep_room_for_fallback`): said in the decision
    /// on its silent failure.
    clamped: Option<String>,
}

static NO_NEEDS: Needs = Needs {
    capabilities: Vec::new(),
    api: None,
    input_tokens: None,
    max_output_tokens: None,
    data_boundary: None,
    max_cost: None,
};

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
    /// How the call writes its events.
    recorder: Recorder,
    /// Dropped by hand (`Drop for Call`): `None`, the usual case, then costs
    /// one inline check instead of a call to the drop of `Ext`.
    x: ManuallyDrop<Option<Box<Ext>>>,
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

impl Call {
    /// Logical request id.
    pub fn id(&self) -> &str {
        self.id_text.get_or_init(|| self.id.to_smol_str())
    }

    /// Logical request id as the engine keeps it: [`RequestId::parts`]
    /// gives it without printing it.
    pub fn request_id(&self) -> &RequestId {
        &self.id
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
    fn pol(&self) -> &Version {
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

    /// The policy's `min_attempt`, as [`Nanos`] and in ms.
    #[inline]
    fn min_attempt(&self) -> (Nanos, u64) {
        let pol = self.pol();
        (pol.compiled.min_attempt, pol.policy.min_attempt_ms)
    }

    #[inline]
    fn route(&self) -> &Route {
        let pol = self.pol();
        self.route_key()
            .and_then(|k| pol.policy.routes.get(k.as_str()))
            .unwrap_or(&pol.compiled.adhoc)
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
        if let Some(fleet) = self.sh().fleet.get() {
            fleet.breaker(key, &t, crate::state::fleet::wall_ms(self.sh()));
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

    fn fallback_allowed(&self) -> bool {
        self.route().fallback == FallbackMode::Allowed && self.sh().mode().fallback && self.owner
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        // Abandoned attempts give back their probe permits, gate slots and budget
        // holds (their rate-limit reservations and concurrency places go with
        // `in_flight`, when their handles drop).
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
