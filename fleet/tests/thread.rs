//! The adapter's background thread on the system clock, against a real
//! Redis: what the process tests drive cycle by cycle runs here on its own.
//! The waits poll for an outcome with a generous cap; nothing is asserted
//! about how fast it came.

mod common;

use common::{call, Redis, POLICY};
use retrywise::{BreakerState, Engine, FleetConfig, Policy};
use retrywise_fleet::RedisFleet;
use std::time::{Duration, Instant};

fn engine() -> Engine {
    Engine::builder(Policy::from_str_any(POLICY).unwrap())
        .read_env(false)
        .build()
        .unwrap()
}

/// Polls `done` for up to 10 s.
fn eventually(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_background_thread_shares_an_open_and_keeps_deciding_with_redis_gone() {
    let mut redis = Redis::start();
    let (a, b) = (engine(), engine());
    let cfg = |name: &str| FleetConfig {
        instance: name.into(),
        quorum: 1,
        interval: Duration::from_millis(20),
        ..FleetConfig::default()
    };
    let fa = RedisFleet::connect(a.fleet(cfg("a")).unwrap(), &redis.url())
        .unwrap()
        .start();
    let fb = RedisFleet::connect(b.fleet(cfg("b")).unwrap(), &redis.url())
        .unwrap()
        .start();
    assert_eq!(call(&b, 200), "sent", "b knows the scope");
    for _ in 0..4 {
        assert_eq!(call(&a, 503), "sent");
    }
    assert_eq!(a.breaker_state("up"), BreakerState::Open);
    eventually("b adopts a's open", || b.breaker_state("up") == BreakerState::Open);
    assert_eq!(call(&b, 200), "breaker_open");
    assert_eq!(fb.fleet().stats().opened, 1);
    redis.kill();
    eventually("a notices Redis is gone", || !fa.fleet().healthy());
    // Decisions go on from local state.
    assert_eq!(
        (call(&a, 200), call(&b, 200)),
        ("breaker_open".into(), "breaker_open".into())
    );
    assert!(fa.fleet().stats().failures >= 1);
}
