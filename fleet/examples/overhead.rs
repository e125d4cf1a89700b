//! What attaching a fleet costs the successful decision cycle, in paired
//! rounds (machine noise hits both sides of each ratio alike): each round
//! times `N` success cycles on an engine without a fleet, then on one whose
//! Redis adapter syncs every 250 ms (the default), then on one syncing every
//! 10 ms (its background thread reading the breaker cells 25 times as
//! often), the order turning each round. A ratio is t(attached) / t(alone);
//! 1.00 is no cost.
//!
//! Usage: `RETRYWISE_REDIS_URL=redis://127.0.0.1:6379/ overhead [N] [ROUNDS]`
//! (defaults 1 000 000 and 7). Build with `--profile bench`.

use retrywise::{Engine, FleetConfig};
use retrywise_fleet::RedisFleet;
use std::time::{Duration, Instant};

#[path = "../../core/benches/common/work.rs"]
#[allow(dead_code)] // the core benchmarks' other helpers
mod work;
use work::{engine, median, round_args, success_cycle};

/// Seconds for `n` success cycles on `e`.
fn timed(e: &Engine, n: u64) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        success_cycle(e, "up");
    }
    start.elapsed().as_secs_f64()
}

fn attached(url: &str, interval_ms: u64) -> (Engine, RedisFleet) {
    let e = engine("");
    let cfg = FleetConfig {
        interval: Duration::from_millis(interval_ms),
        ..FleetConfig::default()
    };
    let f = RedisFleet::connect(e.fleet(cfg).expect("fleet"), url)
        .expect("redis url")
        .start();
    (e, f)
}

fn main() {
    let (n, rounds) = round_args();
    let url = std::env::var("RETRYWISE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let alone = engine("");
    let (slow, slow_fleet) = attached(&url, 250);
    let (fast, fast_fleet) = attached(&url, 10);
    for e in [&alone, &slow, &fast] {
        timed(e, n / 10); // warm, and the breaker key exists for the fleet to read
    }
    let ns = |secs: f64| secs / n as f64 * 1e9;
    let (mut r_slow, mut r_fast) = (Vec::new(), Vec::new());
    println!("round  alone ns  attached 250ms ns  ratio  attached 10ms ns  ratio");
    for round in 1..=rounds {
        // The order turns each round, so no side is always timed first.
        let mut t = [0.0; 3];
        for k in 0..3 {
            let i = (round + k) % 3;
            t[i] = timed([&alone, &slow, &fast][i], n);
        }
        let [a, s, f] = t;
        r_slow.push(s / a);
        r_fast.push(f / a);
        println!(
            "{round:>5}  {:>8.0}  {:>17.0}  {:>5.2}  {:>16.0}  {:>5.2}",
            ns(a),
            ns(s),
            s / a,
            ns(f),
            f / a
        );
    }
    let (s, f) = (slow_fleet.fleet().stats(), fast_fleet.fleet().stats());
    println!(
        "median ratio: 250ms {:.2}, 10ms {:.2} ({rounds} rounds of {n}); syncs ok/failed: 250ms {}/{}, 10ms {}/{}",
        median(&mut r_slow),
        median(&mut r_fast),
        s.cycles,
        s.failures,
        f.cycles,
        f.failures
    );
}
