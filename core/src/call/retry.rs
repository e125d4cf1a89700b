//! Going on after a failure: the checks in the order `rules/mod.rs` gives
//! (kill switch and ownership, attempts left, deadline, route, budget,
//! wait), and the retry or fallback they grant.

use super::upstreams::fixed_open;
use super::{BudgetHold, Call, Decision, InFlight, Next};
use crate::clock::{ms, Nanos};
use crate::few::Few;
use crate::guards::budget::{BudgetCell, Refusal};
use crate::hot::ThreadUp;
use crate::policy::{Backoff, RetryAfter, Route, ScopeDim};
use crate::rules::route::MatchResult;
use crate::rules::{self, Failed, Failure, Halt, Plan, Target, Wait};
use crate::state::registry::Slot;
use crate::state::scope::display_key;
use crate::state::upstream::BudgetScope;
use crate::stats::Ctr;
use crate::telemetry::{EventKind, Then};
use crate::types::{Action, Continuation, Reason};
use rand_pcg::Pcg64Mcg;
use smol_str::SmolStr;
use std::sync::Arc;

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

impl Call {
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
    pub(super) fn withdraw_budget(
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
    pub(super) fn budget_origin(&self) -> SmolStr {
        self.x
            .as_ref()
            .and_then(|e| e.tried.first().cloned())
            .unwrap_or_else(|| self.tu.up.key.clone())
    }

    /// Gives back the retry `withdraw_budget` granted for `target` (the wait did not fit).
    pub(super) fn refund_budget(&self, target: &str, held: &BudgetHold, now_ms: u64) {
        self.refund_budget_for(target, held, Some(&self.tu), now_ms)
    }

    pub(super) fn refund_budget_for(&self, target: &str, held: &BudgetHold, tu: Option<&ThreadUp>, now_ms: u64) {
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

    /// Going on after a failure: the rules decide, in their order
    /// (`rules::after_failure`); the call then stops, waits for a sibling,
    /// or makes the retry or fallback they planned.
    pub(super) fn continue_call(&mut self, base: Decision, f: &InFlight, now: Nanos, failure: &Failure) -> Decision {
        match rules::after_failure(&mut Failing { call: self, f, now }, failure) {
            Ok(plan) => {
                let continuation = failure
                    .continuation
                    .map(|how| self.continuation_to(&plan.to.upstream, how));
                let mut d = self.go_on(base, f, now, plan);
                d.continuation = continuation;
                d
            }
            Err(Halt::Stop {
                reason,
                detail,
                excluded,
            }) => {
                let mut d = base;
                d.action = Action::Stop;
                d.reason = reason;
                if detail.is_some() {
                    d.detail = detail;
                }
                d.excluded = excluded;
                self.finish(d, now)
            }
            Err(Halt::Sibling) => {
                // Not final: the sibling's report decides.
                let mut d = base;
                d.action = Action::Wait;
                d.detail = Some(format!("evidence: {}", d.reason));
                d.reason = Reason::SiblingInFlight;
                d.upstream = Some(self.tu.up.key.clone());
                d.on_failure = None;
                self.next = Next::Retry;
                d
            }
        }
    }

    /// How a continuation goes to `upstream`: with assistant prefill only
    /// where it declares the `assistant_prefill` capability.
    fn continuation_to(&self, upstream: &str, how: Continuation) -> Continuation {
        let prefill = self
            .pol()
            .policy
            .upstreams
            .get(upstream)
            .is_some_and(|u| u.has("assistant_prefill"));
        match how {
            Continuation::Prefill if prefill => Continuation::Prefill,
            _ => Continuation::Instruction,
        }
    }

    /// Makes the retry or fallback the rules planned: counted, the target
    /// switched for a fallback, the decision recorded.
    fn go_on(&mut self, base: Decision, f: &InFlight, now: Nanos, plan: Plan<BudgetHold>) -> Decision {
        let now_ms = now.ms();
        let Plan {
            to:
                Target {
                    upstream: target,
                    fallback: is_fallback,
                    excluded,
                },
            grant: held,
            wait: Wait { delay, source },
        } = plan;
        self.prev_wait_ms = ms(delay);
        self.retries += 1;
        if let Some(held) = held.filter(|h| !h.is_empty()) {
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
}

/// A call at the time of a failure, as the rules see it.
struct Failing<'a> {
    call: &'a mut Call,
    /// The failed attempt.
    f: &'a InFlight,
    now: Nanos,
}

impl Failed for Failing<'_> {
    type Grant = BudgetHold;

    #[inline]
    fn retries_on(&self) -> bool {
        self.call.sh().mode().retries
    }

    #[inline]
    fn fallbacks_on(&self) -> bool {
        self.call.sh().mode().fallback
    }

    #[inline]
    fn is_owner(&self) -> bool {
        self.call.owner
    }

    #[inline]
    fn sibling_in_flight(&self) -> bool {
        !self.call.in_flight.is_empty()
    }

    #[inline]
    fn attempts(&self) -> (u32, u32) {
        (self.call.attempts, self.call.max_attempts)
    }

    #[inline]
    fn remaining(&self) -> Nanos {
        self.call.deadline_at.saturating_sub(self.now)
    }

    #[inline]
    fn min_attempt(&self) -> (Nanos, u64) {
        self.call.min_attempt()
    }

    #[inline]
    fn route(&self) -> &Route {
        self.call.route()
    }

    #[inline]
    fn routed(&self) -> bool {
        self.call.route_key().is_some()
    }

    #[inline]
    fn target(&self) -> &SmolStr {
        &self.call.tu.up.key
    }

    #[inline]
    fn target_attempts(&self) -> u32 {
        self.call.target_attempts
    }

    /// `tu` is the target's state: its breaker is at hand.
    #[inline]
    fn target_open(&self) -> bool {
        let c = &*self.call;
        let now_ms = self.now.ms();
        fixed_open(&c.tu, now_ms).unwrap_or_else(|| c.is_open(&c.tu.up.key, now_ms))
    }

    fn tried(&self) -> Vec<&str> {
        let tried = self.call.x.as_ref().map(|e| &e.tried);
        tried.iter().flat_map(|t| t.iter()).map(|s| s.as_str()).collect()
    }

    fn origin(&self) -> SmolStr {
        self.call.budget_origin()
    }

    fn candidates(&self, tried: &[&str], larger_than: Option<u64>) -> MatchResult {
        self.call.match_now(tried, larger_than, self.now.ms())
    }

    /// A refusal is counted and recorded as a budget refusal.
    fn withdraw(&mut self, upstream: &SmolStr) -> Result<BudgetHold, Halt> {
        let c = &*self.call;
        let (r, key) = match c.withdraw_budget(upstream, Some(&c.tu), self.now.ms()) {
            Ok(held) => return Ok(held),
            Err(refusal) => refusal,
        };
        c.count(Ctr::BudgetRefusals);
        let reason = match r {
            Refusal::Exhausted => Reason::BudgetExhausted,
            Refusal::Concurrency => Reason::RetryConcurrency,
        };
        let detail = format!("scope {key}");
        if c.active() {
            let number = self.f.number;
            c.emit_with(EventKind::BudgetRefusal, self.now, |e| {
                e.upstream = Some(upstream.clone());
                e.reason = Some(reason);
                e.extra().detail = Some(detail.clone());
                e.attempt = Some(number);
                e.attempt_id = Some(number);
            });
        }
        Err(Halt::stop(reason, Some(detail)))
    }

    fn withdraw_spare(&mut self, upstream: &SmolStr) -> Option<BudgetHold> {
        let c = &*self.call;
        c.withdraw_budget(upstream, Some(&c.tu), self.now.ms()).ok()
    }

    fn refund(&mut self, upstream: &SmolStr, grant: &BudgetHold) {
        self.call.refund_budget(upstream, grant, self.now.ms());
    }

    fn exempts_rate_limited(&self) -> bool {
        let b = &self.call.pol().policy.budget;
        b.enabled && b.exempt_rate_limited
    }

    fn waits(&self) -> (&RetryAfter, &Backoff) {
        let p = &self.call.pol().policy;
        (&p.retry_after, &p.backoff)
    }

    fn waited(&self) -> (u32, u64) {
        (self.call.retries, self.call.prev_wait_ms)
    }

    fn rng(&mut self) -> &mut Pcg64Mcg {
        self.call.rng()
    }
}
