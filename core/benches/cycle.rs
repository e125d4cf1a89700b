//! Per-decision cost of the core: a successful begin → next_attempt → report
//! cycle, and a retry decision with budget and breaker active (as a whole
//! retry cycle, and alone: `report-only`); one thread, and two threads on
//! shared and on distinct keys; and a reference row of
//! thread-private work, for what two threads can gain on the machine at all.
//!
//! Run: `cargo bench -p retrywise --bench cycle`

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion};
use retrywise::{Action, CallSpec, Engine, Outcome};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "common/work.rs"]
#[allow(dead_code)] // the other benchmarks' helpers
mod work;
use work::{engine, reference_work, success_cycle, RETRY_POLICY};

/// The same cycle through `begin_attempt` (one clock reading for the first step, but the returned pair is copied).
fn success_cycle_begin_attempt(e: &Engine, route: &str) {
    let (mut c, a) = e.begin_attempt(CallSpec::new(route));
    black_box(&a);
    let d = c.report(&Outcome::success());
    debug_assert_eq!(d.action, Action::Succeeded);
    black_box(d);
}

fn retry_decision(e: &Engine, route: &str, fail: &Outcome) {
    let mut c = e.begin(CallSpec::new(route));
    c.next_attempt().unwrap();
    let d = c.report(fail);
    debug_assert_eq!(d.action, Action::Retry);
    black_box(d);
}

/// Two worker threads kept for a whole benchmark, as in a server's pool (their
/// per-thread state stays warm; no thread start or exit is timed). Each sample
/// has both run `iters` cycles; the time per iteration is the wall time over
/// `iters`, so two threads scale perfectly when it equals the one-thread time.
struct Pair {
    go: Vec<mpsc::Sender<u64>>,
    done: mpsc::Receiver<()>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl Pair {
    fn new(e: &Engine, routes: [&'static str; 2], f: fn(&Engine, &str)) -> Pair {
        let (done_tx, done) = mpsc::channel();
        let mut go = Vec::new();
        let mut workers = Vec::new();
        for route in routes {
            let (tx, rx) = mpsc::channel::<u64>();
            let (e, done_tx) = (e.clone(), done_tx.clone());
            workers.push(std::thread::spawn(move || {
                while let Ok(n) = rx.recv() {
                    for _ in 0..n {
                        f(&e, route);
                    }
                    done_tx.send(()).unwrap();
                }
            }));
            go.push(tx);
        }
        Pair { go, done, workers }
    }

    fn run(&self, iters: u64) -> Duration {
        let start = Instant::now();
        for g in &self.go {
            g.send(iters).unwrap();
        }
        for _ in &self.go {
            self.done.recv().unwrap();
        }
        start.elapsed()
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        self.go.clear();
        for w in self.workers.drain(..) {
            w.join().unwrap();
        }
    }
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("cycle");
    let e = engine("");
    g.bench_function("success/1-thread", |b| b.iter(|| success_cycle(&e, "openai/gpt-4o")));
    g.bench_function("success/1-thread/begin_attempt", |b| {
        b.iter(|| success_cycle_begin_attempt(&e, "openai/gpt-4o"))
    });
    let quiet = engine("telemetry: {ring_size: 0}");
    g.bench_function("success/1-thread/no-ring", |b| {
        b.iter(|| success_cycle(&quiet, "openai/gpt-4o"))
    });
    let r = engine(RETRY_POLICY);
    let fail = Outcome::status(503);
    g.bench_function("retry-decision/1-thread", |b| {
        b.iter(|| retry_decision(&r, "openai/gpt-4o", &fail))
    });
    // The decision alone: the failure's report, each call begun and its
    // attempt started outside the timing (and the call dropped outside it).
    g.bench_function("retry-decision/1-thread/report-only", |b| {
        b.iter_batched(
            || {
                let mut c = r.begin(CallSpec::new("openai/gpt-4o"));
                c.next_attempt().unwrap();
                c
            },
            |mut c| {
                let d = c.report(&fail);
                debug_assert_eq!(d.action, Action::Retry);
                (c, d)
            },
            BatchSize::SmallInput,
        )
    });
    let pair = Pair::new(&e, ["up-a", "up-b"], success_cycle);
    g.bench_function("success/2-threads/distinct-keys", |b| {
        b.iter_custom(|iters| pair.run(iters))
    });
    drop(pair);
    let pair = Pair::new(&e, ["up-a", "up-a"], success_cycle);
    g.bench_function("success/2-threads/shared-key", |b| {
        b.iter_custom(|iters| pair.run(iters))
    });
    drop(pair);
    let pair = Pair::new(&r, ["up-a", "up-b"], |e, k| retry_decision(e, k, &Outcome::status(503)));
    g.bench_function("retry-decision/2-threads/distinct-keys", |b| {
        b.iter_custom(|iters| pair.run(iters))
    });
    drop(pair);
    g.bench_function("reference/1-thread", |b| b.iter(reference_work));
    let pair = Pair::new(&e, ["", ""], |_, _| reference_work());
    g.bench_function("reference/2-threads", |b| b.iter_custom(|iters| pair.run(iters)));
    drop(pair);
    g.finish();
}

criterion_group! {
    name = cycle;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = benches
}
criterion_main!(cycle);
