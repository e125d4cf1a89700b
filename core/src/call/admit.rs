//! `next_attempt`: whether an attempt may start now, and where — the
//! deadline and attempts left, adaptive throttling, the target's breaker
//! (moving to an eligible fallback when it is open) and concurrency gates.

use super::{Attempt, Call, FlightMore, Held, Next, Slots, Stopped};
use crate::clock::Nanos;
use crate::few::Few;
use crate::guards::breaker::{Admit, Transition, NEVER};
use crate::guards::gate::{GateCell, PoolCell};
use crate::guards::throttle::ThrottleCell;
use crate::hot::ThreadUp;
use crate::policy::BreakerOverride;
use crate::rules::deadline::{too_late, TokenEstimate};
use crate::rules::route::Exclusion;
use crate::state::scope::{breaker_override, display_key};
use crate::state::upstream::BreakerRef;
use crate::stats::Ctr;
use crate::telemetry::EventKind;
use crate::types::Reason;
use rand::Rng;
use smol_str::SmolStr;
use std::sync::Arc;
use std::time::Duration;

/// What a silence limit capped for a fallback leaves beyond `min_attempt_ms`:
/// a timer fires a little late, and the binding reports and asks for the
/// next attempt after it, so the fallback still finds `min_attempt_ms` left.
pub(crate) const KEEP_ROOM_SLACK_MS: u64 = 100;

/// What the breaker's slow path decided for an attempt.
enum Verdict {
    /// Go to the planned upstream.
    Go { probe: bool },
    /// Go to this fallback instead.
    Moved { target: SmolStr, held: Held, probe: bool },
}

impl Call {
    /// The next attempt to make, or why none may start. Checks, in order: the
    /// call is not finished; an idempotency conflict; the deadline minus
    /// `min_attempt`; attempts left; adaptive throttling; the target's breaker
    /// (moving to an eligible fallback when it is open); concurrency gates;
    /// the target's rate-limit scope: its adaptive concurrency limit and the
    /// provider's rate limits known for it (`pace.rs`).
    #[inline]
    pub fn next_attempt(&mut self) -> Result<Attempt, Stopped> {
        self.next_attempt_in()
    }

    /// What [`Call::next_attempt`] answers once the call is finished (its
    /// final stop), read without the clock or the admission path; `None`
    /// while the call is not finished. For a binding that keeps a finished
    /// call's answers after freeing it.
    ///
    /// ```
    /// use retrywise::{CallSpec, Engine, Outcome, Policy, Reason};
    /// let engine = Engine::new(Policy::default()).unwrap();
    /// let mut call = engine.begin(CallSpec::new("openai/gpt-4o"));
    /// call.next_attempt().unwrap();
    /// assert_eq!(call.final_stop(), None);
    /// call.report(&Outcome::success());
    /// assert_eq!(call.final_stop().unwrap().reason, Reason::CallFinished);
    /// assert_eq!(call.final_stop(), call.next_attempt().err());
    /// ```
    pub fn final_stop(&self) -> Option<Stopped> {
        self.final_decision.as_ref().map(|f| f.stopped())
    }

    #[inline]
    pub(super) fn next_attempt_in(&mut self) -> Result<Attempt, Stopped> {
        let now = self.now();
        self.next_attempt_at(now)
    }

    /// The lane's attempt when it may grant one (inlined into the caller),
    /// else the general path's (kept out of line).
    #[inline(always)]
    pub(crate) fn next_attempt_at(&mut self, now: Nanos) -> Result<Attempt, Stopped> {
        if self.lane {
            if let Some(a) = self.lane_attempt(now) {
                return Ok(a);
            }
        }
        self.next_attempt_general(now)
    }

    #[inline(never)]
    pub(super) fn next_attempt_general(&mut self, now: Nanos) -> Result<Attempt, Stopped> {
        if let Some(f) = &self.final_decision {
            return Err(f.stopped());
        }
        // Parallel attempts start only through `next_hedge`: after a failure with a
        // sibling still in flight, the caller waits for the sibling.
        if !self.in_flight.is_empty() {
            return Err(Stopped {
                detail: Some("an attempt is still in flight: report it first".into()),
                ..Stopped::plain(Reason::InvalidState)
            });
        }
        if let Some((reason, detail)) = self.x.as_mut().and_then(|e| e.refused.take()) {
            return Err(self.stop_now(reason, Some(detail), now));
        }
        let remaining = self.deadline_at.saturating_sub(now);
        if let Some(detail) = too_late(remaining, self.min_attempt()) {
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
    pub(super) fn admit(
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
        let slots = if self.pol().compiled.gated {
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
        // Provider rate limits (`pace.rs`): the scope's adaptive concurrency
        // limit, and its known allowance once a response said anything about it.
        let (rate, permit) = if self.pol().policy.rate_limits.enabled {
            let cell = hedge_tu.as_deref().unwrap_or(&self.tu).up.value.rate.clone();
            match self.rate_admit(&cell, is_hedge, now, remaining) {
                Ok(held) => held,
                Err(stopped) => {
                    if let Some(sl) = &slots {
                        sl.leave(retry);
                    }
                    if let Some((c, _)) = Self::held_cell(&held, hedge_tu.as_deref().unwrap_or(&self.tu)) {
                        c.value.release(&self.pol().breaker, probe);
                    }
                    return Err(stopped);
                }
            }
        } else {
            (None, None)
        };
        let number = self.attempts + 1;
        if let Some(e) = self.x.as_mut().filter(|e| e.route_key.is_some()) {
            if !e.tried.contains(&target) {
                e.tried.push(target.clone());
            }
        }
        let budget_hold = if is_hedge { Few::new() } else { self.take_pending_hold() };
        let more =
            (hedge_tu.is_some() || slots.is_some() || !budget_hold.is_empty() || rate.is_some() || permit.is_some())
                .then(|| {
                    Box::new(FlightMore {
                        tu: hedge_tu,
                        slots,
                        budget_hold,
                        rate,
                        permit,
                    })
                });
        self.start_attempt(number, retry, is_hedge, probe, held, more, now, remaining);
        let (tokens, fallback, wire_number) = match &*self.x {
            Some(e) => (
                TokenEstimate {
                    input: e.needs.input_tokens,
                    max_output: e.needs.max_output_tokens,
                },
                e.route_key.is_some() && target != e.first_upstream,
                e.inbound_attempt.unwrap_or(number),
            ),
            None => (TokenEstimate::default(), false, number),
        };
        let mut a = self.attempt(number, target, self.id.clone(), tokens, now, remaining);
        a.hedge = is_hedge;
        a.fallback = fallback;
        a.wire_number = wire_number;
        if let Some(e) = self.x.as_mut() {
            e.clamped = None;
        }
        if !is_hedge && self.route_key().is_some() {
            self.keep_room_for_fallback(&mut a, remaining, now_ms);
        }
        Ok(a)
    }

    /// An attempt's silence limits (first byte, first token; explicit ones
    /// included) never take the time a fallback needs: while the route has
    /// an eligible candidate left and the call an attempt for it, they end
    /// `min_attempt_ms` and [`KEEP_ROOM_SLACK_MS`] before the deadline, so a
    /// silent upstream still leaves the next candidate an attempt. Only when
    /// both fit; the note goes into the detail of the decision on a silent
    /// failure (`Ext::clamped`).
    #[cold]
    #[inline(never)]
    fn keep_room_for_fallback(&mut self, a: &mut Attempt, remaining: Nanos, now_ms: u64) {
        let (_, min_ms) = self.min_attempt();
        let room = remaining.ms().saturating_sub(min_ms + KEEP_ROOM_SLACK_MS);
        if room < min_ms || a.number >= self.max_attempts || !self.fallback_allowed() {
            return;
        }
        let mut capped = a.timeouts;
        let Some((byte, token)) = capped.cap_silence(room.min(u32::MAX as u64) as u32) else {
            return;
        };
        let tried: Vec<SmolStr> = self
            .x
            .as_ref()
            .map(|e| e.tried.iter().cloned().collect())
            .unwrap_or_default();
        let tried: Vec<&str> = tried.iter().map(SmolStr::as_str).collect();
        let m = self.match_now(&tried, None, now_ms);
        let Some(next) = m.eligible.first() else {
            return;
        };
        a.timeouts = capped;
        let note = format!(
            "silence limits capped at {room} ms (first byte {byte} ms, first token {token} ms): \
             {min_ms} ms (min_attempt_ms) and {KEEP_ROOM_SLACK_MS} ms stay for {next}"
        );
        self.ext_mut().clamped = Some(note);
    }

    /// The breaker of a scope that depends on the call: resolve it, then ask it.
    #[cold]
    #[inline(never)]
    #[allow(clippy::type_complexity)]
    pub(super) fn acquire_per_call(
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
            Admit::Rejected { .. } if is_hedge => Err(Stopped::plain(Reason::BreakerOpen)),
            Admit::Rejected { retry_in_ms } => {
                let (u, held, probe) = self.breaker_fallback(target, key, retry_in_ms, now)?;
                Ok(Verdict::Moved { target: u, held, probe })
            }
        }
    }

    /// Adaptive throttling: a rejected attempt stops the call (or the hedge) without touching the network.
    pub(super) fn throttle(&mut self, target: &str, is_hedge: bool, now: Nanos) -> Result<(), Stopped> {
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
            return Err(Stopped::plain(Reason::Throttled));
        }
        Err(self.stop_now(Reason::Throttled, Some(format!("p_reject={prob:.3}")), now))
    }

    /// The target's breaker refused: switch to the next eligible candidate
    /// (if the route and mode allow and its breaker admits), else stop.
    /// Returns the new target, its breaker hold and whether the attempt is a probe.
    pub(super) fn breaker_fallback(
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
            if let Some(wait) = self.breaker_hold(retry_in_ms, now) {
                return Err(Stopped {
                    class: self.last_class,
                    detail: Some(format!(
                        "breaker {} admits probes in {retry_in_ms} ms",
                        display_key(key)
                    )),
                    wait: Some(wait),
                    ..Stopped::plain(Reason::BreakerOpen)
                });
            }
            let mut d = self.stop_decision(Reason::BreakerOpen, self.last_class, self.attempts);
            d.detail = Some(if retry_in_ms == NEVER {
                format!("breaker {} forced open", display_key(key))
            } else {
                format!("breaker {} open for {retry_in_ms} ms more", display_key(key))
            });
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

    /// How long a call refused by its upstream's breaker waits before asking
    /// again (`breaker.hold`): until the breaker admits probes, `retry_in_ms`
    /// from now, plus a spread of up to `hold_jitter_ms`; `None` when the call
    /// may not wait (holding is off, an owner above decides, the probe window
    /// is further than `hold_max_ms`) or the wait would not leave
    /// `min_attempt` before the deadline.
    fn breaker_hold(&mut self, retry_in_ms: u64, now: Nanos) -> Option<Duration> {
        let b = &self.pol().policy.breaker;
        if !b.hold || !self.owner || retry_in_ms > b.hold_max_ms {
            return None;
        }
        let spread = b.hold_jitter_ms;
        let room = self
            .deadline_at
            .saturating_sub(now)
            .saturating_sub(self.min_attempt().0);
        let wait = Duration::from_millis(retry_in_ms.saturating_add(self.rng().gen_range(0..=spread)).max(1));
        (wait <= room.dur()).then_some(wait)
    }

    /// Takes a concurrency-gate slot for the target's scope and a priority-pool slot, or says which refused.
    pub(super) fn enter_gates(&self, target: &str, retry: bool, now_ms: u64) -> Result<Slots, String> {
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

    pub(super) fn gate_refusal(&mut self, hedge: bool, detail: String, now: Nanos) -> Stopped {
        if hedge {
            return Stopped {
                detail: Some(detail),
                ..Stopped::plain(Reason::ConcurrencyLimit)
            };
        }
        self.stop_now(Reason::ConcurrencyLimit, Some(detail), now)
    }
}
