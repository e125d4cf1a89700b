//! Provider rate limits in the call path ([`crate::ratelimit`]): admission
//! before an attempt is sent, and the response's reading after it.
//!
//! Each upstream's state holds its rate-limit scope's cell
//! (`state/upstream.rs`). Until a response says anything about the scope's
//! limits the cell is blank and an attempt's only cost is one load of its
//! `live` flag (the fast lane's too). Once live, an attempt is admitted
//! against the scope's known allowance: it goes (its units reserved, settled
//! when it is reported), waits (a [`Stopped`] with `wait`, reason
//! `rate_limited`, detail `paced: ...`: the caller sleeps and asks again,
//! keeping its place in the windows to come), or stops
//! (`retry_after_exceeds_deadline` when the window has no room before the
//! deadline, `quota_exhausted` while a per-day quota is out).

use super::{Call, InFlight, Stopped};
use crate::clock::Nanos;
use crate::outcome::Outcome;
use crate::rules::classify::Classification;
use crate::rules::deadline::TokenEstimate;
use crate::state::ratelimit::{Admission, Cell, Reading, Reservation, StopWhy, Usage};
use crate::telemetry::EventKind;
use crate::types::{ErrorClass, Phase, Reason};

impl Call {
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
        let time_left = remaining.saturating_sub(self.min_attempt().0).dur();
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
            .admit_in(cell, now.0, tokens, time_left, ticket, self.rng());
        let scope = cell.key.as_str();
        match admission {
            Admission::Go(r) => Ok(r),
            Admission::Wait { .. } if is_hedge => Err(Stopped::plain(Reason::RateLimited)),
            Admission::Wait { wait, ticket } => {
                self.ext_mut().rate_ticket = Some(ticket);
                let detail = format!("paced: {} ms until {scope} has room", wait.as_millis());
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

    /// Gives the attempt's response to its rate-limit scope: its reading
    /// settles the attempt's reservation, or, for an attempt admitted
    /// without one (its scope was blank), is taken as news. Nothing to do
    /// (a branch) without a reservation or anything to read.
    #[inline]
    pub(super) fn settle_rate(&self, f: &mut InFlight, outcome: &Outcome, cls: &Classification, now: Nanos) {
        let rate = f.more.as_mut().and_then(|m| m.rate.take());
        if rate.is_some()
            || (self.pol().policy.rate_limits.enabled
                && (!outcome.headers.is_empty()
                    || outcome.retry_delay.is_some()
                    || cls.class == Some(ErrorClass::RateLimit)))
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
            None => limits.observe_in(cell, &r, now.0),
        }
    }
}
