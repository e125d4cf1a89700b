//! Node binding of the retrywise core: type translation only.
//!
//! This is the *lean native API* (`native.js` / `native.d.ts`). The idiomatic
//! JS API (`index.js`, modules in `lib/`) wraps it. Every decision is made by the `retrywise`
//! crate; this file converts types, keeps a few values for lazy getters and
//! turns panics into JS errors.
//!
//! Crossing cost: a call through a napi-rs method costs ~70 ns more than the
//! N-API crossing itself (~13 ns): unwrapping `this` is a private-property
//! lookup inside a `TryCatch`, every argument is type-checked and converted by
//! its own N-API call, the result is one more. So the steps of a governed call
//! also exist as **fast entry points** ([`fast`]): raw N-API functions with no
//! arguments and no return value, bound to one engine through their callback
//! data, that read their inputs from and write their results to a
//! `Float64Array` the JS layer handed to the engine once (the *scratch*
//! buffer, layout below). Strings never cross on the hot path: routes and
//! tenants are interned once (`intern`) and passed by number, upstream names
//! come back as indices into a per-engine table the JS side caches.
//!
//! The scratch layout (which slot holds what after each step) is defined once,
//! in [`scratch`], and exported by name through `vocab()`.
//!
//! Calls are kept in a slab inside the engine and named by numeric handles
//! (see [`NativeEngine`]); a call is freed when it finishes (see
//! [`finished`]), when JS releases it, or when its wrapper is
//! garbage-collected. Every entry point runs inside a panic boundary.

#![deny(clippy::all)]

mod fast;
mod finished;
pub mod fleet;
mod scratch;
mod stream;
pub mod wire;

use finished::Versions;
use napi::bindgen_prelude::*;
use napi_derive::napi;
use retrywise::idempotency::{derive_key, params_digest as core_params_digest};
use retrywise::{
    Action, Attempt, Call, CallSpec, Clock, Continuation, Decision, EffectState, Engine, ErrorClass, ErrorKind, Event,
    Headers, HedgePlan, Idempotency, Inbound, IntoName, ManualClock, Mode, Needs, OnFailure, Outcome, Phase, Policy,
    PolicyErrors, Reason, Stopped, SystemClock, Timer, WaitSource,
};
use scratch::{attempt, codes, decision, flags, hedge_after, hedge_no, step, stopped, Scratch, Slots};
use smol_str::SmolStr;
use std::cell::{RefCell, RefMut};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Upstream names interned per engine (the JS side caches them by index).
const MAX_INTERNED: usize = 256;
/// Route and tenant strings interned per engine (`intern`); past this many the
/// JS side passes the string (slower entry points).
const MAX_STRINGS: usize = 4096;

// ---------------------------------------------------------------------------
// Errors and the panic boundary
// ---------------------------------------------------------------------------

fn throw(env: &Env, code: &str, msg: &str) -> Error {
    let _ = env.throw_error(msg, Some(code));
    Error::new(Status::PendingException, msg.to_string())
}

fn throw_type(env: &Env, msg: &str) -> Error {
    let _ = env.throw_type_error(msg, Some("ERR_INVALID_ARG_TYPE"));
    Error::new(Status::PendingException, msg.to_string())
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Runs `f` inside a panic boundary: a Rust panic becomes a JS `Error` with
/// code `ERR_RETRYWISE_PANIC` instead of aborting the process.
fn guard<T>(env: &Env, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(throw(
            env,
            "ERR_RETRYWISE_PANIC",
            &format!("retrywise panicked: {}", panic_message(&*p)),
        )),
    }
}

fn policy_error(env: &Env, errs: &PolicyErrors) -> Error {
    let list: Vec<serde_json::Value> = errs
        .0
        .iter()
        .map(|e| serde_json::json!({ "path": e.path, "message": e.message }))
        .collect();
    throw(env, "ERR_RETRYWISE_POLICY", &serde_json::Value::Array(list).to_string())
}

const RELEASED: (&str, &str) = ("ERR_RETRYWISE_RELEASED", "this call was released");

fn status_message(status: f64) -> String {
    format!("outcome.status must be an HTTP status (100-999), got {status}")
}

// ---------------------------------------------------------------------------
// Per-engine state
// ---------------------------------------------------------------------------

/// Upstream names by index (the JS side caches the strings by index). Only
/// the engine's JS thread touches it: no lock.
#[derive(Default)]
struct Names {
    list: Vec<SmolStr>,
    last: usize,
}

impl Names {
    /// Index of `u`, interning it when there is room; -1 when the table is full.
    #[inline]
    fn index(&mut self, u: &SmolStr) -> f64 {
        if let Some(n) = self.list.get(self.last) {
            if n == u {
                return self.last as f64;
            }
        }
        for (i, n) in self.list.iter().enumerate() {
            if n == u {
                self.last = i;
                return i as f64;
            }
        }
        if self.list.len() < MAX_INTERNED {
            self.list.push(u.clone());
            self.last = self.list.len() - 1;
            return self.last as f64;
        }
        -1.0
    }

    /// [`Names::index`] of a name given as text (no `SmolStr` made when it is interned).
    #[inline]
    fn index_str(&mut self, u: &str) -> f64 {
        if let Some(n) = self.list.get(self.last) {
            if n.as_str() == u {
                return self.last as f64;
            }
        }
        self.index(&SmolStr::new(u))
    }

    fn name(&self, i: u32) -> Option<String> {
        self.list.get(i as usize).map(|s| s.to_string())
    }
}

/// The monotonic clock behind the JS layer's attempt timers: one per process
/// (timers of every engine share one list), real time even when the engine
/// runs on a manual clock, as `setTimeout` does.
fn rt_clock() -> &'static SystemClock {
    static RT: OnceLock<SystemClock> = OnceLock::new();
    RT.get_or_init(SystemClock::new)
}

#[inline]
fn rt_now_ms() -> f64 {
    ms_exact(rt_clock().now())
}

/// An attempt's stamp on the process clock (`attempt::STAMP`): its start moved by
/// the engine's offset, or a reading now on a manual-clock engine.
#[inline]
fn attempt_stamp(rt_offset_ms: Option<f64>, started_at: Duration) -> f64 {
    match rt_offset_ms {
        Some(o) => ms_exact(started_at) + o,
        None => rt_now_ms(),
    }
}

/// Milliseconds with their fraction, as the timers compare them.
#[inline]
fn ms_exact(d: Duration) -> f64 {
    d.as_secs() as f64 * 1000.0 + d.subsec_nanos() as f64 * 1e-6
}

fn class_code(c: Option<ErrorClass>) -> f64 {
    c.map_or(-1.0, |c| c.code() as f64)
}

fn on_failure_code(o: Option<OnFailure>) -> f64 {
    match o {
        None => -1.0,
        Some(OnFailure::Fail) => 0.0,
        Some(OnFailure::ManualReview) => 1.0,
    }
}

/// Whole milliseconds (truncated, as `Duration::as_millis`) as an f64, without
/// the u128 → f64 conversion `as_millis() as f64` costs.
#[inline]
fn ms_f64(d: Duration) -> f64 {
    let s = d.as_secs();
    if s < (1 << 40) {
        (s * 1000 + d.subsec_millis() as u64) as f64
    } else {
        d.as_millis() as f64
    }
}

/// One slot of the call slab. The buffers stay with the slot when its call is
/// released, so a reused slot allocates nothing.
struct Entry {
    gen: u32,
    call: Option<Call>,
    /// Attempts in flight (at most two with hedging; a few kept), for headers and nesting.
    attempts: Vec<Attempt>,
    detail: Option<String>,
    excluded: Vec<(String, String)>,
    upstream: Option<SmolStr>,
    /// The call's deadline on the engine's clock, once an attempt gave it.
    deadline: Option<Duration>,
}

impl Entry {
    fn clear(&mut self) {
        self.call = None;
        self.attempts.clear();
        self.detail = None;
        self.excluded = Vec::new();
        self.upstream = None;
        self.deadline = None;
    }

    fn put_attempt(&mut self, s: &Slots, names: &mut Names, a: Attempt) {
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
    fn put_next(
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

    fn put_decision(&mut self, s: &Slots, names: &mut Names, d: Decision) -> i32 {
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

    fn find_attempt(&self, n: u32) -> Option<&Attempt> {
        if n > 0 {
            self.attempts.iter().rev().find(|a| a.number == n)
        } else {
            self.attempts.last()
        }
    }

    /// What a call nested inside attempt `n` (0: the latest) inherits: the
    /// enclosing call's ids and key (`Attempt::inbound`), with the deadline
    /// replaced by what is left of the enclosing call's deadline *now*.
    fn inbound_for(&self, call: &Call, n: u32) -> Inbound {
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

/// Handles are `generation * 2^22 + index` (exact in an f64).
const IDX_BITS: f64 = 4_194_304.0;
const MAX_CALLS: usize = 4_194_304;

/// Everything an engine owns. Shared (single-threaded `Rc`) by the napi-rs
/// class and the fast entry points bound to it; only its JS thread touches it.
struct Inner {
    engine: Engine,
    manual: Option<ManualClock>,
    /// The process clock (`rt_now_ms`) minus the engine's, ms, when the
    /// engine runs on the system clock: both are the same calibrated counter
    /// from different origins, so an attempt's stamp is its `started_at`
    /// moved by this, with no clock read of its own. `None` on a manual clock.
    rt_offset_ms: Option<f64>,
    scratch: Scratch,
    names: Names,
    versions: Versions,
    strings: Vec<SmolStr>,
    pending: Arc<Mutex<Vec<Event>>>,
    sink: Option<u64>,
    slab: Vec<Entry>,
    free: Vec<u32>,
}

/// The live slot named by handle `h`.
#[inline]
fn live(slab: &mut [Entry], h: f64) -> Option<&mut Entry> {
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

/// Why a step could not run: thrown into JS by the caller.
enum Fail {
    Type(String),
    Coded(&'static str, String),
}

impl Fail {
    fn released() -> Fail {
        Fail::Coded(RELEASED.0, RELEASED.1.to_string())
    }

    fn into_error(self, env: &Env) -> Error {
        match self {
            Fail::Type(m) => throw_type(env, &m),
            Fail::Coded(c, m) => throw(env, c, &m),
        }
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

    fn release(&mut self, h: f64) {
        if let Some(e) = live(&mut self.slab, h) {
            e.clear();
            self.free.push((h as u64 & (MAX_CALLS as u64 - 1)) as u32);
        }
    }

    fn entry(&mut self, h: f64) -> std::result::Result<&mut Entry, Fail> {
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
    /// none); see [`Inner::start`].
    fn start_fast(&mut self, s: &Slots, first: bool) -> std::result::Result<(f64, i32), Fail> {
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
        self.start(s, spec, first)
    }

    /// Begins a call, and with `first` asks for its first attempt in the same
    /// step. Returns the handle and, with `first`,
    /// `ATTEMPT` or `STOPPED` (fields in scratch).
    #[inline]
    fn start(&mut self, s: &Slots, spec: CallSpec, first: bool) -> std::result::Result<(f64, i32), Fail> {
        // Freed here, its slot and its thread's upstream reference are the new call's.
        let pending = s.get(step::PENDING_RELEASE);
        if pending >= 0.0 {
            s.set(step::PENDING_RELEASE, -1.0);
            self.release(pending);
        }
        let (idx, h) = self.reserve()?;
        let e = &mut self.slab[idx];
        if !first {
            e.call = Some(self.engine.begin(spec));
            return Ok((h, codes::ATTEMPT));
        }
        // `begin` then `next_attempt` (two clock readings) costs fewer
        // instructions than `begin_attempt`, whose returned pair is copied.
        let r = e.call.insert(self.engine.begin(spec)).next_attempt();
        Ok((h, e.put_next(s, &mut self.names, r, true, self.rt_offset_ms)))
    }

    fn next_attempt(&mut self, s: &Slots, h: f64, stamp: bool) -> std::result::Result<i32, Fail> {
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
    fn finish(&mut self, s: &Slots, h: f64) -> std::result::Result<Option<finished::Done>, Fail> {
        let e = live(&mut self.slab, h).ok_or_else(Fail::released)?;
        let call = e.call.as_mut().ok_or_else(Fail::released)?;
        if !(call.is_finished() && call.holds_nothing()) {
            return Ok(None);
        }
        let d = call.final_decision();
        finished::put_finished(s, &mut self.names, &mut self.versions, &self.engine, call, e.deadline);
        if let Some(d) = d {
            e.put_decision(s, &mut self.names, d);
        }
        Ok(Some(finished::Done { h, free: false }))
    }

    /// Reports `o` for attempt `attempt` (0: the latest) of call `h`. `mode`
    /// ([`scratch::report::RELEASE`]): 1 releases a call that succeeded in the
    /// same step; 2 finishes a call that this decision finished and that holds
    /// nothing ([`Inner::finish`]'s fields; the step returns its id), freed
    /// by the step too unless the decision has text the JS layer still reads
    /// by handle (detail, exclusions, an upstream, target or policy version not interned).
    /// Returns the action code, whether the call was (or is about to be) released, and a finished call.
    fn report(
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
            finished::put_finished(s, &mut self.names, &mut self.versions, &self.engine, call, e.deadline);
            let text_left = s.get(decision::FLAGS) as u8 & (flags::DECISION_DETAIL | flags::DECISION_EXCLUDED) != 0
                || s.get(decision::UPSTREAM) < -1.0
                || s.get(scratch::finished::TARGET) < 0.0
                || s.get(scratch::finished::POLICY) < 0.0;
            return Ok((action, !text_left, Some(finished::Done { h, free: !text_left })));
        }
        Ok((action, false, None))
    }
}

fn deadline(ms: f64) -> Option<Duration> {
    (ms >= 0.0).then(|| Duration::from_micros((ms * 1000.0) as u64))
}

fn idempotency_of(code: f64) -> std::result::Result<Idempotency, Fail> {
    if (0.0..256.0).contains(&code) {
        if let Some(i) = Idempotency::from_code(code as u8) {
            return Ok(i);
        }
    }
    Err(Fail::Type("bad idempotency code".to_string()))
}

fn http_status(status: f64) -> std::result::Result<u16, Fail> {
    if (100.0..=999.0).contains(&status) && (status as u16) as f64 == status {
        Ok(status as u16)
    } else {
        Err(Fail::Type(status_message(status)))
    }
}

// ---------------------------------------------------------------------------
// Engine
// ---------------------------------------------------------------------------

/// Lean native engine. Use `Engine` from `index.js` instead.
///
/// Calls live in a slab inside the engine and JS holds a numeric handle:
/// creating a wrapped N-API object per call (and finalizing it) costs more
/// than the whole decision cycle. `release(handle)` drops a call (giving back
/// what an unfinished one holds, exactly as dropping a core `Call` does).
#[napi]
pub struct NativeEngine {
    inner: Rc<RefCell<Inner>>,
}

/// `kind` values for the constructor's `policy` argument.
const POLICY_NONE: u32 = 0;
const POLICY_JSON: u32 = 1;
const POLICY_TEXT: u32 = 2;
const POLICY_FILE: u32 = 3;

fn load_policy(env: &Env, kind: u32, text: Option<String>) -> Result<Policy> {
    let text = text.unwrap_or_default();
    let r = match kind {
        POLICY_NONE => Ok(Policy::default()),
        // A JS object arrives as JSON text: parsing text (rather than a serde
        // Value) lets the core name the field of an unknown-field error.
        POLICY_JSON => Policy::parse(&text, retrywise::Format::Json),
        POLICY_TEXT => Policy::from_str_any(&text),
        POLICY_FILE => Policy::from_file(std::path::Path::new(&text)),
        _ => return Err(throw_type(env, "policy kind must be 0..3")),
    };
    r.map_err(|e| policy_error(env, &e))
}

#[napi]
impl NativeEngine {
    /// `scratch`: a `Float64Array` of at least `vocab().scratch.len` (32)
    /// elements over a `SharedArrayBuffer` (no detach check per step) or a
    /// fixed-length `ArrayBuffer` (see the `scratch` module). `kind`: 0 default
    /// policy, 1 JSON text of a policy object, 2 JSON/YAML/TOML text, 3 a file path.
    /// `seed`: decimal u64 string. `manualClock`: use a `ManualClock`.
    #[napi(
        constructor,
        ts_args_type = "scratch: Float64Array, kind: number, policy: string | undefined | null, seed: string | undefined | null, manualClock: boolean"
    )]
    pub fn new(
        env: Env,
        scratch: Unknown<'_>,
        kind: u32,
        policy: Option<String>,
        seed: Option<String>,
        manual_clock: bool,
    ) -> Result<Self> {
        guard(&env, || {
            let scratch = Scratch::new(&env, scratch).map_err(|f| f.into_error(&env))?;
            let policy = load_policy(&env, kind, policy)?;
            let mut b = Engine::builder(policy);
            // Without a manual clock the core keeps its own system clock
            // (statically dispatched); an injected one is a trait object.
            let manual = if manual_clock {
                let c = ManualClock::new();
                b = b.clock(Arc::new(c.clone()) as Arc<dyn Clock>);
                Some(c)
            } else {
                None
            };
            if let Some(s) = seed {
                let v: u64 = s
                    .trim()
                    .parse()
                    .map_err(|_| throw_type(&env, &format!("opts.seed must be an integer in [0, 2^64), got {s}")))?;
                b = b.seed(v);
            }
            let engine = b.build().map_err(|e| policy_error(&env, &e))?;
            let rt_offset_ms = manual.is_none().then(|| rt_now_ms() - ms_exact(engine.now()));
            scratch
                .slots(&env)
                .map_err(|f| f.into_error(&env))?
                .set(step::PENDING_RELEASE, -1.0);
            Ok(NativeEngine {
                inner: Rc::new(RefCell::new(Inner {
                    engine,
                    manual,
                    rt_offset_ms,
                    scratch,
                    names: Names::default(),
                    versions: Versions::default(),
                    strings: Vec::new(),
                    pending: Arc::new(Mutex::new(Vec::new())),
                    sink: None,
                    slab: Vec::new(),
                    free: Vec::new(),
                })),
            })
        })
    }

    fn st(&self, env: &Env) -> Result<RefMut<'_, Inner>> {
        self.inner.try_borrow_mut().map_err(|_| {
            throw(
                env,
                "ERR_RETRYWISE_BUSY",
                "the engine is in use (re-entered from a callback)",
            )
        })
    }

    /// The engine's state and its scratch, checked, for a step that reads or writes scratch.
    fn st_slots<'e>(&self, env: &'e Env) -> Result<(RefMut<'_, Inner>, Slots<'e>)> {
        let st = self.st(env)?;
        let s = st.scratch.slots(env).map_err(|f| f.into_error(env))?;
        Ok((st, s))
    }

    /// The fast entry points of this engine (see the `fast` module): an object
    /// of functions taking no argument, whose inputs and results are in scratch.
    #[napi(
        ts_return_type = "{ begin(): void; beginAttempt(): void; next(): void; reportStatus(): string | undefined; reportOk(): string | undefined; release(): void; finish(): string | undefined }"
    )]
    pub fn fast(&self, env: Env) -> Result<Object<'static>> {
        guard(&env, || fast::create(&env, &self.inner))
    }

    /// Interns a route or tenant name for the fast entry points; returns its
    /// id, or -1 when the table is full (then pass the string to `begin`).
    #[napi]
    pub fn intern(&self, env: Env, s: String) -> Result<i32> {
        let mut st = self.st(&env)?;
        if let Some(i) = st.strings.iter().position(|x| x.as_str() == s) {
            return Ok(i as i32);
        }
        if st.strings.len() >= MAX_STRINGS {
            return Ok(-1);
        }
        st.strings.push(SmolStr::from(s));
        Ok(st.strings.len() as i32 - 1)
    }

    /// Begins a call: the fast path (route, deadline, idempotency, tenant).
    /// `deadlineMs` < 0 means the policy default; `idempotency` is a code.
    /// Returns the call's handle.
    #[napi]
    pub fn begin(
        &mut self,
        env: Env,
        route: String,
        deadline_ms: f64,
        idempotency: u32,
        tenant: Option<String>,
    ) -> Result<f64> {
        guard(&env, || {
            let mut spec = CallSpec::new(route);
            spec.deadline = deadline(deadline_ms);
            spec.idempotency = idempotency_of(idempotency as f64).map_err(|f| f.into_error(&env))?;
            spec.tenant = tenant.map(IntoName::into_name);
            let (mut st, s) = self.st_slots(&env)?;
            st.start(&s, spec, false)
                .map(|(h, _)| h)
                .map_err(|f| f.into_error(&env))
        })
    }

    /// Begins a call with every field. `extra` is JSON:
    /// `{tenant, task, priority, idempotencyKey, params, paramsDigest,
    ///   needs: {capabilities, inputTokens, maxOutputTokens, dataBoundary, maxCost},
    ///   inboundHeaders: [[name, value], ...]}`.
    /// `parent` (a handle, < 0 for none) / `parentAttempt` (0 = latest): an enclosing
    /// call of this engine (nesting); the new call inherits what is left of its
    /// deadline, its ids and key, and is a non-owner.
    /// With `first`, the call's first attempt is asked for in the same step
    /// (result code in the `step.RESULT` slot of `vocab().scratch`, attempt or stop fields in scratch, as `nextAttempt`).
    #[napi]
    #[allow(clippy::too_many_arguments)]
    pub fn begin_ex(
        &mut self,
        env: Env,
        route: String,
        deadline_ms: f64,
        idempotency: u32,
        extra: String,
        parent: f64,
        parent_attempt: u32,
        first: Option<bool>,
    ) -> Result<f64> {
        guard(&env, || {
            let mut spec = CallSpec::new(route);
            spec.deadline = deadline(deadline_ms);
            spec.idempotency = idempotency_of(idempotency as f64).map_err(|f| f.into_error(&env))?;
            let x: serde_json::Value =
                serde_json::from_str(&extra).map_err(|e| throw_type(&env, &format!("spec: {e}")))?;
            let s = |k: &str| x.get(k).and_then(|v| v.as_str()).map(str::to_string);
            spec.tenant = s("tenant").map(IntoName::into_name);
            spec.task = s("task").map(IntoName::into_name);
            spec.priority = s("priority").map(IntoName::into_name);
            spec.idempotency_key = s("idempotencyKey");
            spec.params_digest = s("paramsDigest");
            if let Some(p) = x.get("params") {
                spec.params_digest = Some(core_params_digest(p));
            }
            if let Some(n) = x.get("needs").filter(|n| n.is_object()) {
                let u = |k: &str| n.get(k).and_then(|v| v.as_f64()).map(|f| f.max(0.0) as u64);
                spec.needs = Needs {
                    capabilities: n
                        .get("capabilities")
                        .and_then(|c| c.as_array())
                        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
                        .unwrap_or_default(),
                    input_tokens: u("inputTokens"),
                    max_output_tokens: u("maxOutputTokens"),
                    data_boundary: n.get("dataBoundary").and_then(|v| v.as_str()).map(str::to_string),
                    max_cost: n.get("maxCost").and_then(|v| v.as_f64()),
                };
            }
            let (mut st, s) = self.st_slots(&env)?;
            if parent >= 0.0 {
                let e = st.entry(parent).map_err(|f| f.into_error(&env))?;
                let call = e.call.as_ref().ok_or_else(|| Fail::released().into_error(&env))?;
                spec.inbound = Some(e.inbound_for(call, parent_attempt));
            } else if let Some(h) = x.get("inboundHeaders").and_then(|h| h.as_array()) {
                let headers = pairs_to_headers(h);
                match Inbound::from_headers(&headers) {
                    Ok(i) => spec.inbound = i,
                    Err(e) => return Err(throw(&env, "ERR_RETRYWISE_INBOUND", &e.to_string())),
                }
            }
            let first = first.unwrap_or(false);
            let (h, r) = st.start(&s, spec, first).map_err(|f| f.into_error(&env))?;
            if first {
                s.set(step::RESULT, r as f64);
            }
            Ok(h)
        })
    }

    /// Drops a call (an unfinished one gives back its probe permits, gate
    /// slots and budget holds, as dropping a core `Call` does). Idempotent.
    #[napi]
    pub fn release(&mut self, env: Env, h: f64) -> Result<()> {
        guard(&env, || {
            self.st(&env)?.release(h);
            Ok(())
        })
    }

    /// Drops the first `n` calls of `handles` (each as `release` does): one
    /// crossing for a batch of finished calls. Unknown and released handles
    /// are skipped.
    #[napi]
    pub fn release_many(&mut self, env: Env, handles: Float64Array, n: u32) -> Result<()> {
        guard(&env, || {
            let mut st = self.st(&env)?;
            for &h in handles.iter().take(n as usize) {
                st.release(h);
            }
            Ok(())
        })
    }

    /// Live (unreleased) calls.
    #[napi]
    pub fn live_calls(&self, env: Env) -> Result<u32> {
        let st = self.st(&env)?;
        Ok((st.slab.len() - st.free.len()) as u32)
    }

    /// Admits the next attempt of call `h` (`0`, fields in scratch) or says
    /// why none may start (`1`, stop fields in scratch).
    #[napi]
    pub fn next_attempt(&mut self, env: Env, h: f64) -> Result<i32> {
        guard(&env, || {
            let (mut st, s) = self.st_slots(&env)?;
            st.next_attempt(&s, h, false).map_err(|f| f.into_error(&env))
        })
    }

    /// Reports a bare HTTP status for the latest attempt (the fast path); returns the action code.
    #[napi]
    pub fn report_status(&mut self, env: Env, h: f64, status: u32) -> Result<i32> {
        guard(&env, || {
            let st16 = http_status(status as f64).map_err(|f| f.into_error(&env))?;
            let (mut st, s) = self.st_slots(&env)?;
            st.report(&s, h, &Outcome::status(st16), 0, 0)
                .map(|r| r.0)
                .map_err(|f| f.into_error(&env))
        })
    }

    /// Reports a success with no status (a transport with no HTTP status); returns the action code.
    #[napi]
    pub fn report_ok(&mut self, env: Env, h: f64) -> Result<i32> {
        guard(&env, || {
            let (mut st, s) = self.st_slots(&env)?;
            st.report(&s, h, &Outcome::success(), 0, 0)
                .map(|r| r.0)
                .map_err(|f| f.into_error(&env))
        })
    }

    /// Reports a full outcome. Numbers < 0 mean absent; enum fields are codes.
    /// `resumable`: a stream broken after output showed text only;
    /// `continuation`: the code of how the attempt continued a broken stream.
    /// `headers` is a flat `[name, value, ...]` list. `body` is read by
    /// `Outcome::read_body` (an error's vendor code when `vendorCode` is absent;
    /// a JSON success that does not parse is `malformed_response`). `attempt` 0 = the latest.
    #[napi]
    #[allow(clippy::too_many_arguments)]
    pub fn report(
        &mut self,
        env: Env,
        h: f64,
        status: f64,
        error: i32,
        phase: i32,
        effect: i32,
        vendor_code: Option<String>,
        headers: Option<Vec<String>>,
        input_tokens: f64,
        body: Option<Uint8Array>,
        attempt: u32,
        ok: bool,
        resumable: Option<bool>,
        continuation: Option<i32>,
    ) -> Result<i32> {
        guard(&env, || {
            let mut o = outcome(
                &env,
                status,
                error,
                phase,
                effect,
                vendor_code,
                headers,
                input_tokens,
                body,
                ok,
            )?;
            o.resumable = resumable.unwrap_or(false);
            if let Some(c) = continuation.filter(|c| *c >= 0) {
                o.continuation =
                    Some(Continuation::from_code(c as u8).ok_or_else(|| throw_type(&env, "bad continuation code"))?);
            }
            let (mut st, s) = self.st_slots(&env)?;
            st.report(&s, h, &o, attempt, 0)
                .map(|r| r.0)
                .map_err(|f| f.into_error(&env))
        })
    }

    /// Cancels call `h`; the decision goes to scratch; returns the action code.
    #[napi]
    pub fn cancel(&mut self, env: Env, h: f64) -> Result<i32> {
        guard(&env, || {
            let (mut st, s) = self.st_slots(&env)?;
            let st = &mut *st;
            let e = live(&mut st.slab, h).ok_or_else(|| Fail::released().into_error(&env))?;
            let call = e.call.as_mut().ok_or_else(|| Fail::released().into_error(&env))?;
            let d = call.cancel();
            Ok(e.put_decision(&s, &mut st.names, d))
        })
    }

    /// Whether a hedged attempt may start: `HEDGE_START` (attempt in scratch),
    /// `HEDGE_AFTER` (ask again after `hedge_after.WAIT_MS` ms) or `HEDGE_NO`
    /// (`hedge_no.REASON`); slots and codes as `vocab().scratch` names them.
    #[napi]
    pub fn next_hedge(&mut self, env: Env, h: f64) -> Result<i32> {
        guard(&env, || {
            let (mut st, s) = self.st_slots(&env)?;
            let st = &mut *st;
            let e = live(&mut st.slab, h).ok_or_else(|| Fail::released().into_error(&env))?;
            let call = e.call.as_mut().ok_or_else(|| Fail::released().into_error(&env))?;
            match call.next_hedge() {
                HedgePlan::Start(a) => {
                    e.put_attempt(&s, &mut st.names, a);
                    Ok(codes::HEDGE_START)
                }
                HedgePlan::After(d) => {
                    s.set(hedge_after::WAIT_MS, d.as_secs_f64() * 1000.0);
                    Ok(codes::HEDGE_AFTER)
                }
                HedgePlan::No(r) => {
                    s.set(hedge_no::REASON, r.code() as f64);
                    Ok(codes::HEDGE_NO)
                }
            }
        })
    }

    /// Propagation headers of attempt `n` (0 = latest) of call `h` as a flat `[name, value, ...]` list.
    #[napi]
    pub fn attempt_headers(&mut self, env: Env, h: f64, n: u32) -> Result<Vec<String>> {
        guard(&env, || {
            let mut st = self.st(&env)?;
            let e = st.entry(h).map_err(|f| f.into_error(&env))?;
            let mut out = Vec::new();
            if let Some(a) = e.find_attempt(n) {
                a.for_each_header(|k, v| {
                    out.push(k.to_string());
                    out.push(v.to_string());
                });
            }
            Ok(out)
        })
    }

    /// Upstream of attempt `n` (0 = latest); for names that were not interned.
    #[napi]
    pub fn upstream_of_attempt(&mut self, env: Env, h: f64, n: u32) -> Result<Option<String>> {
        let mut st = self.st(&env)?;
        let e = st.entry(h).map_err(|f| f.into_error(&env))?;
        Ok(e.find_attempt(n).map(|a| a.upstream.to_string()))
    }

    /// Upstream of the last decision (for names that were not interned).
    #[napi]
    pub fn decision_upstream(&mut self, env: Env, h: f64) -> Result<Option<String>> {
        let mut st = self.st(&env)?;
        let e = st.entry(h).map_err(|f| f.into_error(&env))?;
        Ok(e.upstream.as_deref().map(str::to_string))
    }

    /// Detail of the last decision or stop of call `h`.
    #[napi]
    pub fn detail(&mut self, env: Env, h: f64) -> Result<Option<String>> {
        let mut st = self.st(&env)?;
        let e = st.entry(h).map_err(|f| f.into_error(&env))?;
        Ok(e.detail.clone())
    }

    /// Exclusions of the last decision as a flat `[upstream, why, ...]` list.
    #[napi]
    pub fn excluded(&mut self, env: Env, h: f64) -> Result<Vec<String>> {
        let mut st = self.st(&env)?;
        let e = st.entry(h).map_err(|f| f.into_error(&env))?;
        Ok(e.excluded.iter().flat_map(|(a, b)| [a.clone(), b.clone()]).collect())
    }

    fn with_call<T>(&self, env: &Env, h: f64, f: impl FnOnce(&Call) -> T) -> Result<T> {
        let mut st = self.st(env)?;
        let e = st.entry(h).map_err(|f| f.into_error(env))?;
        let call = e.call.as_ref().ok_or_else(|| Fail::released().into_error(env))?;
        Ok(f(call))
    }

    /// Facts about call `h` as JSON: `{id, attempts, remainingMs, owner, finished, policyVersion, target}`.
    #[napi]
    pub fn call_info(&mut self, env: Env, h: f64) -> Result<String> {
        self.with_call(&env, h, |call| {
            serde_json::json!({
                "id": call.id(),
                "attempts": call.attempts(),
                "remainingMs": call.remaining().as_millis() as u64,
                "owner": call.is_owner(),
                "finished": call.is_finished(),
                "policyVersion": call.policy_version(),
                "target": call.target(),
            })
            .to_string()
        })
    }

    /// Logical request id of call `h`.
    #[napi]
    pub fn call_id(&mut self, env: Env, h: f64) -> Result<String> {
        self.with_call(&env, h, |call| call.id().to_string())
    }

    /// Physical attempts call `h` started so far.
    #[napi]
    pub fn call_attempts(&mut self, env: Env, h: f64) -> Result<u32> {
        self.with_call(&env, h, |call| call.attempts())
    }

    /// Time left before call `h`'s deadline, ms.
    #[napi]
    pub fn call_remaining_ms(&mut self, env: Env, h: f64) -> Result<f64> {
        self.with_call(&env, h, |call| call.remaining().as_secs_f64() * 1000.0)
    }

    /// The engine's clock now, ms with their fraction: a finished call's
    /// remaining time is its `finished.DEADLINE_MS` minus this.
    #[napi]
    pub fn clock_ms(&self, env: Env) -> Result<f64> {
        Ok(ms_exact(self.st(&env)?.engine.now()))
    }

    /// A policy version by the index a finished call gave (`finished.POLICY`).
    #[napi]
    pub fn policy_name(&self, env: Env, i: u32) -> Result<Option<String>> {
        Ok(self.st(&env)?.versions.name(i))
    }

    /// Name of an interned upstream index.
    #[napi]
    pub fn upstream_name(&self, env: Env, i: u32) -> Result<Option<String>> {
        Ok(self.st(&env)?.names.name(i))
    }

    /// Engine stats as JSON.
    #[napi]
    pub fn stats(&self, env: Env) -> Result<String> {
        guard(&env, || {
            Ok(serde_json::to_string(&self.st(&env)?.engine.stats()).unwrap_or_default())
        })
    }

    /// Prometheus text exposition.
    #[napi]
    pub fn prometheus(&self, env: Env) -> Result<String> {
        guard(&env, || Ok(self.st(&env)?.engine.prometheus()))
    }

    /// The event ring buffer as JSON (oldest first).
    #[napi]
    pub fn events(&self, env: Env) -> Result<String> {
        guard(&env, || {
            Ok(serde_json::to_string(&self.st(&env)?.engine.events()).unwrap_or_default())
        })
    }

    /// Takes the event ring buffer as JSON.
    #[napi]
    pub fn drain_events(&self, env: Env) -> Result<String> {
        guard(&env, || {
            Ok(serde_json::to_string(&self.st(&env)?.engine.drain_events()).unwrap_or_default())
        })
    }

    /// Starts or stops collecting events for JS listeners.
    #[napi]
    pub fn set_listening(&mut self, env: Env, on: bool) -> Result<()> {
        guard(&env, || {
            let mut st = self.st(&env)?;
            match (on, st.sink) {
                (true, None) => {
                    let q = st.pending.clone();
                    let id = st.engine.on_event(Arc::new(move |e: &Event| {
                        let mut g = q.lock().unwrap_or_else(|p| p.into_inner());
                        if g.len() < 100_000 {
                            g.push(e.clone());
                        }
                    }));
                    st.sink = Some(id);
                }
                (false, Some(id)) => {
                    st.engine.remove_sink(id);
                    st.sink = None;
                    st.pending.lock().unwrap_or_else(|p| p.into_inner()).clear();
                }
                _ => {}
            }
            Ok(())
        })
    }

    /// Events collected for listeners since the last call, as JSON; `null` when none.
    #[napi]
    pub fn take_events(&self, env: Env) -> Result<Option<String>> {
        guard(&env, || {
            let st = self.st(&env)?;
            let evs = std::mem::take(&mut *st.pending.lock().unwrap_or_else(|p| p.into_inner()));
            if evs.is_empty() {
                return Ok(None);
            }
            Ok(Some(serde_json::to_string(&evs).unwrap_or_default()))
        })
    }

    /// Swaps the policy (same `kind` values as the constructor).
    #[napi]
    pub fn reload(&self, env: Env, kind: u32, policy: Option<String>) -> Result<()> {
        guard(&env, || {
            let p = load_policy(&env, kind, policy)?;
            self.st(&env)?.engine.reload(p).map_err(|e| policy_error(&env, &e))
        })
    }

    /// Kill switch: bit 1 retries, 2 fallback, 4 hedging.
    #[napi]
    pub fn set_mode(&self, env: Env, retries: bool, fallback: bool, hedging: bool) -> Result<()> {
        guard(&env, || {
            self.st(&env)?.engine.set_mode(Mode {
                retries,
                fallback,
                hedging,
            });
            Ok(())
        })
    }

    /// Current mode as bits (1 retries, 2 fallback, 4 hedging).
    #[napi]
    pub fn mode(&self, env: Env) -> Result<u32> {
        let m = self.st(&env)?.engine.mode();
        Ok(m.retries as u32 | (m.fallback as u32) << 1 | (m.hedging as u32) << 2)
    }

    /// The reconcile list as JSON.
    #[napi]
    pub fn reconcile_list(&self, env: Env) -> Result<String> {
        guard(&env, || {
            Ok(serde_json::to_string(&self.st(&env)?.engine.reconcile_list()).unwrap_or_default())
        })
    }

    /// Takes the reconcile list, as JSON.
    #[napi]
    pub fn drain_reconcile(&self, env: Env) -> Result<String> {
        guard(&env, || {
            Ok(serde_json::to_string(&self.st(&env)?.engine.drain_reconcile()).unwrap_or_default())
        })
    }

    /// Breaker state name of an upstream.
    #[napi]
    pub fn breaker_state(&self, env: Env, upstream: String) -> Result<String> {
        guard(&env, || {
            Ok(self.st(&env)?.engine.breaker_state(&upstream).as_str().to_string())
        })
    }

    /// The policy in force, as JSON.
    #[napi]
    pub fn policy(&self, env: Env) -> Result<String> {
        guard(&env, || {
            Ok(serde_json::to_string(&self.st(&env)?.engine.policy()).unwrap_or_default())
        })
    }

    /// Version string of the policy in force.
    #[napi]
    pub fn policy_version(&self, env: Env) -> Result<String> {
        Ok(self.st(&env)?.engine.policy_version())
    }

    /// The route a request for `model` takes (`Engine::route_for_model`: the
    /// policy's `models` map, a route or an upstream of that name); throws a
    /// policy error naming the keys to add for an unknown model.
    #[napi]
    pub fn route_for_model(&self, env: Env, model: String) -> Result<String> {
        guard(&env, || {
            let st = self.st(&env)?;
            st.engine
                .route_for_model(&model)
                .map_err(|e| policy_error(&env, &PolicyErrors(vec![e])))
        })
    }

    /// How to reach `upstream` (`Engine::reach`) as JSON: `{upstream, baseUrl,
    /// api, model, apiKeyEnv, apiVersion, prefill}`, unset fields null.
    #[napi]
    pub fn reach(&self, env: Env, upstream: String) -> Result<String> {
        guard(&env, || {
            Ok(wire::reach_json(&self.st(&env)?.engine.reach(&upstream)).to_string())
        })
    }

    /// The request for an attempt on `upstream` (`wire::rewrite` with the
    /// upstream's reach and this process's environment), or `null` when the
    /// catalog says nothing that would change it.
    #[napi]
    pub fn rewrite(&self, env: Env, upstream: String, req: wire::Request) -> Result<Option<wire::Request>> {
        guard(&env, || {
            let reach = self.st(&env)?.engine.reach(&upstream);
            wire::rewrite(&env, &reach, req)
        })
    }

    /// A stream gate for one attempt's body, reading malformed events as the
    /// policy says (`streams.malformed_event`). `endAtError`: an error event
    /// after output ends the stream before it (`StreamGate::end_at_error`),
    /// for wrapFetch, which continues the answer or ends the stream itself.
    #[napi]
    pub fn stream_gate(
        &self,
        env: Env,
        content_type: Option<String>,
        end_at_error: Option<bool>,
    ) -> Result<stream::StreamGate> {
        guard(&env, || {
            let gate = self.st(&env)?.engine.stream_gate(content_type.as_deref());
            Ok(stream::StreamGate::from_core(if end_at_error.unwrap_or(false) {
                gate.end_at_error()
            } else {
                gate
            }))
        })
    }

    /// Moves the manual clock forward; throws unless built with `manualClock`.
    #[napi]
    pub fn advance_clock(&self, env: Env, ms: f64) -> Result<()> {
        guard(&env, || match &self.st(&env)?.manual {
            Some(c) => {
                if ms.is_nan() || ms < 0.0 || !ms.is_finite() {
                    return Err(throw_type(&env, "ms must be a finite number >= 0"));
                }
                c.advance(Duration::from_micros((ms * 1000.0) as u64));
                Ok(())
            }
            None => Err(throw(
                &env,
                "ERR_RETRYWISE_NO_MANUAL_CLOCK",
                "advanceClock needs an engine built with { manualClock: true }",
            )),
        })
    }
}

fn pairs_to_headers(h: &[serde_json::Value]) -> Headers {
    let mut out = Headers::new();
    for p in h {
        if let Some(a) = p.as_array() {
            if let (Some(k), Some(v)) = (a.first().and_then(|v| v.as_str()), a.get(1).and_then(|v| v.as_str())) {
                out.insert(k, v);
            }
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn outcome(
    env: &Env,
    status: f64,
    error: i32,
    phase: i32,
    effect: i32,
    vendor_code: Option<String>,
    headers: Option<Vec<String>>,
    input_tokens: f64,
    body: Option<Uint8Array>,
    ok: bool,
) -> Result<Outcome> {
    let mut o = Outcome::default();
    if status >= 0.0 {
        if !(100.0..=999.0).contains(&status) {
            return Err(throw_type(env, &status_message(status)));
        }
        o.status = Some(status as u16);
    }
    if error >= 0 {
        o.error = Some(ErrorKind::from_code(error as u8).ok_or_else(|| throw_type(env, "bad error code"))?);
    }
    if phase >= 0 {
        o.phase = Some(Phase::from_code(phase as u8).ok_or_else(|| throw_type(env, "bad phase code"))?);
    }
    if effect >= 0 {
        o.effect = Some(EffectState::from_code(effect as u8).ok_or_else(|| throw_type(env, "bad effect code"))?);
    }
    if let Some(h) = headers {
        let mut it = h.iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            o.headers.insert(k, v);
        }
    }
    o.vendor_code = vendor_code;
    if let Some(b) = body {
        // The bytes as received: a JSON body that is not UTF-8 is malformed,
        // as in every binding.
        o.read_body(&b);
    }
    if input_tokens >= 0.0 {
        o.input_tokens = Some(input_tokens as u64);
    }
    o.ok = ok;
    Ok(o)
}

// ---------------------------------------------------------------------------
// Free functions
// ---------------------------------------------------------------------------

/// Stable names of every vocabulary enum, indexed by code, plus the scratch
/// layout (`scratch`: length, slots by group and name, result codes, flag
/// bits; see the `scratch` module), as JSON (read once when the module loads).
#[napi]
pub fn vocab() -> String {
    serde_json::json!({
        "version": retrywise::VERSION,
        "errorClass": ErrorClass::NAMES,
        "phase": Phase::NAMES,
        "errorKind": ErrorKind::NAMES,
        "idempotency": Idempotency::NAMES,
        "effect": EffectState::NAMES,
        "action": Action::NAMES,
        "waitSource": WaitSource::NAMES,
        "reason": Reason::NAMES,
        "continuation": Continuation::NAMES,
        "onFailure": ["fail", "manual_review"],
        "scratchLen": scratch::LEN,
        "scratch": scratch::vocab_json(),
    })
    .to_string()
}

/// The error kind an expired attempt timer means (`Attempt::timer_error`,
/// one mapping for every binding): `timer` is `connect`, `first_byte`, `idle`
/// or `total`; `totalMs` / `remainingMs` are the attempt's; `bodyStarted`:
/// the response's headers had arrived.
#[napi]
pub fn timer_error(
    env: Env,
    timer: String,
    total_ms: f64,
    remaining_ms: f64,
    body_started: bool,
) -> Result<&'static str> {
    let t = match timer.as_str() {
        "connect" => Timer::Connect,
        "first_byte" => Timer::FirstByte,
        "idle" => Timer::Idle,
        "total" => Timer::Total,
        _ => {
            return Err(throw_type(
                &env,
                &format!("timer must be connect, first_byte, idle or total, got {timer}"),
            ))
        }
    };
    let ms = |v: f64| if v.is_finite() && v > 0.0 { v as u64 } else { 0 };
    Ok(retrywise::rules::deadline::timer_error(t, ms(total_ms), ms(remaining_ms), body_started).as_str())
}

/// Milliseconds on the process-wide monotonic clock that stamps attempts
/// admitted by the fast entry points (the `attempt.STAMP` slot); real time even for engines
/// on a manual clock.
#[napi]
pub fn now_ms() -> f64 {
    rt_now_ms()
}

/// SHA-256 (hex) of the canonical JSON of `paramsJson` (object keys sorted).
#[napi]
pub fn params_digest(env: Env, params_json: String) -> Result<String> {
    guard(&env, || {
        let v: serde_json::Value =
            serde_json::from_str(&params_json).map_err(|e| throw_type(&env, &format!("params: {e}")))?;
        Ok(core_params_digest(&v))
    })
}

/// Whether a `content-type` names JSON (`application/json`, `+json`): the
/// success bodies a report's `body` is checked against.
#[napi]
pub fn json_media_type(content_type: String) -> bool {
    retrywise::json_media_type(&content_type)
}

/// `rw1_` + 32 hex digits of SHA-256(tenant ␀ operation ␀ digest).
#[napi]
pub fn derive_idempotency_key(tenant: String, operation: String, digest: String) -> String {
    derive_key(&tenant, &operation, &digest)
}

/// Vendor error code of an OpenAI- or Anthropic-style error body.
#[napi]
pub fn vendor_code_from_body(body: Uint8Array) -> Option<String> {
    retrywise::vendor_code_from_body(&body)
}

/// The JSON Schema of the policy document.
#[napi]
pub fn policy_schema() -> String {
    Policy::json_schema().to_string()
}

/// Validates a policy without building an engine; throws like the constructor.
#[napi]
pub fn check_policy(env: Env, kind: u32, policy: Option<String>) -> Result<String> {
    guard(&env, || {
        let p = load_policy(&env, kind, policy)?;
        Ok(serde_json::to_string(&p).unwrap_or_default())
    })
}
