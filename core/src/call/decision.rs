//! [`Decision`]: what the caller must do after reporting an attempt; and how
//! a call ends (its final decision, counted and recorded).

use super::{Call, Stopped};
use crate::clock::{ms, Nanos};
use crate::policy::OnFailure;
use crate::stats::Ctr;
use crate::types::{Action, Continuation, ErrorClass, Reason, WaitSource};
use smol_str::SmolStr;
use std::time::Duration;

/// What the caller must do after reporting an attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The action.
    pub action: Action,
    /// Wait before the next attempt (Retry / Fallback only).
    pub delay: Duration,
    /// Error class of the reported outcome (`None` on success).
    pub class: Option<ErrorClass>,
    /// Stable reason code.
    pub reason: Reason,
    /// Upstream of the next attempt (Retry / Fallback), or of the reported attempt otherwise.
    pub upstream: Option<SmolStr>,
    /// Where the wait came from.
    pub wait_source: WaitSource,
    /// The server's wait hint, as evidence for an upstream owner.
    pub retry_after: Option<Duration>,
    /// Route's instruction for failures (`fail` or `manual_review`), on stops.
    pub on_failure: Option<OnFailure>,
    /// Extra detail: the refusing budget scope, an ignored Retry-After, ...
    pub detail: Option<String>,
    /// The reported attempt's number.
    pub attempt: u32,
    /// The reported attempt was a hedge.
    pub hedge: bool,
    /// Candidates the matcher excluded for a fallback, with why.
    pub excluded: Vec<(String, String)>,
    /// The next attempt continues a streamed answer that already showed text
    /// (`stream_recovery: continue`), and how: build its request with
    /// `wire::continuation_body` and splice its stream after what the caller
    /// already has. `None`: the next attempt sends the request as it is.
    pub continuation: Option<Continuation>,
}

impl Decision {
    /// True when the call is over (Succeeded, Stop, Reconcile).
    pub fn is_final(&self) -> bool {
        matches!(self.action, Action::Succeeded | Action::Stop | Action::Reconcile)
    }

    /// The delay in whole milliseconds.
    pub fn delay_ms(&self) -> u64 {
        ms(self.delay)
    }

    /// A success of attempt `attempt` on `upstream`.
    #[inline(always)]
    pub(super) fn success(attempt: u32, hedge: bool, upstream: SmolStr) -> Decision {
        Decision {
            action: Action::Succeeded,
            delay: Duration::ZERO,
            class: None,
            reason: Reason::Success,
            upstream: Some(upstream),
            wait_source: WaitSource::None,
            retry_after: None,
            on_failure: None,
            detail: None,
            attempt,
            hedge,
            excluded: Vec::new(),
            continuation: None,
        }
    }

    pub(super) fn stopped(&self) -> Stopped {
        Stopped {
            reason: if self.action == Action::Succeeded {
                Reason::CallFinished
            } else {
                self.reason
            },
            class: self.class,
            on_failure: self.on_failure,
            detail: self.detail.clone(),
            wait: None,
        }
    }
}

/// A call's final decision; a success (the common end) is kept without a copy of the decision.
pub(super) enum Final {
    Succeeded {
        attempt: u32,
        hedge: bool,
        /// `None`: the call's own upstream (kept apart only for a hedge that won elsewhere).
        upstream: Option<SmolStr>,
    },
    Other(Box<Decision>),
}

impl Final {
    pub(super) fn of(d: &Decision) -> Final {
        match d {
            Decision {
                action: Action::Succeeded,
                delay: Duration::ZERO,
                class: None,
                reason: Reason::Success,
                wait_source: WaitSource::None,
                retry_after: None,
                on_failure: None,
                detail: None,
                excluded,
                attempt,
                hedge,
                upstream,
                continuation: None,
            } if excluded.is_empty() => Final::Succeeded {
                attempt: *attempt,
                hedge: *hedge,
                upstream: upstream.clone(),
            },
            d => Final::Other(Box::new(d.clone())),
        }
    }

    /// The decision; `own` is the call's upstream.
    pub(super) fn decision(&self, own: &SmolStr) -> Decision {
        match self {
            Final::Succeeded {
                attempt,
                hedge,
                upstream,
            } => Decision::success(*attempt, *hedge, upstream.as_ref().unwrap_or(own).clone()),
            Final::Other(d) => (**d).clone(),
        }
    }

    pub(super) fn stopped(&self) -> Stopped {
        match self {
            Final::Succeeded { .. } => Stopped::plain(Reason::CallFinished),
            Final::Other(d) => d.stopped(),
        }
    }
}

impl Call {
    #[inline]
    pub(super) fn finish(&mut self, mut d: Decision, now: Nanos) -> Decision {
        // A stop that skipped candidates says which and why where every
        // caller reads it (an error carries no `excluded` list).
        if d.action == Action::Stop && d.detail.is_none() && !d.excluded.is_empty() {
            let skipped: Vec<String> = d.excluded.iter().map(|(u, why)| format!("{u} ({why})")).collect();
            d.detail = Some(format!("candidates skipped: {}", skipped.join(", ")));
        }
        match d.action {
            Action::Succeeded => {}
            Action::Reconcile => {
                self.count(Ctr::Reconciles);
                self.count_stop(d.reason);
            }
            _ => self.count_stop(d.reason),
        }
        self.release_pending_hold();
        if self.active() {
            self.record_decision(&d, now);
        }
        self.final_decision = Some(Final::of(&d));
        d
    }

    pub(super) fn stop_decision(&self, reason: Reason, class: Option<ErrorClass>, attempt: u32) -> Decision {
        Decision {
            action: Action::Stop,
            delay: Duration::ZERO,
            class,
            reason,
            upstream: Some(self.tu.up.key.clone()),
            wait_source: WaitSource::None,
            retry_after: None,
            on_failure: Some(self.route().on_failure),
            detail: None,
            attempt,
            hedge: false,
            excluded: Vec::new(),
            continuation: None,
        }
    }

    pub(super) fn stop_now(&mut self, reason: Reason, detail: Option<String>, now: Nanos) -> Stopped {
        let mut d = self.stop_decision(reason, self.last_class, self.attempts);
        d.detail = detail;
        if reason == Reason::DeadlineExceeded && d.class.is_none() {
            d.class = Some(ErrorClass::DeadlineExceeded);
        }
        self.finish(d, now).stopped()
    }
}
