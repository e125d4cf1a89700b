//! Two-thread scaling of the successful decision cycle, measured in paired
//! rounds so that machine noise (which moves every row by tens of percent
//! from one minute to the next) hits both sides of each ratio alike.
//!
//! Each round times `N` cycles on one thread, then `N` cycles on each of two
//! threads at once (distinct upstream keys, one engine), then the same two
//! steps for thread-private reference work (what two threads can gain on the
//! machine at all). A round's ratio is `2 × t(one) / t(two)`: 2.0 is perfect
//! scaling. Prints every round and the median ratios.
//!
//! Usage: `scaling [N] [ROUNDS]` (defaults 1 000 000 and 7). Build with
//! `--profile bench` as the criterion benchmarks are.

use retrywise::Engine;
use std::time::Instant;

#[path = "../benches/common/work.rs"]
#[allow(dead_code)] // the other benchmarks' helpers
mod work;
use work::{engine, median, reference_work, round_args, success_cycle};

/// `n` successful cycles (the criterion benchmark's `cycle/success/*`).
fn cycles(e: &Engine, route: &str, n: u64) {
    for _ in 0..n {
        success_cycle(e, route);
    }
}

/// `n` units of the criterion benchmark's reference work (`cycle/reference/*`).
fn reference(_: &Engine, _: &str, n: u64) {
    for _ in 0..n {
        reference_work();
    }
}

/// Seconds for `routes.len()` threads running `work` `n` times each, started together.
fn timed(e: &Engine, routes: &[&'static str], n: u64, work: fn(&Engine, &str, u64)) -> f64 {
    let barrier = std::sync::Barrier::new(routes.len() + 1);
    std::thread::scope(|s| {
        for route in routes {
            let (e, barrier) = (e, &barrier);
            s.spawn(move || {
                work(e, route, n / 100); // this thread's state warm before timing
                barrier.wait();
                work(e, route, n);
                barrier.wait();
            });
        }
        barrier.wait();
        let start = Instant::now();
        barrier.wait();
        start.elapsed().as_secs_f64()
    })
}

fn main() {
    let (n, rounds) = round_args();
    let engine = engine("");
    let ns = |secs: f64| secs / n as f64 * 1e9;
    let (mut cycle_ratios, mut ref_ratios) = (Vec::new(), Vec::new());
    println!("round  cycle 1t ns  2t ns/thread  ratio   reference 1t ns  2t ns/thread  ratio");
    for round in 1..=rounds {
        let one = timed(&engine, &["up-a"], n, cycles);
        let two = timed(&engine, &["up-a", "up-b"], n, cycles);
        let r_one = timed(&engine, &["", ""][..1], n, reference);
        let r_two = timed(&engine, &["", ""], n, reference);
        cycle_ratios.push(2.0 * one / two);
        ref_ratios.push(2.0 * r_one / r_two);
        println!(
            "{round:>5}  {:>11.0}  {:>12.0}  {:>5.2}   {:>15.0}  {:>12.0}  {:>5.2}",
            ns(one),
            ns(two),
            2.0 * one / two,
            ns(r_one),
            ns(r_two),
            2.0 * r_one / r_two
        );
    }
    println!(
        "median ratio: cycle {:.2}, reference {:.2} ({rounds} rounds of {n} iterations per thread)",
        median(&mut cycle_ratios),
        median(&mut ref_ratios)
    );
}
