//! Provider rate limits in the call path ([`crate::ratelimit`]): admission
//! before an attempt is sent — a place in the scope's adaptive concurrency
//! limit, then the scope's known allowance — and the response's reading
//! after it.
//!
//! Each upstream's state holds its rate-limit scope's cell
//! (`state/upstream.rs`). With `rate_limits.concurrency` (opt-in,
//! under `rate_limits.enabled`) every attempt first takes a place in the
//! scope's AIMD limit (`ratelimit/gate.rs`): with none free it is held (a
//! [`Stopped`] with a short `wait`, reason `rate_limited`, detail
//! `concurrency: N in flight of limit M in SCOPE`; the caller asks again),
//! and its report gives the place back with how it ended (a 429 without quota
//! exhaustion or an overload cuts the limit, a success grows it). Until a
//! response says anything about the scope's limits the cell is blank and
//! the allowance is not consulted. Once live, an attempt is admitted
//! against the scope's known allowance: it goes (its units reserved, settled
//! when it is reported), waits (a [`Stopped`] with `wait`, reason
//! `rate_limited`, detail `paced: ...`: the caller sleeps and asks again,
//! keeping its place in the windows to come), or stops
//! (`retry_after_exceeds_deadline` when the window has no room early enough
//! to leave the attempt the longer of `min_attempt_ms` and the scope's
//! smoothed answer time before the deadline, `quota_exhausted` while a
//! per-day quota is out). A hedge is
//! refused where a first attempt would wait, and takes no slot in the queue.

use super::{Call, InFlight, Stopped};
use crate::clock::Nanos;
use crate::outcome::Outcome;
use crate::rules::classify::{Classification, Disposition};
use crate::rules::deadline::TokenEstimate;
use crate::state::ratelimit::headers::may_limit;
use crate::state::ratelimit::{
    Admission, AimdConfig, Asker, Cell, Feedback, GatePermit, Kind, Reading, Reservation, StopWhy, Usage,
};
use crate::telemetry::EventKind;
use crate::types::{ErrorClass, Phase, Reason};

/// What an attempt holds in its rate-limit scope once admitted.
type RateHeld = (Option<Reservation>, Option<GatePermit>);

impl Call {
    /// Admits an attempt in the rate-limit scope `cell` (`rate_limits`
    /// enabled): a place in its adaptive concurrency limit when the policy
    /// gates, then its known allowance once the scope is live. A refusal of
    /// the allowance gives the place back (unused: no feedback).
    #[inline]
    pub(super) fn rate_admit(
        &mut self,
        cell: &Cell,
        is_hedge: bool,
        now: Nanos,
        remaining: Nanos,
    ) -> Result<RateHeld, Stopped> {
        let permit = match self.pol().aimd {
            Some(cfg) => Some(self.take_place(cell, &cfg, is_hedge, now, remaining)?),
            None => None,
        };
        let rate = if cell.value.is_live() {
            Some(self.pace(cell, is_hedge, now, remaining)?)
        } else {
            None
        };
        if rate.is_some() || permit.is_some() {
            // Its report settles the reservation and gives the place back: the general path's work.
            self.lane = false;
        }
        Ok((rate, permit))
    }

    /// A place in `cell`'s adaptive concurrency limit, or the hold (or stop) when none is free.
    #[inline]
    fn take_place(
        &mut self,
        cell: &Cell,
        cfg: &AimdConfig,
        is_hedge: bool,
        now: Nanos,
        remaining: Nanos,
    ) -> Result<GatePermit, Stopped> {
        match cell.value.gate(cfg).aimd.try_acquire() {
            Some(p) => Ok(GatePermit::new(cell.clone(), p, now.0)),
            None => Err(self.hold(cell, is_hedge, now, remaining)),
        }
    }

    /// Every place in `cell`'s limit is taken: the caller waits a short poll
    /// ([`crate::policy::AdaptiveConcurrencyPolicy::hold_max_ms`]) and asks
    /// again; a hedge is refused; a call whose time left (before
    /// `min_attempt`) cannot hold the wait stops with `concurrency_limit`.
    #[cold]
    #[inline(never)]
    fn hold(&mut self, cell: &Cell, is_hedge: bool, now: Nanos, remaining: Nanos) -> Stopped {
        let scope = cell.key.as_str();
        let Some(gate) = cell.value.gate_if_any() else {
            return Stopped::plain(Reason::RateLimited);
        };
        let (n, m) = (gate.aimd.in_flight(), gate.aimd.limit());
        let detail = format!("concurrency: {n} in flight of limit {m} in {scope}");
        if is_hedge {
            return Stopped {
                detail: Some(detail),
                ..Stopped::plain(Reason::RateLimited)
            };
        }
        let wait = gate.poll(self.pol().compiled.hold_max_ms);
        let time_left = remaining.saturating_sub(self.min_attempt().0).dur();
        if wait > time_left {
            let detail = format!(
                "{detail}; a {} ms wait leaves less than min_attempt_ms",
                wait.as_millis()
            );
            return self.stop_now(Reason::ConcurrencyLimit, Some(detail), now);
        }
        self.sh().ratelimits.count_hold();
        if self.active() {
            let target = self.tu.up.key.clone();
            let d = detail.clone();
            self.emit_with(EventKind::Paced, now, |e| {
                e.upstream = Some(target);
                e.reason = Some(Reason::RateLimited);
                e.delay_ms = Some(wait.as_millis() as u64);
                e.extra().detail = Some(d);
            });
        }
        Stopped {
            class: self.last_class,
            detail: Some(detail),
            wait: Some(wait),
            ..Stopped::plain(Reason::RateLimited)
        }
    }

    /// Admits an attempt in the live rate-limit scope `cell`: its
    /// reservation, or why it must wait or stop (a hedge neither waits nor
    /// ends the call: it is only refused).
    #[cold]
    #[inline(never)]
    pub(super) fn pace(
        &mut self,
        cell: &Cell,
        is_hedge: bool,
        now: Nanos,
        remaining: Nanos,
    ) -> Result<Reservation, Stopped> {
        let tokens = self.x.as_ref().map_or(TokenEstimate::default(), |e| TokenEstimate {
            input: e.needs.input_tokens,
            max_output: e.needs.max_output_tokens,
        });
        let asker = Asker {
            remaining: remaining.dur(),
            min_attempt: self.min_attempt().0.dur(),
            hedge: is_hedge,
        };
        let ticket = if is_hedge {
            None
        } else {
            self.x.as_mut().and_then(|e| e.rate_ticket.take())
        };
        let tu = self.tu.clone();
        let admission = tu
            .handle
            .pol
            .shared
            .ratelimits
            .admit_in(cell, now.0, tokens, asker, ticket, self.rng());
        let scope = cell.key.as_str();
        match admission {
            Admission::Go(r) => Ok(r),
            Admission::Wait { .. } if is_hedge => Err(Stopped::plain(Reason::RateLimited)),
            Admission::Wait { wait, ticket } => {
                // A newcomer queued behind the open window's waiters waits its turn, not for room.
                let detail = if ticket.queued() {
                    format!(
                        "paced: {} ms until its turn behind the waiters of {scope}",
                        wait.as_millis()
                    )
                } else {
                    format!("paced: {} ms until {scope} has room", wait.as_millis())
                };
                self.ext_mut().rate_ticket = Some(ticket);
                if self.active() {
                    let target = self.tu.up.key.clone();
                    self.emit_with(EventKind::Paced, now, |e| {
                        e.upstream = Some(target);
                        e.reason = Some(Reason::RateLimited);
                        e.delay_ms = Some(wait.as_millis() as u64);
                        e.extra().detail = Some(scope.to_string());
                    });
                }
                Err(Stopped {
                    class: self.last_class,
                    detail: Some(detail),
                    wait: Some(wait),
                    ..Stopped::plain(Reason::RateLimited)
                })
            }
            Admission::Stop(why) => {
                let (reason, detail) = match why {
                    StopWhy::QuotaExhausted => (Reason::QuotaExhausted, format!("quota of {scope} exhausted")),
                    StopWhy::RateLimitedUntil(d) => (
                        Reason::RetryAfterExceedsDeadline,
                        format!("rate_limited_until: {scope} has room in {} ms", d.as_millis()),
                    ),
                };
                if is_hedge {
                    return Err(Stopped::plain(reason));
                }
                Err(self.stop_now(reason, Some(detail), now))
            }
        }
    }

    /// Gives the attempt's response to its rate-limit scope: its place in
    /// the scope's concurrency limit goes back with how it ended; its
    /// reading settles the attempt's reservation, or, for an attempt
    /// admitted without one (its scope was blank), is taken as news. Nothing
    /// to do (a branch) without a reservation, a place or anything to read.
    #[inline]
    pub(super) fn settle_rate(&self, f: &mut InFlight, outcome: &Outcome, cls: &Classification, now: Nanos) {
        let (rate, permit) = match f.more.as_mut() {
            Some(m) => (m.rate.take(), m.permit.take()),
            None => (None, None),
        };
        if let Some(p) = permit {
            self.give_back(p, cls, now);
        }
        if rate.is_some()
            || (self.pol().policy.rate_limits.enabled
                && (outcome.retry_delay.is_some()
                    || cls.class == Some(ErrorClass::RateLimit)
                    || outcome.headers.iter().any(|(k, _)| may_limit(k))))
        {
            self.settle_rate_slow(f, rate, outcome, cls, now);
        }
    }

    #[cold]
    #[inline(never)]
    fn settle_rate_slow(
        &self,
        f: &InFlight,
        rate: Option<Reservation>,
        outcome: &Outcome,
        cls: &Classification,
        now: Nanos,
    ) {
        let pol = self.pol();
        let mut r = if outcome.headers.is_empty() {
            Reading::default()
        } else {
            Reading::from_headers(&outcome.headers, pol.shared.clock.wall())
        };
        if outcome.status.is_some() {
            r = r.answered();
        }
        if let Some(d) = outcome.retry_delay {
            r = r.retry_delay(d);
        }
        if cls.reason == Reason::QuotaExhausted {
            r = r.quota_exhausted();
        } else if cls.class == Some(ErrorClass::RateLimit) {
            r = r.rate_limited();
        }
        // A policy that ignores the server's wait hint ignores it here too.
        if !pol.policy.retry_after.enabled {
            r.retry_after = None;
        }
        // A bare 429 (no rate-limit header, no body hint) says when this
        // request may come back, not that the scope's allowance is gone: it
        // holds no other call unless the policy asks (its own retry still
        // waits its Retry-After). A provider refusing a share of the traffic
        // is then not starved by one hold after another.
        if r.rate_limited
            && !pol.policy.rate_limits.hold_on_bare_429
            && outcome.retry_delay.is_none()
            && Kind::ALL.iter().all(|&k| r.window(k).is_empty())
        {
            r.rate_limited = false;
            r.retry_after = None;
            r.refused = true;
        }
        let limits = &pol.shared.ratelimits;
        let cell = &self.tu_of(f).up.value.rate;
        match rate {
            Some(res) => {
                let usage = Usage {
                    sent: cls.phase != Phase::BeforeSend,
                    input_tokens: outcome.input_tokens,
                    output_tokens: outcome.output_tokens,
                };
                limits.settle_in(cell, res, &r, usage, now.0);
            }
            None => limits.observe_in(cell, &r, f.started_ns, now.0),
        }
    }

    /// Gives an attempt's place back: a success grows the limit, a 429
    /// without quota exhaustion or an overload cuts it, anything else (a
    /// per-day quota, a client error, a timeout, a cancellation) is neutral.
    fn give_back(&self, permit: GatePermit, cls: &Classification, now: Nanos) {
        let feedback = if cls.disposition == Disposition::Succeeded {
            Feedback::Success
        } else if cls.reason == Reason::QuotaExhausted {
            Feedback::Neutral
        } else {
            match cls.class {
                Some(ErrorClass::RateLimit) => Feedback::RateLimited,
                Some(ErrorClass::Overloaded) => Feedback::Overloaded,
                _ => Feedback::Neutral,
            }
        };
        if permit.release(feedback, now.0) {
            self.sh().ratelimits.count_cut();
        }
    }
}
