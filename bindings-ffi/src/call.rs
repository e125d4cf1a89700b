//! `rw_call`: one logical request — begin, next attempt, report, hedge,
//! cancel, free.
//! Every decision is the core's; this module only converts types and keeps
//! the strings the C caller borrows alive.

use crate::args;
use crate::engine::rw_engine;
use crate::error::rw_error;
use crate::panic::{ffi_boundary, try_arg};
use crate::spare::Spares;
use crate::types::*;
use crate::vocab::*;
use retrywise_core::rules::deadline::{InboundError, H_REQUEST_ID};
use retrywise_core::{
    Attempt, Call, CallSpec, Decision, Engine, Headers, HedgePlan, Inbound, IntoName, Needs, Outcome, PolicyError,
    Stopped,
};
use smol_str::SmolStr;
use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::ptr::addr_of_mut;
use std::time::Duration;

/// One logical request.
///
/// Thread safety: a call belongs to one thread at a time — it may move
/// between threads, but two threads must not use it concurrently.
/// Ownership: created by `rw_call_begin`, freed by `rw_call_free`. Strings
/// and arrays in an `rw_attempt` / `rw_decision` are owned by the call (see
/// those types for how long they stay valid).
pub struct rw_call {
    call: Begun,
    /// Set when a panic was caught inside this call: its state is unknown.
    poisoned: bool,
    /// Strings of the attempt from `rw_call_next_attempt`.
    att: AttemptStrings,
    att_detail: Option<String>,
    /// Strings of the hedged attempt from `rw_call_next_hedge` (kept apart, so
    /// asking for a hedge leaves the primary attempt's strings valid). Boxed
    /// on first use: most calls never hedge, and a small `rw_call` is cheap
    /// to allocate.
    hed: Option<Box<AttemptStrings>>,
    dec_upstream: Option<SmolStr>,
    dec_detail: Option<String>,
    /// Exclusions of the last decision (fallback routes only; boxed on first use).
    dec_excluded: Option<Box<Excluded>>,
}

/// The strings of a decision's exclusions and their C views.
#[derive(Default)]
struct Excluded {
    pairs: Vec<(String, String)>,
    views: Vec<rw_header>,
}

// SAFETY: the core's `Call` is `Send` (checked in lib.rs); the only non-Send
// fields are the `rw_header` / `rw_str` views, whose raw pointers point into
// bytes owned by this same `rw_call` (`att`, `hed`, `dec_excluded`): inline
// arrays of the boxed call or heap strings, which move with it.
unsafe impl Send for rw_call {}

/// The core's call, kept as the `Result` its begin returned: moved into the
/// call's box as that `Result`, it is moved once (a `memcpy` of ~400 bytes),
/// where unwrapping it first moved it twice. Always `Ok`: [`rw_call::boxed`]
/// gives out no box that holds an error.
struct Begun(Result<Call, PolicyError>);

impl std::ops::Deref for Begun {
    type Target = Call;
    #[inline(always)]
    fn deref(&self) -> &Call {
        match &self.0 {
            Ok(c) => c,
            // SAFETY: a `Begun` is always `Ok` (see the type).
            Err(_) => unsafe { std::hint::unreachable_unchecked() },
        }
    }
}

impl std::ops::DerefMut for Begun {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut Call {
        match &mut self.0 {
            Ok(c) => c,
            // SAFETY: a `Begun` is always `Ok` (see the type).
            Err(_) => unsafe { std::hint::unreachable_unchecked() },
        }
    }
}

/// What a thread keeps between calls so that the usual begin allocates and
/// builds nothing it can reuse.
struct Local {
    /// Freed calls' memory, reused by the next `rw_call_begin` on this thread.
    spares: Spares<rw_call>,
    /// The core spec the usual begin lends to the engine (see [`lend`]):
    /// built once per thread, and its route kept while the next call names
    /// the same one.
    spec: RefCell<Option<CallSpec>>,
}

thread_local! {
    static LOCAL: Local = const {
        Local {
            spares: Spares::new(),
            spec: RefCell::new(None),
        }
    };
}

const DETAIL_NULL: &str = "a required argument is NULL";
const DETAIL_INVALID: &str = "invalid argument: enum value out of range or string not UTF-8";
const DETAIL_PANIC: &str = "a panic was caught inside this call; it is unusable: free it and begin a new one";

/// Why no call was begun: a bad argument, a malformed propagation header
/// (with the core's reason) or a route the policy does not know. The core's
/// errors are boxed: the usual begin's result then fits in two registers.
enum BeginError {
    Arg(rw_result),
    Inbound(Box<InboundError>),
    Policy(Box<PolicyError>),
}

impl From<rw_result> for BeginError {
    fn from(r: rw_result) -> Self {
        BeginError::Arg(r)
    }
}

impl From<Box<PolicyError>> for BeginError {
    fn from(e: Box<PolicyError>) -> Self {
        BeginError::Policy(e)
    }
}

impl BeginError {
    fn result(&self) -> rw_result {
        match self {
            BeginError::Arg(r) => *r,
            BeginError::Inbound(_) => rw_result::RwErrInbound,
            BeginError::Policy(_) => rw_result::RwErrPolicy,
        }
    }

    /// The `rw_error` `rw_call_begin_err` gives out.
    fn into_error(self) -> rw_error {
        match self {
            BeginError::Arg(rw_result::RwErrPanic) => rw_error::new(
                rw_result::RwErrPanic,
                "a panic was caught inside retrywise; no call was begun",
                "",
            ),
            BeginError::Arg(r) => rw_error::new(r, error_detail(r).unwrap_or_default(), ""),
            BeginError::Inbound(e) => {
                let path = format!("inbound_headers.{}", e.header);
                rw_error::new(rw_result::RwErrInbound, &format!("{path}: {}", e.message), &path)
            }
            BeginError::Policy(e) => rw_error::new(rw_result::RwErrPolicy, &e.to_string(), &e.path),
        }
    }
}

impl crate::panic::OnPanic for Result<(), BeginError> {
    fn on_panic() -> Self {
        Err(BeginError::Arg(rw_result::RwErrPanic))
    }
}

/// Fills the core's spec from a C spec (in place: a `CallSpec` is large).
///
/// # Safety
/// Every pointer in `s` is NULL or valid as documented on `rw_call_spec`.
unsafe fn fill_spec(spec: &mut CallSpec, s: &rw_call_spec) -> Result<(), BeginError> {
    let owned = |x: Option<&str>| x.map(str::to_string);
    // SAFETY: pointers in `s` are valid per the caller's contract (so for every read below).
    spec.route = unsafe { args::req_str(s.route) }?.into_name();
    spec.idempotency = rw_idempotency::core_from_code(s.idempotency).ok_or(rw_result::RwErrInvalidArg)?;
    if s.deadline_ms > 0 {
        spec.deadline = Some(Duration::from_millis(s.deadline_ms));
    }
    // SAFETY: as above.
    unsafe {
        spec.tenant = args::opt_str(s.tenant)?.map(IntoName::into_name);
        spec.task = args::opt_str(s.task)?.map(IntoName::into_name);
        spec.priority = args::opt_str(s.priority)?.map(IntoName::into_name);
        spec.idempotency_key = owned(args::opt_str(s.idempotency_key)?);
        spec.params_digest = owned(args::opt_str(s.params_digest)?);
    }
    if s.inbound_headers_len > 0 {
        // SAFETY: as above.
        let inbound = unsafe { args::headers(s.inbound_headers, s.inbound_headers_len) }?;
        let h: Headers = inbound.into_iter().collect();
        if let Some(i) = Inbound::from_headers(&h).map_err(|e| BeginError::Inbound(Box::new(e)))? {
            spec.inbound = Some(i);
        }
    }
    let mut given = Needs::default();
    if s.capabilities_len > 0 {
        // SAFETY: as above.
        let caps = unsafe { args::slice(s.capabilities, s.capabilities_len) }?;
        for c in caps {
            // SAFETY: as above.
            given.capabilities.push(unsafe { args::req_str(*c) }?.to_string());
        }
    }
    given.input_tokens = (s.input_tokens > 0).then_some(s.input_tokens);
    given.max_output_tokens = (s.max_output_tokens > 0).then_some(s.max_output_tokens);
    // SAFETY: as above.
    given.data_boundary = owned(unsafe { args::opt_str(s.data_boundary) }?);
    given.max_cost = (s.max_cost > 0.0).then_some(s.max_cost);
    // SAFETY: `request` is NULL or a live `rw_request`, per the caller's contract.
    spec.needs = match unsafe { s.request.as_ref() } {
        // The request's needs, under the caller's own (the core's merge).
        Some(r) => r.facts.needs.merged(&given),
        None => given,
    };
    Ok(())
}

/// True when `s` sets nothing but the route, deadline, idempotency and
/// tenant: the usual spec, which [`lend`] reads.
fn is_simple(s: &rw_call_spec) -> bool {
    // Every other string is NULL with length 0, every other length and count
    // 0 and `request` NULL: their bits OR to 0.
    let bits = |x: rw_str| x.ptr as u64 | x.len as u64;
    let set = bits(s.task)
        | bits(s.priority)
        | bits(s.idempotency_key)
        | bits(s.params_digest)
        | bits(s.data_boundary)
        | s.inbound_headers_len as u64
        | s.capabilities_len as u64
        | s.input_tokens
        | s.max_output_tokens
        | s.request as u64;
    // `max_cost` <= 0 or NaN is "none".
    set == 0 && (s.max_cost <= 0.0 || s.max_cost.is_nan())
}

/// `a == b`, for short byte strings (route names) without a call: two
/// overlapping fixed-size loads from each end of each.
#[inline(always)]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    // SAFETY: every read lies inside `a` or `b` (both `n` bytes long): each
    // pair of loads covers `0..n` from both ends.
    unsafe {
        if n >= 16 {
            if n > 32 {
                return a == b;
            }
            let x = |p: *const u8| {
                (
                    p.cast::<u128>().read_unaligned(),
                    p.add(n - 16).cast::<u128>().read_unaligned(),
                )
            };
            x(pa) == x(pb)
        } else if n >= 8 {
            let x = |p: *const u8| {
                (
                    p.cast::<u64>().read_unaligned(),
                    p.add(n - 8).cast::<u64>().read_unaligned(),
                )
            };
            x(pa) == x(pb)
        } else if n >= 4 {
            let x = |p: *const u8| {
                (
                    p.cast::<u32>().read_unaligned(),
                    p.add(n - 4).cast::<u32>().read_unaligned(),
                )
            };
            x(pa) == x(pb)
        } else {
            a == b
        }
    }
}

/// Sets the core spec `spec` from a C spec for which [`is_simple`] holds,
/// in place: `spec` is the thread's, lent to every usual begin, so only what
/// a simple spec sets is written (the engine takes the tenant out of it and
/// leaves every field a simple spec never sets at its default). The route is
/// kept while the C spec names the same one, so its bytes are compared, not
/// checked and copied again.
///
/// # Safety
/// As for [`fill_spec`].
#[inline(always)]
unsafe fn lend(spec: &mut CallSpec, s: &rw_call_spec) -> Result<(), rw_result> {
    // SAFETY: the spec's pointers are valid per the caller's contract (so for every read below).
    let route = unsafe { args::bytes(s.route) }?.unwrap_or_default();
    if !same_bytes(spec.route.as_bytes(), route) {
        // SAFETY: as above.
        spec.route = unsafe { args::req_str(s.route) }?.into_name();
    }
    spec.deadline = (s.deadline_ms > 0).then(|| Duration::from_millis(s.deadline_ms));
    spec.idempotency = rw_idempotency::core_from_code(s.idempotency).ok_or(rw_result::RwErrInvalidArg)?;
    // SAFETY: as above.
    let tenant = unsafe { args::opt_str(s.tenant) }?;
    // The engine takes the tenant out of the spec: usually nothing to write.
    if tenant.is_some() || spec.tenant.is_some() {
        spec.tenant = tenant.map(IntoName::into_name);
    }
    Ok(())
}

/// The part of a C outcome that holds no pointer and needs no check, as the
/// core's outcome: all of a plain outcome ([`is_plain`]).
#[inline(always)]
fn outcome_plain(o: &rw_outcome) -> Outcome {
    Outcome {
        status: (o.status != 0).then_some(o.status),
        ok: o.ok,
        input_tokens: (o.input_tokens > 0).then_some(o.input_tokens),
        resumable: o.resumable,
        first_token: (o.first_token_ms > 0).then(|| Duration::from_millis(o.first_token_ms)),
        ..Outcome::default()
    }
}

/// True when `o` sets no error kind, phase, effect or continuation, and no
/// headers, vendor code or body: the usual report, all of which
/// [`outcome_plain`] reads.
#[inline(always)]
fn is_plain(o: &rw_outcome) -> bool {
    // Each "none" is -1 (all bits set): their AND is -1 only when all are.
    let unset = o.error_kind & o.phase & o.effect & o.continuation == -1;
    let no_pointers =
        o.headers_len | o.vendor_code.ptr as usize | o.vendor_code.len | o.body.ptr as usize | o.body.len == 0;
    debug_assert_eq!(
        unset,
        o.error_kind == rw_error_kind::None as i32
            && o.phase == rw_phase::None as i32
            && o.effect == rw_effect::Unset as i32
            && o.continuation == rw_continuation::None as i32
    );
    unset && no_pointers
}

/// Converts a C outcome into the core's.
///
/// # Safety
/// Every pointer in `o` is NULL or valid as documented on `rw_outcome`.
#[inline(always)]
unsafe fn outcome_from(o: &rw_outcome) -> Result<Outcome, rw_result> {
    let mut out = outcome_plain(o);
    if !is_plain(o) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { outcome_rest(&mut out, o) }?;
    }
    Ok(out)
}

/// Sets what [`outcome_plain`] leaves out of `out` from `o`.
///
/// # Safety
/// As for [`outcome_from`].
#[inline(never)]
unsafe fn outcome_rest(out: &mut Outcome, o: &rw_outcome) -> Result<(), rw_result> {
    if o.error_kind != rw_error_kind::None as i32 {
        out.error = Some(rw_error_kind::core_from_code(o.error_kind).ok_or(rw_result::RwErrInvalidArg)?);
    }
    if o.phase != rw_phase::None as i32 {
        out.phase = Some(rw_phase::core_from_code(o.phase).ok_or(rw_result::RwErrInvalidArg)?);
    }
    if o.effect != rw_effect::Unset as i32 {
        out.effect = Some(rw_effect::core_from_code(o.effect).ok_or(rw_result::RwErrInvalidArg)?);
    }
    if o.continuation != rw_continuation::None as i32 {
        out.continuation = Some(rw_continuation::core_from_code(o.continuation).ok_or(rw_result::RwErrInvalidArg)?);
    }
    if o.headers_len > 0 {
        // SAFETY: pointers in `o` are valid per the caller's contract.
        let headers = unsafe { args::headers(o.headers, o.headers_len) }?;
        out.headers = headers.into_iter().collect();
    }
    // SAFETY: as above.
    out.vendor_code = unsafe { args::opt_str(o.vendor_code) }?.map(str::to_string);
    // SAFETY: as above.
    if let Some(body) = unsafe { args::bytes(o.body) }? {
        out.read_body(body);
    }
    Ok(())
}

fn views(pairs: &[(impl AsRef<str>, impl AsRef<str>)], into: &mut Vec<rw_header>) {
    into.clear();
    into.extend(pairs.iter().map(|(n, v)| rw_header {
        name: rw_str::of(n.as_ref()),
        value: rw_str::of(v.as_ref()),
    }));
}

/// Bytes for an attempt's header values inside the boxed call: the numbers,
/// a local request id and a usual idempotency key fit, so the hot path
/// allocates nothing; a longer value is kept in `spill`.
const TEXT: usize = 96;

/// Outbound headers kept inline: the core sends at most four
/// (`retrywise-deadline-ms`, `retrywise-request-id`, `retrywise-attempt`,
/// `idempotency-key`).
const INLINE: usize = 4;

/// The strings an `rw_attempt` points into, kept alive by the call.
///
/// Views are made as each value is copied: `text` is an array inside the
/// boxed call (which never moves) and a `spill` string's heap bytes do not
/// move when the vector grows.
struct AttemptStrings {
    upstream: SmolStr,
    /// Written before it is viewed; never read otherwise, so never zeroed.
    text: [MaybeUninit<u8>; TEXT],
    spill: Vec<String>,
    /// The first `INLINE` header views (the first `n` written by `view`;
    /// only those are read).
    inline: [MaybeUninit<rw_header>; INLINE],
    /// All views when there are more than `INLINE` headers.
    more: Vec<rw_header>,
}

impl Default for AttemptStrings {
    fn default() -> Self {
        AttemptStrings {
            upstream: SmolStr::default(),
            text: [MaybeUninit::uninit(); TEXT],
            spill: Vec::new(),
            inline: [MaybeUninit::uninit(); INLINE],
            more: Vec::new(),
        }
    }
}

/// Copies `src` to `dst` (at most 32 bytes by two overlapping unaligned
/// copies of a fixed size, no call; longer with `memcpy`): header values
/// are 1 to ~30 bytes.
///
/// # Safety
/// `dst` is valid for `src.len()` bytes of writes and does not overlap `src`.
#[inline(always)]
unsafe fn copy_short(src: &[u8], dst: *mut u8) {
    let (s, n) = (src.as_ptr(), src.len());
    // SAFETY: every read is inside `src` and every write inside `dst..dst + n`
    // (the caller's contract): each pair of copies covers `0..n` from both ends.
    unsafe {
        if n >= 16 {
            if n > 32 {
                std::ptr::copy_nonoverlapping(s, dst, n);
                return;
            }
            let (x, y) = (
                s.cast::<[u8; 16]>().read_unaligned(),
                s.add(n - 16).cast::<[u8; 16]>().read_unaligned(),
            );
            dst.cast::<[u8; 16]>().write_unaligned(x);
            dst.add(n - 16).cast::<[u8; 16]>().write_unaligned(y);
        } else if n >= 8 {
            let (x, y) = (
                s.cast::<u64>().read_unaligned(),
                s.add(n - 8).cast::<u64>().read_unaligned(),
            );
            dst.cast::<u64>().write_unaligned(x);
            dst.add(n - 8).cast::<u64>().write_unaligned(y);
        } else if n >= 4 {
            let (x, y) = (
                s.cast::<u32>().read_unaligned(),
                s.add(n - 4).cast::<u32>().read_unaligned(),
            );
            dst.cast::<u32>().write_unaligned(x);
            dst.add(n - 4).cast::<u32>().write_unaligned(y);
        } else if n > 0 {
            *dst = *s;
            *dst.add(n / 2) = *s.add(n / 2);
            *dst.add(n - 1) = *s.add(n - 1);
        }
    }
}

/// `name` (a view of a header name from the core) is `retrywise-request-id`.
#[inline(always)]
fn is_request_id(name: rw_str) -> bool {
    name.len == H_REQUEST_ID.len()
        // SAFETY: a header view's name is a `&'static str` of the core, `len` bytes long.
        && unsafe { std::slice::from_raw_parts(name.ptr.cast::<u8>(), name.len) } == H_REQUEST_ID.as_bytes()
}

/// Where [`AttemptStrings::view`] is in `text` and in the headers.
struct Written {
    /// `text`'s first byte: every view into `text` derives from this one
    /// pointer, so a later copy (through it) leaves the earlier views valid.
    base: *mut u8,
    /// Bytes of `text` used.
    used: usize,
    /// Headers written.
    n: usize,
}

impl Written {
    /// Keeps `value` in `text` when it fits, else in `spill`, and returns its view.
    fn keep(&mut self, spill: &mut Vec<String>, value: &str) -> rw_str {
        let len = value.len();
        if len <= TEXT - self.used {
            // SAFETY: `used + len <= TEXT`, so `dst..dst + len` lies inside
            // `text`, and `value` cannot overlap the call's own bytes.
            let dst = unsafe { self.base.add(self.used) };
            // SAFETY: as above.
            unsafe { copy_short(value.as_bytes(), dst) };
            self.used += len;
            rw_str {
                ptr: dst.cast_const().cast(),
                len,
            }
        } else {
            spill.push(value.to_string());
            rw_str::of(&spill[spill.len() - 1])
        }
    }

    /// A header past the first four or whose value does not fit in `text`.
    #[cold]
    #[inline(never)]
    fn push_slow(
        &mut self,
        spill: &mut Vec<String>,
        inline: &mut [MaybeUninit<rw_header>; INLINE],
        more: &mut Vec<rw_header>,
        name: &'static str,
        value: &str,
    ) {
        let h = rw_header {
            name: rw_str::of(name),
            value: self.keep(spill, value),
        };
        if self.n < INLINE {
            inline[self.n].write(h);
        } else {
            if self.n == INLINE {
                // SAFETY: the first `INLINE` views are written (`n` counts them).
                more.extend(inline.iter().map(|h| unsafe { h.assume_init() }));
            }
            more.push(h);
        }
        self.n += 1;
    }
}

impl AttemptStrings {
    /// Writes empty strings at `p` in place (`text` and `inline` left as they are).
    ///
    /// # Safety
    /// `p` is valid for writes and holds no value that needs dropping.
    #[inline(always)]
    unsafe fn init(p: *mut AttemptStrings) {
        // SAFETY: valid for writes (the caller's contract); `text` and
        // `inline` need no initialisation.
        unsafe {
            addr_of_mut!((*p).upstream).write(SmolStr::default());
            addr_of_mut!((*p).spill).write(Vec::new());
            addr_of_mut!((*p).more).write(Vec::new());
        }
    }

    /// Keeps the attempt's strings and returns the C view of them. The
    /// request id is printed once: the `retrywise-request-id` header and
    /// `request_id` point at the same bytes.
    #[inline(always)]
    fn view(&mut self, a: Attempt) -> rw_attempt {
        if !self.spill.is_empty() {
            self.spill.clear();
        }
        self.more.clear();
        let mut w = Written {
            base: self.text.as_mut_ptr().cast::<u8>(),
            used: 0,
            n: 0,
        };
        let (spill, inline, more) = (&mut self.spill, &mut self.inline, &mut self.more);
        // The usual header (one of the first four, its value fits) is copied
        // here; the rest out of line, which keeps this closure small enough
        // to be inlined into the core's loop over the headers.
        a.for_each_header(|name, value| {
            let (n, len) = (w.n, value.len());
            if n < INLINE && len <= TEXT - w.used {
                // SAFETY: `used + len <= TEXT`, so `dst..dst + len` lies inside
                // `text`, and `value` cannot overlap the call's own bytes.
                let dst = unsafe { w.base.add(w.used) };
                // SAFETY: as above.
                unsafe { copy_short(value.as_bytes(), dst) };
                w.used += len;
                inline[n].write(rw_header {
                    name: rw_str::of(name),
                    value: rw_str {
                        ptr: dst.cast_const().cast(),
                        len,
                    },
                });
                w.n = n + 1;
            } else {
                w.push_slow(spill, inline, more, name, value);
            }
        });
        let n = w.n;
        let shown = if n <= INLINE {
            // SAFETY: the first `n` views are written.
            unsafe { std::slice::from_raw_parts(self.inline.as_ptr().cast::<rw_header>(), n) }
        } else {
            &self.more[..]
        };
        // The core sends it second (after `retrywise-deadline-ms`): look there first.
        let request_id = match shown.get(1).filter(|h| is_request_id(h.name)) {
            Some(h) => h.value,
            None => match shown.iter().find(|h| is_request_id(h.name)) {
                Some(h) => h.value,
                None => a.request_id.with_str(|id| w.keep(&mut self.spill, id)),
            },
        };
        let headers = match n {
            0 => std::ptr::null(),
            n if n <= INLINE => self.inline.as_ptr().cast(),
            _ => self.more.as_ptr(),
        };
        let (t, remaining) = (a.timeouts(), a.remaining());
        self.upstream = a.upstream;
        rw_attempt {
            number: a.number,
            upstream: rw_str::of(&self.upstream),
            request_id,
            connect_timeout_ms: ms(t.connect),
            first_byte_timeout_ms: ms(t.first_byte),
            idle_timeout_ms: ms(t.idle),
            total_timeout_ms: ms(t.total),
            remaining_ms: ms(remaining),
            headers,
            headers_len: n,
            hedge: a.hedge,
            fallback: a.fallback,
            first_token_timeout_ms: ms(t.first_token),
            ..rw_attempt::stopped(rw_reason::Success)
        }
    }
}

/// Whole milliseconds, saturating (u64 arithmetic: cheaper than `as_millis`'s u128).
fn ms(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1000)
        .saturating_add(u64::from(d.subsec_millis()))
}

/// The core's begin, out of line: inlined into [`rw_call::boxed`], its
/// call was built aside and moved twice more before reaching the box.
#[inline(never)]
fn begin_into(engine: &Engine, spec: &mut CallSpec) -> Result<Call, PolicyError> {
    engine.try_begin_from(spec)
}

impl rw_call {
    /// Begins the core's call (`try_begin`: a route the policy does not
    /// know is an error) in `spare` (this thread's spare box, when it has
    /// one) or a new box. The box is at hand before the core builds the
    /// call, which is then moved once, into it.
    #[inline(always)]
    fn boxed(
        engine: &Engine,
        spec: &mut CallSpec,
        spare: Option<Box<MaybeUninit<rw_call>>>,
    ) -> Result<Box<rw_call>, Box<PolicyError>> {
        let mut b = spare.unwrap_or_else(Box::new_uninit);
        let p = b.as_mut_ptr();
        // SAFETY: `p` is the box's memory, valid for writes.
        let begun = unsafe { addr_of_mut!((*p).call.0) };
        // SAFETY: as above.
        unsafe { begun.write(begin_into(engine, spec)) };
        // SAFETY: just written.
        if let Err(e) = unsafe { &*begun } {
            // SAFETY: the error is moved out once; the box, whose other
            // fields were never written, goes back to the spares undropped.
            let e = Box::new(unsafe { std::ptr::read(e) });
            let _ = LOCAL.try_with(|l| l.spares.give(b));
            return Err(e);
        }
        // SAFETY: `p` is valid for writes; every other field is written
        // exactly once before `assume_init`, and `call` is `Ok`.
        unsafe {
            addr_of_mut!((*p).poisoned).write(false);
            AttemptStrings::init(addr_of_mut!((*p).att));
            addr_of_mut!((*p).att_detail).write(None);
            addr_of_mut!((*p).hed).write(None);
            addr_of_mut!((*p).dec_upstream).write(None);
            addr_of_mut!((*p).dec_detail).write(None);
            addr_of_mut!((*p).dec_excluded).write(None);
            Ok(b.assume_init())
        }
    }

    /// Drops the call and keeps its memory as one of this thread's spares.
    ///
    /// # Safety
    /// `call` came from `Box::into_raw` of a box made by [`rw_call::boxed`]
    /// and is not used again.
    unsafe fn free(call: *mut rw_call) {
        // SAFETY: a live, uniquely owned call (the caller's contract); after
        // the drop its memory is uninitialised and still allocated.
        let spare = unsafe {
            std::ptr::drop_in_place(call);
            Box::from_raw(call.cast::<MaybeUninit<rw_call>>())
        };
        // During thread teardown the spares are gone: the closure, and the
        // box with it, is dropped uncalled, which deallocates it.
        let _ = LOCAL.try_with(|l| l.spares.give(spare));
    }

    /// Keeps the attempt's strings in the call and returns the C view of them.
    #[inline(always)]
    fn attempt(&mut self, a: Attempt) -> rw_attempt {
        self.att_detail = None;
        self.att.view(a)
    }

    /// The C view of a hedge plan (a started hedge's strings kept in `hed`).
    fn hedge_plan(&mut self, p: HedgePlan) -> rw_hedge_plan {
        match p {
            HedgePlan::Start(a) => rw_hedge_plan {
                action: rw_hedge_action::Start,
                after_ms: 0,
                reason: rw_reason::Success,
                attempt: self.hed.get_or_insert_with(Box::default).view(a),
            },
            HedgePlan::After(d) => rw_hedge_plan {
                action: rw_hedge_action::After,
                after_ms: ms(d),
                ..rw_hedge_plan::no(rw_reason::Success, rw_str::NONE)
            },
            HedgePlan::No(r) => rw_hedge_plan::no(r.into(), rw_str::NONE),
        }
    }

    fn stopped(&mut self, s: Stopped) -> rw_attempt {
        self.att_detail = s.detail;
        rw_attempt {
            stop_class: rw_error_class::of(s.class),
            on_failure: rw_on_failure::of(s.on_failure),
            detail: rw_str::of_opt(self.att_detail.as_deref()),
            wait_ms: s.wait.map_or(-1, |w| i64::try_from(ms(w)).unwrap_or(i64::MAX)),
            ..rw_attempt::stopped(s.reason.into())
        }
    }

    /// Keeps the decision's strings in the call and returns the C view of them.
    #[inline(always)]
    fn decision(&mut self, d: Decision) -> rw_decision {
        self.dec_upstream = d.upstream;
        self.dec_detail = d.detail;
        let excluded = match (d.excluded.is_empty(), &mut self.dec_excluded) {
            (true, None) => None,
            (_, slot) => {
                let x = slot.get_or_insert_with(Box::default);
                x.pairs = d.excluded;
                views(&x.pairs, &mut x.views);
                Some(&x.views).filter(|v| !v.is_empty())
            }
        };
        rw_decision {
            action: d.action.into(),
            delay_ms: ms(d.delay),
            error_class: rw_error_class::of(d.class),
            reason: d.reason.into(),
            upstream: rw_str::of_opt(self.dec_upstream.as_deref()),
            wait_source: d.wait_source.into(),
            retry_after_ms: d
                .retry_after
                .map_or(-1, |r| i64::try_from(r.as_millis()).unwrap_or(i64::MAX)),
            on_failure: rw_on_failure::of(d.on_failure),
            attempt: d.attempt,
            hedge: d.hedge,
            detail: rw_str::of_opt(self.dec_detail.as_deref()),
            excluded: excluded.map_or(std::ptr::null(), |v| v.as_ptr()),
            excluded_len: excluded.map_or(0, Vec::len),
            continuation: rw_continuation::of(d.continuation),
        }
    }
}

/// Begins a call with a core spec of its own: a spec that sets more than the
/// usual fields (`simple` false), or the usual one during thread teardown
/// (the thread's spec is gone). Out of line: it keeps a whole core spec on
/// its stack, which the usual begin does without.
///
/// # Safety
/// As for [`fill_spec`].
#[cold]
#[inline(never)]
unsafe fn begin_own(engine: &Engine, spec: &rw_call_spec, simple: bool) -> Result<Box<rw_call>, BeginError> {
    let mut core_spec = CallSpec::default();
    if simple {
        // SAFETY: the caller's contract, forwarded.
        unsafe { lend(&mut core_spec, spec) }?;
    } else {
        // SAFETY: as above.
        unsafe { fill_spec(&mut core_spec, spec) }?;
    }
    let spare = LOCAL.try_with(|l| l.spares.take()).ok().flatten();
    Ok(rw_call::boxed(engine, &mut core_spec, spare)?)
}

/// Begins a call on `engine` from `spec` into `*out` (NULL first, the call
/// on success).
///
/// # Safety
/// As for `rw_call_begin`.
#[inline(always)]
unsafe fn begin(engine: *const rw_engine, spec: *const rw_call_spec, out: *mut *mut rw_call) -> Result<(), BeginError> {
    if out.is_null() {
        return Err(rw_result::RwErrNull.into());
    }
    // SAFETY: non-NULL and writable per the contract.
    unsafe { out.write(std::ptr::null_mut()) };
    // SAFETY: NULL or live / readable, per the contract.
    let (Some(h), Some(spec)) = (unsafe { engine.as_ref() }, unsafe { spec.as_ref() }) else {
        return Err(rw_result::RwErrNull.into());
    };
    let call = if is_simple(spec) {
        // The thread's spec, lent (see `lend`), and a spare box: one visit
        // to the thread's state.
        let usual = LOCAL.try_with(|l| {
            let mut lent = l.spec.borrow_mut();
            let core_spec = lent.get_or_insert_with(CallSpec::default);
            // SAFETY: the spec's pointers are valid per the contract.
            unsafe { lend(core_spec, spec) }?;
            Ok::<_, BeginError>(rw_call::boxed(&h.engine, core_spec, l.spares.take())?)
        });
        match usual {
            Ok(call) => call?,
            // SAFETY: as above.
            Err(_) => unsafe { begin_own(&h.engine, spec, true) }?,
        }
    } else {
        // SAFETY: as above.
        unsafe { begin_own(&h.engine, spec, false) }?
    };
    // SAFETY: as above.
    unsafe { out.write(Box::into_raw(call)) };
    Ok(())
}

/// Begins one logical request on `engine`. On `RW_OK`, `*out` is a new call
/// the caller frees with `rw_call_free`; on any other result `*out` is NULL.
/// Everything `spec` points to is copied (its `request` too); it need not
/// outlive this call.
///
/// Returns `RW_ERR_NULL` (`engine`, `spec` or `out` NULL, or a string/array
/// pointer NULL with a non-zero length), `RW_ERR_INVALID_ARG` (bad
/// `idempotency`, a string that is not UTF-8), `RW_ERR_INBOUND` (a malformed
/// propagation header in `inbound_headers`), `RW_ERR_POLICY` (the policy
/// declares routes and `route` is neither one of them nor an upstream of its
/// catalog: no call is begun, and no I/O should be made) or `RW_ERR_PANIC`.
/// `rw_call_begin_err` says why in an `rw_error`.
///
/// Thread safety: may be called on a shared engine from any thread; the new
/// call belongs to the calling thread until handed over.
///
/// Memory: a spec that sets nothing but `route`, `deadline_ms`,
/// `idempotency` and `tenant` (the usual one) allocates nothing once the
/// thread has freed a call (a name longer than 23 bytes is copied to the heap
/// when it changes). The calling thread keeps one core spec for it (about 350
/// bytes, with the last route named, so a route named again is compared, not
/// copied) and reuses the memory of a call it freed (see `rw_call_free`);
/// both are given back when the thread exits.
///
/// # Safety
/// `engine` is NULL or live; `spec` is NULL or a readable `rw_call_spec`
/// whose pointers are valid as documented there; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rw_call_begin(
    engine: *const rw_engine,
    spec: *const rw_call_spec,
    out: *mut *mut rw_call,
) -> rw_result {
    ffi_boundary! {
        // SAFETY: the caller's contract, forwarded.
        match unsafe { begin(engine, spec, out) } {
            Ok(()) => rw_result::RwOk,
            Err(e) => e.result(),
        }
    }
}

/// `rw_call_begin`, saying why no call was begun: on any result but
/// `RW_OK`, `*err` (when `err` is not NULL) is an `rw_error` the caller frees
/// with `rw_error_free`, whose result is the one returned. For
/// `RW_ERR_POLICY` its message names the route and the policy's known
/// routes (`routes.chta: no route "chta" in ... known routes: chat`) and its
/// path is `routes.<route>`; for `RW_ERR_INBOUND` the path is
/// `inbound_headers.<header>` and the message says what is wrong with its
/// value. On `RW_OK`, `*err` is NULL.
///
/// Thread safety: as `rw_call_begin`.
///
/// # Safety
/// As for `rw_call_begin`; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rw_call_begin_err(
    engine: *const rw_engine,
    spec: *const rw_call_spec,
    out: *mut *mut rw_call,
    err: *mut *mut rw_error,
) -> rw_result {
    // SAFETY: `err` is NULL or writable, per the contract.
    unsafe { rw_error::clear(err) };
    // SAFETY: the caller's contract, forwarded.
    let r = ffi_boundary! { unsafe { begin(engine, spec, out) } };
    match r {
        Ok(()) => rw_result::RwOk,
        Err(e) => {
            let code = e.result();
            // SAFETY: `err` is NULL or writable, per the contract.
            unsafe { rw_error::store(err, e.into_error()) };
            code
        }
    }
}

/// On an error result, writes the fail-safe attempt (a stop with reason
/// `invalid_state` and a detail naming the error) when `out` is not NULL.
///
/// # Safety
/// `out` is NULL or writable.
unsafe fn fail_attempt(out: *mut rw_attempt, r: rw_result) -> rw_result {
    if let (Some(why), false) = (error_detail(r), out.is_null()) {
        let mut a = rw_attempt::stopped(rw_reason::InvalidState);
        a.detail = rw_str::of(why);
        // SAFETY: non-NULL and writable per the caller's contract.
        unsafe { out.write(a) };
    }
    r
}

/// Like [`fail_attempt`], for decisions: a Stop with reason `invalid_state`.
///
/// # Safety
/// `out` is NULL or writable.
unsafe fn fail_decision(out: *mut rw_decision, r: rw_result) -> rw_result {
    if let (Some(why), false) = (error_detail(r), out.is_null()) {
        // SAFETY: non-NULL and writable per the caller's contract.
        unsafe { out.write(rw_decision::error(rw_str::of(why))) };
    }
    r
}

/// The detail string of an error result (static), `None` for `RW_OK` / `RW_STOPPED`.
fn error_detail(r: rw_result) -> Option<&'static str> {
    match r {
        rw_result::RwOk | rw_result::RwStopped => None,
        rw_result::RwErrNull => Some(DETAIL_NULL),
        rw_result::RwErrPanic => Some(DETAIL_PANIC),
        _ => Some(DETAIL_INVALID),
    }
}

/// Asks for the next attempt. `RW_OK`: make the attempt described by `*out`
/// (upstream, timeouts, headers to send). `RW_STOPPED`: no attempt may start;
/// `out->stop_reason` (and `stop_class`, `on_failure`, `detail`) say why —
/// e.g. `RW_REASON_CALL_FINISHED` after a final decision, `RW_REASON_DEADLINE_EXCEEDED`,
/// `RW_REASON_BREAKER_OPEN`. A stop with `out->wait_ms >= 0` is "not yet"
/// (a held call: the upstream's breaker lets a probe through then): sleep
/// `wait_ms` and ask again. Strings and headers in `*out` are owned by the
/// call and valid until the next `rw_call_next_attempt` or `rw_call_free`.
///
/// On an error result (`RW_ERR_NULL`, `RW_ERR_PANIC`), `*out` (when `out` is
/// not NULL) is a stop with reason `RW_REASON_INVALID_STATE` and a detail.
/// After `RW_ERR_PANIC` the call is unusable (every later use returns
/// `RW_ERR_PANIC`): free it; the engine stays usable.
///
/// Thread safety: not concurrently with any other function on the same call.
///
/// # Safety
/// `call` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rw_call_next_attempt(call: *mut rw_call, out: *mut rw_attempt) -> rw_result {
    let r = ffi_boundary! {
        // SAFETY: NULL or a live call used by this thread only, per the contract.
        let (Some(h), false) = (unsafe { call.as_mut() }, out.is_null()) else { return rw_result::RwErrNull };
        if h.poisoned {
            return rw_result::RwErrPanic;
        }
        // Stays set if the core panics: the call's state is then unknown.
        h.poisoned = true;
        // Each view is written straight into `*out` (non-NULL, checked, and
        // writable per the contract).
        let r = match h.call.next_attempt() {
            Ok(a) => {
                // SAFETY: as above.
                unsafe { out.write(h.attempt(a)) };
                rw_result::RwOk
            }
            Err(s) => {
                // SAFETY: as above.
                unsafe { out.write(h.stopped(s)) };
                rw_result::RwStopped
            }
        };
        h.poisoned = false;
        r
    };
    // SAFETY: `out` is NULL or writable, per the contract.
    unsafe { fail_attempt(out, r) }
}

/// Reports what the attempt returned by the last `rw_call_next_attempt` met,
/// and returns the decision in `*out`: `RW_ACTION_SUCCEEDED` (done),
/// `RW_ACTION_RETRY` / `RW_ACTION_FALLBACK` (sleep `delay_ms`, then call
/// `rw_call_next_attempt` again; with `continuation` set, that attempt
/// continues the broken stream), `RW_ACTION_STOP` / `RW_ACTION_RECONCILE`
/// (surface it with its reason), `RW_ACTION_WAIT` (a hedge sibling is still
/// in flight: start nothing, report the sibling's outcome when it comes).
/// Strings in `*out` are owned by the call and valid until the next
/// `rw_call_report`, `rw_call_report_attempt`, `rw_call_cancel` or
/// `rw_call_free`. `outcome` and what it points to are only read during this
/// call. With a hedge in flight, report each attempt by number with
/// `rw_call_report_attempt` instead.
///
/// Returns `RW_ERR_NULL`, `RW_ERR_INVALID_ARG` (enum value out of range,
/// vendor code not UTF-8; the attempt stays in flight, report it again) or
/// `RW_ERR_PANIC` (the call is unusable from then on: free it; the engine
/// stays usable). On any result but `RW_OK`, `*out` (when `out` is not NULL)
/// is a Stop with reason `RW_REASON_INVALID_STATE` and a detail, so a caller
/// that ignores the result still stops.
///
/// Thread safety: not concurrently with any other function on the same call.
///
/// # Safety
/// `call` is NULL or live; `outcome` is NULL or a readable `rw_outcome`
/// whose pointers are valid as documented there; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rw_call_report(
    call: *mut rw_call,
    outcome: *const rw_outcome,
    out: *mut rw_decision,
) -> rw_result {
    let r = ffi_boundary! {
        // SAFETY: NULL or a live call used by this thread only / readable, per the contract.
        let (Some(h), Some(outcome), false) = (unsafe { call.as_mut() }, unsafe { outcome.as_ref() }, out.is_null()) else {
            return rw_result::RwErrNull;
        };
        if h.poisoned {
            return rw_result::RwErrPanic;
        }
        let mut core_outcome = outcome_plain(outcome);
        if !is_plain(outcome) {
            // SAFETY: the outcome's pointers are valid per the contract.
            try_arg!(unsafe { outcome_rest(&mut core_outcome, outcome) });
        }
        // Stays set if the core panics: the call's state is then unknown.
        h.poisoned = true;
        let d = h.call.report(&core_outcome);
        // SAFETY: non-NULL (checked) and writable per the contract.
        unsafe { out.write(h.decision(d)) };
        h.poisoned = false;
        rw_result::RwOk
    };
    // SAFETY: `out` is NULL or writable, per the contract.
    unsafe { fail_decision(out, r) }
}

/// Reports what attempt `number` met (with hedging, when a primary and a
/// hedge are in flight; `rw_call_report` reports the latest attempt) and
/// returns the decision in `*out`. After a final decision (a sibling already
/// succeeded, stopped or must reconcile) every later report returns that
/// final decision. A `number` that is not in flight gives a Stop with reason
/// `RW_REASON_INVALID_STATE` and changes nothing. `*out`, string lifetimes
/// and error results as for `rw_call_report`.
///
/// Thread safety: not concurrently with any other function on the same call.
///
/// # Safety
/// `call` is NULL or live; `outcome` is NULL or a readable `rw_outcome`
/// whose pointers are valid as documented there; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rw_call_report_attempt(
    call: *mut rw_call,
    number: u32,
    outcome: *const rw_outcome,
    out: *mut rw_decision,
) -> rw_result {
    let r = ffi_boundary! {
        // SAFETY: NULL or a live call used by this thread only / readable, per the contract.
        let (Some(h), Some(outcome), false) = (unsafe { call.as_mut() }, unsafe { outcome.as_ref() }, out.is_null()) else {
            return rw_result::RwErrNull;
        };
        if h.poisoned {
            return rw_result::RwErrPanic;
        }
        // SAFETY: the outcome's pointers are valid per the contract.
        let outcome = try_arg!(unsafe { outcome_from(outcome) });
        // Stays set if the core panics: the call's state is then unknown.
        h.poisoned = true;
        let d = h.call.report_attempt(number, &outcome);
        // SAFETY: non-NULL (checked) and writable per the contract.
        unsafe { out.write(h.decision(d)) };
        h.poisoned = false;
        rw_result::RwOk
    };
    // SAFETY: `out` is NULL or writable, per the contract.
    unsafe { fail_decision(out, r) }
}

/// Asks whether a hedged (parallel) attempt may start now, while exactly one
/// attempt is in flight. `out->action` is `RW_HEDGE_ACTION_START` (make
/// `out->attempt` now, alongside the one in flight, and report each with
/// `rw_call_report_attempt`), `RW_HEDGE_ACTION_AFTER` (ask again after
/// `out->after_ms`) or `RW_HEDGE_ACTION_NO` (`out->reason` says why: the
/// route has no `hedge_after_ms`, the call is unsafe, not the owner or
/// finished, the kill switch is off, no attempt or budget is left, ...).
/// A hedge counts against `max_attempts` and draws from the retry budget.
/// Returns `RW_OK` for all three. Strings in `out->attempt` are owned by the
/// call and valid until the next `rw_call_next_hedge` or `rw_call_free`.
///
/// On an error result (`RW_ERR_NULL`, `RW_ERR_PANIC`), `*out` (when `out` is
/// not NULL) is `RW_HEDGE_ACTION_NO` with reason `RW_REASON_INVALID_STATE`
/// and a detail in `out->attempt.detail`. After `RW_ERR_PANIC` the call is
/// unusable: free it; the engine stays usable.
///
/// Thread safety: not concurrently with any other function on the same call.
///
/// # Safety
/// `call` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rw_call_next_hedge(call: *mut rw_call, out: *mut rw_hedge_plan) -> rw_result {
    let r = ffi_boundary! {
        // SAFETY: NULL or a live call used by this thread only, per the contract.
        let (Some(h), false) = (unsafe { call.as_mut() }, out.is_null()) else { return rw_result::RwErrNull };
        if h.poisoned {
            return rw_result::RwErrPanic;
        }
        // Stays set if the core panics: the call's state is then unknown.
        h.poisoned = true;
        let p = h.call.next_hedge();
        let p = h.hedge_plan(p);
        h.poisoned = false;
        // SAFETY: non-NULL (checked) and writable per the contract.
        unsafe { out.write(p) };
        rw_result::RwOk
    };
    if let (Some(why), false) = (error_detail(r), out.is_null()) {
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out.write(rw_hedge_plan::no(rw_reason::InvalidState, rw_str::of(why))) };
    }
    r
}

/// Cancels the call: every attempt in flight (a primary and its hedge) is
/// reported as cancelled and the call stops with `RW_REASON_CANCELLED` (or
/// keeps its earlier final decision). With no attempt in flight (between
/// attempts, or before the first) the call stops with `RW_REASON_CANCELLED`
/// at once. `*out` and error results as for `rw_call_report`.
///
/// Thread safety: not concurrently with any other function on the same call.
///
/// # Safety
/// `call` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rw_call_cancel(call: *mut rw_call, out: *mut rw_decision) -> rw_result {
    let r = ffi_boundary! {
        // SAFETY: NULL or a live call used by this thread only, per the contract.
        let (Some(h), false) = (unsafe { call.as_mut() }, out.is_null()) else { return rw_result::RwErrNull };
        if h.poisoned {
            return rw_result::RwErrPanic;
        }
        h.poisoned = true;
        let d = h.call.cancel();
        let d = h.decision(d);
        h.poisoned = false;
        // SAFETY: non-NULL (checked) and writable per the contract.
        unsafe { out.write(d) };
        rw_result::RwOk
    };
    // SAFETY: `out` is NULL or writable, per the contract.
    unsafe { fail_decision(out, r) }
}

/// Frees a call (an attempt still in flight gives back its breaker probe,
/// gate slot and budget hold). Every string the call lent out becomes
/// invalid. NULL is a no-op. The calling thread keeps the memory of up to
/// four freed calls for its next `rw_call_begin` (about 1 KiB each), and
/// gives it back when the thread exits.
///
/// Thread safety: not concurrently with any other function on the same call.
///
/// # Safety
/// `call` is NULL or a call from `rw_call_begin` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn rw_call_free(call: *mut rw_call) {
    ffi_boundary! {
        if !call.is_null() {
            // SAFETY: allocated by Box::into_raw in rw_call_begin and not freed yet.
            unsafe { rw_call::free(call) };
        }
    }
}

#[cfg(test)]
mod tests;
