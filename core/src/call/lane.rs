//! The fast lane: straight-line steps for the common call.
//!
//! Most calls name one upstream, run under a policy without throttling,
//! concurrency gates, breaker overrides or per-call scopes, and end with a
//! success. For such a call (`Call::lane`, decided once at `begin` from the
//! call and from its upstream's state, `Version::lane_for`) an attempt
//! grant and a success report skip the general path's generic machinery:
//! the checks that cannot apply, the enums built to be matched at once, and
//! the event built as a whole record to be taken apart again.
//!
//! The lane keeps only its guards ("is this call plain?"): what a step does
//! besides deciding — building the call and the attempt, counting,
//! depositing, putting the attempt in flight, recording the breaker
//! outcome, the start, the end and the decision — it does through the same
//! functions as the general path (`effects.rs`).
//!
//! A lane step decides nothing on its own: whenever anything is not plain
//! (the breaker is not closed, the deadline is too near, no attempt is left,
//! the outcome is not a success, a response header must be recorded) it
//! returns `None` before changing anything and the general path decides.
//! `tests/lane.rs` runs random call sequences with the lane on and off and
//! asserts identical decisions, attempts, counters and events.

use super::effects::tenant_counters;
use super::{Attempt, Call, CallSpec, Decision, Held, Next};
use crate::clock::Nanos;
use crate::guards::breaker::Record;
use crate::hot::ThreadUp;
use crate::id::RequestId;
use crate::outcome::Outcome;
use crate::rules::deadline::TokenEstimate;
use crate::state::ratelimit::headers::may_limit;
use crate::state::upstream::BreakerRef;
use crate::telemetry::ring::End;
use crate::telemetry::{header_allowed, Then};
use crate::types::Reason;
use smol_str::SmolStr;
use std::sync::Arc;

impl Call {
    /// A plain call ([`CallSpec::is_plain`]) to an upstream this thread's
    /// state is at hand for (`tu`): nothing to route, check or box.
    #[inline(always)]
    pub(crate) fn begin_cached(spec: &mut CallSpec, tu: Arc<ThreadUp>, seq: u64, now: Nanos) -> Call {
        // Taken from the spec in place: moving a whole spec here copies it.
        let (deadline, idempotency) = (spec.deadline, spec.idempotency);
        let (tenant, task, idempotency_key) = (spec.tenant.take(), spec.task.take(), spec.idempotency_key.take());
        let now_ms = now.ms();
        tu.touch(now_ms);
        let pol = &*tu.handle.pol;
        let id = RequestId::local(pol.shared.id_prefix, seq);
        let tenant_counters = tenant_counters(pol, tenant.as_ref(), now_ms);
        let deadline_at = now.saturating_add(deadline.map_or(pol.compiled.deadline, Nanos::of));
        let max_attempts = pol.policy.max_attempts;
        let key = idempotency_key.map(SmolStr::from);
        Call::assemble(
            tu,
            id,
            seq,
            tenant,
            task,
            idempotency,
            key,
            deadline_at,
            true,
            max_attempts,
            tenant_counters,
            None,
        )
    }

    /// The next attempt, when the lane may grant it; `None` (nothing
    /// changed) when the general path must decide.
    #[inline(always)]
    pub(super) fn lane_attempt(&mut self, now: Nanos) -> Option<Attempt> {
        if self.x.is_some()
            || self.final_decision.is_some()
            || !self.in_flight.is_empty()
            || self.attempts >= self.max_attempts
        {
            return None;
        }
        let remaining = self.deadline_at.saturating_sub(now);
        let tu = &*self.tu;
        let pol = &*tu.handle.pol;
        if remaining < pol.compiled.min_attempt || remaining.is_zero() {
            return None;
        }
        let held = match &tu.up.value.breaker {
            BreakerRef::Fixed(cell, _) if cell.value.is_closed() => Held::Fixed,
            BreakerRef::None => Held::None,
            _ => return None,
        };
        // Known provider rate limits are admitted on the general path (`pace.rs`).
        if tu.up.value.rate.value.is_live() {
            return None;
        }
        let number = self.attempts + 1;
        let retry = self.next == Next::Retry;
        self.start_attempt(number, retry, false, false, held, None, now, remaining);
        // A lane call's id is one made here: built in place, no match on its kind.
        let id = RequestId::local(self.pol().shared.id_prefix, self.seq);
        Some(self.attempt(
            number,
            self.tu.up.key.clone(),
            id,
            TokenEstimate::default(),
            now,
            remaining,
        ))
    }

    /// The decision on a successful attempt `number`, when the lane may make
    /// it; `None` (nothing changed) when the general path must.
    #[inline(always)]
    pub(super) fn lane_report(&mut self, number: u32, outcome: &Outcome) -> Option<Decision> {
        if self.x.is_some()
            || self.final_decision.is_some()
            || !outcome.is_success()
            || outcome.first_token.is_some()
            || !self.in_flight.is_one()
            || self.in_flight.first().map(|f| f.number) != Some(number)
        {
            return None;
        }
        if !outcome.headers.is_empty() && self.headers_for_general(outcome) {
            return None;
        }
        let f = self.in_flight.take_one()?;
        // Cloned before the breaker's locked update, which drains the stores:
        // moving it into the decision then reads memory, not stores in flight.
        let upstream = self.tu.up.key.clone();
        let now = self.now();
        let now_ms = now.ms();
        let elapsed_ms = now.0.saturating_sub(f.started_ns) / 1_000_000;
        // The lane's attempt holds its upstream's own breaker cell, if any.
        let held = match (&f.breaker, &self.tu.up.value.breaker) {
            (Held::Fixed, BreakerRef::Fixed(cell, ovr)) => Some((&**cell, *ovr)),
            _ => None,
        };
        let transition = self.record_breaker(held, &f, Record::Success, now_ms, elapsed_ms);
        self.last_class = None;
        if let Some((key, t)) = transition {
            self.on_transition(&key, Some(t), now);
        }
        let active = self.active();
        let here = self.tu.here();
        let end = || End {
            at_ns: now.0,
            status: outcome.status,
            error_class: None,
            reason: Some(Reason::Success),
            phase: None,
            error_kind: None,
            hedge: f.hedge,
            remaining_ms: f.remaining_ms,
            delay_ms: elapsed_ms,
        };
        // The call ends here: its decision goes into the attempt's end record.
        let then = || Then::success(self.deadline_at.saturating_sub(now).ms());
        let decided = active && self.record_end(here.ring, &f, end, Some(then()));
        self.count_success(&here, &f);
        self.succeed(&f, None, active && !decided, now);
        // Built here, in the caller's slot: a decision built earlier and
        // moved here is read back before its stores land (a stalled copy).
        Some(Decision::success(f.number, f.hedge, upstream))
    }
}

impl Call {
    /// True when a response header is to be recorded, or read as rate-limit
    /// news (`pace.rs`): the general path's work. Out of line: the lane's
    /// success without headers pays one branch for it.
    #[cold]
    #[inline(never)]
    fn headers_for_general(&self, outcome: &Outcome) -> bool {
        let p = &self.pol().policy;
        let (allow, limits) = (&p.telemetry.header_allowlist, p.rate_limits.enabled);
        (limits || !allow.is_empty())
            && outcome
                .headers
                .iter()
                .any(|(k, _)| (limits && may_limit(k)) || header_allowed(k, allow))
    }
}

#[cfg(test)]
mod tests {
    use crate::{CallSpec, Engine, Outcome, Policy};

    fn engine(yaml: &str) -> Engine {
        Engine::builder(Policy::from_str_any(yaml).unwrap())
            .seed(1)
            .read_env(false)
            .build()
            .unwrap()
    }

    /// The differential test (`tests/lane.rs`) would pass trivially if no
    /// call took the lane: here, plain calls do and others do not.
    #[test]
    fn plain_calls_take_the_lane_and_others_do_not() {
        let e = engine("");
        let mut c = e.begin(CallSpec::new("up").tenant("acme"));
        assert!(c.lane);
        let now = c.now();
        let a = c.lane_attempt(now).expect("the lane grants a plain first attempt");
        assert_eq!(a.number, 1);
        let d = c
            .lane_report(1, &Outcome::success())
            .expect("the lane decides a success");
        assert_eq!(d.action, crate::Action::Succeeded);
        // Finished: the lane leaves the call to the general path.
        assert!(c.lane_attempt(c.now()).is_none());

        let mut c = e.begin(CallSpec::new("up"));
        c.lane_attempt(c.now()).unwrap();
        assert!(
            c.lane_report(1, &Outcome::status(503)).is_none(),
            "a failure is decided by the general path"
        );
        assert!(
            c.lane_report(1, &Outcome::success().header("x-request-id", "r"))
                .is_none(),
            "a header to record"
        );

        for yaml in [
            "throttle: {enabled: true}",
            "breaker: {scope: [upstream, tenant]}",
            "budget: {max_concurrent_retries: 2}",
        ] {
            assert!(!engine(yaml).begin(CallSpec::new("up")).lane, "{yaml}");
        }
        let off = Engine::builder(Policy::default())
            .read_env(false)
            .fast_lane(false)
            .build()
            .unwrap();
        assert!(!off.begin(CallSpec::new("up")).lane);
    }

    /// A call lent its thread's spare reference to the upstream's state
    /// gives it back when it ends: beginning and ending a call on its thread
    /// leaves the count of references where it was (no locked instruction).
    /// A second call alive at the same time takes a reference of its own,
    /// which becomes the spare when it ends first; a call dropped on another
    /// thread drops its reference there.
    #[test]
    fn a_call_gives_its_upstream_reference_back_to_its_thread() {
        use std::sync::Arc;
        let e = engine("");
        drop(e.begin(CallSpec::new("up")));
        let again = e.begin(CallSpec::new("up"));
        let refs = Arc::strong_count(&again.tu);
        assert_eq!(refs, 2, "the thread's cache and the call");
        let second = e.begin(CallSpec::new("up"));
        assert_eq!(Arc::strong_count(&second.tu), refs + 1, "the spare was out");
        drop(second);
        assert_eq!(Arc::strong_count(&again.tu), refs + 1, "its reference is the spare now");
        drop(e.begin(CallSpec::new("up")));
        assert_eq!(Arc::strong_count(&again.tu), refs + 1, "lent and given back");
        let tu = Arc::clone(&again.tu);
        std::thread::spawn(move || drop(again)).join().unwrap();
        assert_eq!(Arc::strong_count(&tu), refs + 1, "dropped on another thread");
    }
}
