//! The floor under a successful decision cycle on this machine: the
//! operations a cycle cannot do without, timed alone, beside the cycle itself.
//!
//! A success cycle reads the clock three times, makes one locked
//! read-modify-write on a line it shares (the breaker's outcome count),
//! writes one event slot (the attempt's start, then its end into the same
//! slot, with plain stores) and bumps thread-owned counters and the
//! thread's budget request count. The floor does exactly that with no
//! logic around it, so `cycle − floor` is what the logic costs.
//!
//! Each round times `N` floor iterations, then `N` success cycles (`begin`,
//! `next_attempt`, `report`), back to back; prints every round and the medians.
//!
//! Usage: `floor [N] [ROUNDS]` (defaults 1 000 000 and 7). Build with
//! `--profile bench` as the criterion benchmarks are.

use retrywise::Engine;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[path = "../benches/common/work.rs"]
#[allow(dead_code)] // the other benchmarks' helpers
mod work;
use work::{engine, median, round_args, success_cycle};

/// One shared atomic on its own cache line, as the engine's shared cells are.
#[repr(align(64))]
#[derive(Default)]
struct Line(AtomicU64);

/// The state the floor touches: the breaker's and the thread's budget counts, a ring of
/// event slots (23 words each, as the engine's) with its version word.
struct Shared {
    breaker: Line,
    budget: Line,
    ver: Line,
    head: Line,
    slots: Vec<[AtomicU64; 23]>,
}

/// `n` floor iterations; ns per iteration.
fn floor(sh: &Shared, clock: &quanta::Clock, n: u64) -> f64 {
    let origin = clock.raw();
    let mut counters = [0u64; 4];
    let t = Instant::now();
    for i in 0..n {
        // begin: a clock reading, a counter.
        let begun = clock.delta_as_nanos(origin, clock.raw());
        counters[0] += 1;
        // first attempt: a reading, a counter, the start event.
        let started = clock.delta_as_nanos(origin, clock.raw());
        counters[1] += 1;
        let h = sh.head.0.load(Ordering::Relaxed);
        let slot = &sh.slots[(h % sh.slots.len() as u64) as usize];
        for (w, v) in slot.iter().take(10).zip([started, i, begun, 4, 5, 6, 7, 8, 9, 10]) {
            w.store(v, Ordering::Relaxed);
        }
        sh.head.0.store(h + 1, Ordering::Release);
        // The thread's budget shard counts the request: a plain load and store.
        sh.budget
            .0
            .store(sh.budget.0.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        // report: a reading, the breaker's count, the end written into the start event.
        let ended = clock.delta_as_nanos(origin, clock.raw());
        sh.breaker.0.fetch_add(1, Ordering::Relaxed);
        sh.ver.0.store(2 * h + 1, Ordering::Relaxed);
        slot[10].store(ended - started, Ordering::Relaxed);
        sh.ver.0.store(2 * h + 2, Ordering::Release);
        counters[2] += 1;
        black_box(&counters);
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

/// `n` success cycles; ns per cycle.
fn cycles(e: &Engine, n: u64) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        success_cycle(e, "openai/gpt-4o");
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let (n, rounds) = round_args();
    let e = engine("");
    let clock = quanta::Clock::new();
    let sh = Shared {
        breaker: Line::default(),
        budget: Line::default(),
        ver: Line::default(),
        head: Line::default(),
        slots: (0..1024).map(|_| std::array::from_fn(|_| AtomicU64::new(0))).collect(),
    };
    // Warm up: the thread's engine state, the ring, the caches.
    cycles(&e, n / 10 + 1);
    floor(&sh, &clock, n / 10 + 1);
    println!("round  floor ns  cycle ns  logic ns");
    let (mut fs, mut cs, mut ls) = (Vec::new(), Vec::new(), Vec::new());
    for r in 1..=rounds {
        let f = floor(&sh, &clock, n);
        let c = cycles(&e, n);
        println!("{r:5}  {f:8.1}  {c:8.1}  {:8.1}", c - f);
        fs.push(f);
        cs.push(c);
        ls.push(c - f);
    }
    println!(
        "median {:7.1}  {:8.1}  {:8.1}   ({rounds} rounds of {n})",
        median(&mut fs),
        median(&mut cs),
        median(&mut ls)
    );
}
