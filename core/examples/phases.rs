//! Instructions per step of a success cycle (the spec, begin, next_attempt,
//! report and the drops), each kept out of line so callgrind counts it apart.
//! Keeping them out of line adds calls and copies a real cycle does not
//! make: compare steps with each other, and whole cycles with `bench/callgrind`.
//!
//! `cargo build --profile bench -p retrywise --example phases`, then
//! `valgrind --tool=callgrind --toggle-collect='phases::p*' target/release/examples/phases N [POLICY]`
//! and `callgrind_annotate --inclusive=yes`; run it for two N and subtract
//! to leave out the engine's setup.

use retrywise::{Attempt, Call, CallSpec, Decision, Engine, Outcome, Stopped};
use std::hint::black_box;

#[path = "../benches/common/work.rs"]
#[allow(dead_code)]
mod work;

#[inline(never)]
fn p1_spec() -> CallSpec {
    CallSpec::new("openai/gpt-4o")
}
#[inline(never)]
fn p2_begin(e: &Engine, s: CallSpec) -> Call {
    e.begin(s)
}
#[inline(never)]
fn p3_attempt(c: &mut Call) -> Result<Attempt, Stopped> {
    c.next_attempt()
}
#[inline(never)]
fn p4_drop_attempt(a: Result<Attempt, Stopped>) {
    drop(a)
}
#[inline(never)]
fn p5_report(c: &mut Call, o: &Outcome) -> Decision {
    c.report(o)
}
#[inline(never)]
fn p6_drop_decision(d: Decision) {
    drop(d)
}
#[inline(never)]
fn p7_drop_call(c: Call) {
    drop(c)
}

fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let yaml = std::env::args().nth(2).unwrap_or_default();
    let engine = work::engine(&yaml);
    let ok = Outcome::success();
    for _ in 0..n {
        let mut c = p2_begin(&engine, p1_spec());
        let a = p3_attempt(&mut c);
        black_box(&a);
        p4_drop_attempt(a);
        let d = p5_report(&mut c, &ok);
        black_box(&d);
        p6_drop_decision(d);
        p7_drop_call(c);
    }
}
