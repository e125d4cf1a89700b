//! Runs N retry cycles with the failure's report out of line, so callgrind can
//! count the retry decision alone (`bench/callgrind`, kind `retry-decision`):
//! the report of a failed attempt that returns `Retry`, with the budget and the
//! breaker consulted, without the call's begin, its attempt or its drop.
//!
//! Usage: `decision_count <N>`. A separate binary from `cycle_count`, so the
//! inlining of the cycles counted there is unchanged.

use retrywise::{Action, Call, CallSpec, Decision, Engine, Outcome};
use std::hint::black_box;

#[path = "../benches/common/work.rs"]
#[allow(dead_code)] // the other benchmarks' helpers
mod work;

fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    // As criterion's retry benchmark.
    let engine = work::engine(work::RETRY_POLICY);
    let fail = Outcome::status(503);
    cycles(&engine, &fail, 1);
    cycles(&engine, &fail, n);
}

#[inline(never)]
fn cycles(engine: &Engine, fail: &Outcome, n: u64) {
    for _ in 0..n {
        let mut call = engine.begin(CallSpec::new("openai/gpt-4o"));
        black_box(call.next_attempt().expect("attempt"));
        let d = decide(&mut call, fail);
        assert_eq!(d.action, Action::Retry);
        black_box(d);
    }
}

/// The counted part: one report and the decision it returns.
#[inline(never)]
fn decide(call: &mut Call, fail: &Outcome) -> Decision {
    call.report(fail)
}
