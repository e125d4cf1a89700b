//! The table through its public API: exact admission decisions on injected
//! time and a seeded RNG, refusal handling, scopes, handles, telemetry, and
//! the safety property against a simulated provider.

use super::*;
use crate::rules::deadline::TokenEstimate;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod learn;
mod slots;

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
const SCOPE: &str = "key-a/openai/gpt-4o";

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn wall() -> SystemTime {
    UNIX_EPOCH + secs(1_735_689_600)
}

fn rng() -> Pcg64Mcg {
    Pcg64Mcg::seed_from_u64(26)
}

fn requests(limit: Option<u64>, remaining: u64, reset: Option<Duration>) -> Reading {
    Reading::default().with_window(
        Kind::Requests,
        Window {
            limit,
            remaining: Some(remaining),
            reset,
            window: None,
        },
    )
}

/// A reading of a per-minute requests window that says so (as IETF `w` does).
fn per_minute(limit: u64, remaining: u64, reset: Duration) -> Reading {
    Reading::default().with_window(
        Kind::Requests,
        Window {
            limit: Some(limit),
            remaining: Some(remaining),
            reset: Some(reset),
            window: Some(secs(60)),
        },
    )
}

fn none() -> TokenEstimate {
    TokenEstimate::default()
}

fn est(input: u64, output: u64) -> TokenEstimate {
    TokenEstimate {
        input: Some(input),
        max_output: Some(output),
    }
}

/// What an admission was, without its handles.
#[derive(Debug, Clone, Copy, PartialEq)]
enum D {
    Go,
    Wait(Duration),
    Stop(StopWhy),
}

fn kind_of(a: &Admission) -> D {
    match a {
        Admission::Go(_) => D::Go,
        Admission::Wait { wait, .. } => D::Wait(*wait),
        Admission::Stop(w) => D::Stop(*w),
    }
}

fn kind(snap: &RateLimitSnapshot, k: Kind) -> KindSnapshot {
    *snap.scopes[0].kinds.iter().find(|x| x.kind == k).expect("kind shown")
}

fn ask(l: &RateLimits, scope: &str, now: u64, left: Duration, r: &mut Pcg64Mcg) -> Admission {
    l.admit(scope, now, none(), left, None, r)
}

#[test]
fn attempts_sent_before_the_first_reading_are_counted_against_it() {
    let mut r = rng();
    let l = RateLimits::default();
    let first: Vec<Admission> = (0..3).map(|_| ask(&l, SCOPE, 0, secs(60), &mut r)).collect();
    let mut first = first.into_iter().map(|a| match a {
        Admission::Go(res) => res,
        a => panic!("{a:?}"),
    });
    // The first response: 2 left. The other two attempts are still in flight.
    let reading = requests(Some(10), 2, Some(secs(30)));
    l.settle(SCOPE, first.next().unwrap(), &reading, Usage::sent(), 500 * MS);
    assert_eq!(kind(&l.snapshot(500 * MS), Kind::Requests).available, Some(0));
    assert!(matches!(
        kind_of(&ask(&l, SCOPE, 500 * MS, secs(60), &mut r)),
        D::Wait(_)
    ));
}

#[test]
fn a_remaining_allowance_admits_exactly_that_many_then_paces() {
    let l = RateLimits::default();
    l.observe(SCOPE, &requests(Some(10), 3, Some(secs(30))), 0);
    let mut r = rng();
    let gos: Vec<Admission> = (0..3).map(|_| ask(&l, SCOPE, S, secs(60), &mut r)).collect();
    assert!(gos.iter().all(|a| kind_of(a) == D::Go));
    let a = ask(&l, SCOPE, S, secs(60), &mut r);
    assert!(
        matches!(kind_of(&a), D::Wait(w) if w >= secs(29) && w <= secs(35)),
        "{a:?}"
    );
    // In-flight attempts are counted until settled; their own readings then take over.
    let snap = l.snapshot(S);
    let k = snap.scopes[0].kinds[0];
    assert_eq!((k.remaining, k.available, k.in_flight), (Some(3), Some(0), 3));
    assert_eq!(k.reset_in, Some(secs(29)));
}

#[test]
fn token_estimates_are_reserved_and_settled_against_usage() {
    let l = RateLimits::default();
    let tokens = |remaining| {
        Reading::default().with_window(
            Kind::Tokens,
            Window {
                limit: Some(100_000),
                remaining: Some(remaining),
                reset: Some(secs(60)),
                window: None,
            },
        )
    };
    l.observe(SCOPE, &tokens(10_000), 0);
    let mut r = rng();
    let a = l.admit(SCOPE, 0, est(3_000, 1_000), secs(1), None, &mut r);
    let b = l.admit(SCOPE, 0, est(3_000, 1_000), secs(1), None, &mut r);
    let (Admission::Go(a), Admission::Go(b)) = (a, b) else {
        panic!()
    };
    assert_eq!(
        (
            a.cost(Kind::Tokens),
            a.cost(Kind::InputTokens),
            a.cost(Kind::OutputTokens)
        ),
        (4_000, 3_000, 1_000)
    );
    // 2 000 left: a third estimate of 4 000 does not fit; 1 000 would.
    let c = l.admit(SCOPE, 0, est(3_000, 1_000), secs(1), None, &mut r);
    assert_eq!(kind_of(&c), D::Stop(StopWhy::RateLimitedUntil(secs(60))));
    let d = l.admit(SCOPE, 0, est(500, 500), secs(1), None, &mut r);
    let Admission::Go(d) = d else { panic!("{d:?}") };
    // a's response says 5 000 remain (it counts a): a leaves the ledger.
    l.settle(SCOPE, a, &tokens(5_000), Usage::tokens(2_000, 300), MS);
    assert_eq!(
        kind(&l.snapshot(MS), Kind::Tokens).available,
        Some(5_000 - 4_000 - 1_000)
    );
    // b ends with no headers: what it used (per its usage) stays counted until the reset.
    l.settle(SCOPE, b, &Reading::default(), Usage::tokens(1_000, 200), MS);
    assert_eq!(
        kind(&l.snapshot(MS), Kind::Tokens).available,
        Some(5_000 - 1_000 - 1_200)
    );
    // d never left the process: all of it comes back.
    l.settle(SCOPE, d, &Reading::default(), Usage::not_sent(), MS);
    assert_eq!(kind(&l.snapshot(MS), Kind::Tokens).available, Some(5_000 - 1_200));
    // Unknown estimates reserve nothing but still need one unit of each known limit.
    l.observe(SCOPE, &tokens(0), 2 * MS);
    let e = l.admit(SCOPE, 2 * MS, none(), secs(1), None, &mut r);
    assert!(matches!(kind_of(&e), D::Stop(StopWhy::RateLimitedUntil(_))));
}

#[test]
fn a_429_holds_its_scope_until_retry_after_never_a_day() {
    let mut r = rng();
    let l = RateLimits::default();
    l.observe(SCOPE, &Reading::default().rate_limited().retry_delay(secs(5)), 0);
    // Limit unknown: the waiters are spread over one second after the hint.
    match kind_of(&ask(&l, SCOPE, 0, secs(60), &mut r)) {
        D::Wait(w) => assert!(w >= secs(5) && w <= secs(6), "{w:?}"),
        d => panic!("{d:?}"),
    }
    // The hold is over: one probe goes (the limit is unknown), the others wait for its answer.
    assert_eq!(kind_of(&ask(&l, SCOPE, 5 * S, secs(60), &mut r)), D::Go);
    assert!(matches!(kind_of(&ask(&l, SCOPE, 5 * S, secs(60), &mut r)), D::Wait(w) if w <= secs(2)));
    // A day-long Retry-After on a rate limit is held for max_hold (60 s) only.
    let l = RateLimits::default();
    l.observe(SCOPE, &Reading::default().rate_limited().retry_delay(secs(86_400)), 0);
    assert_eq!(
        kind_of(&ask(&l, SCOPE, 0, secs(30), &mut r)),
        D::Stop(StopWhy::RateLimitedUntil(secs(60)))
    );
    assert_eq!(kind_of(&ask(&l, SCOPE, 60 * S, secs(30), &mut r)), D::Go);
    // No hint at all: the default reset (1 s).
    let l = RateLimits::default();
    l.observe(SCOPE, &Reading::default().rate_limited(), 0);
    assert!(matches!(kind_of(&ask(&l, SCOPE, 0, secs(60), &mut r)), D::Wait(w) if w >= secs(1) && w <= secs(2)));
    // A hold with a known limit refills it at the end, and the reading's own reset is used.
    let l = RateLimits::default();
    let refusal = Reading::parse(
        [
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-remaining-requests", "3"),
            ("x-ratelimit-reset-tokens", "7s"),
        ],
        wall(),
    )
    .rate_limited();
    l.observe(SCOPE, &refusal, 0);
    assert_eq!(
        kind_of(&ask(&l, SCOPE, 0, secs(1), &mut r)),
        D::Stop(StopWhy::RateLimitedUntil(secs(7)))
    );
    let snap = l.snapshot(7 * S);
    assert_eq!(snap.scopes[0].kinds[0].available, Some(60));
    assert_eq!(snap.counters.rate_limited, 1);
}

#[test]
fn a_429_whose_reading_shows_the_exhausted_window_waits_for_that_window() {
    let mut r = rng();
    let l = RateLimits::default();
    let refusal = Reading::parse(
        [
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("anthropic-ratelimit-output-tokens-remaining", "0"),
            ("anthropic-ratelimit-output-tokens-reset", "2025-01-01T00:00:12Z"),
            ("anthropic-ratelimit-requests-remaining", "40"),
        ],
        wall(),
    )
    .rate_limited();
    l.observe(SCOPE, &refusal, 0);
    let a = l.admit(SCOPE, 0, est(100, 1_000), secs(5), None, &mut r);
    assert_eq!(kind_of(&a), D::Stop(StopWhy::RateLimitedUntil(secs(12))));
    // Requests were not held: the refusal named its window.
    assert_eq!(l.snapshot(0).scopes[0].kinds[0].available, Some(40));
    assert_eq!(
        kind_of(&l.admit(SCOPE, 12 * S, est(100, 1_000), secs(5), None, &mut r)),
        D::Go
    );
}

#[test]
fn a_per_model_429_does_not_slow_other_models_or_keys() {
    let mut r = rng();
    let l = RateLimits::default();
    l.observe(
        "key-a/openai/gpt-4o",
        &Reading::default().rate_limited().retry_delay(secs(30)),
        0,
    );
    l.observe("key-a/openai/gpt-4o", &Reading::default().quota_exhausted(), 0);
    assert!(matches!(
        kind_of(&ask(&l, "key-a/openai/gpt-4o", 0, secs(60), &mut r)),
        D::Stop(_)
    ));
    for other in ["key-a/openai/gpt-4o-mini", "key-b/openai/gpt-4o", "key-a/azure/gpt-4o"] {
        assert_eq!(kind_of(&ask(&l, other, 0, secs(60), &mut r)), D::Go, "{other}");
    }
}

#[test]
fn an_exhausted_quota_stops_at_once_then_lets_one_probe() {
    let mut r = rng();
    let l = RateLimits::default();
    // Gemini: a 429 whose QuotaFailure names a per-day quota, RetryInfo 20 s.
    let gemini = Reading::default()
        .rate_limited()
        .quota_exhausted()
        .retry_delay(secs(20));
    l.observe(SCOPE, &gemini, 0);
    for now in [0, 30 * S, 60 * S - 1] {
        let a = ask(&l, SCOPE, now, secs(3600), &mut r);
        assert_eq!(kind_of(&a), D::Stop(StopWhy::QuotaExhausted), "{now}");
    }
    // After quota_hold (60 s, longer than the hint): one probe goes, the rest still stop.
    let probe = ask(&l, SCOPE, 60 * S, secs(3600), &mut r);
    assert_eq!(kind_of(&probe), D::Go);
    assert_eq!(
        kind_of(&ask(&l, SCOPE, 60 * S, secs(3600), &mut r)),
        D::Stop(StopWhy::QuotaExhausted)
    );
    // Its connection fails: that says nothing about the quota, the hold stays.
    let Admission::Go(probe) = probe else { panic!() };
    l.settle(SCOPE, probe, &Reading::default(), Usage::sent(), 60 * S);
    let a = ask(&l, SCOPE, 61 * S, secs(3600), &mut r);
    assert_eq!(kind_of(&a), D::Stop(StopWhy::QuotaExhausted));
    // The next probe (a quota hold later) succeeds, with no rate-limit headers at all: the hold ends.
    let Admission::Go(probe) = ask(&l, SCOPE, 120 * S, secs(3600), &mut r) else {
        panic!()
    };
    let ok = Reading::parse([("content-type", "application/json")], wall());
    l.settle(SCOPE, probe, &ok, Usage::sent(), 121 * S);
    assert_eq!(kind_of(&ask(&l, SCOPE, 121 * S, secs(3600), &mut r)), D::Go);
    // A longer hint than the hold is respected.
    let day = Reading::default().quota_exhausted().retry_delay(secs(7200));
    l.observe(SCOPE, &day, 122 * S);
    let later = (122 + 7199) * S;
    let a = ask(&l, SCOPE, later, secs(60), &mut r);
    assert_eq!(kind_of(&a), D::Stop(StopWhy::QuotaExhausted));
    assert_eq!(kind_of(&ask(&l, SCOPE, later + S, secs(60), &mut r)), D::Go);
    let c = l.counters();
    assert_eq!((c.quota_exhausted, c.stops_quota), (2, 6));
}

#[test]
fn azure_remaining_without_a_reset_is_rechecked_after_a_second() {
    let mut r = rng();
    let l = RateLimits::default();
    let azure = |requests: &str| {
        Reading::parse(
            [
                ("x-ratelimit-remaining-requests", requests),
                ("x-ratelimit-remaining-tokens", "-1"),
            ],
            wall(),
        )
    };
    l.observe(SCOPE, &azure("2"), 0);
    let Admission::Go(a) = ask(&l, SCOPE, 0, secs(60), &mut r) else {
        panic!()
    };
    let Admission::Go(b) = ask(&l, SCOPE, 0, secs(60), &mut r) else {
        panic!()
    };
    assert!(matches!(kind_of(&ask(&l, SCOPE, 0, secs(60), &mut r)), D::Wait(w) if w >= secs(1) && w <= secs(2)));
    l.settle(SCOPE, a, &azure("1"), Usage::sent(), MS);
    l.settle(SCOPE, b, &azure("0"), Usage::sent(), 2 * MS);
    // No limit known: after the recheck one probe goes, the others wait for its reading...
    let Admission::Go(_probe) = ask(&l, SCOPE, S + 2 * MS, secs(60), &mut r) else {
        panic!()
    };
    assert!(matches!(
        kind_of(&ask(&l, SCOPE, S + 2 * MS, secs(60), &mut r)),
        D::Wait(_)
    ));
    // ... or for the next recheck, after which nothing constrains the scope until a reading.
    assert_eq!(kind_of(&ask(&l, SCOPE, 2 * S + 2 * MS, secs(60), &mut r)), D::Go);
    assert_eq!(kind_of(&ask(&l, SCOPE, 2 * S + 2 * MS, secs(60), &mut r)), D::Go);
}

#[test]
fn late_readings_of_the_same_window_never_raise_remaining() {
    let mut r = rng();
    let l = RateLimits::default();
    l.observe(SCOPE, &requests(Some(60), 10, Some(secs(30))), 0);
    // Two attempts leave; the provider counts the second one first.
    let Admission::Go(a) = ask(&l, SCOPE, MS, secs(60), &mut r) else {
        panic!()
    };
    let Admission::Go(b) = ask(&l, SCOPE, MS, secs(60), &mut r) else {
        panic!()
    };
    l.settle(SCOPE, b, &requests(Some(60), 8, Some(secs(29))), Usage::sent(), 2 * MS);
    // a's reading, produced before b was counted, arrives last: it cannot raise remaining.
    l.settle(SCOPE, a, &requests(Some(60), 9, Some(secs(29))), Usage::sent(), 3 * MS);
    assert_eq!(kind(&l.snapshot(3 * MS), Kind::Requests).remaining, Some(8));
    let Admission::Go(c) = ask(&l, SCOPE, 4 * MS, secs(60), &mut r) else {
        panic!()
    };
    l.settle(SCOPE, c, &requests(Some(60), 10, Some(secs(28))), Usage::sent(), 5 * MS);
    assert_eq!(
        kind(&l.snapshot(5 * MS), Kind::Requests).remaining,
        Some(10),
        "sent after the last reading arrived: newer (a bucket refilled)"
    );
    // An attempt sent before that, answered late with more remaining: ignored.
    let Admission::Go(d) = ask(&l, SCOPE, 4 * MS, secs(60), &mut r) else {
        panic!()
    };
    l.settle(SCOPE, d, &requests(Some(60), 12, Some(secs(28))), Usage::sent(), 6 * MS);
    assert_eq!(kind(&l.snapshot(6 * MS), Kind::Requests).remaining, Some(10));
    // A reading of the next window (its reset beyond this one) starts it.
    let Admission::Go(e) = ask(&l, SCOPE, 4 * MS, secs(60), &mut r) else {
        panic!()
    };
    l.settle(SCOPE, e, &requests(Some(60), 59, Some(secs(60))), Usage::sent(), 31 * S);
    assert_eq!(kind(&l.snapshot(31 * S), Kind::Requests).remaining, Some(59));
}

#[test]
fn dropped_handles_give_back_what_they_hold() {
    let mut r = rng();
    let l = RateLimits::default();
    l.observe(SCOPE, &requests(Some(1), 0, Some(secs(10))), 0);
    // A waiter gives up (its ticket is dropped): a newcomer after the reset gets the slot.
    let w = ask(&l, SCOPE, 0, secs(600), &mut r);
    assert!(matches!(w, Admission::Wait { .. }));
    drop(w);
    let Admission::Go(res) = ask(&l, SCOPE, 10 * S, secs(600), &mut r) else {
        panic!()
    };
    // A reservation dropped unsettled counts as sent: the window stays used after it.
    drop(res);
    let k = l.snapshot(10 * S).scopes[0].kinds[0];
    assert_eq!((k.in_flight, k.available), (0, Some(0)));
    // A ticket brought to another scope is dropped, not redeemed there.
    let l2 = RateLimits::default();
    l2.observe("a", &requests(Some(1), 0, Some(secs(10))), 0);
    l2.observe("b", &requests(Some(5), 5, Some(secs(10))), 0);
    let Admission::Wait { ticket, .. } = ask(&l2, "a", 0, secs(600), &mut r) else {
        panic!()
    };
    assert_eq!(kind_of(&l2.admit("b", 0, none(), secs(1), Some(ticket), &mut r)), D::Go);
    assert_eq!(
        kind_of(&ask(&l2, "a", 10 * S, secs(600), &mut r)),
        D::Go,
        "a's slot was freed"
    );
}

#[test]
fn ietf_fields_drive_admission_with_their_window() {
    let mut r = rng();
    let l = RateLimits::default();
    let reading = Reading::parse(
        [
            ("RateLimit-Policy", "\"burst\";q=10;w=10, \"daily\";q=1000;w=86400"),
            ("RateLimit", "\"burst\";r=0;t=4, \"daily\";r=500;t=50000"),
        ],
        wall(),
    );
    l.observe(SCOPE, &reading, 0);
    // The burst window binds (not the day): from 4 s on, slots of 0.9 s (the
    // 9 s the window surely lasts, its whole-second reset known to a second, / 10).
    let waits: Vec<Admission> = (0..11).map(|_| ask(&l, SCOPE, 0, secs(600), &mut r)).collect();
    for (i, a) in waits.iter().enumerate() {
        let D::Wait(w) = kind_of(a) else { panic!("{i}: {a:?}") };
        let (n, k) = (i as u64 / 10, i as u64 % 10);
        let slot = secs(4 + n * 10) + Duration::from_millis(900 * k);
        assert!(w >= slot && w <= slot + Duration::from_millis(900), "{i}: {w:?}");
    }
}

#[test]
fn malformed_headers_are_counted_and_snapshots_are_sorted() {
    let l = RateLimits::default();
    let bad = Reading::parse(
        [
            ("x-ratelimit-remaining-requests", "lots"),
            ("x-ratelimit-reset-requests", "-1s"),
            ("retry-after", "never"),
        ],
        wall(),
    );
    assert_eq!(bad.problems(), 3);
    l.observe("z", &bad, 0);
    l.observe("b", &requests(Some(5), 4, Some(secs(2))), 0);
    l.observe("a", &requests(None, 1, None), 0);
    let snap = l.snapshot(0);
    assert_eq!(
        snap.scopes.iter().map(|s| s.scope.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(snap.counters.malformed_headers, 3);
    assert_eq!(snap.counters.observed, 3);
    assert_eq!(l.scopes(), 2, "a reading with nothing usable makes no scope");
    let text = snap.prometheus();
    assert!(text.contains("retrywise_ratelimit_remaining{scope=\"b\",kind=\"requests\"} 4"));
    assert!(text.contains("retrywise_ratelimit_malformed_headers_total 3"));
}

#[test]
fn the_table_stays_bounded() {
    let l = RateLimits::new(RateLimitConfig {
        max_scopes: 64,
        ..RateLimitConfig::default()
    });
    for i in 0..10_000u64 {
        l.observe(
            &format!("key-{i}/openai/gpt-4o"),
            &requests(Some(5), 4, Some(secs(60))),
            i * MS,
        );
    }
    assert!(l.scopes() <= 64, "{}", l.scopes());
}

#[test]
fn threads_share_one_remaining_allowance() {
    let l = Arc::new(RateLimits::default());
    l.observe(SCOPE, &requests(Some(100), 50, Some(secs(60))), 0);
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let l = l.clone();
            std::thread::spawn(move || {
                let mut r = Pcg64Mcg::seed_from_u64(t);
                let mut held = Vec::new();
                for _ in 0..100 {
                    if let Admission::Go(res) = l.admit(SCOPE, S, none(), secs(1), None, &mut r) {
                        held.push(res);
                    }
                }
                held
            })
        })
        .collect();
    let admitted: usize = handles.into_iter().map(|h| h.join().unwrap().len()).sum();
    assert_eq!(admitted, 50);
    assert_eq!(l.counters().admitted, 50);
}

#[test]
fn handles_cross_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<RateLimits>();
    shared::<Reservation>();
    shared::<Ticket>();
    shared::<AdaptiveConcurrency>();
}

/// One step of the property test below.
#[derive(Debug, Clone)]
enum Op {
    /// A caller asks (input, output tokens; whether it brings a waiting ticket).
    Admit(u64, u64, bool),
    /// The provider receives an admitted attempt.
    Deliver(usize),
    /// An attempt's response arrives (with or without rate-limit headers).
    Respond(usize, bool),
    /// Time passes (ms), within the window.
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..20_000, 0u64..20_000, any::<bool>()).prop_map(|(i, o, t)| Op::Admit(i, o, t)),
        3 => any::<usize>().prop_map(Op::Deliver),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(i, h)| Op::Respond(i, h)),
        1 => (0u64..2_000).prop_map(Op::Advance),
    ]
}

struct Attempt {
    res: Option<Reservation>,
    tokens: u64,
    delivered: Option<Reading>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Against a provider with a fixed window that counts each request when it
    /// receives it and reports its true remaining in every response (some
    /// responses lose their headers, they arrive in any order): the attempts
    /// admitted within the window never exceed the allowance observed at its
    /// start, in requests or in tokens.
    #[test]
    fn admitted_attempts_never_exceed_the_observed_allowance(
        r_req in 0u64..30, r_tok in 0u64..100_000, seed in any::<u64>(),
        ops in proptest::collection::vec(op(), 0..250),
    ) {
        const WINDOW_MS: u64 = 60_000;
        let l = RateLimits::default();
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        let (l_req, l_tok) = (r_req + 10, r_tok.max(40_000) + 1);
        let provider = |count: u64, tokens: u64, t_ms: u64| {
            Reading::default()
                .with_window(Kind::Requests, Window {
                    limit: Some(l_req), remaining: Some(r_req - count), reset: Some(Duration::from_millis(WINDOW_MS - t_ms)), window: None,
                })
                .with_window(Kind::Tokens, Window {
                    limit: Some(l_tok), remaining: Some(r_tok.saturating_sub(tokens)), reset: Some(Duration::from_millis(WINDOW_MS - t_ms)), window: None,
                })
        };
        l.observe(SCOPE, &provider(0, 0, 0), 0);
        let (mut t_ms, mut count, mut tokens) = (0u64, 0u64, 0u64);
        let (mut admitted, mut admitted_tokens) = (0u64, 0u64);
        let mut attempts: Vec<Attempt> = Vec::new();
        let mut tickets: Vec<Ticket> = Vec::new();
        for op in ops {
            match op {
                Op::Admit(i, o, bring) => {
                    let ticket = if bring { tickets.pop() } else { None };
                    match l.admit(SCOPE, t_ms * MS, est(i, o), secs(3600), ticket, &mut rng) {
                        Admission::Go(res) => {
                            admitted += 1;
                            admitted_tokens += i + o;
                            attempts.push(Attempt { res: Some(res), tokens: i + o, delivered: None });
                        }
                        Admission::Wait { wait, ticket } => {
                            prop_assert!(wait <= secs(3600));
                            tickets.push(ticket);
                        }
                        Admission::Stop(why) => prop_assert!(false, "unexpected stop {:?}", why),
                    }
                }
                Op::Deliver(i) if !attempts.is_empty() => {
                    let n = attempts.len();
                    let a = &mut attempts[i % n];
                    if a.delivered.is_none() {
                        count += 1;
                        tokens += a.tokens;
                        prop_assert!(count <= r_req, "provider saw {} requests, {} allowed", count, r_req);
                        prop_assert!(tokens <= r_tok, "provider saw {} tokens, {} allowed", tokens, r_tok);
                        a.delivered = Some(provider(count, tokens, t_ms));
                    }
                }
                Op::Respond(i, headers) if !attempts.is_empty() => {
                    let n = attempts.len();
                    let a = &mut attempts[i % n];
                    if let (Some(res), Some(reading)) = (a.res.take(), a.delivered.clone()) {
                        let reading = if headers { reading } else { Reading::default() };
                        l.settle(SCOPE, res, &reading, Usage::sent(), t_ms * MS);
                    } else if let Some(res) = a.res.take() {
                        // Failed before the provider received it.
                        l.settle(SCOPE, res, &Reading::default(), Usage::not_sent(), t_ms * MS);
                    }
                }
                Op::Advance(ms) => t_ms = (t_ms + ms).min(WINDOW_MS - 1),
                _ => {}
            }
        }
        prop_assert!(admitted <= r_req, "{} admitted, {} allowed", admitted, r_req);
        prop_assert!(admitted_tokens <= r_tok, "{} tokens admitted, {} allowed", admitted_tokens, r_tok);
    }

    /// Against a token bucket (`cap` requests, one back every `tau_ms`) that
    /// reports its whole level and the time until full in every response
    /// (they arrive in any order, time passes freely): once the table has
    /// taken the scope for a bucket (its first three answers show one), no
    /// attempt it admits finds the bucket empty.
    #[test]
    fn a_bucket_never_refuses_what_the_table_admits(
        cap in 4u64..40, tau_ms in 10u64..500, seed in any::<u64>(),
        ops in proptest::collection::vec(op(), 0..300),
    ) {
        let l = RateLimits::default();
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        // The level in ns of refill (one request is `tau` of it), exact.
        let tau = tau_ms * MS;
        let full = cap * tau;
        let mut level = full;
        let mut since = 0u64;
        let refill = |level: &mut u64, since: &mut u64, now: u64| {
            *level = (*level + (now - *since)).min(full);
            *since = now;
        };
        let reading = |level: u64| Reading::default().with_window(Kind::Requests, Window {
            limit: Some(cap),
            remaining: Some(level / tau),
            reset: Some(Duration::from_millis((full - level).div_ceil(MS))),
            window: None,
        });
        // Three requests of others, a ms apart, each answered at once.
        for t in 0..3 {
            refill(&mut level, &mut since, t * MS);
            level -= tau;
            l.observe(SCOPE, &reading(level), t * MS);
        }
        let mut t = 2 * MS;
        let mut attempts: Vec<Attempt> = Vec::new();
        let mut tickets: Vec<Ticket> = Vec::new();
        for op in ops {
            match op {
                Op::Admit(_, _, bring) => {
                    let ticket = if bring { tickets.pop() } else { None };
                    match l.admit(SCOPE, t, none(), secs(3600), ticket, &mut rng) {
                        Admission::Go(res) => {
                            // Mostly received at once (so readings bound the refill well), sometimes later.
                            let delivered = if bring || attempts.len() % 3 != 0 {
                                refill(&mut level, &mut since, t);
                                prop_assert!(level >= tau, "the bucket refused an admitted attempt: level {} of {}", level, tau);
                                level -= tau;
                                Some(reading(level))
                            } else {
                                None
                            };
                            attempts.push(Attempt { res: Some(res), tokens: 0, delivered });
                        }
                        Admission::Wait { ticket, .. } => tickets.push(ticket),
                        Admission::Stop(why) => prop_assert!(false, "unexpected stop {:?}", why),
                    }
                }
                Op::Deliver(i) if !attempts.is_empty() => {
                    let n = attempts.len();
                    let a = &mut attempts[i % n];
                    if a.delivered.is_none() && a.res.is_some() {
                        refill(&mut level, &mut since, t);
                        prop_assert!(level >= tau, "the bucket refused an admitted attempt: level {} of {}", level, tau);
                        level -= tau;
                        a.delivered = Some(reading(level));
                    }
                }
                Op::Respond(i, _) if !attempts.is_empty() => {
                    let n = attempts.len();
                    let a = &mut attempts[i % n];
                    if let (Some(res), Some(r)) = (a.res.take(), a.delivered.clone()) {
                        // Every answer states the level (a lost header is the window model's case).
                        l.settle(SCOPE, res, &r, Usage::sent(), t);
                    } else if let Some(res) = a.res.take() {
                        l.settle(SCOPE, res, &Reading::default(), Usage::not_sent(), t);
                    }
                }
                Op::Advance(ms) => t += ms * MS / 40,
                _ => {}
            }
        }
    }

    /// Whatever the state: a wait fits the time left, a stop says a wait that would not.
    #[test]
    fn waits_fit_the_time_left_and_stops_say_why(
        limit in proptest::option::of(0u64..50), remaining in 0u64..5, reset_ms in 0u64..120_000,
        left_ms in 0u64..200_000, asks in 1usize..40, seed in any::<u64>(),
    ) {
        let l = RateLimits::default();
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        l.observe(SCOPE, &requests(limit, remaining, Some(Duration::from_millis(reset_ms))), 0);
        let left = Duration::from_millis(left_ms);
        let mut held = Vec::new();
        for _ in 0..asks {
            match l.admit(SCOPE, 0, none(), left, None, &mut rng) {
                Admission::Go(r) => held.push(r),
                Admission::Wait { wait, ticket } => {
                    prop_assert!(wait <= left);
                    prop_assert!(wait >= Duration::from_millis(reset_ms).min(left));
                    drop(ticket);
                }
                // The wait would not leave its sleeper the slack to wake late in (it may equal `left`).
                Admission::Stop(StopWhy::RateLimitedUntil(d)) => prop_assert!(
                    d > left.saturating_sub(Duration::from_nanos(super::table::WAKE_SLACK)) && d >= Duration::from_millis(reset_ms)
                ),
                Admission::Stop(why) => prop_assert!(false, "{:?}", why),
            }
        }
        if reset_ms > 0 {
            prop_assert!(held.len() as u64 <= remaining, "{} admitted, {} remaining", held.len(), remaining);
        }
    }
}
