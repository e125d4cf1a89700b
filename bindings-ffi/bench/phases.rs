//! Instructions per step of the benchmark's cycles, core and C ABI side by
//! side: each core step is kept out of line (`c1_begin` .. `c4_free`), as
//! the ABI's steps are (`rw_call_begin` .. `rw_call_free`), so callgrind
//! counts each apart. Keeping the core's steps out of line adds moves a real
//! cycle does not make: compare whole cycles with `bench_core`.
//!
//! `cargo build --release -p retrywise-ffi --example phases`, then
//! `valgrind --tool=callgrind --callgrind-out-file=cg.out target/release/examples/phases N [success|retry]`
//! and `callgrind_annotate --inclusive=yes cg.out`; divide by N (cycles).

use retrywise::*;
use retrywise_core::{Action, Attempt, Call, CallSpec, Decision, Engine, Outcome, Policy, PolicyError, Stopped};
use std::hint::black_box;

#[path = "cycle.rs"]
mod cycle;
use cycle::{abi_cycle, POLICY, ROUTE};

#[inline(never)]
fn c1_begin(e: &Engine) -> Result<Call, PolicyError> {
    e.try_begin(CallSpec::new(ROUTE).deadline_ms(10_000))
}
#[inline(never)]
fn c2_next(c: &mut Call) -> Result<Attempt, Stopped> {
    c.next_attempt()
}
#[inline(never)]
fn c2_headers(a: &Attempt) {
    a.for_each_header(|name, value| {
        black_box((name, value));
    });
}
#[inline(never)]
fn c3_report(c: &mut Call, o: &Outcome) -> Decision {
    c.report(o)
}
#[inline(never)]
fn c4_free(c: Call) {
    drop(c)
}

fn core_cycle(e: &Engine, fail_first: bool) -> bool {
    let Ok(mut call) = c1_begin(e) else { return false };
    while let Ok(a) = c2_next(&mut call) {
        c2_headers(&a);
        black_box(a.timeouts().total);
        let status = if fail_first && a.number == 1 { 503 } else { 200 };
        let d = c3_report(&mut call, &Outcome::status(status));
        match d.action {
            Action::Succeeded => {
                c4_free(call);
                return true;
            }
            Action::Retry => {
                black_box(d.delay);
            }
            _ => return false,
        }
    }
    false
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let fail_first = args.next().as_deref() == Some("retry");
    let policy = Policy::from_str_any(POLICY).expect("bench policy");
    let core = Engine::builder(policy).seed(7).build().expect("engine");
    let opts = rw_engine_options {
        seed: 7,
        has_seed: true,
        manual_clock: false,
    };
    // SAFETY: POLICY is valid for its length; NULL error pointer is allowed.
    let abi = unsafe { rw_engine_new_with(POLICY.as_ptr().cast(), POLICY.len(), &opts, std::ptr::null_mut()) };
    assert!(!abi.is_null());
    let spec = rw_call_spec {
        route: rw_str {
            ptr: ROUTE.as_ptr().cast(),
            len: ROUTE.len(),
        },
        deadline_ms: 10_000,
        ..Default::default()
    };
    for _ in 0..n {
        assert!(core_cycle(&core, fail_first));
        assert!(abi_cycle(abi, &spec, fail_first));
    }
    // SAFETY: created above, freed once.
    unsafe { rw_engine_free(abi) };
}
