//! Shared state under load: two threads and a million decisions on one
//! engine keep every invariant with no deadlock; a flood of distinct tenant
//! keys keeps tracked keys within the cap.

use retrywise::{Action, BreakerState, CallSpec, Engine, Outcome, Policy};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn two_threads_a_million_decisions_hold_the_invariants() {
    let policy = Policy::from_str_any(
        "max_attempts: 3\nbackoff: {base_ms: 0, cap_ms: 0}\nbreaker: {min_calls: 50, window_size: 200, half_open_probes: 2, open_ms: 1, open_jitter: 0}\nbudget: {ratio: 0.2, min_per_sec: 10}\ntelemetry: {ring_size: 128}",
    )
    .unwrap();
    let e = Engine::builder(policy).seed(1).read_env(false).build().unwrap();
    let decisions = Arc::new(AtomicU64::new(0));
    let max_attempts_seen = Arc::new(AtomicU64::new(0));
    let per_thread = 500_000u64;
    let mut handles = Vec::new();
    for t in 0..2u64 {
        let e = e.clone();
        let decisions = decisions.clone();
        let max_seen = max_attempts_seen.clone();
        handles.push(std::thread::spawn(move || {
            let mut n = 0u64;
            let mut i = 0u64;
            while n < per_thread {
                i += 1;
                // Both threads share "shared"; each also has its own upstream.
                let route = if i % 2 == 0 {
                    "shared".to_string()
                } else {
                    format!("own{t}")
                };
                let mut c = e.begin(CallSpec::new(route).tenant(format!("t{}", i % 5)));
                while let Ok(a) = c.next_attempt() {
                    let fail = (i.wrapping_mul(2654435761) >> 7) % 10 < 3;
                    let d = c.report(&if fail { Outcome::status(503) } else { Outcome::success() });
                    n += 1;
                    assert!(a.number <= 3);
                    max_seen.fetch_max(a.number as u64, Ordering::Relaxed);
                    if d.is_final() {
                        break;
                    }
                    assert!(matches!(d.action, Action::Retry | Action::Fallback));
                }
            }
            decisions.fetch_add(n, Ordering::Relaxed);
        }));
    }
    // A watchdog: the workers must finish (no deadlock).
    let start = std::time::Instant::now();
    for h in handles {
        while !h.is_finished() {
            assert!(
                start.elapsed() < Duration::from_secs(300),
                "stress test did not finish: deadlock?"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        h.join().unwrap();
    }
    assert!(decisions.load(Ordering::Relaxed) >= 1_000_000);
    assert_eq!(max_attempts_seen.load(Ordering::Relaxed), 3);
    let s = e.stats();
    assert!(s.overall.attempts >= 1_000_000);
    assert!(s.overall.attempts as f64 <= s.overall.logical_requests as f64 * 3.0);
    assert!(s.events_dropped > 0, "the ring stayed bounded");
    assert!(e.events().len() <= 128);
    // No probe permit leaked: once the open period is over, every breaker
    // admits a probe again, and a success closes it.
    std::thread::sleep(Duration::from_millis(20));
    for up in ["shared", "own0", "own1"] {
        for _ in 0..3 {
            let mut c = e.begin(CallSpec::new(up));
            assert!(c.next_attempt().is_ok(), "{up}: {:?}", e.breaker_state(up));
            c.report(&Outcome::success());
        }
        assert_eq!(e.breaker_state(up), BreakerState::Closed);
    }
}

#[test]
fn a_million_tenant_keys_stay_within_the_cap() {
    let policy =
        Policy::from_str_any("budget: {scopes: [[tenant]]}\nlimits: {max_keys: 10000}\ntelemetry: {ring_size: 0}")
            .unwrap();
    let e = Engine::builder(policy).seed(1).read_env(false).build().unwrap();
    for i in 0..1_000_000u64 {
        let mut c = e.begin(CallSpec::new("up").tenant(format!("tenant-{i}")));
        c.next_attempt().unwrap();
        c.report(&Outcome::success());
    }
    let s = e.stats();
    for kind in ["budgets", "tenants", "breakers", "upstreams"] {
        assert!(s.tracked_keys[kind] <= 10_000, "{kind}: {}", s.tracked_keys[kind]);
    }
    assert!(s.evicted_keys["budgets"] >= 990_000);
    assert!(s.per_tenant.len() <= 10_000);
    assert_eq!(s.overall.logical_requests, 1_000_000);
}

/// Counters and events stay exact when calls cross threads, threads exit,
/// and the policy is reloaded while calls are in flight (each thread counts
/// into its own block; nothing may be lost when blocks are retired).
#[test]
fn counts_and_events_survive_thread_moves_exits_and_reloads() {
    let e = Engine::builder(Policy::from_str_any("telemetry: {ring_size: 100000}").unwrap())
        .seed(2)
        .read_env(false)
        .build()
        .unwrap();
    let calls_per_thread = 2_000u64;
    // Calls begun on worker threads, some finished there, some sent back and finished here.
    let (tx, rx) = std::sync::mpsc::channel();
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            let e = e.clone();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for i in 0..calls_per_thread {
                    let mut c = e.begin(CallSpec::new(format!("up{}", (t + i) % 3)).tenant("acme"));
                    c.next_attempt().unwrap();
                    if i % 3 == 0 {
                        tx.send(c).unwrap();
                    } else {
                        assert_eq!(c.report(&Outcome::success()).action, Action::Succeeded);
                    }
                    if i == calls_per_thread / 2 && t == 0 {
                        let mut p = e.policy();
                        p.version = "v2".into();
                        e.reload(p).unwrap();
                    }
                }
            })
        })
        .collect();
    drop(tx);
    let mut moved = 0u64;
    for mut c in rx {
        assert_eq!(c.report(&Outcome::success()).action, Action::Succeeded);
        moved += 1;
    }
    for w in workers {
        w.join().unwrap();
    }
    let total = 4 * calls_per_thread;
    let s = e.stats();
    assert_eq!(s.overall.logical_requests, total);
    assert_eq!(s.overall.attempts, total);
    assert_eq!(s.overall.successes, total);
    assert_eq!(s.overall.first_attempt_successes, total);
    let per_version: u64 = s.per_policy_version.values().map(|k| k.logical_requests).sum();
    assert_eq!(per_version, total);
    assert_eq!(s.per_tenant["acme"].successes, total);
    let per_upstream: u64 = s.per_upstream.values().map(|k| k.successes).sum();
    assert_eq!(per_upstream, total);
    assert!(moved > 0);
    // Three events per call (start, end, decision) and the reload; none dropped at this ring size.
    let events = e.events();
    assert_eq!(events.len() as u64, 3 * total + 1);
    assert_eq!(s.events_dropped, 0);
    let starts = events
        .iter()
        .filter(|ev| ev.kind == retrywise::EventKind::AttemptStart)
        .count() as u64;
    assert_eq!(starts, total);
}
