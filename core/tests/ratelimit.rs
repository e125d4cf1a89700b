//! Provider rate limits in the call path (`rate_limits: {enabled: true}`):
//! every response's headers and body evidence update the scope's limits, and
//! `next_attempt` admits against them — a paced wait, a stop when the window
//! has no room before the deadline, a stop while a per-day quota is out —
//! per account × provider × model.

use retrywise::rules::route::Needs;
use retrywise::{Action, CallSpec, Engine, EventKind, ManualClock, Outcome, Policy, Reason, Stopped};
use std::sync::Arc;
use std::time::Duration;

/// Two models of one provider on one key, and one model on another key.
const CATALOG: &str = "
rate_limits: {enabled: true}
upstreams:
  gpt4o: {provider: openai, model: gpt-4o, api_key_env: KEY_A}
  mini: {provider: openai, model: gpt-4o-mini, api_key_env: KEY_A}
  gpt4o-b: {provider: openai, model: gpt-4o, api_key_env: KEY_B}
  gpt4o-eu: {provider: openai, model: gpt-4o, region: eu, api_key_env: KEY_A}
";

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

/// One call to `upstream` whose only attempt ends with `outcome`.
fn one(e: &Engine, upstream: &str, outcome: Outcome) -> retrywise::Decision {
    let mut c = e.begin(CallSpec::new(upstream).deadline_ms(60_000));
    c.next_attempt().expect("an attempt");
    c.report(&outcome)
}

/// The last request of the minute, then the window resets in 20 s.
fn last_of_minute() -> Outcome {
    Outcome::status(200)
        .header("x-ratelimit-limit-requests", "60")
        .header("x-ratelimit-remaining-requests", "0")
        .header("x-ratelimit-reset-requests", "20s")
}

fn paced(s: &Stopped) -> Duration {
    assert_eq!(s.reason, Reason::RateLimited, "{s}");
    assert!(!s.is_final(), "{s}");
    assert!(s.detail.as_deref().unwrap().starts_with("paced: "), "{s}");
    s.wait.unwrap()
}

#[test]
fn an_exhausted_window_paces_the_next_call_until_its_slot() {
    let (e, clock) = engine(CATALOG);
    assert_eq!(one(&e, "gpt4o", last_of_minute()).action, Action::Succeeded);
    let mut c = e.begin(CallSpec::new("gpt4o").deadline_ms(60_000));
    let wait = paced(&c.next_attempt().unwrap_err());
    // The reset, plus this caller's share of the next window (60 s / 60 requests).
    assert!(
        wait >= Duration::from_secs(20) && wait <= Duration::from_secs(21),
        "{wait:?}"
    );
    assert_eq!(c.attempts(), 0, "nothing was sent");
    let stats = e.stats();
    assert_eq!(stats.overall.attempts, 1);
    assert_eq!(stats.rate_limits["paced_waits"], 1);
    let paced_events: Vec<_> = e
        .events()
        .into_iter()
        .filter(|ev| ev.kind == EventKind::Paced)
        .collect();
    assert_eq!(paced_events.len(), 1);
    assert_eq!(paced_events[0].delay_ms, Some(wait.as_millis() as u64));
    assert_eq!(paced_events[0].detail.as_deref(), Some("KEY_A/openai/gpt-4o"));
    clock.advance(wait);
    let a = c.next_attempt().expect("its slot came");
    assert_eq!(a.number, 1);
    assert_eq!(c.report(&Outcome::status(200)).action, Action::Succeeded);
}

/// Once the window opens, its waiters go at their slots across it; a
/// newcomer queues behind them (and is told so), and one that gives up
/// (its call dropped) gives its slot to the next newcomer.
#[test]
fn a_newcomer_waits_its_turn_behind_the_waiters_and_a_dropped_one_gives_its_slot_back() {
    let (e, clock) = engine(CATALOG);
    one(&e, "gpt4o", last_of_minute());
    // Two waiters hold the first two slots of the window that opens at 20 s.
    let mut waiters: Vec<_> = (0..2)
        .map(|_| e.begin(CallSpec::new("gpt4o").deadline_ms(60_000)))
        .collect();
    for w in &mut waiters {
        paced(&w.next_attempt().unwrap_err());
    }
    clock.advance(Duration::from_secs(20));
    // The window has room, but its waiters' slots run past now: newcomers queue behind them.
    let ask = || {
        let mut c = e.begin(CallSpec::new("gpt4o").deadline_ms(60_000));
        let s = c.next_attempt().unwrap_err();
        let wait = paced(&s);
        assert_eq!(
            s.detail,
            Some(format!(
                "paced: {} ms until its turn behind the waiters of KEY_A/openai/gpt-4o",
                wait.as_millis()
            ))
        );
        (c, wait)
    };
    let (first, w1) = ask();
    let (_second, w2) = ask();
    // A slot is the window (the longest reset seen: 20 s) over its 60 requests.
    let slot = Duration::from_secs(20) / 60;
    assert!(w1 >= 2 * slot && w1 <= 3 * slot, "{w1:?}");
    assert!(w2 >= 3 * slot && w2 <= 4 * slot, "{w2:?}");
    // The first newcomer gives up: the next one takes its slot, not a slot after the second's.
    drop(first);
    let (_third, w3) = ask();
    assert!(w3 >= 2 * slot && w3 <= 3 * slot, "{w3:?}");
}

#[test]
fn a_window_that_resets_after_the_deadline_stops_before_sending() {
    let (e, _) = engine(CATALOG);
    one(&e, "gpt4o", last_of_minute());
    let mut c = e.begin(CallSpec::new("gpt4o").deadline_ms(5_000));
    let s = c.next_attempt().unwrap_err();
    assert_eq!((s.reason, s.wait), (Reason::RetryAfterExceedsDeadline, None));
    assert_eq!(
        s.detail.as_deref(),
        Some("rate_limited_until: KEY_A/openai/gpt-4o has room in 20000 ms")
    );
    assert!(c.is_finished());
    assert_eq!(e.stats().rate_limits["stops_rate_limited"], 1);
}

/// The scope is what the provider limits: key × provider × model. Another
/// model and another key go at once; a region of the same model and key
/// shares the window.
#[test]
fn a_limit_binds_its_own_model_and_key_only() {
    let (e, _) = engine(CATALOG);
    one(&e, "gpt4o", last_of_minute());
    for other in ["mini", "gpt4o-b"] {
        assert_eq!(
            one(&e, other, Outcome::status(200)).action,
            Action::Succeeded,
            "{other}"
        );
    }
    let mut c = e.begin(CallSpec::new("gpt4o-eu").deadline_ms(60_000));
    paced(&c.next_attempt().unwrap_err());
}

const GEMINI_DAY: &str = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"37s"}]}}"#;

#[test]
fn a_per_day_quota_stops_the_next_call_at_once_and_only_its_model() {
    let (e, clock) = engine(CATALOG);
    let d = one(&e, "gpt4o", Outcome::status(429).body(GEMINI_DAY.as_bytes()));
    assert_eq!((d.action, d.reason), (Action::Stop, Reason::QuotaExhausted));
    let mut c = e.begin(CallSpec::new("gpt4o").deadline_ms(600_000));
    let s = c.next_attempt().unwrap_err();
    assert_eq!(
        (s.reason, s.wait),
        (Reason::QuotaExhausted, None),
        "no wait: a day does not fit"
    );
    assert_eq!(one(&e, "mini", Outcome::status(200)).action, Action::Succeeded);
    assert_eq!(e.stats().rate_limits["stops_quota"], 1);
    assert!(e.rate_limits().scopes.iter().any(|s| s.quota_exhausted));
    // After the quota hold (60 s) one call probes; its success ends the hold.
    clock.advance(Duration::from_secs(60));
    assert_eq!(one(&e, "gpt4o", Outcome::status(200)).action, Action::Succeeded);
    assert_eq!(one(&e, "gpt4o", Outcome::status(200)).action, Action::Succeeded);
}

/// A 429 asking for a day is held for at most a minute (`max_hold`): a
/// per-minute limit never becomes a day-long cooldown for the calls after it.
#[test]
fn a_429_holds_its_scope_a_minute_at_most() {
    // A bare 429 (Retry-After alone) holds the scope only when the policy asks.
    let (e, _) = engine(CATALOG);
    one(&e, "gpt4o", Outcome::status(429).header("retry-after", "86400"));
    assert!(e
        .begin(CallSpec::new("gpt4o").deadline_ms(120_000))
        .next_attempt()
        .is_ok());
    let (e, clock) = engine(&CATALOG.replace("{enabled: true}", "{enabled: true, hold_on_bare_429: true}"));
    let d = one(&e, "gpt4o", Outcome::status(429).header("retry-after", "86400"));
    assert_eq!(d.reason, Reason::RetryAfterExceedsDeadline);
    let mut c = e.begin(CallSpec::new("gpt4o").deadline_ms(120_000));
    let wait = paced(&c.next_attempt().unwrap_err());
    assert!(
        wait >= Duration::from_secs(60) && wait <= Duration::from_secs(61),
        "{wait:?}"
    );
    clock.advance(wait);
    c.next_attempt().expect("one attempt probes after the hold");
}

/// Declared tokens are reserved against the token window and settled
/// against the usage the response reports.
#[test]
fn declared_tokens_are_reserved_and_settled_against_usage() {
    let (e, _) = engine(CATALOG);
    let tokens = |n: u64| {
        Outcome::status(200)
            .header("x-ratelimit-limit-tokens", "10000")
            .header("x-ratelimit-remaining-tokens", &n.to_string())
            .header("x-ratelimit-reset-tokens", "30s")
    };
    one(&e, "gpt4o", tokens(1_000));
    let spec = || {
        CallSpec::new("gpt4o").deadline_ms(60_000).needs(Needs {
            input_tokens: Some(500),
            max_output_tokens: Some(300),
            ..Needs::default()
        })
    };
    // 800 of the 1 000 left are reserved: a second such call has no room.
    let mut first = e.begin(spec());
    first.next_attempt().expect("800 of 1000 fit");
    let mut second = e.begin(spec());
    paced(&second.next_attempt().unwrap_err());
    let gauge = |e: &Engine| {
        let s = e.rate_limits();
        let k = s.scopes[0]
            .kinds
            .iter()
            .find(|k| k.kind.as_str() == "tokens")
            .copied()
            .unwrap();
        (k.remaining, k.in_flight)
    };
    assert_eq!(gauge(&e), (Some(1_000), 800));
    // Its response used 150 (no header of its own): the reservation becomes the usage.
    assert_eq!(
        first.report(&Outcome::status(200).usage(100, 50)).action,
        Action::Succeeded
    );
    assert_eq!(gauge(&e), (Some(1_000), 0));
    let text = e.prometheus();
    assert!(
        text.lines()
            .any(|l| l == "retrywise_ratelimit_available{scope=\"KEY_A/openai/gpt-4o\",kind=\"tokens\"} 850"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l == "retrywise_ratelimit_paced_waits_total 1"),
        "{text}"
    );
}

/// On by default: the minute's last request paces the next call, and a
/// scope no response spoke of holds nothing. Off (`enabled: false`),
/// responses teach nothing and every call goes.
#[test]
fn on_by_default_and_off_on_request() {
    let (e, _) = engine("");
    let mut c = e.begin(CallSpec::new("quiet").deadline_ms(60_000));
    c.next_attempt().expect("nothing said of quiet's limits: it goes");
    c.report(&Outcome::status(200).header("x-request-id", "r1"));
    assert!(
        e.rate_limits().scopes.is_empty(),
        "a response without rate-limit headers teaches nothing"
    );
    one(&e, "gpt4o", last_of_minute());
    let s = e
        .begin(CallSpec::new("gpt4o").deadline_ms(60_000))
        .next_attempt()
        .unwrap_err();
    assert_eq!(s.reason, Reason::RateLimited);
    assert!(s.detail.as_deref().unwrap().starts_with("paced: "), "{s}");
    assert_eq!(e.stats().rate_limits["observed"], 1);

    let (e, _) = engine("rate_limits: {enabled: false}");
    one(&e, "gpt4o", last_of_minute());
    assert_eq!(one(&e, "gpt4o", Outcome::status(200)).action, Action::Succeeded);
    assert_eq!(e.stats().rate_limits["observed"], 0);
    assert!(!e.prometheus().contains("retrywise_ratelimit"));
}

/// Malformed values are ignored and counted, never a panic; Azure's `-1`
/// (unknown) constrains nothing.
#[test]
fn malformed_and_unknown_values_constrain_nothing() {
    let (e, _) = engine(CATALOG);
    let d = one(
        &e,
        "gpt4o",
        Outcome::status(200)
            .header("x-ratelimit-remaining-requests", "-1")
            .header("x-ratelimit-remaining-tokens", "lots")
            .header("x-ratelimit-reset-requests", "soon"),
    );
    assert_eq!(d.action, Action::Succeeded);
    assert_eq!(one(&e, "gpt4o", Outcome::status(200)).action, Action::Succeeded);
    assert_eq!(e.stats().rate_limits["malformed_headers"], 2);
}
