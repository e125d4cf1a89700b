//! Decisions at real-world edges, through the public API on a manual clock
//! with a fixed seed: breaker overrides by breaker key, routes that forbid
//! fallback, what counts against a breaker, waits and budgets of fallbacks,
//! Retry-After edges, adaptive throttling, keyed calls without a key,
//! `x-should-retry`, hedges that fail while a sibling runs, policy
//! validation, provider error bodies and the retry budget's sliding-window
//! promise. Each test states the rule it holds the engine to.

use proptest::prelude::*;
use retrywise::{
    Action, BreakerState, CallSpec, Engine, ErrorClass, ErrorKind, HedgePlan, Idempotency, Inbound, ManualClock, Mode,
    OnFailure, Outcome, Phase, Policy, Reason, WaitSource,
};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

fn engine_with(policy: Policy) -> (Engine, ManualClock) {
    let clock = ManualClock::new();
    let e = Engine::builder(policy)
        .clock(Arc::new(clock.clone()))
        .seed(42)
        .read_env(false)
        .build()
        .unwrap();
    (e, clock)
}

fn engine(yaml: &str) -> (Engine, ManualClock) {
    engine_with(Policy::from_str_any(yaml).unwrap())
}

/// One call to `route` whose only attempt ends with `outcome`.
fn one_attempt(e: &Engine, spec: CallSpec, outcome: &Outcome) -> retrywise::Decision {
    let mut c = e.begin(spec);
    c.next_attempt().expect("an attempt");
    c.report(outcome)
}

// ---------------------------------------------------------------------------
// 1. Breaker overrides keyed by the breaker key
// ---------------------------------------------------------------------------

const GPT4O: &str = "upstreams:\n  gpt4o: {provider: openai, model: gpt-4o, region: us}\n";

/// The README's form, `overrides: {"openai/gpt-4o/us": force_open}`, names
/// the breaker key: calls to the upstream behind that key are refused.
#[test]
fn force_open_by_breaker_key_refuses_attempts() {
    let (e, _) = engine(&format!(
        "{GPT4O}breaker: {{overrides: {{\"openai/gpt-4o/us\": force_open}}}}"
    ));
    let mut c = e.begin(CallSpec::new("gpt4o"));
    let s = c.next_attempt().unwrap_err();
    assert_eq!(s.reason, Reason::BreakerOpen);
    assert_eq!(e.breaker_state("gpt4o"), BreakerState::ForcedOpen);
    assert_eq!(e.stats().overall.attempts, 0);
}

/// `metrics_only` by breaker key records but never refuses, however bad the window.
#[test]
fn metrics_only_by_breaker_key_never_refuses() {
    let (e, _) = engine(&format!(
        "{GPT4O}max_attempts: 1\nbreaker: {{min_calls: 2, window_size: 4, overrides: {{\"openai/gpt-4o/us\": metrics_only}}}}"
    ));
    for _ in 0..10 {
        let d = one_attempt(&e, CallSpec::new("gpt4o"), &Outcome::status(503));
        assert_eq!((d.action, d.reason), (Action::Stop, Reason::MaxAttempts));
    }
    assert_eq!(e.breaker_state("gpt4o"), BreakerState::MetricsOnly);
    let st = e.stats();
    assert_eq!((st.overall.attempts, st.overall.breaker_opens), (10, 0));
}

// ---------------------------------------------------------------------------
// 2. Fallback forbidden (route, kill switch, non-owner) holds at begin too
// ---------------------------------------------------------------------------

const TWO: &str = "upstreams: {a: {}, b: {}}\n";

/// Opens `a`'s breaker with two failures (min_calls 2, window 2).
fn trip_a(e: &Engine) {
    for _ in 0..2 {
        one_attempt(e, CallSpec::new("a"), &Outcome::status(503));
    }
    assert_eq!(e.breaker_state("a"), BreakerState::Open);
}

/// A breaker that two failures trip, and that fails calls fast while open
/// (no hold: these tests are about where a call goes, not how long it waits).
const TRIPPABLE: &str =
    "max_attempts: 1\nbreaker: {min_calls: 2, window_size: 2, failure_rate: 0.5, open_jitter: 0, hold: false}\n";

#[test]
fn forbidden_route_never_starts_on_another_candidate() {
    let (e, _) = engine(&format!(
        "{TWO}{TRIPPABLE}routes:\n  contract: {{candidates: [a, b], fallback: forbidden, on_failure: manual_review}}\n"
    ));
    trip_a(&e);
    let mut c = e.begin(CallSpec::new("contract"));
    let s = c.next_attempt().unwrap_err();
    assert_eq!(
        (s.reason, s.on_failure),
        (Reason::BreakerOpen, Some(OnFailure::ManualReview))
    );
    assert!(!e.stats().per_upstream.contains_key("b"), "b was never called");
}

#[test]
fn forbidden_by_a_forced_override_stops_with_manual_review() {
    let (e, _) = engine(&format!(
        "{TWO}breaker: {{overrides: {{a: force_open}}}}\nroutes:\n  contract: {{candidates: [a, b], fallback: forbidden, on_failure: manual_review}}\n"
    ));
    let mut c = e.begin(CallSpec::new("contract"));
    let s = c.next_attempt().unwrap_err();
    assert_eq!(
        (s.reason, s.on_failure),
        (Reason::BreakerOpen, Some(OnFailure::ManualReview))
    );
    assert_eq!(e.stats().overall.attempts, 0);
}

#[test]
fn kill_switch_and_non_owner_calls_do_not_fall_back_at_begin() {
    let yaml = format!("{TWO}{TRIPPABLE}routes:\n  r: {{candidates: [a, b]}}\n");
    // Allowed and owner: the call starts on b (a's breaker is open).
    let (e, _) = engine(&yaml);
    trip_a(&e);
    let mut c = e.begin(CallSpec::new("r"));
    assert_eq!(&*c.next_attempt().unwrap().upstream, "b");

    // Kill switch: fallback off.
    let (e, _) = engine(&yaml);
    trip_a(&e);
    e.set_mode(Mode {
        fallback: false,
        ..Mode::default()
    });
    let mut c = e.begin(CallSpec::new("r"));
    let s = c.next_attempt().unwrap_err();
    assert_eq!((s.reason, s.on_failure), (Reason::BreakerOpen, Some(OnFailure::Fail)));

    // Not the owner: the owner above decides where to go.
    let (e, _) = engine(&yaml);
    trip_a(&e);
    let inbound = Inbound {
        deadline: Some(Duration::from_secs(10)),
        request_id: Some("outer".into()),
        attempt: Some(1),
        idempotency_key: None,
    };
    let mut c = e.begin(CallSpec::new("r").inbound(inbound));
    assert_eq!(c.next_attempt().unwrap_err().reason, Reason::BreakerOpen);
    assert!(!e.stats().per_upstream.contains_key("b"));
}

// ---------------------------------------------------------------------------
// 3. SSE error events before content
// ---------------------------------------------------------------------------

use retrywise::StreamGate;

const ANTHROPIC_START: &[u8] = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"role\":\"assistant\",\"content\":[]}}\n\n";
const ANTHROPIC_OVERLOADED: &[u8] = b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";

/// An `error` event before any content is held, not shown: the stream stays
/// `stream_open`, and the outcome the gate builds carries the error's type.
#[test]
fn sse_error_event_before_content_is_held_and_classified() {
    let mut gate = StreamGate::new(Some("text/event-stream"));
    assert!(gate.feed(ANTHROPIC_START).is_empty());
    assert!(gate.feed(ANTHROPIC_OVERLOADED).is_empty());
    assert!(!gate.is_visible());
    assert_eq!(gate.phase(), Phase::StreamOpen);
    let err = gate.stream_error().expect("the error event was recognised");
    assert_eq!(err.code.as_deref(), Some("overloaded_error"));
    assert!(
        gate.finish().is_empty(),
        "a failed attempt's preamble is never delivered"
    );

    // Reported as the attempt's outcome it is an overload, retried.
    let (e, _) = engine("");
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    let d = c.report(&gate.outcome(200));
    assert_eq!(
        (d.action, d.class, d.reason),
        (Action::Retry, Some(ErrorClass::Overloaded), Reason::Overloaded)
    );
}

/// OpenAI's error chunk (`data: {"error": {...}}`) before content is held the same way.
#[test]
fn openai_error_chunk_before_content_is_held() {
    let mut gate = StreamGate::new(Some("text/event-stream"));
    let role = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
    let err =
        b"data: {\"error\":{\"message\":\"The server had an error\",\"type\":\"server_error\",\"code\":null}}\n\n";
    assert!(gate.feed(role).is_empty());
    assert!(gate.feed(err).is_empty());
    assert!(!gate.is_visible());
    assert_eq!(gate.stream_error().unwrap().code.as_deref(), Some("server_error"));
    let o = gate.outcome(200);
    let (e, _) = engine("");
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    let d = c.report(&o);
    assert_eq!((d.action, d.class), (Action::Retry, Some(ErrorClass::Transient)));
}

/// After visible content an error event is a partial stream: shown output is never replayed.
#[test]
fn sse_error_event_after_content_is_a_partial_stream() {
    let mut gate = StreamGate::new(Some("text/event-stream"));
    let text = b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n";
    gate.feed(ANTHROPIC_START);
    assert!(!gate.feed(text).is_empty());
    gate.feed(ANTHROPIC_OVERLOADED);
    assert!(gate.is_visible());
    let (e, _) = engine("");
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    let d = c.report(&gate.outcome(200));
    assert_eq!(
        (d.action, d.class, d.reason),
        (
            Action::Stop,
            Some(ErrorClass::PartialStream),
            Reason::StreamVisibleOutput
        )
    );
}

// ---------------------------------------------------------------------------
// 4. What trips the breaker is upstream health, not the caller's idempotency
// ---------------------------------------------------------------------------

#[test]
fn timeouts_resets_and_5xx_count_for_every_call() {
    let cases: [(&str, Outcome, Idempotency); 5] = [
        (
            "unsafe first-byte timeout",
            Outcome::error(ErrorKind::FirstByteTimeout),
            Idempotency::Unsafe,
        ),
        (
            "deadline-expired attempt",
            Outcome::error(ErrorKind::DeadlineExceeded).phase(Phase::Sent),
            Idempotency::Safe,
        ),
        (
            "mid-stream reset",
            Outcome::error(ErrorKind::ConnectionReset).phase(Phase::StreamVisible),
            Idempotency::Safe,
        ),
        (
            "unsafe mid-stream reset",
            Outcome::error(ErrorKind::ConnectionReset).phase(Phase::StreamVisible),
            Idempotency::Unsafe,
        ),
        ("unsafe 500", Outcome::status(500), Idempotency::Unsafe),
    ];
    for (what, outcome, idem) in cases {
        let (e, _) = engine(TRIPPABLE);
        for _ in 0..2 {
            one_attempt(&e, CallSpec::new("up").idempotency(idem), &outcome);
        }
        assert_eq!(e.breaker_state("up"), BreakerState::Open, "{what}");
        let mut c = e.begin(CallSpec::new("up"));
        assert_eq!(c.next_attempt().unwrap_err().reason, Reason::BreakerOpen, "{what}");
    }
}

#[test]
fn caller_side_failures_never_count() {
    let cases: [(&str, Outcome); 4] = [
        ("cancelled", Outcome::error(ErrorKind::Cancelled).phase(Phase::Sent)),
        (
            "deadline before send",
            Outcome::error(ErrorKind::DeadlineExceeded).phase(Phase::BeforeSend),
        ),
        ("invalid request", Outcome::status(400)),
        ("auth", Outcome::status(401)),
    ];
    for (what, outcome) in cases {
        let (e, _) = engine(TRIPPABLE);
        for _ in 0..4 {
            one_attempt(&e, CallSpec::new("up").idempotency(Idempotency::Unsafe), &outcome);
        }
        assert_eq!(e.breaker_state("up"), BreakerState::Closed, "{what}");
    }
}

/// Both bindings map an attempt timer's expiry through the core: the total
/// timer is the deadline's when it was cut to the time left, otherwise it is
/// a first-byte (no headers yet) or idle (body started) timeout.
#[test]
fn timer_expiry_maps_to_one_error_kind() {
    use retrywise::Timer;
    let (e, _) = engine("timeouts: {attempt_ms: 5000}");
    let mut c = e.begin(CallSpec::new("up").deadline_ms(20_000));
    let a = c.next_attempt().unwrap();
    assert_eq!(a.timeouts().total, Duration::from_secs(5));
    assert_eq!(a.timer_error(Timer::Total, false), ErrorKind::FirstByteTimeout);
    assert_eq!(a.timer_error(Timer::Total, true), ErrorKind::StreamIdleTimeout);
    assert_eq!(a.timer_error(Timer::Connect, false), ErrorKind::ConnectTimeout);
    assert_eq!(a.timer_error(Timer::FirstByte, false), ErrorKind::FirstByteTimeout);
    // A stream with no output by its first-token timer: nothing was shown, a first-byte timeout.
    assert_eq!(a.timer_error(Timer::FirstToken, true), ErrorKind::FirstByteTimeout);
    assert_eq!(a.timer_error(Timer::Idle, true), ErrorKind::StreamIdleTimeout);

    let (e, _) = engine("");
    let mut c = e.begin(CallSpec::new("up").deadline_ms(2_000));
    let a = c.next_attempt().unwrap();
    assert_eq!(a.timeouts().total, Duration::from_secs(2));
    assert_eq!(a.timer_error(Timer::Total, false), ErrorKind::DeadlineExceeded);
    assert_eq!(a.timer_error(Timer::Total, true), ErrorKind::DeadlineExceeded);
}

// ---------------------------------------------------------------------------
// 5. The primary's Retry-After does not govern a fallback
// ---------------------------------------------------------------------------

#[test]
fn retry_after_beyond_deadline_falls_back_now_to_an_idle_candidate() {
    let (e, _) = engine(&format!("{TWO}routes:\n  r: {{candidates: [a, b]}}\n"));
    let mut c = e.begin(CallSpec::new("r").deadline_ms(10_000));
    assert_eq!(&*c.next_attempt().unwrap().upstream, "a");
    let d = c.report(&Outcome::status(429).header("retry-after", "20"));
    assert_eq!(
        (d.action, d.upstream.as_deref(), d.delay, d.wait_source),
        (Action::Fallback, Some("b"), Duration::ZERO, WaitSource::None)
    );
    assert_eq!(d.retry_after, Some(Duration::from_secs(20)), "kept as evidence");
    let a = c.next_attempt().unwrap();
    assert_eq!((&*a.upstream, a.fallback), ("b", true));
    assert_eq!(c.report(&Outcome::status(200)).action, Action::Succeeded);

    // A single-upstream call still stops: there is nowhere else to go (a
    // bare 429 holds no other call: this one is sent, and its own 429 stops it).
    let mut c = e.begin(CallSpec::new("a").deadline_ms(10_000));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::status(429).header("retry-after", "20"));
    assert_eq!((d.action, d.reason), (Action::Stop, Reason::RetryAfterExceedsDeadline));
}

#[test]
fn context_length_fallback_waits_no_jitter() {
    let (e, _) = engine(
        "budget: {enabled: false}\nbackoff: {base_ms: 2000, cap_ms: 4000}\nupstreams:\n  small: {context_tokens: 8000}\n  large: {context_tokens: 128000}\nroutes:\n  r: {candidates: [small, large]}\n",
    );
    for i in 0..20 {
        let mut c = e.begin(CallSpec::new("r"));
        c.next_attempt().unwrap();
        let d = c.report(&Outcome::status(400).vendor_code("context_length_exceeded"));
        assert_eq!(
            (d.action, d.upstream.as_deref(), d.delay, d.wait_source),
            (Action::Fallback, Some("large"), Duration::ZERO, WaitSource::None),
            "call {i}"
        );
    }
}

// ---------------------------------------------------------------------------
// 6. A fallback draws from the budget of the scope the request started in
// ---------------------------------------------------------------------------

#[test]
fn a_pure_backup_upstream_gets_the_primarys_budget() {
    let (e, clock) = engine(&format!(
        "{TWO}max_attempts: 2\nbreaker: {{enabled: false}}\nroutes:\n  r: {{candidates: [a, b], attempts_per_upstream: 1}}\n"
    ));
    let (mut fallbacks, mut refused) = (0, 0);
    for _ in 0..1000 {
        let mut c = e.begin(CallSpec::new("r"));
        assert_eq!(&*c.next_attempt().unwrap().upstream, "a");
        let d = c.report(&Outcome::status(503));
        match (d.action, d.reason) {
            (Action::Fallback, _) => {
                fallbacks += 1;
                assert_eq!(&*c.next_attempt().unwrap().upstream, "b");
                assert_eq!(c.report(&Outcome::status(200)).action, Action::Succeeded);
            }
            (Action::Stop, Reason::BudgetExhausted) => refused += 1,
            other => panic!("unexpected {other:?}"),
        }
        clock.advance_ms(1);
    }
    // 10 % of the 1 000 requests a counted, plus the floor of 1/s over 10 s;
    // once a's budget is spent, b's own floor (1/s over 10 s) takes 10 more.
    assert_eq!((fallbacks, refused), (120, 880));
}

/// A retry the origin's budget refuses does not end a call that has a
/// healthy backup: it moves there, on the backup's own budget.
#[test]
fn a_refused_retry_on_the_failing_upstream_moves_to_the_backup() {
    let (e, clock) = engine(&format!(
        "{TWO}max_attempts: 2\nbreaker: {{enabled: false}}\nbackoff: {{base_ms: 0, cap_ms: 0}}\nroutes:\n  r: {{candidates: [a, b], attempts_per_upstream: 2}}\n"
    ));
    let (mut retries, mut fallbacks, mut stops) = (0, 0, 0);
    for i in 0..1000 {
        let mut c = e.begin(CallSpec::new("r"));
        assert_eq!(&*c.next_attempt().unwrap().upstream, "a");
        let d = c.report(&Outcome::status(503));
        match (d.action, d.upstream.as_deref(), d.reason) {
            (Action::Retry, Some("a"), _) => retries += 1,
            (Action::Fallback, Some("b"), _) => {
                assert_eq!(d.delay, Duration::ZERO);
                fallbacks += 1;
            }
            (Action::Stop, _, Reason::BudgetExhausted) => {
                // Only once b has nothing to spare either.
                assert_eq!(fallbacks, 10, "call {i}: stopped with b's budget unspent");
                stops += 1;
            }
            other => panic!("call {i}: unexpected {other:?}"),
        }
        clock.advance_ms(1);
    }
    // a's budget: 10 % of 1 000 requests plus its floor (1/s over 10 s);
    // b's own floor (1/s over 10 s) takes the first 10 a refuses.
    assert_eq!((retries, fallbacks, stops), (110, 10, 880));
    assert_eq!(e.stats().overall.budget_refusals, 890);
}

/// A 429 rate limit retried where it failed after its valid Retry-After
/// draws no budget (`budget.exempt_rate_limited`, default true): the
/// provider said when to come back. Everything else still draws: a 429
/// without a hint, a 503 with one, a 429 moving to another upstream, and
/// every 429 once the exemption is off.
#[test]
fn a_rate_limit_retry_that_waits_out_retry_after_draws_no_budget() {
    // Pacing off: every call's own retry is judged, not the hold a 429 puts on the next call.
    const NO_BUDGET: &str =
        "budget: {ratio: 0, min_per_sec: 0}\nbreaker: {enabled: false}\nrate_limits: {enabled: false}\n";
    let ra = |status: u16, secs: &str| Outcome::status(status).header("retry-after", secs);
    let (e, _) = engine(NO_BUDGET);
    for i in 0..100 {
        let mut c = e.begin(CallSpec::new("up").deadline_ms(10_000));
        c.next_attempt().unwrap();
        let d = c.report(&ra(429, "1"));
        assert_eq!(
            (d.action, d.reason, d.wait_source),
            (Action::Retry, Reason::RateLimited, WaitSource::RetryAfter),
            "call {i}"
        );
        assert!(d.delay >= Duration::from_secs(1), "call {i}: {:?}", d.delay);
    }
    assert_eq!((e.stats().overall.retries, e.stats().overall.budget_refusals), (100, 0));
    for (outcome, why) in [
        (Outcome::status(429), "a 429 without a hint"),
        (ra(503, "1"), "a 503 with one"),
    ] {
        let d = one_attempt(&e, CallSpec::new("up").deadline_ms(10_000), &outcome);
        assert_eq!((d.action, d.reason), (Action::Stop, Reason::BudgetExhausted), "{why}");
    }
    // Another upstream is not waiting out the primary's hint: it draws.
    let (e, _) = engine(&format!("{TWO}{NO_BUDGET}routes:\n  r: {{candidates: [a, b]}}\n"));
    let d = one_attempt(&e, CallSpec::new("r").deadline_ms(10_000), &ra(429, "20"));
    assert_eq!((d.action, d.reason), (Action::Stop, Reason::BudgetExhausted));
    // Off: the budget decides every retry.
    let (e, _) = engine("budget: {ratio: 0, min_per_sec: 0, exempt_rate_limited: false}\nbreaker: {enabled: false}\n");
    let d = one_attempt(&e, CallSpec::new("up").deadline_ms(10_000), &ra(429, "1"));
    assert_eq!((d.action, d.reason), (Action::Stop, Reason::BudgetExhausted));
}

// ---------------------------------------------------------------------------
// 7. A zero or past hint still spreads clients out
// ---------------------------------------------------------------------------

#[test]
fn zero_and_past_hints_are_jittered_by_default() {
    // Many calls on one upstream: the budget and pacing are off so only the wait is judged.
    let (e, _) = engine("budget: {enabled: false}\nbreaker: {enabled: false}\nrate_limits: {enabled: false}");
    for (name, value) in [
        ("retry-after", "0"),
        ("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ("retry-after-ms", "0"),
    ] {
        let mut delays = Vec::new();
        for _ in 0..20 {
            let d = one_attempt(&e, CallSpec::new("up"), &Outcome::status(429).header(name, value));
            assert_eq!(
                (d.action, d.wait_source),
                (Action::Retry, WaitSource::RetryAfter),
                "{name}: {value}"
            );
            assert!(d.delay <= Duration::from_millis(250), "{name}: {value}: {:?}", d.delay);
            delays.push(d.delay);
        }
        delays.sort();
        delays.dedup();
        assert!(delays.len() >= 15, "{name}: {value}: clients wake together: {delays:?}");
    }
}

/// A hint is a minimum: the jitter is added on top, never taken off.
#[test]
fn a_hint_is_a_minimum() {
    let (e, _) = engine("budget: {enabled: false}\nbreaker: {enabled: false}");
    for _ in 0..20 {
        let d = one_attempt(
            &e,
            CallSpec::new("up"),
            &Outcome::status(503).header("retry-after", "2"),
        );
        assert!(
            d.delay >= Duration::from_secs(2) && d.delay <= Duration::from_millis(2_250),
            "{:?}",
            d.delay
        );
    }
}

// ---------------------------------------------------------------------------
// 8. Adaptive throttling: threshold, in-flight, what is an accept
// ---------------------------------------------------------------------------

#[test]
fn throttle_does_not_count_attempts_in_flight_as_rejects() {
    let (e, _) = engine("throttle: {enabled: true}");
    let mut calls: Vec<_> = (0..20).map(|_| e.begin(CallSpec::new("up"))).collect();
    for (i, c) in calls.iter_mut().enumerate() {
        assert!(c.next_attempt().is_ok(), "call {i} throttled on a fresh upstream");
    }
    for c in &mut calls {
        assert_eq!(c.report(&Outcome::status(200)).action, Action::Succeeded);
    }
    assert_eq!(e.stats().overall.stops.get("throttled"), None);
}

#[test]
fn throttle_waits_for_a_minimum_of_requests() {
    let (e, _) = engine("max_attempts: 1\nthrottle: {enabled: true, min_requests: 10}");
    for i in 0..10 {
        let mut c = e.begin(CallSpec::new("up"));
        assert!(c.next_attempt().is_ok(), "call {i} throttled below min_requests");
        c.report(&Outcome::status(503));
    }
    // Past the threshold with no accept, most attempts are refused.
    let throttled = (0..20)
        .filter(|_| {
            let mut c = e.begin(CallSpec::new("up"));
            match c.next_attempt() {
                Ok(_) => {
                    c.report(&Outcome::status(503));
                    false
                }
                Err(s) => s.reason == Reason::Throttled,
            }
        })
        .count();
    assert!(throttled >= 10, "{throttled}");
}

#[test]
fn unfinished_outcomes_are_not_accepts() {
    let cases: [(&str, Outcome, Idempotency); 3] = [
        (
            "deadline exceeded",
            Outcome::error(ErrorKind::DeadlineExceeded).phase(Phase::Sent),
            Idempotency::Safe,
        ),
        (
            "result unknown",
            Outcome::error(ErrorKind::ConnectionReset).phase(Phase::Sent),
            Idempotency::Unsafe,
        ),
        (
            "partial stream",
            Outcome::error(ErrorKind::ConnectionReset).phase(Phase::StreamVisible),
            Idempotency::Safe,
        ),
    ];
    for (what, outcome, idem) in cases {
        let (e, _) = engine("max_attempts: 1\nthrottle: {enabled: true, min_requests: 10}");
        let mut throttled = 0;
        for _ in 0..40 {
            let mut c = e.begin(CallSpec::new("up").idempotency(idem));
            match c.next_attempt() {
                Ok(_) => {
                    c.report(&outcome);
                }
                Err(s) => {
                    assert_eq!(s.reason, Reason::Throttled);
                    throttled += 1;
                }
            }
        }
        assert!(throttled >= 10, "{what}: {throttled} throttled: counted as accepts");
    }
    // A cancellation says nothing about the upstream either way: 9 failures
    // (below min_requests), then 30 cancellations, then one more failure. Had
    // the cancellations counted as accepts, the 10 failures would be
    // outweighed (P_reject = 0) and the next 20 attempts all admitted.
    let (e, _) = engine("max_attempts: 1\nthrottle: {enabled: true, min_requests: 10}");
    for i in 0..9 {
        let mut c = e.begin(CallSpec::new("up"));
        assert!(c.next_attempt().is_ok(), "failure {i}");
        c.report(&Outcome::status(503));
    }
    for i in 0..30 {
        let mut c = e.begin(CallSpec::new("up"));
        assert!(
            c.next_attempt().is_ok(),
            "cancellation {i} throttled: counted as a request"
        );
        c.cancel();
    }
    let mut c = e.begin(CallSpec::new("up"));
    assert!(c.next_attempt().is_ok());
    c.report(&Outcome::status(503));
    let throttled = (0..20)
        .filter(|_| {
            let mut c = e.begin(CallSpec::new("up"));
            match c.next_attempt() {
                Ok(_) => {
                    c.report(&Outcome::status(503));
                    false
                }
                Err(s) => s.reason == Reason::Throttled,
            }
        })
        .count();
    assert!(
        throttled >= 10,
        "cancellations counted as accepts: {throttled} throttled"
    );
}

// ---------------------------------------------------------------------------
// 9. Keyed without a key is unsafe
// ---------------------------------------------------------------------------

#[test]
fn keyed_without_a_key_is_never_replayed_after_send() {
    let (e, _) = engine("");
    let reset = Outcome::error(ErrorKind::ConnectionReset).phase(Phase::Sent);
    let d = one_attempt(&e, CallSpec::new("up").idempotency(Idempotency::Keyed), &reset);
    assert_eq!(
        (d.action, d.reason, d.class),
        (
            Action::Reconcile,
            Reason::EffectUnknown,
            Some(ErrorClass::ResultUnknown)
        )
    );
    let d = one_attempt(
        &e,
        CallSpec::new("up")
            .idempotency(Idempotency::Keyed)
            .idempotency_key("order-17"),
        &reset,
    );
    assert_eq!(d.action, Action::Retry);
}

// ---------------------------------------------------------------------------
// 10. x-should-retry never widens the operator's whitelist
// ---------------------------------------------------------------------------

#[test]
fn should_retry_true_does_not_widen_the_whitelist() {
    let (e, _) = engine("retry: {classes: [transient]}");
    let d = one_attempt(
        &e,
        CallSpec::new("up"),
        &Outcome::status(429).header("x-should-retry", "true"),
    );
    assert_eq!((d.action, d.reason), (Action::Stop, Reason::NotRetryable));

    let (e, _) = engine("");
    // 409 is an invalid request: not on the default whitelist.
    let d = one_attempt(
        &e,
        CallSpec::new("up"),
        &Outcome::status(409).header("x-should-retry", "true"),
    );
    assert_eq!((d.action, d.reason), (Action::Stop, Reason::NotRetryable));
    // 501 is transient (whitelisted) but not a retryable status: the server may say otherwise.
    let d = one_attempt(
        &e,
        CallSpec::new("up"),
        &Outcome::status(501).header("x-should-retry", "true"),
    );
    assert_eq!((d.action, d.reason), (Action::Retry, Reason::ServerSaysRetry));
}

// ---------------------------------------------------------------------------
// 11. A failure while a hedge sibling runs: wait for the sibling
// ---------------------------------------------------------------------------

#[test]
fn a_failure_with_a_sibling_in_flight_says_wait() {
    let (e, clock) = engine(&format!(
        "{TWO}routes:\n  r: {{candidates: [a, b], hedge_after_ms: 100}}\n"
    ));
    let mut c = e.begin(CallSpec::new("r"));
    let first = c.next_attempt().unwrap();
    clock.advance_ms(100);
    let HedgePlan::Start(hedge) = c.next_hedge() else {
        panic!("a hedge is due")
    };
    assert_eq!(&*hedge.upstream, "b");
    let d = c.report_attempt(first.number, &Outcome::status(503));
    assert_eq!(
        (d.action, d.reason, d.delay, d.is_final()),
        (Action::Wait, Reason::SiblingInFlight, Duration::ZERO, false)
    );
    let d = c.report_attempt(hedge.number, &Outcome::status(200));
    assert_eq!((d.action, d.upstream.as_deref()), (Action::Succeeded, Some("b")));
}

// ---------------------------------------------------------------------------
// 12. A count window that can never hold min_calls is refused
// ---------------------------------------------------------------------------

#[test]
fn count_window_smaller_than_min_calls_is_a_field_error() {
    let errs = Policy::from_str_any("breaker: {window_size: 10, min_calls: 20}").unwrap_err();
    let first = errs.first();
    assert_eq!(first.path, "breaker.min_calls");
    assert!(first.message.contains("window_size"), "{}", first.message);
    // A time window counts calls per time: any min_calls is possible.
    let p = Policy::from_str_any("breaker: {window: time, window_size: 10000, min_calls: 20000}").unwrap();
    assert!(Engine::new(p).is_ok());
}

// ---------------------------------------------------------------------------
// 13. Absurd hints are too large, not absent
// ---------------------------------------------------------------------------

#[test]
fn absurd_hints_stop_like_too_large_ones() {
    // Pacing off: each call's own decision on its hint is judged.
    let (e, _) = engine("rate_limits: {enabled: false}");
    let hour = one_attempt(
        &e,
        CallSpec::new("up"),
        &Outcome::status(429).header("retry-after", "3600"),
    );
    assert_eq!(hour.reason, Reason::RetryAfterExceedsDeadline);
    for (name, value) in [
        ("retry-after", "99999999999999999999"),
        ("retry-after", "40000000"),
        ("retry-after-ms", "99999999999999999999999"),
        ("retry-after", "Fri, 01 Jan 2100 00:00:00 GMT"),
    ] {
        let d = one_attempt(&e, CallSpec::new("up"), &Outcome::status(429).header(name, value));
        assert_eq!(
            (d.action, d.reason, d.delay),
            (Action::Stop, Reason::RetryAfterExceedsDeadline, Duration::ZERO),
            "{name}: {value}"
        );
    }
    // With `on_exceed: cap`, an absurd hint waits the cap.
    let (e, _) = engine("retry_after: {max_ms: 1000, on_exceed: cap, jitter_ms: 0}");
    let d = one_attempt(
        &e,
        CallSpec::new("up"),
        &Outcome::status(429).header("retry-after", "99999999999999999999"),
    );
    assert_eq!(
        (d.action, d.delay, d.wait_source),
        (Action::Retry, Duration::from_secs(1), WaitSource::RetryAfter)
    );
}

// ---------------------------------------------------------------------------
// 14. Provider error bodies beyond OpenAI and Anthropic
// ---------------------------------------------------------------------------

const GEMINI_MINUTE: &str = r#"{"error":{"code":429,"message":"You exceeded your current quota.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier","quotaDimensions":{"location":"global","model":"gemini-2.0-flash"},"quotaValue":"15"}]},{"@type":"type.googleapis.com/google.rpc.Help","links":[{"description":"Learn more","url":"https://ai.google.dev/gemini-api/docs/rate-limits"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"37s"}]}}"#;

#[test]
fn gemini_retry_info_is_a_wait_hint() {
    // Pacing off: each call's own decision on its hint is judged.
    let (e, _) = engine("retry_after: {jitter_ms: 0}\nrate_limits: {enabled: false}");
    let d = one_attempt(
        &e,
        CallSpec::new("gemini").deadline_ms(60_000),
        &Outcome::status(429).body(GEMINI_MINUTE.as_bytes()),
    );
    assert_eq!(
        (d.action, d.reason, d.delay, d.wait_source),
        (
            Action::Retry,
            Reason::RateLimited,
            Duration::from_secs(37),
            WaitSource::RetryAfter
        )
    );
    // Inside a shorter deadline the hint does not fit.
    let d = one_attempt(
        &e,
        CallSpec::new("gemini").deadline_ms(10_000),
        &Outcome::status(429).body(GEMINI_MINUTE.as_bytes()),
    );
    assert_eq!(d.reason, Reason::RetryAfterExceedsDeadline);
}

#[test]
fn gemini_per_day_quota_stops_at_once() {
    let body = GEMINI_MINUTE.replace("PerMinute", "PerDay");
    let (e, _) = engine("");
    let d = one_attempt(
        &e,
        CallSpec::new("gemini").deadline_ms(60_000),
        &Outcome::status(429).body(body.as_bytes()),
    );
    assert_eq!(
        (d.action, d.reason, d.class),
        (Action::Stop, Reason::QuotaExhausted, Some(ErrorClass::RateLimit))
    );
}

#[test]
fn anthropic_prompt_too_long_is_context_length_and_rematched() {
    let (e, _) = engine(
        "upstreams:\n  sonnet: {context_tokens: 200000}\n  big: {context_tokens: 1000000}\n  mid: {context_tokens: 205000}\nroutes:\n  r: {candidates: [sonnet, mid, big]}\n",
    );
    let body = br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210463 tokens > 200000 maximum"}}"#;
    let mut c = e.begin(CallSpec::new("r"));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::status(400).body(body));
    assert_eq!(
        (d.action, d.reason, d.upstream.as_deref()),
        (Action::Fallback, Reason::ContextLengthExceeded, Some("big"))
    );
    assert!(
        d.excluded
            .iter()
            .any(|(u, why)| u == "mid" && why.starts_with("context_too_small")),
        "{:?}",
        d.excluded
    );
}

#[test]
fn azure_shapes_are_read() {
    let (e, _) = engine("");
    // Azure's content filter: a policy refusal of the request, never retried.
    let filter = br#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":{"hate":{"filtered":true,"severity":"high"}}}}}"#;
    let d = one_attempt(&e, CallSpec::new("azure"), &Outcome::status(400).body(filter));
    assert_eq!((d.action, d.class), (Action::Stop, Some(ErrorClass::InvalidRequest)));
    assert_eq!(d.reason, Reason::InvalidRequest);
    // Azure's context length: the same code as OpenAI's.
    let ctx = br#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
    let d = one_attempt(&e, CallSpec::new("azure"), &Outcome::status(400).body(ctx));
    assert_eq!(d.reason, Reason::ContextLengthExceeded);
    // Azure's rate limit: retry-after-ms wins, "-1" limits are ignored.
    let d = one_attempt(
        &e,
        CallSpec::new("azure"),
        &Outcome::status(429)
            .header("retry-after-ms", "1200")
            .header("x-ratelimit-remaining-requests", "-1")
            .body(br#"{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-02-01 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 2 seconds."}}"#),
    );
    assert_eq!((d.action, d.wait_source), (Action::Retry, WaitSource::RetryAfter));
    assert!(
        d.delay >= Duration::from_millis(1200) && d.delay <= Duration::from_millis(1450),
        "{:?}",
        d.delay
    );
}

#[test]
fn grpc_retry_pushback() {
    let (e, _) = engine("retry_after: {jitter_ms: 0}");
    let d = one_attempt(
        &e,
        CallSpec::new("up"),
        &Outcome::status(503).header("grpc-retry-pushback-ms", "1500"),
    );
    assert_eq!(
        (d.action, d.delay, d.wait_source),
        (Action::Retry, Duration::from_millis(1500), WaitSource::RetryAfter)
    );
    // A negative pushback means "do not retry".
    let d = one_attempt(
        &e,
        CallSpec::new("up"),
        &Outcome::status(503).header("grpc-retry-pushback-ms", "-1"),
    );
    assert_eq!((d.action, d.reason), (Action::Stop, Reason::ServerSaysNoRetry));
}

// ---------------------------------------------------------------------------
// 15. The budget's promise holds in any window of its length
// ---------------------------------------------------------------------------

const FLOOR_ONLY: &str =
    "max_attempts: 2\nbreaker: {enabled: false}\nbackoff: {base_ms: 0, cap_ms: 0}\nbudget: {ratio: 0, min_per_sec: 1}\n";

/// One failing call; true when its retry was granted.
fn retry_granted(e: &Engine) -> bool {
    let d = one_attempt(e, CallSpec::new("up"), &Outcome::status(503));
    match (d.action, d.reason) {
        (Action::Retry, _) => true,
        (Action::Stop, Reason::BudgetExhausted) => false,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn budget_never_grants_twice_the_floor_within_one_window() {
    let (e, clock) = engine(FLOOR_ONLY);
    clock.advance_ms(999);
    let early = (0..15).filter(|_| retry_granted(&e)).count();
    assert_eq!(early, 10, "the floor: 1/s over 10 s");
    // 9.001 s later the ten grants are still inside a 10 s window.
    clock.advance_ms(9_001);
    let late = (0..15).filter(|_| retry_granted(&e)).count();
    assert_eq!(late, 0);
    // Once a whole window has passed since, the floor is there again.
    clock.advance_ms(1_000);
    let later = (0..15).filter(|_| retry_granted(&e)).count();
    assert_eq!(later, 10);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The promise itself, not the buckets: at every grant, the grants in the
    /// window of the budget's length ending there are at most ratio × the
    /// requests in that window + the floor.
    #[test]
    fn budget_promise_holds_in_every_sliding_window(
        steps in proptest::collection::vec((0u64..1_500, 1usize..8), 1..60),
        ratio_tenths in 0u32..5,
    ) {
        let ratio = ratio_tenths as f64 / 10.0;
        let (e, clock) = engine(&format!(
            "max_attempts: 2\nbreaker: {{enabled: false}}\nbackoff: {{base_ms: 0, cap_ms: 0}}\nbudget: {{ratio: {ratio}, min_per_sec: 1, window_ms: 10000, buckets: 10}}\n"
        ));
        let window = 10_000u64;
        let floor = 10.0;
        let mut now = 0u64;
        let mut requests: VecDeque<u64> = VecDeque::new();
        let mut grants: VecDeque<u64> = VecDeque::new();
        let mut all_requests = Vec::new();
        for (gap, n) in steps {
            clock.advance_ms(gap);
            now += gap;
            for _ in 0..n {
                all_requests.push(now);
                requests.push_back(now);
                if retry_granted(&e) {
                    grants.push_back(now);
                    while grants.front().is_some_and(|t| *t + window <= now) {
                        grants.pop_front();
                    }
                    while requests.front().is_some_and(|t| *t + window <= now) {
                        requests.pop_front();
                    }
                    let allowed = ratio * requests.len() as f64 + floor;
                    prop_assert!(
                        grants.len() as f64 <= allowed + 1e-9,
                        "{} grants in ({}, {}] ms against {} requests (allowed {})",
                        grants.len(), now.saturating_sub(window), now, requests.len(), allowed
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// An open breaker with nowhere else to go: wait for its probes, within the deadline
// ---------------------------------------------------------------------------

#[test]
fn a_call_refused_by_an_open_breaker_waits_for_its_probe_window() {
    let yaml = "max_attempts: 1\nbreaker: {min_calls: 2, window_size: 2, failure_rate: 0.5, open_ms: 5000, open_jitter: 0, hold_max_ms: 5000}";
    let (e, clock) = engine(yaml);
    for _ in 0..2 {
        one_attempt(&e, CallSpec::new("up"), &Outcome::status(503));
    }
    let mut c = e.begin(CallSpec::new("up").deadline_ms(30_000));
    let s = c.next_attempt().unwrap_err();
    assert_eq!((s.reason, s.is_final()), (Reason::BreakerOpen, false));
    let wait = s.wait.unwrap();
    assert!(
        wait >= Duration::from_secs(5) && wait <= Duration::from_secs(6),
        "{wait:?}"
    );
    assert!(!c.is_finished());
    assert_eq!(
        e.stats().overall.stops.get("breaker_open"),
        None,
        "a wait is not a stop"
    );
    // After the wait the call is a probe, and its success closes nothing yet but serves the call.
    clock.advance(wait);
    let a = c.next_attempt().unwrap();
    assert_eq!(a.number, 1);
    assert_eq!(c.report(&Outcome::status(200)).action, Action::Succeeded);

    // A deadline the open period does not fit: a stop, at once.
    for _ in 0..2 {
        one_attempt(&e, CallSpec::new("other"), &Outcome::status(503));
    }
    let mut c = e.begin(CallSpec::new("other").deadline_ms(3_000));
    let s = c.next_attempt().unwrap_err();
    assert_eq!((s.reason, s.wait), (Reason::BreakerOpen, None));
    assert!(c.is_finished());

    // A probe window further off than hold_max_ms: a stop (calls held are
    // at most that long's worth of traffic).
    let (e, _) = engine(&yaml.replace("hold_max_ms: 5000", "hold_max_ms: 4999"));
    for _ in 0..2 {
        one_attempt(&e, CallSpec::new("up"), &Outcome::status(503));
    }
    let s = e.begin(CallSpec::new("up")).next_attempt().unwrap_err();
    assert_eq!((s.reason, s.wait), (Reason::BreakerOpen, None));

    // Forced open: no probe will come, so nothing waits.
    let (e, _) = engine("breaker: {overrides: {up: force_open}}");
    let s = e.begin(CallSpec::new("up")).next_attempt().unwrap_err();
    assert_eq!((s.reason, s.wait), (Reason::BreakerOpen, None));
}
