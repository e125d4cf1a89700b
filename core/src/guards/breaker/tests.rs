use super::*;
use crate::policy::Breaker as BreakerPolicy;
use crate::types::ErrorClass;

/// A small breaker with one probe and open periods doubling from 5 s up to 60 s,
/// so the mechanics tests read in round numbers (the defaults have their own tests).
fn params(f: impl FnOnce(&mut BreakerPolicy)) -> BreakerParams {
    let mut p = BreakerPolicy {
        min_calls: 4,
        window_size: 10,
        open_jitter: 0.0,
        close_after: 2,
        half_open_probes: 1,
        open_ms: 5_000,
        open_factor: 2.0,
        open_max_ms: 60_000,
        ..BreakerPolicy::default()
    };
    f(&mut p);
    BreakerParams::new(&p)
}

fn fail(b: &BreakerCell, p: &BreakerParams, t: u64) -> Option<Transition> {
    let (a, _) = b.acquire(p, None, t);
    assert_eq!(a, Admit::Allowed { probe: false });
    b.record(p, None, t, false, Record::Failure, false)
}

/// The lock-free count window trips at exactly the call, and for exactly
/// the reason, a reference model (every outcome kept) says, over random
/// sequences of failures, slow calls and successes.
#[test]
fn count_window_trips_when_the_reference_model_does() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(7);
    let mut trips = 0;
    for case in 0..3_000 {
        let size = [1u64, 5, 10, 64, 100][case % 5];
        let min_calls = [1u32, 4, 10, 20][case / 5 % 4];
        let failure_rate = [Some(0.5), Some(0.2), None][case / 20 % 3];
        let slow_call_rate = [None, Some(0.3)][case / 60 % 2];
        let consecutive = [None, Some(3)][case / 120 % 2];
        let p = params(|b| {
            b.window_size = size;
            b.min_calls = min_calls;
            b.failure_rate = failure_rate;
            b.slow_call_rate = slow_call_rate;
            b.consecutive_failures = consecutive;
            // The count alone (a run's span has a test of its own).
            b.consecutive_min_ms = 0;
        });
        let b = BreakerCell::new(p.clone(), 1);
        let (pf, ps) = (rng.gen_range(0.0..0.6), rng.gen_range(0.0..0.5));
        let mut seen: Vec<(bool, bool)> = Vec::new();
        let mut run = 0u32;
        for _ in 0..300 {
            let (failure, slow) = (rng.gen_bool(pf), rng.gen_bool(ps));
            seen.push((failure, slow));
            run = if failure { run + 1 } else { 0 };
            let last = &seen[seen.len().saturating_sub(size as usize)..];
            let n = last.len() as f64;
            let (f, sl) = (
                last.iter().filter(|x| x.0).count() as f64,
                last.iter().filter(|x| x.1).count() as f64,
            );
            let judged = last.len() >= min_calls as usize;
            let want = if consecutive.is_some_and(|c| run >= c) {
                Some("consecutive_failures")
            } else if judged && failure_rate.is_some_and(|r| f >= r * n) {
                Some("failure_rate")
            } else if judged && slow_call_rate.is_some_and(|r| sl >= r * n) {
                Some("slow_call_rate")
            } else {
                None
            };
            let rec = if failure { Record::Failure } else { Record::Success };
            let got = b.record(&p, None, 0, false, rec, slow).map(|t| t.reason);
            assert_eq!(got, want, "case {case} after {seen:?}");
            if got.is_some() {
                trips += 1;
                break;
            }
        }
    }
    assert!(trips > 1_000, "the sequences trip often enough to test: {trips}");
}

#[test]
fn closed_open_half_open_closed() {
    let p = params(|_| {});
    let b = BreakerCell::new(p.clone(), 1);
    assert!(fail(&b, &p, 0).is_none());
    assert!(fail(&b, &p, 0).is_none());
    assert!(fail(&b, &p, 0).is_none());
    let t = fail(&b, &p, 0).unwrap();
    assert_eq!(
        (t.from, t.to, t.reason, t.open_for_ms),
        (BreakerState::Closed, BreakerState::Open, "failure_rate", 5_000)
    );
    assert_eq!(b.acquire(&p, None, 4_999).0, Admit::Rejected { retry_in_ms: 1 });
    let (a, t) = b.acquire(&p, None, 5_000);
    assert_eq!(a, Admit::Allowed { probe: true });
    assert_eq!(t.unwrap().to, BreakerState::HalfOpen);
    // Only one probe in flight.
    assert_eq!(b.acquire(&p, None, 5_000).0, Admit::Rejected { retry_in_ms: 0 });
    assert!(b.record(&p, None, 5_001, true, Record::Success, false).is_none());
    assert_eq!(b.acquire(&p, None, 5_002).0, Admit::Allowed { probe: true });
    let t = b.record(&p, None, 5_003, true, Record::Success, false).unwrap();
    assert_eq!((t.from, t.to), (BreakerState::HalfOpen, BreakerState::Closed));
    assert_eq!(b.state(&p, None, 5_003), BreakerState::Closed);
    assert_eq!(b.window_counts(&p, 5_003), (0, 0, 0));
}

#[test]
fn half_open_failure_reopens_with_growing_duration() {
    let p = params(|_| {});
    let b = BreakerCell::new(p.clone(), 1);
    for _ in 0..4 {
        fail(&b, &p, 0);
    }
    let (a, _) = b.acquire(&p, None, 5_000);
    assert_eq!(a, Admit::Allowed { probe: true });
    let t = b.record(&p, None, 5_000, true, Record::Failure, false).unwrap();
    assert_eq!(
        (t.from, t.to, t.reason, t.open_for_ms),
        (BreakerState::HalfOpen, BreakerState::Open, "probe_failed", 10_000)
    );
    b.acquire(&p, None, 15_000);
    let t = b.record(&p, None, 15_000, true, Record::Failure, false).unwrap();
    assert_eq!(t.open_for_ms, 20_000);
    for k in 0..5 {
        let now = 1_000_000 * (k + 1);
        b.acquire(&p, None, now);
        let t = b.record(&p, None, now, true, Record::Failure, false).unwrap();
        assert!(t.open_for_ms <= 60_000);
    }
}

#[test]
fn ignored_outcomes_and_min_calls() {
    let p = params(|_| {});
    let b = BreakerCell::new(p.clone(), 1);
    for _ in 0..10 {
        b.acquire(&p, None, 0);
        assert!(b.record(&p, None, 0, false, Record::Ignored, false).is_none());
    }
    assert_eq!(b.state(&p, None, 0), BreakerState::Closed);
    // 3 failures < min_calls 4: no trip.
    for _ in 0..3 {
        assert!(fail(&b, &p, 0).is_none());
    }
    assert!(!p.counts(ErrorClass::InvalidRequest));
    assert!(!p.counts(ErrorClass::AuthOrPolicy));
    assert!(p.counts(ErrorClass::Transient));
    assert!(!p.counts(ErrorClass::RateLimit));
}

#[test]
fn consecutive_and_slow_call_trips() {
    let p = params(|p| {
        p.failure_rate = None;
        p.consecutive_failures = Some(3);
        p.consecutive_min_ms = 0;
    });
    let b = BreakerCell::new(p.clone(), 1);
    fail(&b, &p, 0);
    fail(&b, &p, 0);
    assert_eq!(fail(&b, &p, 0).unwrap().reason, "consecutive_failures");

    // A run must also last consecutive_min_ms: failures in a row within
    // milliseconds are a busy upstream's noise; a second with no success is not.
    let p = params(|p| {
        p.failure_rate = None;
        p.consecutive_failures = Some(3);
        p.consecutive_min_ms = 1_000;
    });
    let b = BreakerCell::new(p.clone(), 1);
    for t in [0, 10, 20, 30, 999] {
        assert!(fail(&b, &p, t).is_none(), "{t}");
    }
    assert_eq!(fail(&b, &p, 1_000).unwrap().reason, "consecutive_failures");
    // A success starts the run again: its clock too.
    let b = BreakerCell::new(p.clone(), 1);
    for t in [0, 500] {
        assert!(fail(&b, &p, t).is_none());
    }
    assert!(b.record(&p, None, 900, false, Record::Success, false).is_none());
    for t in [1_000, 1_500, 1_999] {
        assert!(fail(&b, &p, t).is_none(), "{t}");
    }
    assert_eq!(fail(&b, &p, 2_000).unwrap().reason, "consecutive_failures");

    let p = params(|p| {
        p.failure_rate = None;
        p.slow_call_ms = Some(1_000);
        p.slow_call_rate = Some(0.5);
    });
    let b = BreakerCell::new(p.clone(), 1);
    assert!(p.is_slow(1_000) && !p.is_slow(999));
    let mut last = None;
    for _ in 0..4 {
        b.acquire(&p, None, 0);
        last = b.record(&p, None, 0, false, Record::Success, true);
    }
    assert_eq!(last.unwrap().reason, "slow_call_rate");
}

#[test]
fn overrides() {
    let p = params(|_| {});
    let b = BreakerCell::new(p.clone(), 1);
    assert_eq!(
        b.acquire(&p, Some(BreakerOverride::ForceOpen), 0).0,
        Admit::Rejected { retry_in_ms: NEVER },
        "forced open: no probe will come"
    );
    for ovr in [BreakerOverride::MetricsOnly, BreakerOverride::ForceClosed] {
        for _ in 0..50 {
            assert_eq!(b.acquire(&p, Some(ovr), 0).0, Admit::Allowed { probe: false });
            assert!(b.record(&p, Some(ovr), 0, false, Record::Failure, false).is_none());
        }
    }
    assert!(b.window_counts(&p, 0).1 > 0, "metrics_only records");
    let d = BreakerCell::new(p.clone(), 1);
    for _ in 0..50 {
        d.record(&p, Some(BreakerOverride::Disabled), 0, false, Record::Failure, false);
    }
    assert_eq!(d.window_counts(&p, 0), (0, 0, 0));
    assert_eq!(
        b.state(&p, Some(BreakerOverride::MetricsOnly), 0),
        BreakerState::MetricsOnly
    );
}

#[test]
fn time_window_expires() {
    let p = params(|p| {
        p.window = WindowKind::Time;
        p.window_size = 10_000;
        p.buckets = 10;
    });
    let b = BreakerCell::new(p.clone(), 1);
    for _ in 0..3 {
        fail(&b, &p, 0);
    }
    assert_eq!(b.window_counts(&p, 9_999), (3, 3, 0));
    assert_eq!(b.window_counts(&p, 10_000), (0, 0, 0));
    // The old failures no longer count towards a trip.
    assert!(fail(&b, &p, 10_000).is_none());
}

#[test]
fn jitter_spreads_open_durations_deterministically() {
    let p = params(|p| p.open_jitter = 0.2);
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..20u64 {
        let b = BreakerCell::new(p.clone(), seed);
        let mut t = None;
        for _ in 0..4 {
            t = fail(&b, &p, 0);
        }
        let d = t.unwrap().open_for_ms;
        assert!((4_000..=6_000).contains(&d), "{d}");
        seen.insert(d);
        let again = BreakerCell::new(p.clone(), seed);
        let mut t2 = None;
        for _ in 0..4 {
            t2 = fail(&again, &p, 0);
        }
        assert_eq!(t2.unwrap().open_for_ms, d);
    }
    assert!(seen.len() > 10);
}
