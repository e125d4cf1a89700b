//! The scratch buffer: a `Float64Array` the JS layer hands to its engine once,
//! through which the steps of a call pass numbers (codes, milliseconds,
//! handles) instead of N-API values.
//!
//! Its layout is defined here and nowhere else: `vocab().scratch` gives every
//! slot to the JS side by name (`slots.attempt.NUMBER`), which resolves them
//! to constants once when it loads. Groups are views of the same buffer: an
//! attempt, a stop and a decision reuse the low slots; the inputs of the fast
//! entry points sit above every output, so a step may write its results while
//! it still reads its inputs.
//!
//! The buffer belongs to JS. A plain `ArrayBuffer` may be detached
//! (`structuredClone(buf, { transfer: [buf] })`, `buf.transfer()`): its memory
//! then belongs to another `ArrayBuffer` and is freed with it. So no step
//! touches the memory without [`Scratch::slots`], which checks first that the
//! array still has its elements (a detached array has none) and otherwise
//! fails with `ERR_RETRYWISE_SCRATCH_DETACHED`. A step runs no JS, so the
//! check holds for the whole step. The check is two N-API calls (~150
//! instructions a step, ~9 % of the explicit loop), so the JS layer puts its
//! scratch on a `SharedArrayBuffer`, which can be neither detached nor shrunk
//! (transferring one throws in JS): for it there is nothing to check. Another
//! thread may hold a shared buffer, so every access is a relaxed atomic (a
//! plain load or store on x86-64 and AArch64), never a data race.

use crate::errors::Fail;
use napi::bindgen_prelude::*;
use napi::sys;
use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Elements the scratch buffer must have.
pub(crate) const LEN: usize = 40;

/// Defines each group of slots as a module of constants, the JSON table that
/// `vocab()` exports, and compile-time checks: every slot in bounds, no two
/// slots of a group alike, inputs above outputs.
macro_rules! layout {
    ($( $(#[$doc:meta])* $dir:ident $group:ident { $( $(#[$sdoc:meta])* $name:ident = $idx:literal ),+ $(,)? } )+) => {
        $(
            $(#[$doc])*
            pub(crate) mod $group {
                $( $(#[$sdoc])* pub(crate) const $name: usize = $idx; )+
            }
        )+

        /// The layout as JSON: `{ group: { NAME: index, ... }, ... }`.
        pub(crate) fn layout_json() -> serde_json::Value {
            let mut groups = serde_json::Map::new();
            $(
                let mut g = serde_json::Map::new();
                $( g.insert(stringify!($name).to_string(), $group::$name.into()); )+
                groups.insert(stringify!($group).to_string(), g.into());
            )+
            groups.into()
        }

        const _: () = {
            $(
                assert!(distinct(&[$($group::$name),+]), concat!("two slots of ", stringify!($group), " are alike"));
                assert!(within(&[$($group::$name),+], dir!($dir)), concat!("a slot of ", stringify!($group), " is outside its range"));
            )+
        };
    };
}

macro_rules! dir {
    (output) => {
        OUTPUTS
    };
    (input) => {
        INPUTS
    };
}

/// Where results go (`output` groups) and where the fast entry points read
/// their arguments (`input` groups): disjoint, so inputs survive the writes.
const OUTPUTS: (usize, usize) = (0, 32);
const INPUTS: (usize, usize) = (32, LEN);

const fn distinct(s: &[usize]) -> bool {
    let mut i = 0;
    while i < s.len() {
        let mut j = i + 1;
        while j < s.len() {
            if s[i] == s[j] {
                return false;
            }
            j += 1;
        }
        i += 1;
    }
    true
}

const fn within(s: &[usize], range: (usize, usize)) -> bool {
    let mut i = 0;
    while i < s.len() {
        if s[i] < range.0 || s[i] >= range.1 {
            return false;
        }
        i += 1;
    }
    true
}

layout! {
    /// An admitted attempt (`nextAttempt` gave `ATTEMPT`, `nextHedge` gave `HEDGE_START`).
    output attempt {
        NUMBER = 1,
        /// Index into the engine's upstream names; -1: ask `upstreamOfAttempt`.
        UPSTREAM = 2,
        CONNECT_MS = 3,
        FIRST_BYTE_MS = 4,
        IDLE_MS = 5,
        TOTAL_MS = 6,
        REMAINING_MS = 7,
        /// Bits: `flags::ATTEMPT_HEDGE`, `flags::ATTEMPT_FALLBACK`.
        FLAGS = 8,
        /// Process-wide monotonic ms (`nowMs`) when the attempt was admitted
        /// (fast entry points asked to stamp it only).
        STAMP = 9,
        FIRST_TOKEN_MS = 10,
    }
    /// No attempt may start (`nextAttempt` gave `STOPPED`).
    output stopped {
        REASON = 1,
        /// Error class code, or -1.
        CLASS = 2,
        /// `onFailure` code, or -1.
        ON_FAILURE = 3,
        /// 1 when the stop has a detail (`detail(h)`).
        HAS_DETAIL = 4,
        /// Not a stop but "not yet": ask again after this many ms (`Stopped::wait`), or -1.
        WAIT_MS = 5,
    }
    /// A decision (`report*`, `cancel`).
    output decision {
        ACTION = 0,
        DELAY_MS = 1,
        /// Error class code, or -1.
        CLASS = 2,
        REASON = 3,
        /// Index into the engine's upstream names; -1: none, -2: ask `decisionUpstream`.
        UPSTREAM = 4,
        WAIT_SOURCE = 5,
        /// Retry-After ms, or -1.
        RETRY_AFTER_MS = 6,
        /// `onFailure` code, or -1.
        ON_FAILURE = 7,
        ATTEMPT = 8,
        /// Bits: `flags::DECISION_HEDGE`, `DECISION_DETAIL`, `DECISION_EXCLUDED`;
        /// the continuation's code + 1 (0: none) shifted by `flags::DECISION_CONTINUATION_SHIFT`.
        FLAGS = 9,
    }
    /// `nextHedge` gave `HEDGE_AFTER`.
    output hedge_after {
        /// Ms to wait before asking again.
        WAIT_MS = 1,
    }
    /// `nextHedge` gave `HEDGE_NO`.
    output hedge_no {
        REASON = 1,
    }
    /// `readNextRequest` read a request.
    output request {
        /// Its API family's code (`vocab().apiFamily`).
        FAMILY = 1,
    }
    /// What every step leaves besides its fields.
    output step {
        /// Result code of a fast entry point (`results`), or the action code of a report.
        RESULT = 12,
        /// Handle of a begun call; after a report, 1 when the call was released.
        HANDLE = 13,
        /// After a report that did not release the call: 1 when it holds
        /// nothing (it may be freed later), else 0. After a `next` that
        /// stopped: 1 when the stop finished the call and it holds nothing.
        IDLE = 14,
        /// Handle of a released call that holds nothing, or -1: the next begin
        /// frees it before it starts the new call (JS writes it).
        PENDING_RELEASE = 15,
    }
    /// What a finished call (final decision, nothing held) still tells once
    /// it is freed: written by a report with `report::RELEASE` 2 and by
    /// `finish()`, beside the final decision's fields (in the output slots
    /// no decision and no step uses).
    output finished {
        /// `Call::attempts`.
        ATTEMPTS = 10,
        /// 1 when the call owns its retries.
        OWNER = 11,
        /// What `next_attempt` answers now (the final stop): reason, class or -1, `onFailure` or -1.
        STOP_REASON = 16,
        STOP_CLASS = 17,
        STOP_ON_FAILURE = 18,
        /// 1 when that stop has a detail (the final decision's).
        STOP_HAS_DETAIL = 19,
        /// What `next_hedge` answers now.
        HEDGE_REASON = 20,
        /// Index into the engine's upstream names of `Call::target`; -1: not interned.
        TARGET = 21,
        /// Index of the call's policy version (`policyName`); -1: not interned.
        POLICY = 22,
        /// The deadline on the engine's clock (`clockMs`), ms.
        DEADLINE_MS = 23,
        /// The call's id as two exact numbers (`finished::id_parts`), printed
        /// only when asked (`requestIdText`); `ID_HI` -1: the step returned the
        /// id's text instead (an id inherited from an upstream owner).
        ID_HI = 24,
        ID_LO = 25,
    }
    /// `begin()` / `beginAttempt()` arguments.
    input begin {
        /// Interned id (`intern`).
        ROUTE = 32,
        /// < 0: the policy default.
        DEADLINE_MS = 33,
        IDEMPOTENCY = 34,
        /// Interned id, or < 0 for none.
        TENANT = 35,
        /// 1: the call needs what the request last read by `readNextRequest`
        /// needs (its needs are taken: one begin uses them); 0: nothing.
        REQUEST = 36,
    }
    /// `next()` arguments.
    input next {
        HANDLE = 32,
        /// 1: stamp the attempt (`attempt::STAMP`).
        STAMP = 33,
    }
    /// `reportStatus()` / `reportOk()` arguments.
    input report {
        HANDLE = 32,
        /// HTTP status (`reportStatus` only).
        STATUS = 33,
        /// 1: release the call if it succeeded. 2: finish it if the decision
        /// is final and it holds nothing (`finished` fields; freed in the step
        /// unless the decision has text left to read, see `fast`).
        RELEASE = 34,
    }
    /// `release()` / `finish()` arguments.
    input release {
        HANDLE = 32,
    }
}

/// Result codes and flag bits the scratch carries, exported with the slots.
pub(crate) mod codes {
    /// `nextAttempt`: an attempt was admitted (fields in `attempt`).
    pub(crate) const ATTEMPT: i32 = 0;
    /// `nextAttempt`: no attempt may start (fields in `stopped`).
    pub(crate) const STOPPED: i32 = 1;
    /// `nextHedge`: start a hedged attempt (fields in `attempt`).
    pub(crate) const HEDGE_START: i32 = 0;
    /// `nextHedge`: ask again after `hedge_after::WAIT_MS`.
    pub(crate) const HEDGE_AFTER: i32 = 2;
    /// `nextHedge`: no hedge (`hedge_no::REASON`).
    pub(crate) const HEDGE_NO: i32 = 3;
}

/// Bits of `attempt::FLAGS` and `decision::FLAGS`.
pub(crate) mod flags {
    pub(crate) const ATTEMPT_HEDGE: u8 = 1;
    pub(crate) const ATTEMPT_FALLBACK: u8 = 2;
    pub(crate) const DECISION_HEDGE: u8 = 1;
    pub(crate) const DECISION_DETAIL: u8 = 2;
    pub(crate) const DECISION_EXCLUDED: u8 = 4;
    /// `Decision::continuation` sits above the bits: its code + 1, 0 for none.
    pub(crate) const DECISION_CONTINUATION_SHIFT: u8 = 3;
}

/// Everything `vocab().scratch` says: the length, the slots, result codes and flag bits.
pub(crate) fn vocab_json() -> serde_json::Value {
    serde_json::json!({
        "len": LEN,
        "slots": layout_json(),
        "results": {
            "ATTEMPT": codes::ATTEMPT,
            "STOPPED": codes::STOPPED,
            "HEDGE_START": codes::HEDGE_START,
            "HEDGE_AFTER": codes::HEDGE_AFTER,
            "HEDGE_NO": codes::HEDGE_NO,
        },
        "flags": {
            "ATTEMPT_HEDGE": flags::ATTEMPT_HEDGE,
            "ATTEMPT_FALLBACK": flags::ATTEMPT_FALLBACK,
            "DECISION_HEDGE": flags::DECISION_HEDGE,
            "DECISION_DETAIL": flags::DECISION_DETAIL,
            "DECISION_EXCLUDED": flags::DECISION_EXCLUDED,
            "DECISION_CONTINUATION_SHIFT": flags::DECISION_CONTINUATION_SHIFT,
        },
    })
}

/// The engine's hold on its scratch `Float64Array`: a reference that keeps the
/// array alive, and the address of its elements.
pub(crate) struct Scratch {
    env: sys::napi_env,
    array: sys::napi_ref,
    ptr: *mut f64,
    /// Over a `SharedArrayBuffer`: never detached, never shorter, no check needed.
    shared: bool,
}

const DETACHED: &str = "ERR_RETRYWISE_SCRATCH_DETACHED";

impl Scratch {
    /// Takes hold of `value`, which must be a `Float64Array` of at least
    /// [`LEN`] elements over a `SharedArrayBuffer` or a fixed-length
    /// `ArrayBuffer` (a resizable one could shrink under the engine).
    pub(crate) fn new(env: &Env, value: Unknown<'_>) -> std::result::Result<Scratch, Fail> {
        let bad = || {
            Fail::Type(format!(
                "scratch must be a Float64Array of at least {LEN} elements over a SharedArrayBuffer or a fixed-length ArrayBuffer"
            ))
        };
        let ok = |status| status == sys::Status::napi_ok;
        let raw = env.raw();
        let v = value.raw();
        let mut is_typed = false;
        let mut kind = 0;
        let mut len = 0usize;
        let mut data: *mut std::ffi::c_void = ptr::null_mut();
        let mut buffer = ptr::null_mut();
        let mut offset = 0usize;
        let mut plain = false;
        let mut resizable = ptr::null_mut();
        let mut yes = false;
        let mut array = ptr::null_mut();
        // SAFETY: `raw` and `v` are this call's env and argument; every out
        // pointer is a local.
        unsafe {
            if !ok(sys::napi_is_typedarray(raw, v, &mut is_typed)) || !is_typed {
                return Err(bad());
            }
            let info = sys::napi_get_typedarray_info(raw, v, &mut kind, &mut len, &mut data, &mut buffer, &mut offset);
            if !ok(info) || kind != sys::TypedarrayType::float64_array || len < LEN || data.is_null() {
                return Err(bad());
            }
            // A typed array's buffer is an ArrayBuffer or a SharedArrayBuffer.
            if !ok(sys::napi_is_arraybuffer(raw, buffer, &mut plain)) {
                return Err(bad());
            }
            // A resizable ArrayBuffer may shrink under the pointer (a growable
            // SharedArrayBuffer only grows). `resizable` is undefined before
            // Node 20: not a bool, not resizable.
            if plain {
                if !ok(sys::napi_get_named_property(
                    raw,
                    buffer,
                    c"resizable".as_ptr(),
                    &mut resizable,
                )) {
                    return Err(bad());
                }
                if ok(sys::napi_get_value_bool(raw, resizable, &mut yes)) && yes {
                    return Err(bad());
                }
            }
            if !ok(sys::napi_create_reference(raw, v, 1, &mut array)) {
                return Err(Fail::Coded(
                    "ERR_RETRYWISE_SCRATCH",
                    "could not keep a reference to the scratch buffer".to_string(),
                ));
            }
        }
        Ok(Scratch {
            env: raw,
            array,
            ptr: data.cast(),
            shared: !plain,
        })
    }

    /// The buffer for one step, once it is known to be still attached.
    /// The lifetime ties the view to the step's `env`: a step runs no JS, so
    /// nothing can detach the buffer before the view is gone.
    #[inline]
    pub(crate) fn slots<'step>(&self, env: &'step Env) -> std::result::Result<Slots<'step>, Fail> {
        if !self.shared && !self.attached(env.raw()) {
            return Err(Fail::Coded(
                DETACHED,
                "the engine's scratch Float64Array was detached (its ArrayBuffer was transferred): build a new engine"
                    .to_string(),
            ));
        }
        Ok(Slots {
            ptr: self.ptr,
            _step: PhantomData,
        })
    }

    /// Whether the array still has its elements (0 once its buffer is detached).
    fn attached(&self, raw: sys::napi_env) -> bool {
        let mut v = ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: `array` is a strong reference created on this env; with only
        // `length` asked for, Node reads the array's length and touches nothing else.
        unsafe {
            sys::napi_get_reference_value(raw, self.array, &mut v) == sys::Status::napi_ok
                && !v.is_null()
                && sys::napi_get_typedarray_info(
                    raw,
                    v,
                    ptr::null_mut(),
                    &mut len,
                    ptr::null_mut(),
                    ptr::null_mut(),
                    ptr::null_mut(),
                ) == sys::Status::napi_ok
                && len >= LEN
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: created on `env` by `new`; an engine is dropped on its JS
        // thread, by a finalizer, while the env is alive.
        unsafe {
            sys::napi_delete_reference(self.env, self.array);
        }
    }
}

/// The checked buffer of one step ([`Scratch::slots`]).
pub(crate) struct Slots<'step> {
    ptr: *mut f64,
    _step: PhantomData<&'step Env>,
}

impl Slots<'_> {
    /// Slot `i`, as an atomic: a shared buffer may be written by another thread.
    #[inline]
    fn slot(&self, i: usize) -> &AtomicU64 {
        assert!(i < LEN, "scratch slot {i} out of bounds");
        // SAFETY: `slots` made sure the array has LEN elements at `ptr` for
        // this step; a Float64Array's elements are 8-byte aligned, as AtomicU64 needs.
        unsafe { AtomicU64::from_ptr(self.ptr.add(i).cast()) }
    }

    #[inline]
    pub(crate) fn set(&self, i: usize, v: f64) {
        self.slot(i).store(v.to_bits(), Relaxed)
    }

    #[inline]
    pub(crate) fn get(&self, i: usize) -> f64 {
        f64::from_bits(self.slot(i).load(Relaxed))
    }
}
