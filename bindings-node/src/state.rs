//! Everything an engine owns (`Inner`), shared by the `NativeEngine` class and
//! the fast entry points bound to it: the call slab and its handles, and the
//! steps of a call (begin, next attempt, report, finish, release) that both
//! kinds of entry point run.

use crate::convert::{deadline, idempotency_of};
use crate::entry::Entry;
use crate::errors::Fail;
use crate::finished::{self, Versions};
use crate::names::Names;
use crate::scratch::{self, codes, decision, flags, step, Scratch, Slots};
use retrywise::{Action, CallSpec, Engine, Event, ManualClock, Needs, Outcome};
use smol_str::SmolStr;
use std::sync::{Arc, Mutex};

/// Handles are `generation * 2^22 + index` (exact in an f64).
const IDX_BITS: f64 = 4_194_304.0;
const MAX_CALLS: usize = 4_194_304;

/// Everything an engine owns. Shared (single-threaded `Rc`) by the napi-rs
/// class and the fast entry points bound to it; only its JS thread touches it.
pub(crate) struct Inner {
    pub(crate) engine: Engine,
    pub(crate) manual: Option<ManualClock>,
    /// The process clock (`rt_now_ms`) minus the engine's, ms, when the
    /// engine runs on the system clock: both are the same calibrated counter
    /// from different origins, so an attempt's stamp is its `started_at`
    /// moved by this, with no clock read of its own. `None` on a manual clock.
    pub(crate) rt_offset_ms: Option<f64>,
    pub(crate) scratch: Scratch,
    pub(crate) names: Names,
    pub(crate) versions: Versions,
    pub(crate) strings: Vec<SmolStr>,
    pub(crate) pending: Arc<Mutex<Vec<Event>>>,
    pub(crate) sink: Option<u64>,
    pub(crate) slab: Vec<Entry>,
    pub(crate) free: Vec<u32>,
    /// What the request last read by `readNextRequest` needs, until a begin
    /// takes it (`begin::REQUEST`, or `beginEx`'s `readNext`): a wrapped
    /// fetch reads a request and begins its call in the same job, so no
    /// other read comes between.
    pub(crate) read: Option<Needs>,
}

/// The live slot named by handle `h`.
#[inline]
pub(crate) fn live(slab: &mut [Entry], h: f64) -> Option<&mut Entry> {
    if h.is_nan() || h < 0.0 {
        return None;
    }
    let hi = h as u64;
    let idx = (hi & (MAX_CALLS as u64 - 1)) as usize;
    let gen = (hi >> 22) as u32;
    match slab.get_mut(idx) {
        Some(e) if e.gen == gen && e.call.is_some() => Some(e),
        _ => None,
    }
}

impl Inner {
    /// A free slot for a new call (its generation bumped): its index and handle.
    fn reserve(&mut self) -> std::result::Result<(usize, f64), Fail> {
        let idx = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                if self.slab.len() >= MAX_CALLS {
                    return Err(Fail::Coded(
                        "ERR_RETRYWISE_TOO_MANY_CALLS",
                        "more than 4 194 304 live calls: release finished calls".to_string(),
                    ));
                }
                self.slab.push(Entry {
                    gen: 0,
                    call: None,
                    attempts: Vec::with_capacity(2),
                    detail: None,
                    excluded: Vec::new(),
                    upstream: None,
                    deadline: None,
                });
                self.slab.len() - 1
            }
        };
        let e = &mut self.slab[idx];
        e.gen = e.gen.wrapping_add(1) & 0x7fff_ffff;
        Ok((idx, e.gen as f64 * IDX_BITS + idx as f64))
    }

    pub(crate) fn release(&mut self, h: f64) {
        if let Some(e) = live(&mut self.slab, h) {
            e.clear();
            self.free.push((h as u64 & (MAX_CALLS as u64 - 1)) as u32);
        }
    }

    pub(crate) fn entry(&mut self, h: f64) -> std::result::Result<&mut Entry, Fail> {
        live(&mut self.slab, h).ok_or_else(Fail::released)
    }

    /// An interned string by id; `None` for -1 (absent).
    fn string(&self, id: f64) -> std::result::Result<Option<SmolStr>, Fail> {
        if id < 0.0 {
            return Ok(None);
        }
        let i = id as usize;
        match self.strings.get(i) {
            Some(s) if i as f64 == id => Ok(Some(s.clone())),
            _ => Err(Fail::Type(format!("unknown interned string id {id}"))),
        }
    }

    /// Begins a call from the fast spec in `s` (`scratch::begin`: route id,
    /// deadline ms < 0: policy default, idempotency code, tenant id < 0:
    /// none, request 1: the needs `readNextRequest` kept); see [`Inner::start`].
    pub(crate) fn start_fast(&mut self, s: &Slots, first: bool) -> std::result::Result<(f64, i32), Fail> {
        use scratch::begin::*;
        let route = self
            .string(s.get(ROUTE))?
            .ok_or_else(|| Fail::Type("route id must be >= 0".to_string()))?;
        let tenant = self.string(s.get(TENANT))?;
        let idempotency = idempotency_of(s.get(IDEMPOTENCY))?;
        let mut spec = CallSpec::new(route);
        spec.deadline = deadline(s.get(DEADLINE_MS));
        spec.idempotency = idempotency;
        spec.tenant = tenant;
        if s.get(REQUEST) == 1.0 {
            spec.needs = self.read.take().unwrap_or_default();
        }
        self.start(s, &mut spec, first)
    }

    /// Begins a call, and with `first` asks for its first attempt in the same
    /// step. Returns the handle and, with `first`,
    /// `ATTEMPT` or `STOPPED` (fields in scratch). `spec` is lent, not moved:
    /// moving one copies it (~340 bytes) at each call it passes. A route the
    /// policy does not know is a policy error (`Engine::try_begin_from`), and
    /// the slot reserved for the call is free again.
    #[inline]
    pub(crate) fn start(
        &mut self,
        s: &Slots,
        spec: &mut CallSpec,
        first: bool,
    ) -> std::result::Result<(f64, i32), Fail> {
        // Freed here, its slot and its thread's upstream reference are the new call's.
        let pending = s.get(step::PENDING_RELEASE);
        if pending >= 0.0 {
            s.set(step::PENDING_RELEASE, -1.0);
            self.release(pending);
        }
        let (idx, h) = self.reserve()?;
        let e = &mut self.slab[idx];
        let call = match self.engine.try_begin_from(spec) {
            Ok(c) => e.call.insert(c),
            Err(err) => {
                self.free.push(idx as u32);
                return Err(Fail::policy(err));
            }
        };
        if !first {
            return Ok((h, codes::ATTEMPT));
        }
        // `begin` then `next_attempt` (two clock readings) costs fewer
        // instructions than `begin_attempt`, whose returned pair is copied.
        let r = call.next_attempt();
        Ok((h, e.put_next(s, &mut self.names, r, true, self.rt_offset_ms)))
    }

    pub(crate) fn next_attempt(&mut self, s: &Slots, h: f64, stamp: bool) -> std::result::Result<i32, Fail> {
        let e = live(&mut self.slab, h).ok_or_else(Fail::released)?;
        let r = e.call.as_mut().ok_or_else(Fail::released)?.next_attempt();
        let code = e.put_next(s, &mut self.names, r, stamp, self.rt_offset_ms);
        if code == codes::STOPPED {
            // Whether the stop finished the call and left nothing held (see `finish`).
            let done = e.call.as_ref().is_some_and(|c| c.is_finished() && c.holds_nothing());
            s.set(step::IDLE, done as u8 as f64);
        }
        Ok(code)
    }

    /// Call `h`, finished and holding nothing, as a finished call: its final
    /// decision into the decision slots, the `finished` slots (see
    /// [`finished`]); the step returns its id. `None` (nothing written) for a
    /// call that is not finished or still holds something.
    pub(crate) fn finish(&mut self, s: &Slots, h: f64) -> std::result::Result<Option<finished::Done>, Fail> {
        let e = live(&mut self.slab, h).ok_or_else(Fail::released)?;
        let call = e.call.as_mut().ok_or_else(Fail::released)?;
        if !(call.is_finished() && call.holds_nothing()) {
            return Ok(None);
        }
        let d = call.final_decision();
        let numbered = finished::put_finished(s, &mut self.names, &mut self.versions, &self.engine, call, e.deadline);
        if let Some(d) = d {
            e.put_decision(s, &mut self.names, d);
        }
        Ok(Some(finished::Done {
            h,
            free: false,
            numbered,
        }))
    }

    /// Reports `o` for attempt `attempt` (0: the latest) of call `h`. `mode`
    /// ([`scratch::report::RELEASE`]): 1 releases a call that succeeded in the
    /// same step; 2 finishes a call that this decision finished and that holds
    /// nothing ([`Inner::finish`]'s fields; the step returns its id), freed
    /// by the step too unless the decision has text the JS layer still reads
    /// by handle (detail, exclusions, an upstream, target or policy version not interned).
    /// Returns the action code, whether the call was (or is about to be) released, and a finished call.
    pub(crate) fn report(
        &mut self,
        s: &Slots,
        h: f64,
        o: &Outcome,
        attempt: u32,
        mode: u8,
    ) -> std::result::Result<(i32, bool, Option<finished::Done>), Fail> {
        let e = live(&mut self.slab, h).ok_or_else(Fail::released)?;
        let call = e.call.as_mut().ok_or_else(Fail::released)?;
        let d = if attempt > 0 {
            call.report_attempt(attempt, o)
        } else {
            call.report(o)
        };
        let action = e.put_decision(s, &mut self.names, d);
        if mode == 1 && action == Action::Succeeded.code() as i32 {
            self.release(h);
            return Ok((action, true, None));
        }
        // Whether the JS layer may free the call later (`step::PENDING_RELEASE` or `releaseMany`).
        let idle = e.call.as_ref().is_some_and(|c| c.holds_nothing());
        s.set(step::IDLE, idle as u8 as f64);
        // A final decision does not always finish the call (a misplaced report
        // stops with `invalid_state` and changes nothing): ask the call.
        let finished = mode == 2 && idle && e.call.as_ref().is_some_and(|c| c.is_finished());
        if finished {
            let Some(call) = e.call.as_mut() else {
                return Ok((action, false, None));
            };
            let numbered =
                finished::put_finished(s, &mut self.names, &mut self.versions, &self.engine, call, e.deadline);
            let text_left = s.get(decision::FLAGS) as u8 & (flags::DECISION_DETAIL | flags::DECISION_EXCLUDED) != 0
                || s.get(decision::UPSTREAM) < -1.0
                || s.get(scratch::finished::TARGET) < 0.0
                || s.get(scratch::finished::POLICY) < 0.0;
            let done = finished::Done {
                h,
                free: !text_left,
                numbered,
            };
            return Ok((action, !text_left, Some(done)));
        }
        Ok((action, false, None))
    }
}
