//! `report`: what an attempt's outcome means for the call — classified,
//! recorded with the breaker, throttle and counters, then decided: done,
//! reconcile, stop, or go on (`retry.rs`).

use super::{Call, Decision, InFlight};
use crate::guards::breaker::Record;
use crate::guards::throttle;
use crate::outcome::Outcome;
use crate::policy::{OnSilence, StreamRecovery};
use crate::rules::classify::Disposition;
use crate::rules::wait::wait_hint;
use crate::rules::Failure;
use crate::state::shared::ReconcileItem;
use crate::telemetry::ring::End;
use crate::telemetry::{header_allowed, Then};
use crate::types::{Action, Continuation, ErrorClass, ErrorKind, Idempotency, Phase, Reason, WaitSource};
use smallvec::SmallVec;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl Call {
    /// Reports the outcome of the most recent attempt in flight.
    #[inline]
    pub fn report(&mut self, outcome: &Outcome) -> Decision {
        let n = self.in_flight.last().map(|f| f.number).unwrap_or(0);
        self.report_attempt(n, outcome)
    }

    /// Reports the outcome of attempt `number` (needed only with hedging, when
    /// two attempts are in flight). The decision is final once the call
    /// succeeded, stopped or must reconcile; later reports of sibling attempts
    /// return that final decision.
    #[inline]
    pub fn report_attempt(&mut self, number: u32, outcome: &Outcome) -> Decision {
        self.report_in(number, outcome)
    }

    /// The lane's decision when it may make it (inlined into the caller),
    /// else the general path's (kept out of line).
    #[inline(always)]
    pub(super) fn report_in(&mut self, number: u32, outcome: &Outcome) -> Decision {
        if self.lane {
            if let Some(d) = self.lane_report(number, outcome) {
                return d;
            }
        }
        self.report_general(number, outcome)
    }

    #[inline(never)]
    pub(super) fn report_general(&mut self, number: u32, outcome: &Outcome) -> Decision {
        #[cfg(feature = "test-hooks")]
        if let Some(hook) = &self.pol().policy.testing.panic_on_vendor_code {
            if outcome.vendor_code.as_deref() == Some(hook.as_str()) {
                panic!("retrywise test hook: forced panic inside a decision");
            }
        }
        let Some(mut f) = self.in_flight.take(|f| f.number == number) else {
            if let Some(f) = &self.final_decision {
                return f.decision(&self.tu.up.key);
            }
            let mut d = self.stop_decision(Reason::InvalidState, None, number);
            d.detail = Some(format!("attempt {number} is not in flight"));
            d.on_failure = None;
            return d;
        };
        let now = self.now();
        let now_ms = now.ms();
        let elapsed_ms = now.0.saturating_sub(f.started_ns) / 1_000_000;
        let pol = self.pol();
        f.leave(&pol.budget);
        let f_up = self.tu_of(&f).up.key.clone();
        let cls = pol.classifier.classify(outcome, self.idem);
        self.settle_rate(&mut f, outcome, &cls, now);
        let pol = self.pol();
        // Breaker, throttle and per-upstream counters see every attempt.
        // Upstream health, not the caller's idempotency or what its consumer saw.
        let record = match (cls.disposition, cls.evidence) {
            (Disposition::Succeeded, _) => Record::Success,
            (_, Some(c)) if pol.breaker.counts(c) => Record::Failure,
            _ => Record::Ignored,
        };
        let held = Self::held_cell(&f.breaker, self.tu_of(&f));
        let transition = self.record_breaker(held, &f, record, now_ms, elapsed_ms);
        if pol.policy.throttle.enabled {
            let key = self.scope(&pol.policy.throttle.scope, &f_up);
            if let Some(cell) = pol.shared.throttles.get(&key) {
                cell.value.settle(now_ms, throttle::verdict(cls.class));
            }
        }
        let hint = if pol.policy.retry_after.enabled && (!outcome.headers.is_empty() || outcome.retry_delay.is_some()) {
            wait_hint(outcome, || pol.shared.clock.wall())
        } else {
            Default::default()
        };
        self.last_class = cls.class;
        if let Some((key, t)) = transition {
            self.on_transition(&key, Some(t), now);
        }
        // True once the success decision is recorded with the attempt's end.
        let mut decided = false;
        if self.active() {
            let end = || End {
                at_ns: now.0,
                status: outcome.status,
                error_class: cls.class,
                reason: Some(cls.reason),
                phase: if cls.class.is_some() { Some(cls.phase) } else { None },
                error_kind: outcome.error,
                hedge: f.hedge,
                remaining_ms: f.remaining_ms,
                delay_ms: elapsed_ms,
            };
            let allow = &self.pol().policy.telemetry.header_allowlist;
            let headers: Vec<(String, String)> = match outcome.headers.is_empty() {
                true => Vec::new(),
                false => outcome
                    .headers
                    .iter()
                    .filter(|(k, _)| header_allowed(k, allow))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            };
            if headers.is_empty() {
                // A success ends the call: its decision goes into the same record.
                let then = (cls.disposition == Disposition::Succeeded && self.final_decision.is_none())
                    .then(|| Then::success(self.deadline_at.saturating_sub(now).ms()));
                decided = self.record_end(self.tu.handle.ring_here(), &f, end, then);
            } else {
                let mut e = self.end_event(&f, &end()).to_rec();
                e.extra().headers = headers;
                self.emit(&mut e);
            }
        }
        if let Some(f) = &self.final_decision {
            // A sibling already ended the call (hedging).
            return f.decision(&self.tu.up.key);
        }
        let base = |s: &Self| Decision {
            action: Action::Stop,
            delay: Duration::ZERO,
            class: cls.class,
            reason: cls.reason,
            upstream: Some(f_up.clone()),
            wait_source: WaitSource::None,
            retry_after: hint.wait,
            on_failure: Some(s.route().on_failure),
            detail: hint.problem.map(|p| p.as_str().to_string()),
            attempt: f.number,
            hedge: f.hedge,
            excluded: Vec::new(),
            continuation: None,
        };
        match cls.disposition {
            Disposition::Succeeded => {
                let learn = &self.pol().policy.timeouts.learn;
                if let (Some(after), true) = (outcome.first_token, learn.enabled) {
                    let ms = after.as_millis().min(u64::MAX as u128) as u64;
                    self.tu_of(&f).up.value.first_token.value.record(ms, learn);
                }
                self.count_success(&self.tu_of(&f).here(), &f);
                self.release_pending_hold();
                let upstream = f.tu().map(|t| t.up.key.clone());
                self.succeed(&f, upstream, !decided && self.active(), now);
                Decision::success(f.number, f.hedge, f_up)
            }
            Disposition::Reconcile => {
                let d = Decision {
                    action: Action::Reconcile,
                    ..base(self)
                };
                self.push_reconcile(&d, &f, now_ms);
                self.finish(d, now)
            }
            Disposition::Stop => {
                // A continuation refused in its prefill form goes again at once as an instruction.
                if outcome.continuation == Some(Continuation::Prefill) && cls.reason == Reason::InvalidRequest {
                    let mut d = base(self);
                    d.reason = Reason::PrefillRejected;
                    let failure = Failure {
                        at_once: true,
                        continuation: Some(Continuation::Instruction),
                        ..Failure::plain(Reason::PrefillRejected, &hint)
                    };
                    return self.continue_call(d, &f, now, &failure);
                }
                // What already showed is continued by another upstream (`stream_recovery: continue`).
                let continues = cls.class == Some(ErrorClass::PartialStream)
                    && outcome.resumable
                    && self.route().stream_recovery == StreamRecovery::Continue
                    && self.idem == Idempotency::Safe
                    && self.route_key().is_some();
                let switch = if cls.larger_context {
                    let real = outcome.input_tokens.or(self.needs().input_tokens);
                    if let Some(n) = outcome.input_tokens {
                        self.ext_mut().needs.input_tokens = Some(n);
                    }
                    let cur_ctx = self
                        .pol()
                        .policy
                        .upstreams
                        .get(f_up.as_str())
                        .and_then(|u| u.context_tokens);
                    let floor = match (real, cur_ctx) {
                        (Some(r), _) => Some(
                            r.saturating_add(self.needs().max_output_tokens.unwrap_or(0))
                                .saturating_sub(1),
                        ),
                        (None, Some(c)) => Some(c),
                        (None, None) => None,
                    };
                    Some(floor)
                } else if continues
                    || (cls.class == Some(ErrorClass::PartialStream)
                        && !self.route().forbid_after_stream_started
                        && self.idem == Idempotency::Safe
                        && self.route_key().is_some())
                {
                    Some(None)
                } else {
                    None
                };
                match switch {
                    Some(larger_than) if self.fallback_allowed() && self.sh().mode().retries => {
                        let d = base(self);
                        let failure = Failure {
                            force_switch: true,
                            larger_than,
                            continuation: continues.then_some(Continuation::Prefill),
                            ..Failure::plain(d.reason, &hint)
                        };
                        self.continue_call(d, &f, now, &failure)
                    }
                    _ => {
                        let d = base(self);
                        self.finish(d, now)
                    }
                }
            }
            Disposition::Retryable => {
                // A silent upstream (no first byte, no token, a stall before
                // any output) is left for the next candidate, not waited on again.
                let silent = matches!(
                    outcome.error,
                    Some(ErrorKind::FirstByteTimeout | ErrorKind::StreamIdleTimeout)
                ) && matches!(cls.phase, Phase::Sent | Phase::Headers | Phase::StreamOpen)
                    && self.route().on_silence == OnSilence::Fallback;
                let mut d = base(self);
                let timed_out = matches!(
                    outcome.error,
                    Some(ErrorKind::FirstByteTimeout | ErrorKind::StreamIdleTimeout)
                );
                if let Some(note) = self.x.as_mut().and_then(|e| e.clamped.take()).filter(|_| timed_out) {
                    d.detail.get_or_insert(note);
                }
                let failure = Failure {
                    prefer_switch: silent,
                    // A continuation that failed before its own output is
                    // still one: the caller holds the text it continues.
                    continuation: outcome.continuation,
                    ..Failure::plain(d.reason, &hint)
                };
                self.continue_call(d, &f, now, &failure)
            }
        }
    }

    pub(super) fn push_reconcile(&self, d: &Decision, f: &InFlight, now_ms: u64) {
        let item = ReconcileItem {
            logical_request_id: self.id.to_string(),
            attempt: f.number,
            upstream: self.tu_of(f).up.key.to_string(),
            idempotency_key: self.key.as_deref().map(str::to_string),
            tenant: self.tenant.as_deref().map(str::to_string),
            class: d.class,
            reason: d.reason,
            at_ms: now_ms,
            policy_version: self.pol().version.to_string(),
        };
        let cap = self.pol().policy.limits.max_keys as usize;
        let sh = self.sh();
        let mut q = sh.reconcile.lock();
        if q.len() >= cap {
            q.pop_front();
            sh.reconcile_dropped.fetch_add(1, Ordering::Relaxed);
        }
        q.push_back(item);
    }

    /// Cancels the call: every attempt in flight is reported as cancelled and
    /// the call stops with `cancelled`.
    pub fn cancel(&mut self) -> Decision {
        if let Some(f) = &self.final_decision {
            return f.decision(&self.tu.up.key);
        }
        let numbers: SmallVec<[u32; 2]> = self.in_flight.iter().map(|f| f.number).collect();
        let mut last = None;
        for n in numbers {
            last = Some(self.report_attempt(n, &Outcome::error(ErrorKind::Cancelled).phase(Phase::Sent)));
        }
        match last {
            Some(d) if d.is_final() => d,
            _ => {
                let mut d = self.stop_decision(Reason::Cancelled, Some(ErrorClass::Cancelled), self.attempts);
                d.on_failure = None;
                self.finish(d, self.now())
            }
        }
    }
}
