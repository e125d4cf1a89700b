//! Outcome → error class, default disposition and reason. Pure and table
//! driven: the tables come from the policy (whitelist semantics — what is not
//! listed as retryable is not retried).

use crate::outcome::Outcome;
use crate::policy::{Classify, Retry};
use crate::types::{EffectState, ErrorClass, ErrorKind, Idempotency, Phase, Reason};

/// The default next step for a classified failure, before deadlines, budgets,
/// breakers and routes are consulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// The attempt succeeded.
    Succeeded,
    /// May be retried (subject to attempts, deadline, budget).
    Retryable,
    /// Never retried.
    Stop,
    /// Effect unknown: reconcile, never replay.
    Reconcile,
}

/// What the classifier concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classification {
    /// Error class; `None` on success.
    pub class: Option<ErrorClass>,
    /// Default disposition.
    pub disposition: Disposition,
    /// Stable reason code.
    pub reason: Reason,
    /// A larger-context upstream could serve this request (`context_length_exceeded`).
    pub larger_context: bool,
    /// The phase used for the decision.
    pub phase: Phase,
    /// What the outcome says about the upstream's health, whoever called it:
    /// the class a breaker judges. It never depends on the call's idempotency,
    /// its effect state or what its consumer already saw (an unsafe call's
    /// timeout is as much a sign of trouble as a safe call's); `None` for a
    /// success and for failures on the caller's side (cancelled, out of time
    /// before sending).
    pub evidence: Option<ErrorClass>,
}

/// Classification tables compiled from the policy: O(1) status lookups.
#[derive(Debug, Clone)]
pub struct Classifier {
    status: [StatusKind; 600],
    unsafe_ok: [bool; 600],
    retryable_errors: [bool; 12],
    retryable_classes: [bool; 9],
    honor_should_retry: bool,
    quota_codes: Vec<String>,
    overloaded_codes: Vec<String>,
    context_codes: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatusKind {
    Unlisted,
    Invalid,
    Auth,
    RateLimit,
    Overloaded,
    Transient,
}

impl Classifier {
    /// Compiles the tables.
    pub fn new(c: &Classify, r: &Retry) -> Self {
        let mut status = [StatusKind::Unlisted; 600];
        // Later lists win, so a policy that lists a code twice gets the more specific kind.
        for (list, kind) in [
            (&c.transient_statuses, StatusKind::Transient),
            (&c.overloaded_statuses, StatusKind::Overloaded),
            (&c.rate_limit_statuses, StatusKind::RateLimit),
            (&c.invalid_request_statuses, StatusKind::Invalid),
            (&c.auth_statuses, StatusKind::Auth),
        ] {
            for s in list {
                if let Some(slot) = status.get_mut(*s as usize) {
                    *slot = kind;
                }
            }
        }
        let mut unsafe_ok = [false; 600];
        for s in &c.unsafe_retryable_statuses {
            if let Some(slot) = unsafe_ok.get_mut(*s as usize) {
                *slot = true;
            }
        }
        let mut retryable_errors = [false; 12];
        for k in &c.retryable_errors {
            retryable_errors[k.code() as usize % 12] = true;
        }
        let mut retryable_classes = [false; 9];
        for k in &r.classes {
            retryable_classes[k.code() as usize % 9] = true;
        }
        Classifier {
            status,
            unsafe_ok,
            retryable_errors,
            retryable_classes,
            honor_should_retry: r.honor_should_retry,
            quota_codes: c.quota_codes.clone(),
            overloaded_codes: c.overloaded_codes.clone(),
            context_codes: c.context_length_codes.clone(),
        }
    }

    fn status_kind(&self, s: u16) -> StatusKind {
        self.status.get(s as usize).copied().unwrap_or(StatusKind::Unlisted)
    }

    fn code_in(list: &[String], code: Option<&str>) -> bool {
        code.is_some_and(|c| list.iter().any(|x| x.eq_ignore_ascii_case(c)))
    }

    /// Whether the class is on the retryable whitelist.
    pub fn class_retryable(&self, class: ErrorClass) -> bool {
        self.retryable_classes[class.code() as usize % 9]
    }

    /// Classifies one outcome for a call with the given idempotency.
    ///
    /// Order (seed 003): success; cancellation and deadline; auth/policy and
    /// invalid requests (never retried, never bypassed); effect state and
    /// stream phase (reconcile or stop before any replay); the status / error
    /// tables; the whitelist; finally `x-should-retry`, which may flip only
    /// what remains (never auth, effects, streams).
    pub fn classify(&self, o: &Outcome, idem: Idempotency) -> Classification {
        // The common case first: a success needs none of the evidence below.
        if o.is_success() {
            return Classification {
                class: None,
                disposition: Disposition::Succeeded,
                reason: Reason::Success,
                larger_context: false,
                phase: o.effective_phase(),
                evidence: None,
            };
        }
        let phase = o.effective_phase();
        let code = o.vendor_code.as_deref();
        let skind = o.status.map(|s| self.status_kind(s));
        let evidence = self.evidence(o, skind, phase);
        let mk = |class, disposition, reason| Classification {
            class: Some(class),
            disposition,
            reason,
            larger_context: false,
            phase,
            evidence,
        };
        // Cancellation and the deadline end the call; but an unsafe request
        // that was already sent may have executed, so it is reconciled
        // (unless the caller knows nothing happened).
        let maybe_executed =
            idem == Idempotency::Unsafe && phase != Phase::BeforeSend && !matches!(o.effect, Some(EffectState::None));
        match o.error {
            Some(ErrorKind::Cancelled) if maybe_executed => {
                return mk(ErrorClass::Cancelled, Disposition::Reconcile, Reason::EffectUnknown)
            }
            Some(ErrorKind::Cancelled) => return mk(ErrorClass::Cancelled, Disposition::Stop, Reason::Cancelled),
            Some(ErrorKind::DeadlineExceeded) if maybe_executed => {
                return mk(
                    ErrorClass::DeadlineExceeded,
                    Disposition::Reconcile,
                    Reason::EffectUnknown,
                )
            }
            Some(ErrorKind::DeadlineExceeded) => {
                return mk(
                    ErrorClass::DeadlineExceeded,
                    Disposition::Stop,
                    Reason::DeadlineExceeded,
                )
            }
            _ => {}
        }
        if skind == Some(StatusKind::Auth) {
            return mk(ErrorClass::AuthOrPolicy, Disposition::Stop, Reason::AuthError);
        }
        if Self::code_in(&self.context_codes, code) {
            let mut c = mk(
                ErrorClass::InvalidRequest,
                Disposition::Stop,
                Reason::ContextLengthExceeded,
            );
            c.larger_context = true;
            return c;
        }
        if skind == Some(StatusKind::Invalid) {
            return mk(ErrorClass::InvalidRequest, Disposition::Stop, Reason::InvalidRequest);
        }

        // Effects the caller reported override everything below.
        match o.effect {
            Some(EffectState::Unknown) => {
                return mk(
                    self.failure_class(o, skind, phase),
                    Disposition::Reconcile,
                    Reason::EffectUnknown,
                )
            }
            Some(EffectState::Pending) => {
                return mk(
                    self.failure_class(o, skind, phase),
                    Disposition::Reconcile,
                    Reason::EffectPending,
                )
            }
            Some(EffectState::Confirmed) if idem != Idempotency::Keyed => {
                return mk(
                    self.failure_class(o, skind, phase),
                    Disposition::Stop,
                    Reason::EffectConfirmed,
                )
            }
            _ => {}
        }

        // Visible output is never silently replayed.
        if phase == Phase::StreamVisible {
            if idem == Idempotency::Unsafe {
                return mk(ErrorClass::PartialStream, Disposition::Reconcile, Reason::EffectUnknown);
            }
            return mk(
                ErrorClass::PartialStream,
                Disposition::Stop,
                Reason::StreamVisibleOutput,
            );
        }

        // An unsafe call that may have reached the upstream: reconcile unless
        // the status proves it was not executed.
        let reached = phase != Phase::BeforeSend;
        if idem == Idempotency::Unsafe && reached {
            let proven_unexecuted = o.error.is_none()
                && o.status
                    .is_some_and(|s| self.unsafe_ok.get(s as usize).copied().unwrap_or(false));
            if !proven_unexecuted {
                let class = if o.status.is_some() && o.error.is_none() {
                    self.failure_class(o, skind, phase)
                } else {
                    ErrorClass::ResultUnknown
                };
                return mk(class, Disposition::Reconcile, Reason::EffectUnknown);
            }
        }

        let (class, mut disposition, mut reason) = match (o.error, skind) {
            (Some(kind), _) => {
                let retryable = self.retryable_errors[kind.code() as usize % 12];
                let reason = if phase == Phase::StreamOpen {
                    Reason::StreamNotStarted
                } else {
                    Reason::RetryableError
                };
                if retryable {
                    (ErrorClass::Transient, Disposition::Retryable, reason)
                } else {
                    (ErrorClass::Transient, Disposition::Stop, Reason::NotRetryable)
                }
            }
            (None, Some(StatusKind::RateLimit)) => {
                if Self::code_in(&self.quota_codes, code) {
                    (ErrorClass::RateLimit, Disposition::Stop, Reason::QuotaExhausted)
                } else {
                    (ErrorClass::RateLimit, Disposition::Retryable, Reason::RateLimited)
                }
            }
            (None, Some(StatusKind::Overloaded)) => {
                (ErrorClass::Overloaded, Disposition::Retryable, Reason::Overloaded)
            }
            (None, Some(StatusKind::Transient)) => {
                if Self::code_in(&self.overloaded_codes, code) {
                    (ErrorClass::Overloaded, Disposition::Retryable, Reason::Overloaded)
                } else {
                    (ErrorClass::Transient, Disposition::Retryable, Reason::RetryableStatus)
                }
            }
            (None, Some(_)) => {
                let s = o.status.unwrap_or(0);
                if s >= 500 {
                    (ErrorClass::Transient, Disposition::Stop, Reason::NotRetryable)
                } else {
                    (ErrorClass::InvalidRequest, Disposition::Stop, Reason::NotRetryable)
                }
            }
            (None, None) => (ErrorClass::Transient, Disposition::Stop, Reason::NotRetryable),
        };

        if disposition == Disposition::Retryable && !self.class_retryable(class) {
            disposition = Disposition::Stop;
            reason = Reason::NotRetryable;
        }

        if self.honor_should_retry && reason != Reason::QuotaExhausted {
            // gRPC's pushback: negative or unreadable means "do not retry" (A6).
            let pushback = o.headers.get("grpc-retry-pushback-ms").map(str::trim);
            let no_retry = pushback.is_some_and(|v| v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()));
            let should_retry = if no_retry {
                Some("false")
            } else {
                o.headers.get("x-should-retry").map(str::trim)
            };
            match should_retry {
                // The server may ask again for what the operator allows, never for more.
                Some(v)
                    if v.eq_ignore_ascii_case("true")
                        && disposition == Disposition::Stop
                        && self.class_retryable(class) =>
                {
                    disposition = Disposition::Retryable;
                    reason = Reason::ServerSaysRetry;
                }
                Some(v) if v.eq_ignore_ascii_case("false") && disposition == Disposition::Retryable => {
                    disposition = Disposition::Stop;
                    reason = Reason::ServerSaysNoRetry;
                }
                _ => {}
            }
        }
        mk(class, disposition, reason)
    }

    /// See [`Classification::evidence`]: the class the outcome would have
    /// for a safe call that showed nothing, except that running out of time
    /// after sending is a timeout like any other.
    fn evidence(&self, o: &Outcome, skind: Option<StatusKind>, phase: Phase) -> Option<ErrorClass> {
        match (o.error, skind) {
            (Some(ErrorKind::Cancelled), _) => None,
            (Some(ErrorKind::DeadlineExceeded), _) => (phase != Phase::BeforeSend).then_some(ErrorClass::Transient),
            (Some(_), _) => Some(ErrorClass::Transient),
            (None, Some(StatusKind::Auth)) => Some(ErrorClass::AuthOrPolicy),
            (None, Some(StatusKind::Invalid)) => Some(ErrorClass::InvalidRequest),
            (None, Some(StatusKind::Unlisted)) if o.status.is_some_and(|s| s < 500) => Some(ErrorClass::InvalidRequest),
            (None, _) => Some(self.failure_class(o, skind, Phase::Headers)),
        }
    }

    fn failure_class(&self, o: &Outcome, skind: Option<StatusKind>, phase: Phase) -> ErrorClass {
        if phase == Phase::StreamVisible {
            return ErrorClass::PartialStream;
        }
        match (o.error, skind) {
            (None, Some(StatusKind::RateLimit)) => ErrorClass::RateLimit,
            (None, Some(StatusKind::Overloaded)) => ErrorClass::Overloaded,
            (None, Some(_)) if Self::code_in(&self.overloaded_codes, o.vendor_code.as_deref()) => {
                ErrorClass::Overloaded
            }
            (None, Some(_)) => ErrorClass::Transient,
            _ => ErrorClass::ResultUnknown,
        }
    }
}

impl Default for Classifier {
    fn default() -> Self {
        Classifier::new(&Classify::default(), &Retry::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Disposition as D;
    use ErrorClass as C;

    fn cls(o: Outcome, idem: Idempotency) -> (Option<C>, D, Reason) {
        let c = Classifier::default().classify(&o, idem);
        (c.class, c.disposition, c.reason)
    }

    fn safe(o: Outcome) -> (Option<C>, D, Reason) {
        cls(o, Idempotency::Safe)
    }

    #[test]
    fn statuses() {
        for s in [400, 404, 413, 422] {
            assert_eq!(
                safe(Outcome::status(s)),
                (Some(C::InvalidRequest), D::Stop, Reason::InvalidRequest),
                "{s}"
            );
        }
        for s in [401, 403] {
            assert_eq!(
                safe(Outcome::status(s)),
                (Some(C::AuthOrPolicy), D::Stop, Reason::AuthError),
                "{s}"
            );
        }
        for s in [408, 500, 502, 503, 504] {
            assert_eq!(
                safe(Outcome::status(s)),
                (Some(C::Transient), D::Retryable, Reason::RetryableStatus),
                "{s}"
            );
        }
        assert_eq!(
            safe(Outcome::status(429)),
            (Some(C::RateLimit), D::Retryable, Reason::RateLimited)
        );
        assert_eq!(
            safe(Outcome::status(429).vendor_code("insufficient_quota")),
            (Some(C::RateLimit), D::Stop, Reason::QuotaExhausted)
        );
        assert_eq!(
            safe(Outcome::status(529)),
            (Some(C::Overloaded), D::Retryable, Reason::Overloaded)
        );
        assert_eq!(
            safe(Outcome::status(503).vendor_code("overloaded_error")),
            (Some(C::Overloaded), D::Retryable, Reason::Overloaded)
        );
        assert_eq!(
            safe(Outcome::status(409)),
            (Some(C::InvalidRequest), D::Stop, Reason::NotRetryable)
        );
        assert_eq!(
            safe(Outcome::status(501)),
            (Some(C::Transient), D::Stop, Reason::NotRetryable)
        );
        assert_eq!(safe(Outcome::status(200)), (None, D::Succeeded, Reason::Success));
    }

    #[test]
    fn context_length_is_flagged_for_larger_context_fallback() {
        let c = Classifier::default().classify(
            &Outcome::status(400).vendor_code("context_length_exceeded"),
            Idempotency::Safe,
        );
        assert_eq!(
            (c.class, c.disposition, c.reason),
            (Some(C::InvalidRequest), D::Stop, Reason::ContextLengthExceeded)
        );
        assert!(c.larger_context);
        let plain = Classifier::default().classify(&Outcome::status(400), Idempotency::Safe);
        assert!(!plain.larger_context);
    }

    #[test]
    fn cancel_and_deadline_after_send_reconcile_unsafe_calls() {
        for (k, class, reason) in [
            (ErrorKind::Cancelled, C::Cancelled, Reason::Cancelled),
            (
                ErrorKind::DeadlineExceeded,
                C::DeadlineExceeded,
                Reason::DeadlineExceeded,
            ),
        ] {
            let sent = Outcome::error(k).phase(Phase::Sent);
            assert_eq!(
                cls(sent.clone(), Idempotency::Unsafe),
                (Some(class), D::Reconcile, Reason::EffectUnknown)
            );
            for idem in [Idempotency::Safe, Idempotency::Keyed] {
                assert_eq!(cls(sent.clone(), idem), (Some(class), D::Stop, reason));
            }
            // Not sent, or the caller knows nothing happened: a plain stop.
            let before = Outcome::error(k).phase(Phase::BeforeSend);
            assert_eq!(cls(before, Idempotency::Unsafe), (Some(class), D::Stop, reason));
            let mut nothing = sent;
            nothing.effect = Some(EffectState::None);
            assert_eq!(cls(nothing, Idempotency::Unsafe), (Some(class), D::Stop, reason));
        }
    }

    #[test]
    fn machine_errors_and_phases() {
        for k in [
            ErrorKind::Dns,
            ErrorKind::Connect,
            ErrorKind::Tls,
            ErrorKind::ConnectTimeout,
        ] {
            for idem in [Idempotency::Safe, Idempotency::Unsafe] {
                assert_eq!(
                    cls(Outcome::error(k), idem),
                    (Some(C::Transient), D::Retryable, Reason::RetryableError),
                    "{k}"
                );
            }
        }
        let reset_before = Outcome::error(ErrorKind::ConnectionReset).phase(Phase::BeforeSend);
        assert_eq!(
            cls(reset_before.clone(), Idempotency::Unsafe),
            (Some(C::Transient), D::Retryable, Reason::RetryableError)
        );
        // After the request was written: unsafe → reconcile, safe/keyed → transient.
        for o in [
            Outcome::error(ErrorKind::ConnectionReset).phase(Phase::Sent),
            Outcome::error(ErrorKind::FirstByteTimeout),
            Outcome::error(ErrorKind::Write),
        ] {
            assert_eq!(
                cls(o.clone(), Idempotency::Unsafe),
                (Some(C::ResultUnknown), D::Reconcile, Reason::EffectUnknown)
            );
            assert_eq!(
                cls(o.clone(), Idempotency::Safe),
                (Some(C::Transient), D::Retryable, Reason::RetryableError)
            );
            assert_eq!(
                cls(o, Idempotency::Keyed),
                (Some(C::Transient), D::Retryable, Reason::RetryableError)
            );
        }
        let visible = Outcome::error(ErrorKind::ConnectionReset).phase(Phase::StreamVisible);
        assert_eq!(
            safe(visible.clone()),
            (Some(C::PartialStream), D::Stop, Reason::StreamVisibleOutput)
        );
        assert_eq!(
            cls(visible, Idempotency::Unsafe),
            (Some(C::PartialStream), D::Reconcile, Reason::EffectUnknown)
        );
        let open = Outcome::error(ErrorKind::StreamIdleTimeout).phase(Phase::StreamOpen);
        assert_eq!(safe(open), (Some(C::Transient), D::Retryable, Reason::StreamNotStarted));
        assert_eq!(
            safe(Outcome::error(ErrorKind::Other)),
            (Some(C::Transient), D::Stop, Reason::NotRetryable)
        );
        assert_eq!(
            safe(Outcome::error(ErrorKind::Cancelled)),
            (Some(C::Cancelled), D::Stop, Reason::Cancelled)
        );
        assert_eq!(
            safe(Outcome::error(ErrorKind::DeadlineExceeded)),
            (Some(C::DeadlineExceeded), D::Stop, Reason::DeadlineExceeded)
        );
    }

    #[test]
    fn unsafe_status_rules() {
        // 503 and 429 prove the request was not executed.
        assert_eq!(
            cls(Outcome::status(503), Idempotency::Unsafe),
            (Some(C::Transient), D::Retryable, Reason::RetryableStatus)
        );
        assert_eq!(
            cls(Outcome::status(429), Idempotency::Unsafe),
            (Some(C::RateLimit), D::Retryable, Reason::RateLimited)
        );
        // 500 / 502 may have executed.
        assert_eq!(
            cls(Outcome::status(500), Idempotency::Unsafe),
            (Some(C::Transient), D::Reconcile, Reason::EffectUnknown)
        );
        assert_eq!(
            cls(Outcome::status(500), Idempotency::Keyed),
            (Some(C::Transient), D::Retryable, Reason::RetryableStatus)
        );
    }

    #[test]
    fn effect_state_overrides() {
        let o = Outcome::status(503).effect(EffectState::Unknown);
        assert_eq!(cls(o, Idempotency::Safe).2, Reason::EffectUnknown);
        let o = Outcome::status(503).effect(EffectState::Confirmed);
        assert_eq!(
            cls(o.clone(), Idempotency::Unsafe),
            (Some(C::Transient), D::Stop, Reason::EffectConfirmed)
        );
        assert_eq!(cls(o, Idempotency::Keyed).1, D::Retryable);
        let o = Outcome::error(ErrorKind::ConnectionReset).effect(EffectState::Pending);
        assert_eq!(cls(o, Idempotency::Safe).1, D::Reconcile);
    }

    #[test]
    fn should_retry_header_overrides_status_but_not_auth_or_effects() {
        // The server may widen what is retried only within the operator's whitelist.
        let o = Outcome::status(501).header("x-should-retry", "true");
        assert_eq!(safe(o), (Some(C::Transient), D::Retryable, Reason::ServerSaysRetry));
        let o = Outcome::status(409).header("x-should-retry", "true");
        assert_eq!(safe(o), (Some(C::InvalidRequest), D::Stop, Reason::NotRetryable));
        let o = Outcome::status(503).header("X-Should-Retry", "false");
        assert_eq!(safe(o), (Some(C::Transient), D::Stop, Reason::ServerSaysNoRetry));
        let o = Outcome::status(401).header("x-should-retry", "true");
        assert_eq!(safe(o).2, Reason::AuthError);
        let o = Outcome::status(400).header("x-should-retry", "true");
        assert_eq!(safe(o).2, Reason::InvalidRequest);
        let o = Outcome::status(500).header("x-should-retry", "true");
        assert_eq!(cls(o, Idempotency::Unsafe).1, D::Reconcile);
        let o = Outcome::error(ErrorKind::ConnectionReset)
            .phase(Phase::StreamVisible)
            .header("x-should-retry", "true");
        assert_eq!(safe(o).2, Reason::StreamVisibleOutput);
    }

    #[test]
    fn whitelist_is_policy_driven() {
        let retry = Retry {
            classes: vec![C::Transient],
            ..Retry::default()
        };
        let c = Classifier::new(&Classify::default(), &retry);
        let r = c.classify(&Outcome::status(429), Idempotency::Safe);
        assert_eq!((r.disposition, r.reason), (D::Stop, Reason::NotRetryable));
        let mut cl = Classify::default();
        cl.transient_statuses.push(409);
        let c = Classifier::new(&cl, &Retry::default());
        assert_eq!(
            c.classify(&Outcome::status(409), Idempotency::Safe).disposition,
            D::Retryable
        );
    }
}
