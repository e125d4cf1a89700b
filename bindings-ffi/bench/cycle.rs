//! What the ABI benchmarks share (`bench_core`, `phases`): the policy, the
//! route, and one logical request through the C ABI as `bench.c` makes it.

use retrywise::*;
use std::hint::black_box;
use std::mem::MaybeUninit;

pub const POLICY: &str = r#"{"budget": {"enabled": false}, "breaker": {"enabled": false}}"#;
pub const ROUTE: &str = "bench/upstream";

/// The same request through the C ABI, as bench.c does it.
pub fn abi_cycle(e: *const rw_engine, spec: &rw_call_spec, fail_first: bool) -> bool {
    let mut call = std::ptr::null_mut();
    // SAFETY: `e` is a live engine, `spec` points to 'static strings, `call` is writable.
    if unsafe { rw_call_begin(e, spec, &mut call) } != rw_result::RwOk {
        return false;
    }
    // Left uninitialised, as bench.c leaves them: the ABI writes every field.
    let mut a = MaybeUninit::<rw_attempt>::uninit();
    let mut d = MaybeUninit::<rw_decision>::uninit();
    let mut ok = false;
    let mut o = rw_outcome::default();
    // SAFETY: `call` is live and used by this thread only; out-pointers are writable.
    while unsafe { rw_call_next_attempt(call, a.as_mut_ptr()) } == rw_result::RwOk {
        // SAFETY: written by rw_call_next_attempt.
        let a = unsafe { a.assume_init_ref() };
        black_box(a.headers_len + a.total_timeout_ms as usize);
        o.status = if fail_first && a.number == 1 { 503 } else { 200 };
        // SAFETY: as above; `o` has no pointers.
        if unsafe { rw_call_report(call, &o, d.as_mut_ptr()) } != rw_result::RwOk {
            break;
        }
        // SAFETY: written by rw_call_report.
        let d = unsafe { d.assume_init_ref() };
        match d.action {
            rw_action::Succeeded => {
                ok = true;
                break;
            }
            rw_action::Retry => {
                black_box(d.delay_ms);
            }
            _ => break,
        }
    }
    // SAFETY: `call` came from rw_call_begin and is freed once.
    unsafe { rw_call_free(call) };
    ok
}
