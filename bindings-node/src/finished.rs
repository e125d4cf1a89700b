//! A finished call's last words.
//!
//! A call whose final decision (succeeded, stop, reconcile) left nothing in
//! flight gives nothing back when dropped, so the JS layer frees it at once
//! instead of waiting for its wrapper to be garbage-collected (a
//! `FinalizationRegistry` entry costs more than the whole decision cycle).
//! What the call can still be asked afterwards is written into the scratch's
//! `finished` slots first, and the JS `Call` keeps it: the core's answers,
//! asked of the core before the call is dropped (`next_attempt` gives the
//! final stop, `next_hedge` its refusal), never re-derived here.

use crate::convert::{class_code, ms_exact, on_failure_code};
use crate::names::Names;
use crate::scratch::{finished, Slots};
use retrywise::{Call, Engine};
use smol_str::SmolStr;
use std::time::Duration;

/// A call a step finished: its id goes back to JS as the step's value, read
/// while the call still exists; `free`: the step frees it right after.
pub(crate) struct Done {
    pub(crate) h: f64,
    pub(crate) free: bool,
}

/// Policy versions by index (the JS side caches the strings by index): a
/// call's version is found by comparing with the last one seen.
#[derive(Default)]
pub(crate) struct Versions {
    list: Vec<SmolStr>,
    /// The index of the last version looked up.
    last: usize,
}

/// Versions kept per engine (one per reload); past this many a version is
/// not interned and the JS layer reads the call's before freeing it.
const MAX_VERSIONS: usize = 64;

impl Versions {
    fn index(&mut self, v: &str) -> f64 {
        if self.list.get(self.last).is_some_and(|x| x.as_str() == v) {
            return self.last as f64;
        }
        if let Some(i) = self.list.iter().rposition(|x| x.as_str() == v) {
            self.last = i;
            return i as f64;
        }
        if self.list.len() < MAX_VERSIONS {
            self.list.push(SmolStr::new(v));
            self.last = self.list.len() - 1;
            return (self.list.len() - 1) as f64;
        }
        -1.0
    }

    pub(crate) fn name(&self, i: u32) -> Option<String> {
        self.list.get(i as usize).map(|s| s.to_string())
    }
}

/// Writes into the `finished` slots what `call` (finished, holding nothing)
/// still tells once freed (its id is read by the step). `deadline`: the call's deadline on
/// the engine's clock when an attempt gave it (its start plus the time it
/// had left), else it is read off the clock.
pub(crate) fn put_finished(
    s: &Slots,
    names: &mut Names,
    versions: &mut Versions,
    engine: &Engine,
    call: &mut Call,
    deadline: Option<Duration>,
) {
    s.set(finished::ATTEMPTS, call.attempts() as f64);
    s.set(finished::OWNER, call.is_owner() as u8 as f64);
    // A finished call admits no attempt: this reads its final stop.
    let (reason, class, on_failure, has_detail) = match call.next_attempt() {
        Err(st) => (
            st.reason.code() as f64,
            class_code(st.class),
            on_failure_code(st.on_failure),
            st.detail.is_some(),
        ),
        Ok(_) => unreachable!("a finished call admitted an attempt"),
    };
    s.set(finished::STOP_REASON, reason);
    s.set(finished::STOP_CLASS, class);
    s.set(finished::STOP_ON_FAILURE, on_failure);
    s.set(finished::STOP_HAS_DETAIL, has_detail as u8 as f64);
    let hedge = match call.next_hedge() {
        retrywise::HedgePlan::No(r) => r.code() as f64,
        _ => unreachable!("a finished call planned a hedge"),
    };
    s.set(finished::HEDGE_REASON, hedge);
    s.set(finished::TARGET, names.index_str(call.target()));
    s.set(finished::POLICY, versions.index(call.policy_version()));
    let deadline = deadline.unwrap_or_else(|| engine.now() + call.remaining());
    s.set(finished::DEADLINE_MS, ms_exact(deadline));
}
