//! One slot of an engine's call slab (`Entry`): a call, its attempts in
//! flight and the text of its last answer that the JS layer reads by handle,
//! and how each answer of the call (an attempt, a stop, a decision) is
//! written into scratch.

use crate::clock::attempt_stamp;
use crate::convert::{class_code, ms_f64, on_failure_code};
use crate::names::Names;
use crate::scratch::{attempt, codes, decision, flags, stopped, Slots};
use retrywise::{Attempt, Call, Decision, Inbound, Stopped};
use smol_str::SmolStr;
use std::time::Duration;

/// One slot of the call slab. The buffers stay with the slot when its call is
/// released, so a reused slot allocates nothing.
pub(crate) struct Entry {
    pub(crate) gen: u32,
    pub(crate) call: Option<Call>,
    /// Attempts in flight (at most two with hedging; a few kept), for headers and nesting.
    pub(crate) attempts: Vec<Attempt>,
    pub(crate) detail: Option<String>,
    pub(crate) excluded: Vec<(String, String)>,
    pub(crate) upstream: Option<SmolStr>,
    /// The call's deadline on the engine's clock, once an attempt gave it.
    pub(crate) deadline: Option<Duration>,
}

impl Entry {
    pub(crate) fn clear(&mut self) {
        self.call = None;
        self.attempts.clear();
        self.detail = None;
        self.excluded = Vec::new();
        self.upstream = None;
        self.deadline = None;
    }

    pub(crate) fn put_attempt(&mut self, s: &Slots, names: &mut Names, a: Attempt) {
        self.deadline = Some(a.started_at() + a.remaining());
        s.set(attempt::NUMBER, a.number as f64);
        s.set(attempt::UPSTREAM, names.index(&a.upstream));
        let t = a.timeouts();
        s.set(attempt::CONNECT_MS, ms_f64(t.connect));
        s.set(attempt::FIRST_BYTE_MS, ms_f64(t.first_byte));
        s.set(attempt::FIRST_TOKEN_MS, ms_f64(t.first_token));
        s.set(attempt::IDLE_MS, ms_f64(t.idle));
        s.set(attempt::TOTAL_MS, ms_f64(t.total));
        s.set(attempt::REMAINING_MS, ms_f64(a.remaining()));
        let f = (a.hedge as u8 * flags::ATTEMPT_HEDGE) | (a.fallback as u8 * flags::ATTEMPT_FALLBACK);
        s.set(attempt::FLAGS, f as f64);
        if self.attempts.len() >= 4 {
            self.attempts.remove(0);
        }
        self.attempts.push(a);
    }

    /// What `next_attempt` returned, into scratch: `ATTEMPT` (stamped in
    /// `attempt::STAMP` with `stamp`, see [`attempt_stamp`]) or `STOPPED`.
    #[inline]
    pub(crate) fn put_next(
        &mut self,
        s: &Slots,
        names: &mut Names,
        r: std::result::Result<Attempt, Stopped>,
        stamp: bool,
        rt_offset_ms: Option<f64>,
    ) -> i32 {
        match r {
            Ok(a) => {
                if stamp {
                    s.set(attempt::STAMP, attempt_stamp(rt_offset_ms, a.started_at()));
                }
                self.put_attempt(s, names, a);
                codes::ATTEMPT
            }
            Err(st) => {
                self.put_stopped(s, st);
                codes::STOPPED
            }
        }
    }

    fn put_stopped(&mut self, s: &Slots, st: Stopped) {
        s.set(stopped::REASON, st.reason.code() as f64);
        s.set(stopped::CLASS, class_code(st.class));
        s.set(stopped::ON_FAILURE, on_failure_code(st.on_failure));
        s.set(stopped::HAS_DETAIL, st.detail.is_some() as u8 as f64);
        s.set(stopped::WAIT_MS, st.wait.map_or(-1.0, ms_f64));
        self.detail = st.detail;
    }

    pub(crate) fn put_decision(&mut self, s: &Slots, names: &mut Names, d: Decision) -> i32 {
        s.set(decision::ACTION, d.action.code() as f64);
        s.set(decision::DELAY_MS, ms_f64(d.delay));
        s.set(decision::CLASS, class_code(d.class));
        s.set(decision::REASON, d.reason.code() as f64);
        s.set(
            decision::UPSTREAM,
            match &d.upstream {
                None => -1.0,
                Some(u) => {
                    let i = names.index(u);
                    if i < 0.0 {
                        -2.0
                    } else {
                        i
                    }
                }
            },
        );
        s.set(decision::WAIT_SOURCE, d.wait_source.code() as f64);
        s.set(decision::RETRY_AFTER_MS, d.retry_after.map_or(-1.0, ms_f64));
        s.set(decision::ON_FAILURE, on_failure_code(d.on_failure));
        s.set(decision::ATTEMPT, d.attempt as f64);
        let f = (d.hedge as u8 * flags::DECISION_HEDGE)
            | (d.detail.is_some() as u8 * flags::DECISION_DETAIL)
            | (!d.excluded.is_empty() as u8 * flags::DECISION_EXCLUDED)
            | (d.continuation.map_or(0, |c| c.code() + 1) << flags::DECISION_CONTINUATION_SHIFT);
        s.set(decision::FLAGS, f as f64);
        // Attempts that were reported are no longer in flight.
        if d.is_final() {
            self.attempts.clear();
        } else {
            let n = d.attempt;
            self.attempts.retain(|a| a.number != n);
        }
        self.detail = d.detail;
        self.excluded = d.excluded;
        self.upstream = d.upstream;
        d.action.code() as i32
    }

    pub(crate) fn find_attempt(&self, n: u32) -> Option<&Attempt> {
        if n > 0 {
            self.attempts.iter().rev().find(|a| a.number == n)
        } else {
            self.attempts.last()
        }
    }

    /// What a call nested inside attempt `n` (0: the latest) inherits: the
    /// enclosing call's ids and key (`Attempt::inbound`), with the deadline
    /// replaced by what is left of the enclosing call's deadline *now*.
    pub(crate) fn inbound_for(&self, call: &Call, n: u32) -> Inbound {
        let remaining = call.remaining();
        match self.find_attempt(n) {
            Some(a) => {
                let mut i = a.inbound();
                i.deadline = Some(remaining);
                i
            }
            None => Inbound {
                deadline: Some(remaining),
                request_id: Some(call.id().to_string()),
                attempt: None,
                idempotency_key: None,
            },
        }
    }
}
