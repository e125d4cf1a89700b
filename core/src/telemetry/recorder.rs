//! A call's recorder: how a call writes its events, keeping the ring's
//! record indexes and the fold protocol to itself.
//!
//! An attempt costs one ring slot when nothing comes between its events:
//! its end is written into its start's record while that is still the
//! newest of the thread's ring, and the decision right after the end is
//! folded into the same record. For that the recorder remembers where an
//! attempt's start went (a [`StartMark`] the call keeps with the attempt)
//! and where the call's last attempt end went (inside the recorder).

use super::bus::EventBus;
use super::ring::{End, Packed, Start, ThreadRing};
use super::{EventKind, Hot, Rec, Then};
use smol_str::SmolStr;
use std::cell::Cell;

/// The usual attempt start — an id made here, no tenant or task, not a
/// hedge, an upstream name that fits a slot — with the names' word
/// (`names`, see `ring::plain_names`) computed once per upstream.
#[derive(Clone, Copy)]
pub(crate) struct PlainStart<'a> {
    pub(crate) names: u64,
    pub(crate) up: &'a Packed,
    /// The id's sequence number.
    pub(crate) seq: u64,
    pub(crate) at_ns: u64,
    pub(crate) version: u32,
    pub(crate) attempt: u32,
    pub(crate) remaining_ms: u64,
}

/// Where an attempt's start was recorded, for writing its end into the same record.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StartMark(Option<u64>);

/// Where an attempt's end was recorded, so the decision that follows can fold into it.
struct EndMark {
    index: u64,
    attempt: u32,
    hedge: bool,
    upstream: Option<SmolStr>,
}

impl EndMark {
    /// Attempt end `h`, recorded as (or into) record `index`.
    #[inline(always)]
    fn of(index: u64, h: &Hot) -> EndMark {
        EndMark {
            index,
            attempt: h.attempt,
            hedge: h.hedge,
            upstream: Some(h.upstream.clone()),
        }
    }
}

/// See the module documentation. `ring` arguments are the calling thread's
/// own ring when the call may write it there (else `None`: the shared ring).
#[derive(Default)]
pub(crate) struct Recorder {
    /// The attempt end this call recorded last, while it is the newest record of its ring.
    last_end: Cell<Option<EndMark>>,
}

impl Recorder {
    /// Records `rec` (into `ring` or the shared ring) and hands it to the sinks.
    #[inline(always)]
    pub(crate) fn record(&self, bus: &EventBus, ring: Option<&ThreadRing>, rec: &mut Rec) {
        let end = rec.kind == EventKind::AttemptEnd;
        let at = bus.write(ring, rec);
        // An attempt's end is remembered so that the decision right after it can fold into it.
        self.last_end.set(match (end, at) {
            (true, Some(index)) => Some(EndMark {
                index,
                attempt: rec.attempt.unwrap_or(0),
                hedge: rec.hedge,
                upstream: rec.upstream.take(),
            }),
            _ => None,
        });
    }

    /// Records an attempt's start or end given whole.
    #[inline(always)]
    fn record_hot(&self, bus: &EventBus, ring: Option<&ThreadRing>, h: &Hot) -> Option<u64> {
        let at = bus.write_hot(ring, h);
        self.last_end.set(match (h.kind == EventKind::AttemptEnd, at) {
            (true, Some(index)) => Some(EndMark::of(index, h)),
            _ => None,
        });
        at
    }

    /// Records an attempt's start, written straight into `ring` when only the
    /// ring takes it: `plain` when it is the usual start, else `start`'s
    /// fields; `hot` gives the start whole, for a record of its own.
    #[inline(always)]
    pub(crate) fn start<'a>(
        &self,
        bus: &EventBus,
        ring: Option<&ThreadRing>,
        plain: impl FnOnce() -> Option<PlainStart<'a>>,
        start: impl FnOnce() -> Start<'a>,
        hot: impl FnOnce() -> Hot<'a>,
    ) -> StartMark {
        let only = ring.filter(|_| bus.ring_only());
        if let Some(r) = only {
            if let Some(p) = plain() {
                let index = r.push_plain_start(p.names, p.up, p.seq, p.at_ns, p.version, p.attempt, p.remaining_ms);
                self.last_end.set(None);
                return StartMark(Some(index));
            }
        }
        match only.and_then(|r| r.push_start(&start())) {
            Some(index) => {
                self.last_end.set(None);
                StartMark(Some(index))
            }
            None => self.start_slow(bus, ring, hot),
        }
    }

    /// [`Recorder::start`] when the start needs a whole record.
    #[cold]
    #[inline(never)]
    fn start_slow<'a>(&self, bus: &EventBus, ring: Option<&ThreadRing>, hot: impl FnOnce() -> Hot<'a>) -> StartMark {
        StartMark(self.record_hot(bus, ring, &hot()))
    }

    /// Records an attempt's `end` (made when needed) — into its start's record (`start`) while
    /// that is the newest of `ring` and only the ring takes it — with `then`
    /// (the decision right after it) folded in. True when `then` was
    /// recorded. `hot` gives the end whole, for a record of its own.
    #[inline(always)]
    pub(crate) fn end<'a>(
        &self,
        bus: &EventBus,
        ring: Option<&ThreadRing>,
        start: StartMark,
        end: impl FnOnce() -> End,
        then: Option<Then>,
        hot: impl FnOnce() -> Hot<'a>,
    ) -> bool {
        if let (Some(index), Some(r)) = (start.0, ring) {
            if bus.ring_only() && r.end_at(index, end(), then) {
                self.last_end.set(match then {
                    Some(_) => None,
                    None => Some(EndMark::of(index, &hot())),
                });
                return then.is_some();
            }
        }
        self.end_slow(bus, ring, hot)
    }

    /// [`Recorder::end`] when the end cannot go into its start's record: a
    /// record of its own (the decision is then recorded apart).
    #[cold]
    #[inline(never)]
    fn end_slow<'a>(&self, bus: &EventBus, ring: Option<&ThreadRing>, hot: impl FnOnce() -> Hot<'a>) -> bool {
        self.record_hot(bus, ring, &hot());
        false
    }

    /// Folds decision `then` of attempt `attempt` (`hedge`, to `upstream`)
    /// into that attempt's end, when that is the last record this recorder
    /// wrote and still the newest of `ring`.
    #[inline]
    pub(crate) fn fold(
        &self,
        ring: Option<&ThreadRing>,
        attempt: u32,
        hedge: bool,
        upstream: Option<&SmolStr>,
        then: Then,
    ) -> bool {
        let Some(m) = self.last_end.take() else {
            return false;
        };
        if m.attempt != attempt || m.hedge != hedge || m.upstream.as_ref() != upstream {
            return false;
        }
        match ring {
            Some(ring) => ring.fold(m.index, then),
            None => false,
        }
    }
}
