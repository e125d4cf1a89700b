//! What every path of a call does besides deciding: counting, depositing
//! into the budget, and recording events.

use super::{Call, Decision, EndMark};
use crate::clock::Nanos;
use crate::hot::ThreadUp;
use crate::id::RequestId;
use crate::state::upstream::{BudgetScope, UpstreamState};
use crate::telemetry::{EventKind, Hot, Rec, Then};
use crate::types::WaitSource;
use smol_str::SmolStr;

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

impl Call {
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

    /// Records an attempt's start or end (see [`Call::emit`]).
    /// Returns the record's index in this thread's ring, when it went there.
    #[inline(always)]
    pub(super) fn emit_hot(&self, h: &Hot) -> Option<u64> {
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
    pub(super) fn emit_end(&self, start_rec: Option<u64>, h: &Hot, then: Option<Then>) -> bool {
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
    pub(super) fn fold(&self, attempt: u32, hedge: bool, upstream: Option<&SmolStr>, then: Then) -> bool {
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

    /// Deposits one request into every budget scope of `up` for this call.
    #[inline]
    pub(super) fn deposit(&self, up: &UpstreamState, target: &str, now_ms: u64) {
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
}
