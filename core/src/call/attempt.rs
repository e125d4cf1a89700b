//! [`Attempt`]: one physical attempt the caller makes now, and [`Stopped`]:
//! why none may start.

use crate::clock::Nanos;
use crate::id::RequestId;
use crate::policy::OnFailure;
use crate::rules::deadline::{
    AttemptTimeouts, Inbound, TimeoutsMs, Timer, H_ATTEMPT, H_DEADLINE, H_IDEMPOTENCY_KEY, H_REQUEST_ID,
};
use crate::types::{ErrorClass, ErrorKind, Reason};
use smol_str::SmolStr;
use std::time::Duration;

/// One physical attempt the caller should make now.
///
/// Kept under 128 bytes, so handing it back (`next_attempt()?`) moves it in
/// a few vector stores rather than a `memcpy` call: times are stored as
/// integers and read through [`Attempt::timeouts`], [`Attempt::remaining`]
/// and [`Attempt::started_at`].
#[derive(Clone, PartialEq)]
pub struct Attempt {
    /// 1-based attempt number (hedges and fallbacks included).
    pub number: u32,
    /// Attempt number sent downstream: the owner's attempt number for a non-owner call.
    pub(super) wire_number: u32,
    /// Propagation safety margin, ms.
    pub(super) margin_ms: u32,
    /// True for a hedged (parallel) attempt.
    pub hedge: bool,
    /// True when this attempt goes to another upstream than the first one.
    pub fallback: bool,
    pub(super) propagate: bool,
    /// Upstream to call.
    pub upstream: SmolStr,
    pub(super) timeouts: TimeoutsMs,
    pub(super) remaining: Nanos,
    pub(super) started: Nanos,
    /// Logical request id.
    pub request_id: RequestId,
    /// Business idempotency key, unchanged across attempts.
    pub idempotency_key: Option<SmolStr>,
}

impl std::fmt::Debug for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attempt")
            .field("number", &self.number)
            .field("upstream", &self.upstream)
            .field("timeouts", &self.timeouts())
            .field("remaining", &self.remaining())
            .field("request_id", &self.request_id)
            .field("idempotency_key", &self.idempotency_key)
            .field("hedge", &self.hedge)
            .field("fallback", &self.fallback)
            .field("started_at", &self.started_at())
            .finish()
    }
}

impl Attempt {
    /// Timeouts for this attempt, clamped to the deadline, in whole
    /// milliseconds (floored: never past the deadline).
    ///
    /// ```
    /// use retrywise::{CallSpec, Engine, Policy};
    /// let engine = Engine::new(Policy::default()).unwrap();
    /// let mut call = engine.begin(CallSpec::new("openai/gpt-4o"));
    /// let attempt = call.next_attempt().unwrap();
    /// let t = attempt.timeouts();
    /// assert!(t.connect <= t.total && t.total <= attempt.remaining());
    /// ```
    #[inline]
    pub fn timeouts(&self) -> AttemptTimeouts {
        self.timeouts.timeouts()
    }

    /// Time left before the deadline when the attempt started.
    #[inline]
    pub fn remaining(&self) -> Duration {
        self.remaining.dur()
    }

    /// The engine clock's reading when the attempt was granted (see
    /// [`crate::Engine::now`]): bindings time the attempt from it without reading
    /// a clock of their own.
    #[inline]
    pub fn started_at(&self) -> Duration {
        self.started.dur()
    }

    /// Outbound propagation headers (`retrywise-deadline-ms`, `retrywise-request-id`,
    /// `retrywise-attempt`, `idempotency-key`); empty when propagation is off.
    /// Allocates the values; transports use [`Attempt::for_each_header`].
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::with_capacity(4);
        self.for_each_header(|name, value| v.push((name, value.to_string())));
        v
    }

    /// Hands each outbound propagation header (the same as
    /// [`Attempt::headers`], in the same order) to `f`, numbers formatted on
    /// the stack: no allocation per attempt.
    ///
    /// ```
    /// use retrywise::{CallSpec, Engine, Policy};
    /// let engine = Engine::new(Policy::default()).unwrap();
    /// let mut call = engine.begin(CallSpec::new("openai/gpt-4o"));
    /// let attempt = call.next_attempt().unwrap();
    /// let mut names = Vec::new();
    /// attempt.for_each_header(|name, _value| names.push(name));
    /// assert_eq!(names, ["retrywise-deadline-ms", "retrywise-request-id", "retrywise-attempt"]);
    /// ```
    pub fn for_each_header(&self, mut f: impl FnMut(&'static str, &str)) {
        if self.propagate {
            let mut n = itoa::Buffer::new();
            f(
                H_DEADLINE,
                n.format(self.remaining.ms().saturating_sub(u64::from(self.margin_ms))),
            );
            self.request_id.with_str(|id| f(H_REQUEST_ID, id));
            f(H_ATTEMPT, n.format(self.wire_number));
        }
        if let Some(k) = &self.idempotency_key {
            f(H_IDEMPOTENCY_KEY, k);
        }
    }

    /// The error to report when one of this attempt's timers expired (see
    /// [`crate::rules::deadline::timer_error`]); `body_started`: the
    /// response's headers had arrived.
    ///
    /// ```
    /// use retrywise::{CallSpec, Engine, ErrorKind, Policy, Timer};
    /// let engine = Engine::new(Policy::default()).unwrap();
    /// let mut call = engine.begin(CallSpec::new("openai/gpt-4o").deadline_ms(2_000));
    /// let attempt = call.next_attempt().unwrap();
    /// // Given all the time left, the attempt's own timer is the deadline's.
    /// assert_eq!(attempt.timer_error(Timer::Total, false), ErrorKind::DeadlineExceeded);
    /// assert_eq!(attempt.timer_error(Timer::FirstByte, false), ErrorKind::FirstByteTimeout);
    /// ```
    pub fn timer_error(&self, timer: Timer, body_started: bool) -> ErrorKind {
        crate::rules::deadline::timer_error(timer, self.timeouts.total_ms(), self.remaining.ms(), body_started)
    }

    /// What a call started inside this attempt (same process) inherits: the
    /// deadline, ids and key. Such a call is a non-owner: one attempt per outer attempt.
    pub fn inbound(&self) -> Inbound {
        Inbound {
            deadline: Some(self.remaining()),
            request_id: Some(self.request_id.to_string()),
            attempt: Some(self.number),
            idempotency_key: self.idempotency_key.as_deref().map(str::to_string),
        }
    }
}

/// Why no attempt may start (from [`crate::Call::next_attempt`]): the call
/// is over, or, when [`Stopped::wait`] is set, not yet.
#[derive(Debug, Clone, PartialEq)]
pub struct Stopped {
    /// Stable reason code.
    pub reason: Reason,
    /// Error class of the last failure, when any.
    pub class: Option<ErrorClass>,
    /// Route's instruction for failures.
    pub on_failure: Option<OnFailure>,
    /// Extra detail (refusing scope, conflicting digest, ...).
    pub detail: Option<String>,
    /// Not a stop but "not yet": no attempt may start now, and one may after
    /// this long, within the deadline (the upstream's breaker lets probes
    /// through then, reason `breaker_open`; or the provider's rate-limit
    /// window has the call's slot then, reason `rate_limited`, detail
    /// `paced: ...`). The call is not over: ask [`crate::Call::next_attempt`]
    /// again after the wait. A loop that treats it as a stop only fails fast.
    pub wait: Option<Duration>,
}

impl Stopped {
    /// A stop (not a wait) with this reason and nothing else.
    pub(crate) fn plain(reason: Reason) -> Stopped {
        Stopped {
            reason,
            class: None,
            on_failure: None,
            detail: None,
            wait: None,
        }
    }

    /// True when the call is over; false when it only has to wait ([`Stopped::wait`]).
    pub fn is_final(&self) -> bool {
        self.wait.is_none()
    }
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stopped: {}", self.reason)?;
        if let Some(c) = self.class {
            write!(f, " (class {c})")?;
        }
        if let Some(d) = &self.detail {
            write!(f, ": {d}")?;
        }
        if let Some(w) = self.wait {
            write!(f, " (ask again in {} ms)", w.as_millis())?;
        }
        Ok(())
    }
}

impl std::error::Error for Stopped {}
