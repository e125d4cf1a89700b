//! Breaker recovery with the default open periods and probes: how long a
//! recovered upstream can stay unused, how many probes half-open admits,
//! and that calls during an outage do not each touch the upstream.

use retrywise::internals::{Admit, BreakerCell, BreakerParams, Record, Transition};
use retrywise::policy::Breaker;
use retrywise::BreakerState;
use retrywise::{CallSpec, Engine, ManualClock, Outcome, Policy, Reason};
use std::sync::Arc;

/// The default breaker, tripping after 4 counted failures (the open
/// periods, jitter, probes and close threshold are the defaults).
fn defaults(jitter: Option<f64>) -> BreakerParams {
    let d = Breaker::default();
    BreakerParams::new(&Breaker {
        min_calls: 4,
        window_size: 10,
        open_jitter: jitter.unwrap_or(d.open_jitter),
        ..d
    })
}

fn trip(b: &BreakerCell, p: &BreakerParams, now: u64) -> Transition {
    let mut last = None;
    for _ in 0..4 {
        assert_eq!(b.acquire(p, None, now).0, Admit::Allowed { probe: false });
        last = b.record(p, None, now, false, Record::Failure, false);
    }
    last.expect("4 failures of 4 trip the breaker")
}

/// A probe at `now` that fails: the breaker reopens; returns the new open period.
fn failed_probe(b: &BreakerCell, p: &BreakerParams, now: u64) -> u64 {
    assert_eq!(b.acquire(p, None, now).0, Admit::Allowed { probe: true });
    let t = b.record(p, None, now, true, Record::Failure, false).unwrap();
    assert_eq!(
        (t.from, t.to, t.reason),
        (BreakerState::HalfOpen, BreakerState::Open, "probe_failed")
    );
    t.open_for_ms
}

#[test]
fn defaults_are_the_documented_ones() {
    let d = Breaker::default();
    assert_eq!(
        (
            d.open_ms,
            d.open_factor,
            d.open_max_ms,
            d.open_jitter,
            d.half_open_probes,
            d.close_after
        ),
        (1_000, 1.5, 20_000, 0.1, 10, 2)
    );
    assert_eq!((d.hold, d.hold_jitter_ms, d.hold_max_ms), (true, 1_000, 1_000));
}

#[test]
fn open_periods_grow_by_half_and_stop_at_the_cap() {
    let p = defaults(Some(0.0));
    let b = BreakerCell::new(p.clone(), 1);
    let t = trip(&b, &p, 0);
    assert_eq!((t.reason, t.open_for_ms), ("failure_rate", 1_000));
    let mut now = 1_000;
    let mut periods = Vec::new();
    for _ in 0..9 {
        assert_eq!(b.acquire(&p, None, now - 1).0, Admit::Rejected { retry_in_ms: 1 });
        let d = failed_probe(&b, &p, now);
        periods.push(d);
        now += d;
    }
    assert_eq!(
        periods,
        [1_500, 2_250, 3_375, 5_063, 7_594, 11_391, 17_086, 20_000, 20_000]
    );
}

#[test]
fn jitter_never_takes_an_open_period_past_the_cap() {
    let p = defaults(None);
    let mut at_cap = std::collections::BTreeSet::new();
    for seed in 0..200u64 {
        let b = BreakerCell::new(p.clone(), seed);
        let first = trip(&b, &p, 0).open_for_ms;
        // Below the cap the spread is the full ± 10 %.
        assert!((900..=1_100).contains(&first), "{first}");
        let mut now = first;
        for k in 2..=12u32 {
            let d = failed_probe(&b, &p, now);
            assert!(d <= 20_000, "seed {seed}, trip {k}: {d} ms");
            if k >= 9 {
                // 1 000 × 1.5^8 > 20 000: capped, spread downwards only.
                assert!((18_000..=20_000).contains(&d), "seed {seed}, trip {k}: {d} ms");
                at_cap.insert(d);
            }
            now += d;
        }
    }
    assert!(
        at_cap.len() > 100,
        "instances still probe at different times at the cap: {}",
        at_cap.len()
    );
}

#[test]
fn half_open_admits_ten_probes_and_closes_after_two_successes() {
    let p = defaults(Some(0.0));
    let b = BreakerCell::new(p.clone(), 1);
    trip(&b, &p, 0);
    for i in 0..10 {
        let (a, t) = b.acquire(&p, None, 1_000);
        assert_eq!(a, Admit::Allowed { probe: true }, "probe {i}");
        assert_eq!(
            t.map(|t| (t.from, t.to)),
            (i == 0).then_some((BreakerState::Open, BreakerState::HalfOpen))
        );
    }
    assert_eq!(b.probes_in_flight(), 10);
    assert_eq!(b.acquire(&p, None, 1_000).0, Admit::Rejected { retry_in_ms: 0 });
    assert!(b.record(&p, None, 1_400, true, Record::Success, false).is_none());
    assert_eq!(b.state(&p, None, 1_400), BreakerState::HalfOpen);
    // A probe abandoned without an outcome frees its slot for another.
    b.release(&p, true);
    assert_eq!(b.probes_in_flight(), 8);
    assert_eq!(b.acquire(&p, None, 1_450).0, Admit::Allowed { probe: true });
    let t = b.record(&p, None, 1_500, true, Record::Success, false).unwrap();
    assert_eq!(
        (t.from, t.to, t.reason),
        (BreakerState::HalfOpen, BreakerState::Closed, "probes_succeeded")
    );
    assert_eq!(b.acquire(&p, None, 1_500).0, Admit::Allowed { probe: false });
    // The probes still in flight report into the fresh window like any call.
    for _ in 0..8 {
        assert!(b.record(&p, None, 1_600, true, Record::Success, false).is_none());
    }
    assert_eq!(b.window_counts(&p, 1_600), (8, 0, 0));
}

#[test]
fn one_failed_probe_reopens_and_the_others_do_not_steer_it() {
    let p = defaults(Some(0.0));
    let b = BreakerCell::new(p.clone(), 1);
    trip(&b, &p, 0);
    for _ in 0..10 {
        b.acquire(&p, None, 1_000);
    }
    assert!(b.record(&p, None, 1_100, true, Record::Success, false).is_none());
    let t = b.record(&p, None, 1_200, true, Record::Failure, false).unwrap();
    assert_eq!(
        (t.to, t.reason, t.open_for_ms),
        (BreakerState::Open, "probe_failed", 1_500)
    );
    for rec in [Record::Success, Record::Success, Record::Failure] {
        assert!(b.record(&p, None, 1_300, true, rec, false).is_none());
    }
    assert_eq!(b.state(&p, None, 2_699), BreakerState::Open);
    assert_eq!(b.acquire(&p, None, 2_700).0, Admit::Allowed { probe: true });
}

/// Whenever the upstream recovers, the breaker admits a probe within
/// `open_max_ms` of it and closes on that round of probes.
#[test]
fn a_recovered_upstream_is_back_within_the_cap() {
    let p = defaults(None);
    for seed in 0..20u64 {
        for recovers_at in (1_000..180_000u64).step_by(7_919) {
            let b = BreakerCell::new(p.clone(), seed);
            let mut now = trip(&b, &p, 0).open_for_ms;
            while now < recovers_at {
                now += failed_probe(&b, &p, now);
            }
            assert!(
                now - recovers_at <= 20_000,
                "seed {seed}: recovered at {recovers_at}, probed at {now}"
            );
            for _ in 0..2 {
                assert_eq!(b.acquire(&p, None, now).0, Admit::Allowed { probe: true });
            }
            assert!(b.record(&p, None, now, true, Record::Success, false).is_none());
            let t = b.record(&p, None, now, true, Record::Success, false).unwrap();
            assert_eq!(t.to, BreakerState::Closed);
        }
    }
}

/// The same through the engine, on a manual clock: one call every 100 ms to
/// a single upstream that is down from 0 to 45 s. While it is down, only
/// probes reach it (not every call); after it recovers, calls are served
/// again within `open_max_ms`.
#[test]
fn engine_an_outage_touches_the_upstream_only_with_probes_and_ends_within_the_cap() {
    let policy = Policy::from_str_any("max_attempts: 1\nbudget: {enabled: false}").unwrap();
    let clock = ManualClock::new();
    let e = Engine::builder(policy)
        .clock(Arc::new(clock.clone()))
        .seed(9)
        .build()
        .unwrap();
    let recovers_at = 45_000u64;
    let (mut sent_down, mut refused, mut first_ok) = (0u32, 0u32, None);
    let mut now = 0u64;
    while now < 120_000 && e.breaker_state("up") != BreakerState::Closed || now < recovers_at {
        let mut c = e.begin(CallSpec::new("up"));
        match c.next_attempt() {
            Ok(_) if now < recovers_at => {
                sent_down += 1;
                let _ = c.report(&Outcome::status(503));
            }
            Ok(_) => {
                c.report(&Outcome::success());
                first_ok.get_or_insert(now);
            }
            Err(s) => {
                assert_eq!(s.reason, Reason::BreakerOpen);
                refused += 1;
            }
        }
        clock.advance_ms(100);
        now += 100;
    }
    let first_ok = first_ok.expect("the upstream is used again");
    assert!(first_ok - recovers_at <= 20_000, "back at {first_ok} ms");
    // Failures in a row for a second trip it at 1.0 s, on the eleventh
    // (`consecutive_failures` 5 lasting `consecutive_min_ms` 1 000, before
    // the rate window has its 20 calls); afterwards one probe as each open
    // period ends: 1, 1.5, 2.25, 3.4, 5.1, 7.6 and 11.4 s (± 10 %) end
    // before 45 s, the eighth (17.1 s) after it, at 51.3 s. (Doubling from
    // 5 s up to 60 s, the periods of 5, 10, 20 and 40 s left it unused until
    // 76.9 s.)
    assert_eq!(sent_down, 11 + 7, "calls that reached the upstream while it was down");
    assert_eq!(first_ok, 51_300);
    assert!(refused >= 480, "{refused} calls refused without touching it");
    // The second probe success closes it: every call is admitted again.
    assert!(
        now - first_ok <= 200,
        "closed {} ms after the first success",
        now - first_ok
    );
}
