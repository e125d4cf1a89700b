//! The work the core benchmarks time and the engines they time it on,
//! shared by the criterion benchmark and the `scaling`, `floor`,
//! `cycle_count` and `decision_count` examples (each uses part of it).

use retrywise::{Action, CallSpec, Engine, Outcome, Policy};
use std::hint::black_box;

/// One successful begin → next_attempt → report cycle on `route`.
pub fn success_cycle(e: &Engine, route: &str) {
    let mut c = e.begin(CallSpec::new(route));
    let a = c.next_attempt().unwrap();
    black_box(&a);
    let d = c.report(&Outcome::success());
    debug_assert_eq!(d.action, Action::Succeeded);
    black_box(d);
}

/// Reference work for two-thread scaling: about one decision cycle's length
/// of thread-private work (eight xorshift lanes in a stack array, through
/// memory each round as the engine's state is), nothing shared. What two
/// threads gain on it is what the machine allows at all; the engine's
/// two-thread rows are read against it.
pub fn reference_work() {
    let mut lanes = [1u64, 2, 3, 4, 5, 6, 7, 8];
    for _ in 0..48 {
        for v in black_box(&mut lanes).iter_mut() {
            *v ^= *v << 13;
            *v ^= *v >> 7;
            *v ^= *v << 17;
        }
    }
    black_box(lanes);
}

/// The paired-round examples' arguments: `[N] [ROUNDS]` (defaults 1 000 000 and 7).
pub fn round_args() -> (u64, usize) {
    let mut args = std::env::args().skip(1);
    let n = args.next().and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let rounds = args.next().and_then(|s| s.parse().ok()).unwrap_or(7);
    (n, rounds)
}

/// Retries always granted (ratio 1, one request per call) and a breaker that
/// records every outcome but never trips, so every failed report is a Retry decision.
pub const RETRY_POLICY: &str = "budget: {ratio: 1.0, min_per_sec: 0}\nbreaker: {failure_rate: null}";

/// An engine on policy `yaml` (empty: the default policy) with a fixed seed
/// and no environment overrides.
pub fn engine(yaml: &str) -> Engine {
    Engine::builder(Policy::from_str_any(yaml).expect("policy"))
        .seed(1)
        .read_env(false)
        .build()
        .expect("engine")
}

/// The median of `v` (the upper one for an even length).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
