//! The Rust side of the ABI benchmark: the same cycles as `bench/bench.c`,
//! calling the core directly (same policy, seed and outcomes; the outbound
//! headers of every attempt are produced, as the C ABI does for its caller).
//!
//! It also runs the C ABI functions in-process (through the rlib), in
//! alternating rounds with the core, so the overhead ratio holds even on a
//! loaded machine where two separate processes see different load.
//!
//! `cargo run --release -p retrywise-ffi --example bench_core -- [iterations] [rounds] [success|retry]`
//!
//! Under `valgrind --tool=callgrind` the inclusive instruction counts of
//! `core_cycle` and `abi_cycle` give a load-independent overhead figure.

use retrywise::*;
use retrywise_core::{Action, CallSpec, Engine, Outcome, Policy};
use std::hint::black_box;
use std::time::Instant;

#[path = "cycle.rs"]
mod cycle;
use cycle::{abi_cycle, POLICY, ROUTE};

/// One logical request on the core; `fail_first` reports a 503 before the 200.
fn core_cycle(e: &Engine, fail_first: bool) -> bool {
    // `try_begin`, as `rw_call_begin` (and every binding) begins: the route is checked first.
    let Ok(mut call) = e.try_begin(CallSpec::new(ROUTE).deadline_ms(10_000)) else {
        return false;
    };
    while let Ok(a) = call.next_attempt() {
        a.for_each_header(|name, value| {
            black_box((name, value));
        });
        black_box(a.timeouts().total);
        let status = if fail_first && a.number == 1 { 503 } else { 200 };
        let d = call.report(&Outcome::status(status));
        match d.action {
            Action::Succeeded => return true,
            Action::Retry => {
                black_box(d.delay);
            }
            _ => return false,
        }
    }
    false
}

fn time(iters: u64, mut f: impl FnMut() -> bool) -> f64 {
    let t0 = Instant::now();
    let mut ok = 0;
    for _ in 0..iters {
        ok += f() as u64;
    }
    assert_eq!(ok, iters, "every cycle must succeed");
    t0.elapsed().as_nanos() as f64 / iters as f64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let iters: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let rounds: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(7);
    let only = args.next();

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

    for (name, fail_first) in [("success", false), ("retry", true)] {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        time(iters / 10, || core_cycle(&core, fail_first));
        time(iters / 10, || abi_cycle(abi, &spec, fail_first));
        // Rounds alternate which side runs first; the overhead is the median
        // of the per-round ratios, which a loaded machine disturbs least.
        let (mut best_core, mut best_abi) = (f64::MAX, f64::MAX);
        let mut ratios = Vec::with_capacity(rounds as usize);
        for r in 0..rounds {
            let (c, a) = if r % 2 == 0 {
                let c = time(iters, || core_cycle(&core, fail_first));
                (c, time(iters, || abi_cycle(abi, &spec, fail_first)))
            } else {
                let a = time(iters, || abi_cycle(abi, &spec, fail_first));
                (time(iters, || core_cycle(&core, fail_first)), a)
            };
            best_core = best_core.min(c);
            best_abi = best_abi.min(a);
            ratios.push(a / c);
        }
        ratios.sort_by(f64::total_cmp);
        let median = ratios[ratios.len() / 2];
        println!(
            "{name:8} rust-core {best_core:8.1} ns/cycle | c-abi in-process {best_abi:8.1} ns/cycle (best of {rounds}) | overhead: median {:+.1} %, best-vs-best {:+.1} %",
            (median - 1.0) * 100.0,
            (best_abi / best_core - 1.0) * 100.0
        );
    }
    // SAFETY: created above, freed once.
    unsafe { rw_engine_free(abi) };
}
