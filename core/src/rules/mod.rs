//! The rules: what happens to a call after an attempt, one file per rule —
//! [`classify`] (what the outcome means: done, stop, reconcile, or may be
//! retried), [`deadline`] (how much time is left), [`route`] (which
//! upstream takes the next attempt: the fallback matcher) and [`wait`] (how
//! long to wait first: jitter and Retry-After). The retry budget is a guard
//! (`guards/budget.rs`), asked in its turn.
//!
//! `after_failure` is the order of checks for a failure that may be
//! retried — owner → attempts → deadline → route → budget → wait — in one
//! function. An outcome reaches it only once classified as retryable (or as
//! one that needs another upstream): auth errors and invalid requests stop
//! at once, an unsafe call that may have executed reconciles, visible
//! stream output is never replayed (`call/report.rs`).

pub mod classify;
pub mod deadline;
pub mod route;
pub mod wait;

use crate::clock::Nanos;
use crate::policy::{Backoff, RetryAfter, Route};
use crate::types::{Continuation, Reason};
use route::MatchResult;
use smol_str::SmolStr;
use std::time::Duration;
use wait::RetryHint;

/// The order of checks after a failure: the first that refuses ends the
/// call (or, for a sibling in flight, waits for it); when none refuses,
/// the plan for the next attempt.
pub(crate) fn after_failure<C: Failed>(c: &mut C, f: &Failure) -> Result<Plan<C::Grant>, Halt> {
    owner(c, f)?; // the kill switch, a retry owner upstream, a sibling still running
    attempts(c)?; // max_attempts counts every attempt, the first included
    let room = deadline::room(c.remaining(), c.min_attempt())?; // time for one more attempt
    let hint = wait::hinted(f.hint, c.waits().0); // the server's wait, capped; absurd = a year
    let stay_blocked = wait::too_long(hint, room, c.waits().0);
    let to = route::next(c, f, stay_blocked)?; // the same upstream, or the next eligible fallback
    let (to, drawn, grant) = budget(c, f, to, hint, stay_blocked)?; // the origin's budget, else a fallback's own
    match wait::plan(c, hint, &to, room, f.at_once) {
        // A retry: Retry-After or jitter, within the deadline; a fallback: now
        Ok(wait) => Ok(Plan { to, grant, wait }),
        Err(halt) => {
            if let Some(g) = &grant {
                c.refund(&drawn, g);
            }
            Err(halt)
        }
    }
}

/// Budget: a retry from every budget scope the request started in. When
/// those refuse, the failing upstream has had its share of retries, but
/// another upstream is not the one failing: the call moves to the route's
/// next eligible candidate if that upstream's own budget has a retry to
/// spare (a healthy backup serves the outage instead of the caller seeing
/// the primary's error), and stops `budget_exhausted` otherwise.
///
/// A rate-limit 429 retried where it failed after its valid Retry-After
/// draws nothing (`budget.exempt_rate_limited`): the provider said when to
/// come back (seed 003: a 429 is bounded by attempts, the deadline and
/// Retry-After; the budget guards failures that say nothing of when the
/// upstream can take more).
fn budget<C: Failed>(
    c: &mut C,
    f: &Failure,
    to: Target,
    hint: Option<Duration>,
    stay_blocked: bool,
) -> Result<(Target, SmolStr, Option<C::Grant>), Halt> {
    let origin = c.origin();
    if f.reason == Reason::RateLimited && hint.is_some() && !to.fallback && c.exempts_rate_limited() {
        return Ok((to, origin, None));
    }
    let refused = match c.withdraw(&origin) {
        Ok(grant) => return Ok((to, origin, Some(grant))),
        Err(halt) => halt,
    };
    let to = if to.fallback {
        to
    } else {
        let switch = Failure {
            prefer_switch: true,
            ..*f
        };
        match route::next(c, &switch, stay_blocked) {
            Ok(t) if t.fallback => t,
            _ => return Err(refused),
        }
    };
    if to.upstream == origin {
        return Err(refused);
    }
    match c.withdraw_spare(&to.upstream) {
        Some(grant) => {
            let drawn = to.upstream.clone();
            Ok((to, drawn, Some(grant)))
        }
        None => Err(refused),
    }
}

/// A failure the rules decide on.
pub(crate) struct Failure<'a> {
    /// The reason its classification gave (the stop's, unless a rule gives another).
    pub(crate) reason: Reason,
    /// The failure itself demands another upstream (a context window too
    /// small, a stream cut on a routed call): the same one is not retried.
    pub(crate) force_switch: bool,
    /// Candidates must have a context window above this many tokens.
    pub(crate) larger_than: Option<u64>,
    /// Another upstream is preferred (the failed one went silent): the next
    /// eligible candidate when there is one, else the same upstream.
    pub(crate) prefer_switch: bool,
    /// The next attempt goes at once: the upstream is not what failed (a
    /// continuation it refused in one form is sent in the other).
    pub(crate) at_once: bool,
    /// The next attempt continues a streamed answer that showed text, in
    /// this form (`Prefill` falls back to `Instruction` where the target
    /// does not take an assistant prefill).
    pub(crate) continuation: Option<Continuation>,
    /// The server's wait hint.
    pub(crate) hint: &'a RetryHint,
}

impl<'a> Failure<'a> {
    /// A failure that may be retried where it happened, after a wait.
    pub(crate) fn plain(reason: Reason, hint: &'a RetryHint) -> Failure<'a> {
        Failure {
            reason,
            force_switch: false,
            larger_than: None,
            prefer_switch: false,
            at_once: false,
            continuation: None,
            hint,
        }
    }
}

/// Why a call does not go on after a failure.
#[derive(Debug)]
pub(crate) enum Halt {
    /// The call stops with `reason`; `detail` replaces the failure's own
    /// when given; `excluded` lists the candidates a fallback could not use.
    Stop {
        reason: Reason,
        detail: Option<String>,
        excluded: Vec<(String, String)>,
    },
    /// A sibling attempt (a hedge) is still running: its outcome decides.
    Sibling,
}

impl Halt {
    /// A stop with no excluded candidates.
    pub(crate) fn stop(reason: Reason, detail: Option<String>) -> Halt {
        Halt::Stop {
            reason,
            detail,
            excluded: Vec::new(),
        }
    }
}

/// Where the next attempt goes.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) upstream: SmolStr,
    /// Another upstream than the call's current target.
    pub(crate) fallback: bool,
    /// Candidates the matcher excluded, with why (when it was asked).
    pub(crate) excluded: Vec<(String, String)>,
}

/// How long to wait before the next attempt, and why that long.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wait {
    pub(crate) delay: Duration,
    pub(crate) source: crate::types::WaitSource,
}

/// What the call does next when every check allows it.
pub(crate) struct Plan<G> {
    pub(crate) to: Target,
    /// The retries the budget granted for it (none for a retry it exempts).
    pub(crate) grant: Option<G>,
    pub(crate) wait: Wait,
}

/// What the rules read and ask of a call that failed (`call/retry.rs`
/// implements it for a call at the time of its failure).
pub(crate) trait Failed {
    /// The retries a budget grants (given back by [`Failed::refund`]).
    type Grant;

    /// Retries are switched on (the kill switch).
    fn retries_on(&self) -> bool;
    /// Fallbacks are switched on (the kill switch).
    fn fallbacks_on(&self) -> bool;
    /// No retrywise layer upstream owns this call's retries.
    fn is_owner(&self) -> bool;
    /// Another attempt of the call (a hedge) is still in flight.
    fn sibling_in_flight(&self) -> bool;
    /// Attempts started, and the most the call may start.
    fn attempts(&self) -> (u32, u32);
    /// Time left before the deadline.
    fn remaining(&self) -> Nanos;
    /// The policy's `min_attempt`, as [`Nanos`] and in ms.
    fn min_attempt(&self) -> (Nanos, u64);
    /// The call's route (an ad-hoc one when it names an upstream).
    fn route(&self) -> &Route;
    /// The call runs on a policy route (not on an upstream it named).
    fn routed(&self) -> bool;
    /// The upstream the call's next attempt goes to unless a rule moves it.
    fn target(&self) -> &SmolStr;
    /// Attempts made on the current target.
    fn target_attempts(&self) -> u32;
    /// The current target's breaker refuses attempts now.
    fn target_open(&self) -> bool;
    /// Upstreams the call has tried.
    fn tried(&self) -> Vec<&str>;
    /// The upstream the call's first attempt went to: its request was counted
    /// there, so its retries and fallbacks draw from that upstream's budget.
    fn origin(&self) -> SmolStr;
    /// The route's candidates now, apart from `tried` (see [`route::candidates`]).
    fn candidates(&self, tried: &[&str], larger_than: Option<u64>) -> MatchResult;
    /// A retry from every budget scope of `upstream`, or the stop a refusal means.
    fn withdraw(&mut self, upstream: &SmolStr) -> Result<Self::Grant, Halt>;
    /// A retry from every budget scope of `upstream` when they have one to
    /// spare; a refusal here is not counted (the stop, if any, is another's).
    fn withdraw_spare(&mut self, upstream: &SmolStr) -> Option<Self::Grant>;
    /// Gives back a grant that will not be used.
    fn refund(&mut self, upstream: &SmolStr, grant: &Self::Grant);
    /// A rate-limit retry that waits out its Retry-After draws no budget
    /// (`budget.exempt_rate_limited`, and the budget is on).
    fn exempts_rate_limited(&self) -> bool;
    /// The policy's Retry-After and backoff sections.
    fn waits(&self) -> (&RetryAfter, &Backoff);
    /// Retries granted so far, and the last wait, ms (decorrelated jitter grows from it).
    fn waited(&self) -> (u32, u64);
    /// The call's random stream (jitter).
    fn rng(&mut self) -> &mut rand_pcg::Pcg64Mcg;
}

/// Owner: retries switched on, no retry owner upstream, no sibling running.
fn owner<C: Failed>(c: &C, f: &Failure) -> Result<(), Halt> {
    if !c.retries_on() {
        return Err(Halt::stop(Reason::RetriesDisabled, None));
    }
    if !c.is_owner() {
        let detail = format!("upstream owner decides; evidence: {}", f.reason);
        return Err(Halt::stop(Reason::NotOwner, Some(detail)));
    }
    if c.sibling_in_flight() {
        // Let the sibling finish rather than add load.
        return Err(Halt::Sibling);
    }
    Ok(())
}

/// Attempts: one more may start.
fn attempts<C: Failed>(c: &C) -> Result<(), Halt> {
    let (made, max) = c.attempts();
    if made >= max {
        return Err(Halt::stop(Reason::MaxAttempts, None));
    }
    Ok(())
}
