//! The C ABI fed arbitrary bytes, through the `retrywise-ffi` crate's
//! Rust-visible `extern "C"` functions — exactly what a C caller reaches.
//!
//! Input: policy bytes up to the first NUL byte go to `rw_engine_new` (as
//! JSON, YAML or TOML, UTF-8 or not); the bytes after it drive, through
//! `arbitrary`, a sequence of `rw_call_begin` (arbitrary route, tenant,
//! inbound header bytes, enum codes), `rw_call_next_attempt`,
//! `rw_call_report` (arbitrary status, error-kind / phase / effect codes in
//! and out of range, header bytes, vendor-code bytes), `rw_call_cancel`,
//! `rw_call_free`, `rw_engine_reload` (arbitrary bytes), kill switch, clock,
//! stats and name lookups, with NULL arguments mixed in.
//!
//! Checks: never a panic escaping (libFuzzer aborts on any panic, caught or
//! not — except the policy's own test hook, whose panic must be contained and
//! turn the call into `RW_ERR_PANIC`); every result code is one the header
//! documents for that function; errors and strings handed out are readable
//! and valid UTF-8 for as long as the header promises (re-read after later
//! calls, so AddressSanitizer sees any lifetime mistake); invalid enum codes
//! and non-UTF-8 strings are refused with `RW_ERR_INVALID_ARG` without
//! consuming the attempt; NULL arguments give `RW_ERR_NULL`.

#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use retrywise_core::{Action, ApiFamily, Continuation, ErrorClass, Reason, WaitSource};
use retrywise_ffi::*;
use std::ffi::CStr;
use std::os::raw::c_char;
use std::ptr;

/// The panic message of the policy's `testing.panic_on_vendor_code` hook.
const TEST_HOOK: &str = "retrywise test hook";

/// libfuzzer-sys aborts on every panic. Keep that, except for the test hook a
/// fuzzed policy may switch on: that panic must unwind into the ABI's panic
/// boundary, which is what is under test then.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let fuzzer_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str))
                .unwrap_or("");
            if !msg.contains(TEST_HOOK) {
                fuzzer_hook(info);
            }
        }));
    });
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Code {
    /// A documented value (-1 = unset / none).
    Valid(u8),
    Any(i32),
}

impl Code {
    fn get(self, n: i32) -> i32 {
        match self {
            Code::Valid(v) => i32::from(v) % (n + 1) - 1,
            Code::Any(v) => v,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Text<'a> {
    Absent,
    /// NULL pointer with a non-zero length.
    NullWithLen(u8),
    Bytes(&'a [u8]),
    Known(u8),
}

const KNOWN: [&str; 10] = [
    "openai/gpt-4o",
    "chat",
    "a",
    "b",
    "acme",
    "retry-after",
    "retry-after-ms",
    "retrywise-deadline-ms",
    "insufficient_quota",
    "boom",
];

impl Text<'_> {
    fn raw(&self) -> rw_str {
        match self {
            Text::Absent => rw_str::default(),
            Text::NullWithLen(n) => rw_str {
                ptr: ptr::null(),
                len: 1 + usize::from(*n),
            },
            Text::Bytes(b) => rw_str {
                ptr: b.as_ptr().cast(),
                len: b.len(),
            },
            Text::Known(i) => {
                let s = KNOWN[usize::from(*i) % KNOWN.len()];
                rw_str {
                    ptr: s.as_ptr().cast(),
                    len: s.len(),
                }
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Op<'a> {
    Begin {
        route: Text<'a>,
        tenant: Text<'a>,
        task: Text<'a>,
        key: Text<'a>,
        digest: Text<'a>,
        deadline_ms: u32,
        idempotency: Code,
        inbound: Vec<(Text<'a>, Text<'a>)>,
        capabilities: Vec<Text<'a>>,
        input_tokens: u32,
        max_cost: f64,
        null_out: bool,
    },
    Next {
        call: u8,
        null_out: bool,
    },
    Report {
        call: u8,
        status: u16,
        error_kind: Code,
        phase: Code,
        effect: Code,
        headers: Vec<(Text<'a>, Text<'a>)>,
        vendor_code: Text<'a>,
        input_tokens: u32,
        ok: bool,
        resumable: bool,
        continuation: Code,
        null_outcome: bool,
    },
    Cancel(u8),
    Free(u8),
    Advance(u32),
    Reload(&'a [u8]),
    Mode(bool, bool, bool),
    Stats,
    Names(i32),
    FreeEngine,
}

/// One live call, with the last attempt and decision it lent out.
struct Live {
    call: *mut rw_call,
    attempt: Option<rw_attempt>,
    decision: Option<rw_decision>,
    poisoned: bool,
}

/// Reads `s` (ASan checks the bytes are live) and checks it is UTF-8.
fn read(s: rw_str) -> usize {
    if s.ptr.is_null() {
        assert_eq!(s.len, 0);
        return 0;
    }
    // SAFETY: the ABI promises `len` readable bytes while the owner is live.
    let b = unsafe { std::slice::from_raw_parts(s.ptr.cast::<u8>(), s.len) };
    assert!(std::str::from_utf8(b).is_ok(), "non-UTF-8 string from the ABI");
    b.iter().map(|x| usize::from(*x)).sum()
}

fn read_pairs(p: *const rw_header, n: usize) -> usize {
    if p.is_null() {
        assert_eq!(n, 0);
        return 0;
    }
    // SAFETY: the ABI promises `n` headers while the owner is live.
    let hs = unsafe { std::slice::from_raw_parts(p, n) };
    hs.iter().map(|h| read(h.name) + read(h.value)).sum()
}

fn read_attempt(a: &rw_attempt) -> usize {
    read(a.upstream) + read(a.request_id) + read(a.detail) + read_pairs(a.headers, a.headers_len)
}

fn read_decision(d: &rw_decision) -> usize {
    read(d.upstream) + read(d.detail) + read_pairs(d.excluded, d.excluded_len)
}

fn cstr(p: *const c_char) -> usize {
    assert!(!p.is_null());
    // SAFETY: the ABI returns NUL-terminated strings.
    let s = unsafe { CStr::from_ptr(p) };
    assert!(s.to_str().is_ok());
    s.to_bytes().len()
}

/// Checks and frees an `rw_error`.
fn consume_error(err: *mut rw_error, expect: &[rw_result]) {
    assert!(!err.is_null());
    // SAFETY: a live error from the ABI.
    unsafe {
        let r = rw_error_result(err);
        assert!(expect.contains(&r), "unexpected error result {r:?}");
        assert_eq!(cstr(rw_error_message(err)), rw_error_message_len(err));
        cstr(rw_error_path(err));
        rw_error_free(err);
    }
}

fn new_engine(policy: &[u8], null_policy: bool) -> *mut rw_engine {
    let opts = rw_engine_options {
        seed: 42,
        has_seed: true,
        manual_clock: true,
    };
    let mut err: *mut rw_error = ptr::null_mut();
    let (p, len) = if null_policy {
        (ptr::null(), policy.len())
    } else {
        (policy.as_ptr().cast::<c_char>(), policy.len())
    };
    // SAFETY: `p` is NULL or points to `len` bytes; `err` is writable.
    let e = unsafe { rw_engine_new_with(p, len, &opts, &mut err) };
    if e.is_null() {
        let expect: &[rw_result] = if null_policy && len > 0 {
            &[rw_result::RwErrNull]
        } else {
            &[rw_result::RwErrPolicy, rw_result::RwErrInvalidArg]
        };
        consume_error(err, expect);
    } else {
        assert!(err.is_null());
    }
    e
}

fn default_engine() -> *mut rw_engine {
    let e = new_engine(b"", false);
    assert!(!e.is_null());
    e
}

fn run(policy: &[u8], ops: Vec<Op<'_>>) {
    let mut engine = new_engine(policy, false);
    if engine.is_null() {
        engine = default_engine();
    }
    // SAFETY: every pointer below is either live (tracked here) or deliberately NULL.
    unsafe {
        assert_eq!(rw_engine_advance_clock(ptr::null(), 1), rw_result::RwErrNull);
        let mut calls: Vec<Live> = Vec::new();
        let mut sink = 0usize;
        for op in ops.into_iter().take(128) {
            match op {
                Op::Begin {
                    route,
                    tenant,
                    task,
                    key,
                    digest,
                    deadline_ms,
                    idempotency,
                    inbound,
                    capabilities,
                    input_tokens,
                    max_cost,
                    null_out,
                } => {
                    let inbound: Vec<rw_header> = inbound
                        .iter()
                        .take(8)
                        .map(|(n, v)| rw_header {
                            name: n.raw(),
                            value: v.raw(),
                        })
                        .collect();
                    let caps: Vec<rw_str> = capabilities.iter().take(4).map(Text::raw).collect();
                    let spec = rw_call_spec {
                        route: route.raw(),
                        deadline_ms: u64::from(deadline_ms % 200_000),
                        idempotency: idempotency.get(3),
                        tenant: tenant.raw(),
                        task: task.raw(),
                        idempotency_key: key.raw(),
                        params_digest: digest.raw(),
                        inbound_headers: if inbound.is_empty() {
                            ptr::null()
                        } else {
                            inbound.as_ptr()
                        },
                        inbound_headers_len: inbound.len(),
                        capabilities: if caps.is_empty() { ptr::null() } else { caps.as_ptr() },
                        capabilities_len: caps.len(),
                        input_tokens: u64::from(input_tokens),
                        max_cost,
                        ..rw_call_spec::default()
                    };
                    let mut out: *mut rw_call = ptr::null_mut();
                    let r = rw_call_begin(engine, &spec, if null_out { ptr::null_mut() } else { &mut out });
                    if null_out {
                        assert_eq!(r, rw_result::RwErrNull);
                        continue;
                    }
                    assert!(
                        matches!(
                            r,
                            rw_result::RwOk
                                | rw_result::RwErrNull
                                | rw_result::RwErrInvalidArg
                                | rw_result::RwErrInbound
                                // A route the fuzzed policy does not know.
                                | rw_result::RwErrPolicy
                        ),
                        "rw_call_begin: {r:?}"
                    );
                    assert_eq!(r == rw_result::RwOk, !out.is_null());
                    if !out.is_null() {
                        if calls.len() >= 4 {
                            let old = calls.remove(0);
                            rw_call_free(old.call);
                        }
                        calls.push(Live {
                            call: out,
                            attempt: None,
                            decision: None,
                            poisoned: false,
                        });
                    }
                }
                Op::Next { call, null_out } => {
                    if calls.is_empty() {
                        continue;
                    }
                    let i = usize::from(call) % calls.len();
                    let l = &mut calls[i];
                    if null_out {
                        assert_eq!(rw_call_next_attempt(l.call, ptr::null_mut()), rw_result::RwErrNull);
                        continue;
                    }
                    let mut a = rw_attempt::default();
                    let r = rw_call_next_attempt(l.call, &mut a);
                    match r {
                        rw_result::RwOk => {
                            assert!(a.number >= 1);
                            assert!(a.total_timeout_ms <= a.remaining_ms);
                        }
                        rw_result::RwStopped => {}
                        rw_result::RwErrPanic => assert!(l.poisoned),
                        other => panic!("rw_call_next_attempt: {other:?}"),
                    }
                    sink += read_attempt(&a);
                    l.attempt = Some(a);
                    // The decision lent by the last report is still valid.
                    if let Some(d) = &l.decision {
                        sink += read_decision(d);
                    }
                }
                Op::Report {
                    call,
                    status,
                    error_kind,
                    phase,
                    effect,
                    headers,
                    vendor_code,
                    input_tokens,
                    ok,
                    resumable,
                    continuation,
                    null_outcome,
                } => {
                    if calls.is_empty() {
                        continue;
                    }
                    let i = usize::from(call) % calls.len();
                    let l = &mut calls[i];
                    let hs: Vec<rw_header> = headers
                        .iter()
                        .take(8)
                        .map(|(n, v)| rw_header {
                            name: n.raw(),
                            value: v.raw(),
                        })
                        .collect();
                    let o = rw_outcome {
                        status,
                        error_kind: error_kind.get(12),
                        phase: phase.get(5),
                        effect: effect.get(4),
                        headers: if hs.is_empty() { ptr::null() } else { hs.as_ptr() },
                        headers_len: hs.len(),
                        vendor_code: vendor_code.raw(),
                        input_tokens: u64::from(input_tokens),
                        ok,
                        body: rw_str {
                            ptr: ptr::null(),
                            len: 0,
                        },
                        resumable,
                        continuation: continuation.get(2),
                        first_token_ms: u64::from(input_tokens % 1_000),
                    };
                    let mut d = rw_decision::default();
                    let r = rw_call_report(l.call, if null_outcome { ptr::null() } else { &o }, &mut d);
                    match r {
                        rw_result::RwOk => {}
                        rw_result::RwErrNull => {
                            assert!(
                                null_outcome
                                    || hs.iter().any(|h| h.name.ptr.is_null() && h.name.len > 0
                                        || h.value.ptr.is_null() && h.value.len > 0)
                                    || (o.vendor_code.ptr.is_null() && o.vendor_code.len > 0)
                            );
                            assert_eq!(d.reason, rw_reason::InvalidState);
                        }
                        rw_result::RwErrInvalidArg => assert_eq!(d.reason, rw_reason::InvalidState),
                        rw_result::RwErrPanic => {
                            l.poisoned = true;
                            assert_eq!(d.reason, rw_reason::InvalidState);
                        }
                        other => panic!("rw_call_report: {other:?}"),
                    }
                    sink += read_decision(&d);
                    l.decision = Some(d);
                    // The attempt lent by the last next_attempt is still valid.
                    if let Some(a) = &l.attempt {
                        sink += read_attempt(a);
                    }
                }
                Op::Cancel(i) => {
                    if calls.is_empty() {
                        continue;
                    }
                    let i = usize::from(i) % calls.len();
                    let l = &mut calls[i];
                    let mut d = rw_decision::default();
                    let r = rw_call_cancel(l.call, &mut d);
                    assert!(
                        matches!(r, rw_result::RwOk) || (r == rw_result::RwErrPanic && l.poisoned),
                        "rw_call_cancel: {r:?}"
                    );
                    sink += read_decision(&d);
                    l.decision = Some(d);
                    if let Some(a) = &l.attempt {
                        sink += read_attempt(a);
                    }
                }
                Op::Free(i) => {
                    if calls.is_empty() {
                        continue;
                    }
                    let l = calls.remove(usize::from(i) % calls.len());
                    rw_call_free(l.call);
                }
                Op::Advance(ms) => {
                    assert_eq!(rw_engine_advance_clock(engine, u64::from(ms)), rw_result::RwOk);
                }
                Op::Reload(bytes) => {
                    let mut err: *mut rw_error = ptr::null_mut();
                    let r = rw_engine_reload(engine, bytes.as_ptr().cast(), bytes.len(), &mut err);
                    if r == rw_result::RwOk {
                        assert!(err.is_null());
                    } else {
                        assert_eq!(r, rw_error_result(err));
                        consume_error(err, &[rw_result::RwErrPolicy, rw_result::RwErrInvalidArg]);
                    }
                }
                Op::Mode(a, b, c) => {
                    assert_eq!(rw_engine_set_mode(engine, a, b, c), rw_result::RwOk);
                }
                Op::Stats => {
                    let mut s: *mut c_char = ptr::null_mut();
                    assert_eq!(rw_engine_stats_json(engine, &mut s), rw_result::RwOk);
                    let n = cstr(s);
                    assert!(n > 2);
                    rw_string_free(s);
                    assert_eq!(rw_engine_stats_json(engine, ptr::null_mut()), rw_result::RwErrNull);
                }
                Op::Names(code) => {
                    // NULL for an unknown code; a static NUL-terminated name otherwise.
                    let n = |all: usize| i32::try_from(all).unwrap_or(i32::MAX);
                    let names = [
                        (rw_reason_name(code), n(Reason::ALL.len()), false),
                        (rw_action_name(code), n(Action::ALL.len()), false),
                        (rw_class_name(code), n(ErrorClass::ALL.len()), true),
                        (rw_wait_source_name(code), n(WaitSource::ALL.len()), false),
                        (rw_continuation_name(code), n(Continuation::ALL.len()), false),
                        (rw_api_family_name(code), n(ApiFamily::ALL.len()), false),
                        (rw_result_name(code), 8, false),
                    ];
                    for (p, n, none) in names {
                        let valid = (0..n).contains(&code) || (none && code == -1);
                        assert_eq!(!p.is_null(), valid, "name of code {code} (of {n})");
                        if !p.is_null() {
                            sink += cstr(p);
                        }
                    }
                    sink += cstr(rw_version());
                }
                Op::FreeEngine => {
                    // Calls outlive their engine handle.
                    rw_engine_free(engine);
                    engine = default_engine();
                }
            }
        }
        for l in calls {
            if let Some(d) = &l.decision {
                sink += read_decision(d);
            }
            rw_call_free(l.call);
        }
        rw_engine_free(engine);
        std::hint::black_box(sink);
    }
}

fuzz_target!(|data: &[u8]| {
    install_panic_hook();
    let (policy, rest) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    if rest.is_empty() {
        // Policy bytes alone: also the NULL-with-length case.
        let e = new_engine(policy, true);
        assert_eq!(policy.is_empty(), !e.is_null());
        // SAFETY: NULL or a live engine.
        unsafe { rw_engine_free(e) };
    }
    let ops: Vec<Op<'_>> = Vec::arbitrary_take_rest(Unstructured::new(rest)).unwrap_or_default();
    run(policy, ops);
});
