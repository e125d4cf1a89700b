//! A finished call's last words.
//!
//! A call whose final decision (succeeded, stop, reconcile) left nothing in
//! flight gives nothing back when dropped, so the JS layer frees it at once
//! instead of waiting for its wrapper to be garbage-collected (a
//! `FinalizationRegistry` entry costs more than the whole decision cycle).
//! What the call can still be asked afterwards is written into the scratch's
//! `finished` slots first, and the JS `Call` keeps it: the core's answers,
//! asked of the core before the call is dropped (`final_stop` gives what
//! `next_attempt` answers now, `next_hedge` its refusal), never re-derived here.

use crate::convert::{class_code, ms_exact, on_failure_code};
use crate::names::Names;
use crate::scratch::{finished, Slots};
use retrywise::{Call, Engine, RequestId};
use smol_str::SmolStr;
use std::time::Duration;

/// A call a step finished: the step returns `true`, or its id's text when
/// it has no numbers (read while the call still exists); `free`: the step
/// frees it right after.
pub(crate) struct Done {
    pub(crate) h: f64,
    pub(crate) free: bool,
    /// The id went into the `finished` slots as numbers.
    pub(crate) numbered: bool,
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
/// still tells once freed, its id as numbers (an inherited id is read by the
/// step: the result is false). `deadline`: the call's deadline on
/// the engine's clock when an attempt gave it (its start plus the time it
/// had left), else it is read off the clock.
pub(crate) fn put_finished(
    s: &Slots,
    names: &mut Names,
    versions: &mut Versions,
    engine: &Engine,
    call: &mut Call,
    deadline: Option<Duration>,
) -> bool {
    s.set(finished::ATTEMPTS, call.attempts() as f64);
    s.set(finished::OWNER, call.is_owner() as u8 as f64);
    // What `next_attempt` answers now (the core's final stop, no clock read).
    let (reason, class, on_failure, has_detail) = match call.final_stop() {
        Some(st) => (
            st.reason.code() as f64,
            class_code(st.class),
            on_failure_code(st.on_failure),
            st.detail.is_some(),
        ),
        None => unreachable!("put_finished on a call that is not finished"),
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
    let parts = id_parts(call.request_id());
    let (hi, lo) = parts.unwrap_or((-1.0, 0.0));
    s.set(finished::ID_HI, hi);
    s.set(finished::ID_LO, lo);
    parts.is_some()
}

/// 2^40: `ID_LO` holds the low 40 bits of the sequence number.
const LO: f64 = 1_099_511_627_776.0;

/// An id the engine made as two numbers an f64 holds exactly: the prefix
/// and the sequence number's top 20 bits (52 bits), its low 40 bits. Most
/// finished calls are never asked for their id, so none is printed here
/// (printing it and making a JS string of it was a tenth of a success's
/// native time). `None` for an inherited id.
fn id_parts(id: &RequestId) -> Option<(f64, f64)> {
    let (prefix, seq) = id.parts()?;
    Some((
        ((prefix as u64) << 20 | seq >> 40) as f64,
        (seq & ((1 << 40) - 1)) as f64,
    ))
}

/// The id [`id_parts`] gave `(hi, lo)`; `None` for numbers it cannot have given.
pub(crate) fn id_text(hi: f64, lo: f64) -> Option<String> {
    let exact = |x: f64, below: f64| x >= 0.0 && x < below && x.fract() == 0.0;
    if !exact(hi, 4_503_599_627_370_496.0) || !exact(lo, LO) {
        return None;
    }
    let (hi, lo) = (hi as u64, lo as u64);
    Some(RequestId::from_parts((hi >> 20) as u32, (hi & 0xf_ffff) << 40 | lo).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_go_through_two_numbers_and_back() {
        for (prefix, seq) in [
            (0, 0),
            (u32::MAX, (1 << 60) - 1),
            (0xdead_beef, 42),
            (1, 1 << 40),
            (7, (1 << 40) - 1),
        ] {
            let id = RequestId::from_parts(prefix, seq);
            let (hi, lo) = id_parts(&id).unwrap();
            assert_eq!(id_text(hi, lo).as_deref(), Some(id.to_string().as_str()));
        }
        assert_eq!(
            id_parts(&RequestId::from_parts(0xdead_beef, 42)),
            Some((0xdead_beef_u32 as f64 * 1_048_576.0, 42.0))
        );
        for (hi, lo) in [
            (-1.0, 0.0),
            (0.5, 0.0),
            (0.0, LO),
            (f64::NAN, 0.0),
            (4_503_599_627_370_496.0, 0.0),
        ] {
            assert_eq!(id_text(hi, lo), None, "{hi} {lo}");
        }
    }
}
