//! Adaptive concurrency per rate-limit scope in the call path
//! (`rate_limits: {enabled: true}`, `rate_limits.concurrency`): every
//! attempt takes a place in its scope's AIMD limit before it is sent; with
//! none free `next_attempt` holds it (reason `rate_limited`, a short `wait`,
//! detail `concurrency: N in flight of limit M in SCOPE`); a 429 without
//! quota exhaustion or an overload halves the limit, a window of successes
//! grows it by one; a dropped or cancelled call gives its place back.

use retrywise::ratelimit::ConcurrencySnapshot;
use retrywise::{Action, Call, CallSpec, Engine, EventKind, HedgePlan, ManualClock, Outcome, Policy, Reason, Stopped};
use std::sync::Arc;
use std::time::Duration;

const SCOPE: &str = "KEY_A/openai/gpt-4o";

/// `gpt4o` and `gpt4o-eu` share a key and a model (one scope); `mini` is another model.
/// The gate is opt-in: `enabled: true` is added unless `concurrency` says.
fn catalog(concurrency: &str) -> String {
    let concurrency = if concurrency.contains("enabled") {
        concurrency.to_string()
    } else {
        concurrency.replacen('{', "{enabled: true, ", 1)
    };
    format!(
        "
rate_limits: {{enabled: true, concurrency: {concurrency}}}
upstreams:
  gpt4o: {{provider: openai, model: gpt-4o, api_key_env: KEY_A}}
  gpt4o-eu: {{provider: openai, model: gpt-4o, region: eu, api_key_env: KEY_A}}
  mini: {{provider: openai, model: gpt-4o-mini, api_key_env: KEY_A}}
routes:
  hedged: {{candidates: [gpt4o, gpt4o-eu], hedge_after_ms: 500}}
"
    )
}

fn engine(yaml: &str) -> (Engine, ManualClock) {
    let clock = ManualClock::new();
    let e = Engine::builder(Policy::from_str_any(yaml).unwrap())
        .clock(Arc::new(clock.clone()))
        .seed(7)
        .read_env(false)
        .build()
        .unwrap();
    (e, clock)
}

fn begin(e: &Engine, upstream: &str) -> Call {
    e.begin(CallSpec::new(upstream).deadline_ms(60_000))
}

/// A call with its first attempt in flight.
fn sent(e: &Engine, upstream: &str) -> Call {
    let mut c = begin(e, upstream);
    c.next_attempt().expect("a place in the limit");
    c
}

/// The hold of a call refused a place: its wait.
fn held(s: &Stopped, in_flight: u32, limit: u32) -> Duration {
    assert_eq!(s.reason, Reason::RateLimited, "{s}");
    assert!(!s.is_final(), "{s}");
    assert_eq!(
        s.detail.as_deref(),
        Some(format!("concurrency: {in_flight} in flight of limit {limit} in {SCOPE}").as_str())
    );
    s.wait.expect("a hold has a wait")
}

fn gate(e: &Engine, scope: &str) -> Option<ConcurrencySnapshot> {
    e.rate_limits()
        .scopes
        .into_iter()
        .find(|s| s.scope == scope)
        .and_then(|s| s.concurrency)
}

fn limit(e: &Engine) -> u32 {
    gate(e, SCOPE).expect("the scope is gated").limit
}

/// A bare 429: it cuts the scope's concurrency, and pacing holds the scope
/// for a moment (`RateLimitConfig::default_reset`, 1 s; see [`after_pacing`]).
fn refused() -> Outcome {
    Outcome::status(429)
}

/// Past the pacing a bare 429 starts (its hold, then waiters spread over a second).
fn after_pacing(clock: &ManualClock) {
    clock.advance(Duration::from_secs(5));
}

/// Begins calls to `gpt4o` until one is held; returns those sent.
fn fill(e: &Engine) -> Vec<Call> {
    let mut calls = Vec::new();
    loop {
        let mut c = begin(e, "gpt4o");
        match c.next_attempt() {
            Ok(_) => calls.push(c),
            Err(s) => {
                assert!(s.detail.as_deref().unwrap().starts_with("concurrency: "), "{s}");
                return calls;
            }
        }
    }
}

#[test]
fn the_limit_admits_n_and_holds_the_rest_until_a_place_frees() {
    let (e, clock) = engine(&catalog("{initial: 4, max: 8}"));
    let mut calls: Vec<Call> = (0..4).map(|_| sent(&e, "gpt4o")).collect();
    // The fifth is held; no attempt ended yet: the wait is hold_max_ms (100).
    let mut fifth = begin(&e, "gpt4o");
    assert_eq!(
        held(&fifth.next_attempt().unwrap_err(), 4, 4),
        Duration::from_millis(100)
    );
    assert_eq!(fifth.attempts(), 0, "nothing was sent");
    // Another upstream of the same key and model shares the limit; another model does not.
    let mut eu = begin(&e, "gpt4o-eu");
    held(&eu.next_attempt().unwrap_err(), 4, 4);
    let mini = sent(&e, "mini");
    assert_eq!(
        gate(&e, SCOPE),
        Some(ConcurrencySnapshot {
            limit: 4,
            in_flight: 4,
            cuts: 0,
            mean_hold: None
        })
    );
    // The first ends after 200 ms: its place is free, and the scope's mean hold is 200 ms.
    clock.advance(Duration::from_millis(200));
    assert_eq!(calls[0].report(&Outcome::success()).action, Action::Succeeded);
    fifth.next_attempt().expect("the freed place");
    // Held again: the wait is the mean hold over the limit, 200 ms / 4.
    assert_eq!(held(&eu.next_attempt().unwrap_err(), 4, 4), Duration::from_millis(50));
    let stats = e.stats();
    assert_eq!(stats.rate_limits["concurrency_holds"], 3);
    assert_eq!(stats.rate_limits["concurrency_cuts"], 0);
    let events: Vec<_> = e
        .events()
        .into_iter()
        .filter(|ev| ev.kind == EventKind::Paced)
        .collect();
    assert_eq!(events.len(), 3);
    assert_eq!(events[2].delay_ms, Some(50));
    assert_eq!(events[2].reason, Some(Reason::RateLimited));
    assert_eq!(
        events[2].detail.as_deref(),
        Some("concurrency: 4 in flight of limit 4 in KEY_A/openai/gpt-4o")
    );
    let text = e.prometheus();
    for line in [
        "retrywise_ratelimit_concurrency_limit{scope=\"KEY_A/openai/gpt-4o\"} 4",
        "retrywise_ratelimit_concurrency_in_flight{scope=\"KEY_A/openai/gpt-4o\"} 4",
        "retrywise_ratelimit_concurrency_limit{scope=\"KEY_A/openai/gpt-4o-mini\"} 4",
        "retrywise_ratelimit_concurrency_holds_total 3",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    drop((calls, fifth, mini));
    assert_eq!(gate(&e, SCOPE).unwrap().in_flight, 0);
}

#[test]
fn a_429_halves_the_limit_and_a_window_of_successes_grows_it_by_one() {
    let (e, clock) = engine(&catalog("{initial: 4, max: 8}"));
    let mut calls = fill(&e);
    assert_eq!(calls.len(), 4);
    // Four in flight when the first 429 comes: the limit becomes 2.
    let d = calls[0].report(&refused());
    assert_eq!((d.action, d.reason), (Action::Retry, Reason::RateLimited));
    assert_eq!(limit(&e), 2);
    // The other three were sent before the cut: the same congestion event.
    for c in &mut calls[1..] {
        c.report(&refused());
    }
    assert_eq!(gate(&e, SCOPE).map(|g| (g.limit, g.in_flight, g.cuts)), Some((2, 0, 1)));
    assert_eq!(e.stats().rate_limits["concurrency_cuts"], 1);
    drop(calls);
    after_pacing(&clock);
    // The next admission count proves it: two go, the third is held.
    let mut calls = fill(&e);
    assert_eq!(calls.len(), 2);
    // Steady traffic: each success is followed by a new call while there is room.
    // A window's worth of successes (as many as the limit) raises it by one.
    let mut limits = Vec::new();
    for _ in 0..9 {
        let mut c = calls.remove(0);
        assert_eq!(c.report(&Outcome::success()).action, Action::Succeeded);
        calls.extend(fill(&e));
        limits.push(limit(&e));
        assert_eq!(calls.len() as u32, limit(&e), "every place in use");
    }
    assert_eq!(limits, [2, 3, 3, 3, 4, 4, 4, 4, 5]);
}

#[test]
fn successes_never_grow_the_limit_past_max_nor_an_unused_one() {
    let (e, _) = engine(&catalog("{initial: 2, max: 3}"));
    let mut calls = fill(&e);
    for _ in 0..20 {
        calls.remove(0).report(&Outcome::success());
        calls.extend(fill(&e));
    }
    assert_eq!(limit(&e), 3, "the ceiling");
    drop(calls);
    // One call at a time uses a third of the limit: no growth, however many succeed.
    let (e, _) = engine(&catalog("{initial: 3, max: 10}"));
    for _ in 0..50 {
        sent(&e, "gpt4o").report(&Outcome::success());
    }
    assert_eq!(limit(&e), 3);
}

#[test]
fn a_dropped_or_cancelled_call_gives_its_place_back_unchanged() {
    let (e, _) = engine(&catalog("{initial: 2}"));
    let a = sent(&e, "gpt4o");
    let mut b = sent(&e, "gpt4o");
    let mut c = begin(&e, "gpt4o");
    held(&c.next_attempt().unwrap_err(), 2, 2);
    // Dropped without a report: its place comes back, the limit says nothing.
    drop(a);
    c.next_attempt().expect("the dropped call's place");
    assert_eq!(
        gate(&e, SCOPE),
        Some(ConcurrencySnapshot {
            limit: 2,
            in_flight: 2,
            cuts: 0,
            mean_hold: None
        })
    );
    // Cancelled: neutral too.
    assert_eq!(b.cancel().reason, Reason::Cancelled);
    assert_eq!(gate(&e, SCOPE).map(|g| (g.limit, g.in_flight)), Some((2, 1)));
    // A call held, then dropped, holds nothing.
    let mut d = begin(&e, "gpt4o");
    d.next_attempt().expect("a place");
    let mut h = begin(&e, "gpt4o");
    held(&h.next_attempt().unwrap_err(), 2, 2);
    drop((h, d, c));
    assert_eq!(gate(&e, SCOPE).map(|g| (g.limit, g.in_flight, g.cuts)), Some((2, 0, 0)));
}

const GEMINI_DAY: &str = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]}]}}"#;

#[test]
fn a_per_day_quota_does_not_cut_concurrency_an_overload_does() {
    let (e, _) = engine(&catalog("{initial: 4}"));
    let mut calls = fill(&e);
    assert_eq!(calls.len(), 4);
    let d = calls[0].report(&Outcome::status(429).body(GEMINI_DAY.as_bytes()));
    assert_eq!((d.action, d.reason), (Action::Stop, Reason::QuotaExhausted));
    // A transient 500 and a timeout say nothing about capacity either.
    calls[1].report(&Outcome::status(500));
    calls[2].report(&Outcome::error(retrywise::ErrorKind::ConnectTimeout));
    assert_eq!(gate(&e, SCOPE).map(|g| (g.limit, g.cuts)), Some((4, 0)));
    // An overload (529) cuts: one in flight when it came, halved to the floor.
    calls[3].report(&Outcome::status(529));
    assert_eq!(gate(&e, SCOPE).map(|g| (g.limit, g.in_flight, g.cuts)), Some((1, 0, 1)));
}

#[test]
fn a_hedge_is_refused_not_held() {
    let (e, clock) = engine(&catalog("{initial: 1}"));
    let mut c = e.begin(CallSpec::new("hedged").deadline_ms(60_000));
    assert_eq!(&*c.next_attempt().unwrap().upstream, "gpt4o");
    clock.advance(Duration::from_millis(500));
    // The hedge would go to gpt4o-eu: the same scope, whose one place is taken.
    assert_eq!(c.next_hedge(), HedgePlan::No(Reason::RateLimited));
    assert_eq!(e.stats().rate_limits["concurrency_holds"], 0, "refused, not held");
    assert_eq!(c.report(&Outcome::success()).action, Action::Succeeded);
    assert_eq!(gate(&e, SCOPE).map(|g| g.in_flight), Some(0));
}

#[test]
fn a_hold_that_does_not_fit_the_time_left_stops() {
    let (e, _) = engine(&catalog("{initial: 1}"));
    let _a = sent(&e, "gpt4o");
    // 350 ms left, less min_attempt_ms 300: 50 ms, less than the 100 ms wait.
    let mut c = e.begin(CallSpec::new("gpt4o").deadline_ms(350));
    let s = c.next_attempt().unwrap_err();
    assert_eq!(s.reason, Reason::ConcurrencyLimit, "{s}");
    assert!(s.is_final());
    assert_eq!(
        s.detail.as_deref(),
        Some(
            "concurrency: 1 in flight of limit 1 in KEY_A/openai/gpt-4o; a 100 ms wait leaves less than min_attempt_ms"
        )
    );
    // With 400 ms (100 ms to spare) it is held.
    let mut c = e.begin(CallSpec::new("gpt4o").deadline_ms(400));
    assert_eq!(held(&c.next_attempt().unwrap_err(), 1, 1), Duration::from_millis(100));
}

#[test]
fn off_the_gate_never_holds() {
    // rate_limits off: no gate, whatever its knobs say.
    let (e, _) = engine("rate_limits: {enabled: false, concurrency: {enabled: true, initial: 1, max: 1}}");
    let calls: Vec<Call> = (0..10).map(|_| sent(&e, "gpt4o")).collect();
    assert!(e.rate_limits().scopes.is_empty());
    assert_eq!(e.stats().rate_limits["concurrency_holds"], 0);
    drop(calls);
    // Pacing on, the gate at its default (off): ten go at once.
    let (e, _) = engine(&catalog("{initial: 1}").replace("enabled: true, initial", "initial"));
    let calls: Vec<Call> = (0..10).map(|_| sent(&e, "gpt4o")).collect();
    assert_eq!(e.stats().rate_limits["concurrency_holds"], 0);
    drop(calls);
    // The gate off, pacing on.
    let (e, _) = engine(&catalog("{enabled: false, initial: 1}"));
    let mut calls: Vec<Call> = (0..10).map(|_| sent(&e, "gpt4o")).collect();
    assert_eq!(gate(&e, SCOPE), None);
    calls[0].report(
        &Outcome::status(200)
            .header("x-ratelimit-limit-requests", "60")
            .header("x-ratelimit-remaining-requests", "0")
            .header("x-ratelimit-reset-requests", "20s"),
    );
    let s = begin(&e, "gpt4o").next_attempt().unwrap_err();
    assert!(s.detail.as_deref().unwrap().starts_with("paced: "), "{s}");
}

#[test]
fn a_reload_adopts_the_new_bounds() {
    let (e, clock) = engine(&catalog("{initial: 2, max: 4}"));
    let calls = fill(&e);
    assert_eq!(calls.len(), 2);
    // Never cut: the scope starts over at the new initial.
    e.reload(Policy::from_str_any(&catalog("{initial: 6, max: 8}")).unwrap())
        .unwrap();
    let more = fill(&e);
    assert_eq!((more.len(), limit(&e)), (4, 6));
    drop((calls, more));
    let mut calls = fill(&e);
    calls[0].report(&refused());
    assert_eq!(limit(&e), 3, "six in flight, halved");
    drop(calls);
    after_pacing(&clock);
    // Learned from a refusal: kept within the new bounds.
    e.reload(Policy::from_str_any(&catalog("{initial: 6, min: 4, max: 8}")).unwrap())
        .unwrap();
    assert_eq!(fill(&e).len(), 4);
    assert_eq!(limit(&e), 4);
}

#[test]
fn knobs_are_validated_by_field() {
    for (knobs, field) in [
        ("{min: 0}", "rate_limits.concurrency.min"),
        ("{min: 4, max: 2}", "rate_limits.concurrency.max"),
        ("{initial: 20, max: 10}", "rate_limits.concurrency.initial"),
        ("{initial: 1, min: 2}", "rate_limits.concurrency.initial"),
        ("{grow_after: 0}", "rate_limits.concurrency.grow_after"),
        ("{hold_max_ms: 0}", "rate_limits.concurrency.hold_max_ms"),
        ("{hold_max_ms: 60001}", "rate_limits.concurrency.hold_max_ms"),
    ] {
        let err = Policy::from_str_any(&catalog(knobs))
            .and_then(|p| p.validate().map(|_| p))
            .map(|_| ())
            .map_err(|e| e.to_string())
            .expect_err(knobs);
        assert!(err.contains(field), "{knobs}: {err}");
    }
    let err = Policy::from_str_any(&catalog("{initial: 2, limit: 3}"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("limit"), "{err}");
}
