//! The fast lane: straight-line steps for the common call.
//!
//! Most calls name one upstream, run under a policy without throttling,
//! concurrency gates, breaker overrides or per-call scopes, and end with a
//! success. For such a call (`Call::lane`, decided once at `begin` from the
//! call and from its upstream's state, [`Compiled::lane_for`]) an attempt
//! grant and a success report skip the general path's generic machinery:
//! the checks that cannot apply, the enums built to be matched at once, and
//! the event built as a whole record to be taken apart again. They count,
//! deposit, record the breaker outcome and write the event ring exactly as
//! the general path does.
//!
//! A lane step decides nothing on its own: whenever anything is not plain
//! (the breaker is not closed, the deadline is too near, no attempt is left,
//! the outcome is not a success, a response header must be recorded) it
//! returns `None` before changing anything and the general path decides.
//! `tests/lane.rs` runs random call sequences with the lane on and off and
//! asserts identical decisions, attempts, counters and events.

use super::*;
use crate::id::CallId;
use crate::ring::{End, Start, ThreadRing};

impl Engine {
    /// A plain call ([`CallSpec::is_plain`]) to an upstream this thread's
    /// state is at hand for (`tu`): nothing to route, check or box.
    #[inline(always)]
    pub(super) fn begin_cached(&self, spec: &mut CallSpec, tu: Arc<ThreadUp>, seq: u64, now: Nanos) -> Call {
        // Taken from the spec in place: moving a whole spec here copies it.
        let (deadline, idempotency) = (spec.deadline, spec.idempotency);
        let (tenant, task, idempotency_key) = (spec.tenant.take(), spec.task.take(), spec.idempotency_key.take());
        let now_ms = now.ms();
        tu.touch(now_ms);
        let pol = &*tu.handle.pol;
        let tenant_counters = tenant.as_ref().map(|t| {
            let l = &pol.policy.limits;
            pol.shared
                .tenant_stats
                .get_or_insert(t, now_ms, l.max_keys, l.idle_ms, Counters::default)
        });
        tu.here().version.bump(Ctr::Begun);
        if let Some(t) = &tenant_counters {
            t.value.bump(Ctr::Begun);
        }
        Call {
            id: RequestId::local(pol.shared.id_prefix, seq),
            id_text: std::cell::OnceCell::new(),
            tenant,
            task,
            idem: crate::idempotency::effective(idempotency, idempotency_key.is_some()),
            key: idempotency_key.map(SmolStr::from),
            deadline_at: now.saturating_add(deadline.map_or(pol.deadline, Nanos::of)),
            owner: true,
            lane: tu.lane,
            next: Next::First,
            last_class: None,
            max_attempts: pol.policy.max_attempts,
            attempts: 0,
            target_attempts: 0,
            retries: 0,
            prev_wait_ms: 0,
            seq,
            in_flight: Few::new(),
            rng: None,
            final_decision: None,
            tenant_counters,
            last_end: std::cell::Cell::new(None),
            x: ManuallyDrop::new(None),
            tu: Lent::new(tu),
        }
    }
}

impl Call {
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
        if remaining < pol.min_attempt || remaining.is_zero() {
            return None;
        }
        let held = match &tu.up.value.breaker {
            BreakerRef::Fixed(cell, _) if cell.value.is_closed() => Held::Fixed,
            BreakerRef::None => Held::None,
            _ => return None,
        };
        let number = self.attempts + 1;
        let retry = self.next == Next::Retry;
        let now_ms = now.ms();
        let remaining_ms = remaining.ms();
        let here = self.tu.here();
        let start_rec = if pol.shared.bus.active() {
            self.lane_start_event(here.ring, now, number, remaining_ms)
        } else {
            None
        };
        let tu = &*self.tu;
        let pol = &*tu.handle.pol;
        let c = Ctr::attempt(number);
        here.version.bump(c);
        if let Some(t) = &self.tenant_counters {
            t.value.bump(c);
        }
        here.upstream.bump(c);
        // The budget counts requests: one per first attempt, in every scope.
        if !retry {
            for (i, b) in tu.up.value.budgets.iter().enumerate() {
                if let BudgetScope::Fixed(cell) = b {
                    // Into this thread's shard when it may write it: no locked instruction.
                    match here.deposits.get(i) {
                        Some(Some(d)) => cell.value.deposit_via(d, &pol.budget, now_ms),
                        _ => cell.value.deposit(&pol.budget, now_ms),
                    }
                }
            }
        }
        self.in_flight.push(InFlight {
            number,
            probe: false,
            retry,
            hedge: false,
            started_ns: now.0,
            remaining_ms,
            start_rec,
            breaker: held,
            more: None,
        });
        self.attempts = number;
        self.target_attempts += 1;
        let pol = &*self.tu.handle.pol;
        Some(Attempt {
            number,
            fallback: false,
            upstream: self.tu.up.key.clone(),
            timeouts: pol.timeouts(remaining, TokenEstimate::default()),
            remaining,
            // A lane call's id is one made here: built in place, no match on its kind.
            request_id: RequestId::local(pol.shared.id_prefix, self.seq),
            idempotency_key: self.key.clone(),
            hedge: false,
            started: now,
            margin_ms: pol.margin_ms,
            propagate: pol.policy.propagation.enabled,
            wire_number: number,
        })
    }

    /// Records the start of attempt `number` (the events are on); its index
    /// in this thread's ring, when it went there.
    #[inline(always)]
    fn lane_start_event(&self, ring: Option<&ThreadRing>, now: Nanos, number: u32, remaining_ms: u64) -> Option<u64> {
        let tu = &*self.tu;
        let bus = &tu.handle.pol.shared.bus;
        let ring = ring.filter(|_| bus.ring_only());
        // The usual start: its names' words are the upstream's, computed once.
        if let (Some(ring), Some(up), CallId::Local { seq, .. }, None, None) =
            (ring, &tu.up.value.packed, self.id.raw(), &self.tenant, &self.task)
        {
            let index = ring.push_plain_start(
                tu.up.value.plain_names,
                up,
                *seq,
                now.0,
                tu.handle.pol.version_idx,
                number,
                remaining_ms,
            );
            self.last_end.set(None);
            return Some(index);
        }
        let written = ring.and_then(|ring| {
            ring.push_start(&Start {
                at_ns: now.0,
                version: tu.handle.pol.version_idx,
                id: self.id.raw(),
                up: tu.up.value.packed,
                tenant: self.tenant.as_ref(),
                task: self.task.as_ref(),
                attempt: number,
                hedge: false,
                remaining_ms,
            })
        });
        match written {
            Some(index) => {
                self.last_end.set(None);
                Some(index)
            }
            None => self.start_event_slow(now, number, remaining_ms),
        }
    }

    /// [`Call::lane_start_event`] when the start needs a whole record.
    #[cold]
    #[inline(never)]
    fn start_event_slow(&self, now: Nanos, number: u32, remaining_ms: u64) -> Option<u64> {
        let mut h = self.hot(EventKind::AttemptStart, now, &self.tu, number);
        h.start = true;
        h.remaining_ms = remaining_ms;
        self.emit_hot(&h)
    }

    /// The decision on a successful attempt `number`, when the lane may make
    /// it; `None` (nothing changed) when the general path must.
    #[inline(always)]
    pub(super) fn lane_report(&mut self, number: u32, outcome: &Outcome) -> Option<Decision> {
        if self.x.is_some()
            || self.final_decision.is_some()
            || !outcome.is_success()
            || !self.in_flight.is_one()
            || self.in_flight.first().map(|f| f.number) != Some(number)
        {
            return None;
        }
        if !outcome.headers.is_empty() {
            let allow = &self.pol().policy.telemetry.header_allowlist;
            if !allow.is_empty() && outcome.headers.iter().any(|(k, _)| header_allowed(k, allow)) {
                return None;
            }
        }
        let f = self.in_flight.take_one()?;
        // Cloned before the breaker's locked update, which drains the stores:
        // moving it into the decision then reads memory, not stores in flight.
        let upstream = self.tu.up.key.clone();
        let now = self.now();
        let now_ms = now.ms();
        let elapsed_ms = now.0.saturating_sub(f.started_ns) / 1_000_000;
        let tu = &*self.tu;
        let pol = &*tu.handle.pol;
        let transition = match (&f.breaker, &tu.up.value.breaker) {
            (Held::Fixed, BreakerRef::Fixed(cell, ovr)) => cell
                .value
                .record(
                    &pol.breaker,
                    *ovr,
                    now_ms,
                    f.probe,
                    Record::Success,
                    pol.breaker.is_slow(elapsed_ms),
                )
                .map(|t| (cell.key.clone(), t)),
            _ => None,
        };
        self.last_class = None;
        if let Some((key, t)) = transition {
            self.on_transition(&key, Some(t), now);
        }
        let active = self.active();
        let here = self.tu.here();
        let decided = active && self.lane_end_event(here.ring, &f, now, outcome.status, elapsed_ms);
        let c = Ctr::success(f.number);
        here.version.bump(c);
        if let Some(t) = &self.tenant_counters {
            t.value.bump(c);
        }
        here.upstream.bump(c);
        if !decided && active {
            self.record_success(f.number, f.hedge, now);
        }
        self.final_decision = Some(Final::Succeeded {
            attempt: f.number,
            hedge: f.hedge,
            upstream: None,
        });
        // Built here, in the caller's slot: a decision built earlier and
        // moved here is read back before its stores land (a stalled copy).
        Some(Decision::success(f.number, f.hedge, upstream))
    }

    /// Records the success decision on its own (the end record could not take it).
    #[cold]
    #[inline(never)]
    fn record_success(&self, number: u32, hedge: bool, now: Nanos) {
        self.record_decision(&Decision::success(number, hedge, self.tu.up.key.clone()), now);
    }

    /// Records the end of successful attempt `f` with the success decision
    /// folded in (the events are on); true when the decision was recorded.
    #[inline(always)]
    fn lane_end_event(
        &self,
        ring: Option<&ThreadRing>,
        f: &InFlight,
        now: Nanos,
        status: Option<u16>,
        elapsed_ms: u64,
    ) -> bool {
        let then = Then::success(self.deadline_at.saturating_sub(now).ms());
        let tu = &*self.tu;
        if let (Some(index), Some(ring)) = (f.start_rec, ring) {
            let end = End {
                at_ns: now.0,
                status,
                error_class: None,
                reason: Some(Reason::Success),
                phase: None,
                error_kind: None,
                hedge: f.hedge,
                remaining_ms: f.remaining_ms,
                delay_ms: elapsed_ms,
            };
            if tu.handle.pol.shared.bus.ring_only() && ring.end_at(index, end, Some(then)) {
                self.last_end.set(None);
                return true;
            }
        }
        self.end_event_slow(f, now, status, elapsed_ms)
    }

    /// [`Call::lane_end_event`] when the end cannot go into its start
    /// record: a record of its own (the decision is then recorded apart).
    #[cold]
    #[inline(never)]
    fn end_event_slow(&self, f: &InFlight, now: Nanos, status: Option<u16>, elapsed_ms: u64) -> bool {
        let mut h = self.hot(EventKind::AttemptEnd, now, &self.tu, f.number);
        h.reason = Some(Reason::Success);
        h.status = status;
        h.hedge = f.hedge;
        h.remaining_ms = f.remaining_ms;
        h.delay_ms = Some(elapsed_ms);
        self.emit_hot(&h);
        false
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
