//! Runs N decision cycles of one kind, for instruction counting under
//! callgrind (`bench/callgrind`), which is stable on noisy machines.
//!
//! Usage: `cycle_count <success|success-no-ring|success-begin-attempt|retry> <N>`
//! (`success-begin-attempt`: the success cycle through `Engine::begin_attempt`).

use retrywise::{CallSpec, Engine, Outcome};
use std::hint::black_box;

#[path = "../benches/common/work.rs"]
#[allow(dead_code)] // the other benchmarks' helpers
mod work;

fn main() {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "success".into());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let yaml = match kind.as_str() {
        "success" | "success-begin-attempt" => "",
        "success-no-ring" => "telemetry: {ring_size: 0}",
        "retry" => work::RETRY_POLICY,
        other => {
            eprintln!("unknown kind {other:?}: expected success, success-no-ring, success-begin-attempt or retry");
            std::process::exit(2);
        }
    };
    let engine = work::engine(yaml);
    let outcome = if kind == "retry" {
        Outcome::status(503)
    } else {
        Outcome::success()
    };
    // Warm up: the thread's per-engine state and the upstream's shared state exist before counting.
    if kind == "success-begin-attempt" {
        cycles_begin_attempt(&engine, &outcome, 1);
        cycles_begin_attempt(&engine, &outcome, n);
        return;
    }
    cycles(&engine, &outcome, 1);
    cycles(&engine, &outcome, n);
}

/// The success cycle with begin and the first attempt in one step (one clock reading for both).
#[inline(never)]
fn cycles_begin_attempt(engine: &Engine, outcome: &Outcome, n: u64) {
    for _ in 0..n {
        let (mut call, attempt) = engine.begin_attempt(CallSpec::new("openai/gpt-4o"));
        black_box(&attempt.expect("attempt"));
        black_box(call.report(outcome));
    }
}

/// The counted loop (`bench/callgrind` collects instructions inside this function only).
#[inline(never)]
fn cycles(engine: &Engine, outcome: &Outcome, n: u64) {
    for _ in 0..n {
        let mut call = engine.begin(CallSpec::new("openai/gpt-4o"));
        let attempt = call.next_attempt().expect("attempt");
        black_box(&attempt);
        black_box(call.report(outcome));
    }
}
