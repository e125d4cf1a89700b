//! Hedged attempts: a parallel attempt once the first has been out for the
//! route's `hedge_after_ms`, to another eligible upstream when there is one.

use super::{Attempt, Call};
use crate::clock::Nanos;
use crate::stats::Ctr;
use crate::types::{Idempotency, Reason};
use smol_str::SmolStr;
use std::time::Duration;

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

impl Call {
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
        if remaining < self.pol().compiled.min_attempt {
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
            self.count(Ctr::BudgetRefusals);
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

    fn hedging_allowed(&self) -> bool {
        self.route().hedge_after_ms.is_some()
            && self.idem != Idempotency::Unsafe
            && self.owner
            && self.sh().mode().hedging
    }
}
