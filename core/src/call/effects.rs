//! What a call does besides deciding, written once for both paths (the
//! general steps and the fast lane, `lane.rs`): building the call and its
//! attempts, counting, depositing a first attempt's request into the
//! budget, putting attempts in flight, recording starts, ends and decisions
//! (through the call's recorder, `telemetry/recorder.rs`), and ending the
//! call with a success.

use super::{Attempt, Call, Decision, Ext, Final, FlightMore, Held, InFlight, Next};
use crate::clock::Nanos;
use crate::few::Few;
use crate::guards::breaker::{BreakerCell, Record, Transition};
use crate::hot::{Here, Lent, ThreadUp};
use crate::id::{CallId, RequestId};
use crate::policy::BreakerOverride;
use crate::rules::deadline::{TimeoutsMs, TokenEstimate};
use crate::state::registry::Slot;
use crate::state::upstream::BudgetScope;
use crate::state::version::Version;
use crate::stats::{Counters, Ctr};
use crate::telemetry::ring::{End, Start, ThreadRing};
use crate::telemetry::{EventKind, Hot, PlainStart, Rec, Recorder, Then};
use crate::types::{Idempotency, WaitSource};
use smol_str::SmolStr;
use std::mem::ManuallyDrop;
use std::sync::Arc;

/// A record with a call's common fields.
#[inline(always)]
pub(super) fn rec_for(
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

/// The counters of `tenant`, when the call has one.
#[inline(always)]
pub(super) fn tenant_counters(pol: &Version, tenant: Option<&SmolStr>, now_ms: u64) -> Option<Arc<Slot<Counters>>> {
    tenant.map(|t| {
        let l = &pol.policy.limits;
        pol.shared
            .tenant_stats
            .get_or_insert(t, now_ms, l.max_keys, l.idle_ms, Counters::default)
    })
}

impl Call {
    /// A call about to make its first attempt, counted as begun: what
    /// `begin` settled about it (its parts are passed one by one, not as
    /// a struct: the lane's begin then builds the call in place).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn assemble(
        tu: Arc<ThreadUp>,
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
        x: Option<Box<Ext>>,
    ) -> Call {
        tu.handle.sink().bump(Ctr::Begun);
        if let Some(t) = &tenant_counters {
            t.value.bump(Ctr::Begun);
        }
        Call {
            id,
            id_text: std::cell::OnceCell::new(),
            tenant,
            task,
            idem: crate::idempotency::effective(idem, key.is_some()),
            key,
            deadline_at,
            owner,
            lane: tu.lane && owner,
            next: Next::First,
            last_class: None,
            max_attempts,
            attempts: 0,
            target_attempts: 0,
            retries: 0,
            prev_wait_ms: 0,
            seq,
            in_flight: Few::new(),
            rng: None,
            final_decision: None,
            tenant_counters,
            recorder: Recorder::default(),
            x: ManuallyDrop::new(x),
            tu: Lent::new(tu),
        }
    }

    /// Starts attempt `number` to the call's target, or to the upstream of
    /// `more`'s hedge: records its start, counts it, deposits a first
    /// attempt's request into every budget scope of its upstream, and puts
    /// it in flight holding `breaker` (and `more`).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_attempt(
        &mut self,
        number: u32,
        retry: bool,
        hedge: bool,
        probe: bool,
        breaker: Held,
        more: Option<Box<FlightMore>>,
        now: Nanos,
        remaining: Nanos,
    ) {
        let remaining_ms = remaining.ms();
        let tu = more.as_ref().and_then(|m| m.tu.as_deref()).unwrap_or(&self.tu);
        let here = tu.here();
        let start_rec = if tu.handle.pol.shared.bus.active() {
            self.record_start(here.ring, tu, now, number, hedge, remaining_ms)
        } else {
            Default::default()
        };
        self.count_in(&here, Ctr::attempt(number));
        // The budget counts requests: one per first attempt, in every scope.
        if !retry && !hedge {
            self.deposit(tu, &here, now.ms());
        }
        self.in_flight.push(InFlight {
            number,
            probe,
            retry,
            hedge,
            started_ns: now.0,
            remaining_ms,
            start_rec,
            breaker,
            more,
        });
        self.attempts = number;
        self.target_attempts += 1;
    }

    /// Attempt `number` to `upstream` (the caller sets the rest when it
    /// is a hedge, a fallback or a non-owner's), started `now` with
    /// `remaining` left, sent with `request_id`.
    #[inline(always)]
    pub(super) fn attempt(
        &self,
        number: u32,
        upstream: SmolStr,
        request_id: RequestId,
        tokens: TokenEstimate,
        now: Nanos,
        remaining: Nanos,
    ) -> Attempt {
        let pol = &*self.tu.handle.pol;
        let mut timeouts = pol.timeouts(remaining, tokens);
        if pol.policy.timeouts.learn.enabled && upstream == self.tu.up.key {
            if let Some(ms) = self.tu.up.value.first_token.value.limit_ms() {
                self.learned(&mut timeouts, ms);
            }
        }
        Attempt {
            number,
            fallback: false,
            upstream,
            timeouts,
            remaining,
            request_id,
            idempotency_key: self.key.clone(),
            hedge: false,
            started: now,
            margin_ms: pol.compiled.margin_ms,
            propagate: pol.policy.propagation.enabled,
            wire_number: number,
        }
    }

    /// The upstream's learned first-token limit `ms` on an attempt's timeouts
    /// (`timeouts.learn`): its first-token limit, and a streamed request's
    /// first-byte limit, where the policy leaves them to the default rule.
    #[cold]
    #[inline(never)]
    fn learned(&self, t: &mut TimeoutsMs, ms: u32) {
        let p = &self.pol().policy.timeouts;
        let streamed = self
            .x
            .as_ref()
            .is_some_and(|e| e.needs.capabilities.iter().any(|c| c == "streaming"));
        t.learned(ms, p.first_token_ms.is_none(), streamed && p.first_byte_ms.is_none());
    }

    /// Counts `c` into the call's policy version, its tenant and the upstream `here` is of.
    #[inline(always)]
    fn count_in(&self, here: &Here, c: Ctr) {
        here.version.bump(c);
        if let Some(t) = &self.tenant_counters {
            t.value.bump(c);
        }
        here.upstream.bump(c);
    }

    /// Deposits one request into every budget scope of `tu`'s upstream for
    /// this call: into the thread's own shard when it may write it (no
    /// locked instruction).
    #[inline(always)]
    fn deposit(&self, tu: &ThreadUp, here: &Here, now_ms: u64) {
        let pol = &*tu.handle.pol;
        for (i, s) in tu.up.value.budgets.iter().enumerate() {
            match s {
                BudgetScope::Fixed(cell) => match here.deposits.get(i) {
                    Some(Some(d)) => cell.value.deposit_via(d, &pol.budget, now_ms),
                    _ => cell.value.deposit(&pol.budget, now_ms),
                },
                BudgetScope::PerCall(i) => self.deposit_per_call(*i, &tu.up.key, now_ms),
            }
        }
    }

    /// A budget scope that depends on the call: its cell is looked up now.
    #[cold]
    #[inline(never)]
    fn deposit_per_call(&self, i: usize, upstream: &str, now_ms: u64) {
        let pol = self.pol();
        let key = self.scope(&pol.policy.budget.scopes[i], upstream);
        pol.budget_cell(&key, now_ms).value.deposit(&pol.budget, now_ms);
    }

    /// Records attempt `f`'s outcome with its breaker (`held`: its cell and
    /// override, `elapsed_ms` after it started); the key and transition
    /// when the breaker changed state.
    #[inline(always)]
    pub(super) fn record_breaker(
        &self,
        held: Option<(&Slot<BreakerCell>, Option<BreakerOverride>)>,
        f: &InFlight,
        rec: Record,
        now_ms: u64,
        elapsed_ms: u64,
    ) -> Option<(SmolStr, Transition)> {
        let pol = self.pol();
        let (cell, ovr) = held?;
        let t = cell
            .value
            .record(&pol.breaker, ovr, now_ms, f.probe, rec, pol.breaker.is_slow(elapsed_ms));
        t.map(|t| (cell.key.clone(), t))
    }

    /// Counts the success of attempt `f` (into `here`, its upstream's).
    #[inline(always)]
    pub(super) fn count_success(&self, here: &Here, f: &InFlight) {
        self.count_in(here, Ctr::success(f.number));
    }

    /// Ends the call with the success of attempt `f` to `upstream` (`None`:
    /// the call's own), recording its decision when `record` (the events
    /// are on and the attempt's end did not take it).
    #[inline(always)]
    pub(super) fn succeed(&mut self, f: &InFlight, upstream: Option<SmolStr>, record: bool, now: Nanos) {
        if record {
            self.record_success(f.number, f.hedge, upstream.as_ref(), now);
        }
        self.final_decision = Some(Final::Succeeded {
            attempt: f.number,
            hedge: f.hedge,
            upstream,
        });
    }

    /// Records the success decision on its own (the end record could not take it).
    #[cold]
    #[inline(never)]
    fn record_success(&self, number: u32, hedge: bool, upstream: Option<&SmolStr>, now: Nanos) {
        let upstream = upstream.unwrap_or(&self.tu.up.key).clone();
        self.record_decision(&Decision::success(number, hedge, upstream), now);
    }

    /// A record with the call's common fields.
    #[inline(always)]
    pub(super) fn rec(&self, kind: EventKind, now: Nanos) -> Rec {
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
    pub(super) fn emit_with(&self, kind: EventKind, now: Nanos, fill: impl FnOnce(&mut Rec)) {
        let mut e = self.rec(kind, now);
        fill(&mut e);
        self.emit(&mut e);
    }

    /// Records an event: into this thread's ring (or the shared one), and to the sinks.
    #[inline(always)]
    pub(super) fn emit(&self, e: &mut Rec) {
        self.recorder.record(&self.sh().bus, self.tu.handle.ring_here(), e);
    }

    /// An attempt event of this call with only the common fields set.
    #[inline(always)]
    pub(super) fn hot<'a>(&'a self, kind: EventKind, now: Nanos, tu: &'a ThreadUp, attempt: u32) -> Hot<'a> {
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

    /// Records the start of attempt `number` to `tu`'s upstream (a hedge's when `hedge`).
    #[inline(always)]
    fn record_start(
        &self,
        ring: Option<&ThreadRing>,
        tu: &ThreadUp,
        now: Nanos,
        number: u32,
        hedge: bool,
        remaining_ms: u64,
    ) -> crate::telemetry::StartMark {
        let pol = &*tu.handle.pol;
        // The usual start: its names' words are the upstream's, computed once.
        let plain = || match (&tu.up.value.packed, self.id.raw(), &self.tenant, &self.task, hedge) {
            (Some(up), CallId::Local { seq, .. }, None, None, false) => Some(PlainStart {
                names: tu.up.value.plain_names,
                up,
                seq: *seq,
                at_ns: now.0,
                version: pol.version_idx,
                attempt: number,
                remaining_ms,
            }),
            _ => None,
        };
        let start = || Start {
            at_ns: now.0,
            version: pol.version_idx,
            id: self.id.raw(),
            up: tu.up.value.packed,
            tenant: self.tenant.as_ref(),
            task: self.task.as_ref(),
            attempt: number,
            hedge,
            remaining_ms,
        };
        self.recorder.start(&pol.shared.bus, ring, plain, start, || {
            let kind = if hedge {
                EventKind::Hedge
            } else {
                EventKind::AttemptStart
            };
            let mut h = self.hot(kind, now, tu, number);
            h.start = true;
            h.hedge = hedge;
            h.remaining_ms = remaining_ms;
            h
        })
    }

    /// Records the end of attempt `f` — into its start's record when the
    /// ring allows — with `then` (the decision right after it) folded in.
    /// True when `then` was recorded.
    #[inline(always)]
    pub(super) fn record_end(
        &self,
        ring: Option<&ThreadRing>,
        f: &InFlight,
        end: impl Fn() -> End,
        then: Option<Then>,
    ) -> bool {
        let bus = &self.tu.handle.pol.shared.bus;
        self.recorder
            .end(bus, ring, f.start_rec, &end, then, || self.end_event(f, &end()))
    }

    /// Attempt `f`'s end as a whole event.
    #[inline(always)]
    pub(super) fn end_event<'a>(&'a self, f: &'a InFlight, end: &End) -> Hot<'a> {
        let mut h = self.hot(EventKind::AttemptEnd, Nanos(end.at_ns), self.tu_of(f), f.number);
        h.error_class = end.error_class;
        h.reason = end.reason;
        h.phase = end.phase;
        h.status = end.status;
        h.error_kind = end.error_kind;
        h.hedge = end.hedge;
        h.remaining_ms = end.remaining_ms;
        h.delay_ms = Some(end.delay_ms);
        h
    }

    /// Folds a decision into the attempt-end record written just before it,
    /// when that is the last record of this thread's ring.
    #[inline]
    pub(super) fn fold(&self, attempt: u32, hedge: bool, upstream: Option<&SmolStr>, then: Then) -> bool {
        self.recorder
            .fold(self.tu.handle.ring_here(), attempt, hedge, upstream, then)
    }

    /// Records the decision event, folded into the attempt-end record it follows when it can be.
    pub(super) fn record_decision(&self, d: &Decision, now: Nanos) {
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
}
