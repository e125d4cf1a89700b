//! The decision loop through the public API: one test per rule, exact
//! decisions, counts and bounds, on a manual clock with a fixed seed.

use retrywise::{
    Action, CallSpec, EffectState, Engine, ErrorClass, ErrorKind, HedgePlan, Idempotency, Inbound, ManualClock, Mode,
    Needs, Outcome, Phase, Policy, Reason, WaitSource,
};
use std::sync::{Arc, Mutex};
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

#[test]
fn success_on_first_attempt() {
    let (e, _) = engine("");
    let mut c = e.begin(CallSpec::new("up").deadline_ms(10_000));
    let a = c.next_attempt().unwrap();
    assert_eq!((a.number, &*a.upstream, a.hedge, a.fallback), (1, "up", false, false));
    let d = c.report(&Outcome::status(200));
    assert_eq!(
        (d.action, d.reason, d.class),
        (Action::Succeeded, Reason::Success, None)
    );
    assert!(d.is_final());
    let s = c.next_attempt().unwrap_err();
    assert_eq!(s.reason, Reason::CallFinished);
    assert_eq!(c.final_stop(), Some(s));
    let st = e.stats();
    assert_eq!(
        (st.overall.logical_requests, st.overall.attempts, st.overall.successes),
        (1, 1, 1)
    );
    assert_eq!(st.overall.first_attempt_success_rate, 1.0);
}

/// Deadlines are kept in u64 nanoseconds: one beyond that range (584 years)
/// saturates there, and the call still runs, retries and reports its time left.
#[test]
fn a_deadline_beyond_the_nanosecond_range_saturates() {
    let (e, clock) = engine("");
    clock.advance_ms(5_000);
    let mut c = e.begin(CallSpec::new("up").deadline(Duration::MAX));
    let a = c.next_attempt().unwrap();
    let max = Duration::from_nanos(u64::MAX);
    // The deadline saturates at u64::MAX ns on the engine clock, 5 s of which have passed.
    assert_eq!(a.remaining(), max - Duration::from_secs(5));
    assert!(a.timeouts().total <= a.remaining(), "{:?}", a.timeouts());
    let mut headers = Vec::new();
    a.for_each_header(|name, value| headers.push((name, value.to_string())));
    let deadline: u64 = headers[0].1.parse().unwrap();
    assert!(
        deadline <= u64::MAX / 1_000_000 && deadline > 500 * 365 * 86_400_000,
        "{headers:?}"
    );
    let d = c.report(&Outcome::status(503));
    assert_eq!(d.action, Action::Retry);
    clock.advance(d.delay);
    assert!(c.remaining() <= max && c.remaining() > max - Duration::from_secs(60));
    assert_eq!(c.next_attempt().unwrap().number, 2);
}

#[test]
fn transient_then_success_with_full_jitter_within_bounds() {
    let (e, clock) = engine("");
    let mut c = e.begin(CallSpec::new("up").deadline_ms(30_000));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::status(503));
    assert_eq!(
        (d.action, d.reason, d.class, d.wait_source),
        (
            Action::Retry,
            Reason::RetryableStatus,
            Some(ErrorClass::Transient),
            WaitSource::Jitter
        )
    );
    assert!(d.delay <= Duration::from_millis(250), "{:?}", d.delay);
    clock.advance(d.delay);
    let a = c.next_attempt().unwrap();
    assert_eq!(a.number, 2);
    let d = c.report(&Outcome::status(502));
    assert!(d.delay <= Duration::from_millis(500));
    clock.advance(d.delay);
    c.next_attempt().unwrap();
    assert_eq!(c.report(&Outcome::success()).action, Action::Succeeded);
    let st = e.stats();
    assert_eq!(
        (st.overall.attempts, st.overall.retries, st.overall.retry_successes),
        (3, 2, 1)
    );
    assert_eq!(st.overall.retry_recovery_rate, 0.5);
}

#[test]
fn max_attempts_counts_every_attempt() {
    let (e, clock) = engine("max_attempts: 3");
    let mut c = e.begin(CallSpec::new("up"));
    let mut n = 0;
    loop {
        match c.next_attempt() {
            Ok(_) => n += 1,
            Err(s) => {
                assert_eq!(s.reason, Reason::MaxAttempts);
                break;
            }
        }
        let d = c.report(&Outcome::status(503));
        if d.is_final() {
            assert_eq!(d.reason, Reason::MaxAttempts);
            break;
        }
        clock.advance(d.delay);
    }
    assert_eq!(n, 3);
    assert_eq!(e.stats().overall.stops.get("max_attempts"), Some(&1));
}

#[test]
fn stops_at_once_on_auth_invalid_quota() {
    let (e, _) = engine("");
    for (o, reason, class) in [
        (Outcome::status(401), Reason::AuthError, ErrorClass::AuthOrPolicy),
        (Outcome::status(403), Reason::AuthError, ErrorClass::AuthOrPolicy),
        (Outcome::status(400), Reason::InvalidRequest, ErrorClass::InvalidRequest),
        (Outcome::status(422), Reason::InvalidRequest, ErrorClass::InvalidRequest),
        (
            Outcome::status(429).vendor_code("insufficient_quota"),
            Reason::QuotaExhausted,
            ErrorClass::RateLimit,
        ),
    ] {
        let mut c = e.begin(CallSpec::new("up"));
        c.next_attempt().unwrap();
        let d = c.report(&o);
        assert_eq!(
            (d.action, d.reason, d.class),
            (Action::Stop, reason, Some(class)),
            "{o:?}"
        );
        assert_eq!(c.attempts(), 1);
    }
}

#[test]
fn retry_after_wins_over_jitter_and_is_exact() {
    let (e, _) = engine("retry_after: {jitter_ms: 0}");
    let mut c = e.begin(CallSpec::new("up").deadline_ms(30_000));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::status(429).header("Retry-After", "2"));
    assert_eq!(
        (d.action, d.delay, d.wait_source, d.reason),
        (
            Action::Retry,
            Duration::from_secs(2),
            WaitSource::RetryAfter,
            Reason::RateLimited
        )
    );
    assert_eq!(d.retry_after, Some(Duration::from_secs(2)));
}

#[test]
fn retry_after_beyond_deadline_stops_at_once() {
    // Pacing off: each call's own decision (with it, the 429's hour holds the next calls).
    let (e, _) = engine("rate_limits: {enabled: false}");
    let mut c = e.begin(CallSpec::new("up").deadline_ms(5_000));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::status(429).header("retry-after", "3600"));
    assert_eq!(
        (d.action, d.reason, d.delay),
        (Action::Stop, Reason::RetryAfterExceedsDeadline, Duration::ZERO)
    );
    // Fits the deadline but leaves less than min_attempt: also a stop.
    let mut c = e.begin(CallSpec::new("up").deadline_ms(5_000));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::status(503).header("retry-after", "4.8"));
    assert_eq!(d.reason, Reason::RetryAfterExceedsDeadline);
    let mut c = e.begin(CallSpec::new("up").deadline_ms(5_000));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::status(503).header("retry-after", "4.7"));
    assert_eq!((d.action, d.delay), (Action::Retry, Duration::from_millis(4_700)));
}

#[test]
fn retry_after_above_max_follows_on_exceed() {
    let (e, _) = engine("retry_after: {max_ms: 1000}\ndeadline_ms: 120000");
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    assert_eq!(
        c.report(&Outcome::status(429).header("retry-after", "5")).reason,
        Reason::RetryAfterTooLarge
    );
    let (e, _) = engine("retry_after: {max_ms: 1000, on_exceed: cap, jitter_ms: 0}\ndeadline_ms: 120000");
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::status(429).header("retry-after", "5"));
    assert_eq!((d.action, d.delay), (Action::Retry, Duration::from_secs(1)));
}

#[test]
fn invalid_retry_after_falls_back_to_jitter_and_is_recorded() {
    let (e, _) = engine("");
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::status(503).header("retry-after", "soon"));
    assert_eq!((d.action, d.wait_source), (Action::Retry, WaitSource::Jitter));
    assert_eq!(d.detail.as_deref(), Some("retry_after_unparseable"));
}

#[test]
fn jitter_is_clamped_to_the_deadline_and_min_attempt_is_enforced() {
    let (e, clock) = engine("backoff: {base_ms: 10000, cap_ms: 10000}\nmin_attempt_ms: 300");
    let mut c = e.begin(CallSpec::new("up").deadline_ms(1_000));
    c.next_attempt().unwrap();
    clock.advance_ms(100);
    let d = c.report(&Outcome::status(503));
    assert_eq!(d.action, Action::Retry);
    assert!(d.delay <= Duration::from_millis(600), "{:?}", d.delay);
    clock.advance(d.delay);
    // The wait ends no later than deadline - min_attempt, so the attempt may start.
    let a = c.next_attempt().unwrap();
    assert!(a.remaining() >= Duration::from_millis(300));
    assert!(a.timeouts().total <= a.remaining());
    // Time passes beyond the window: the next decision stops.
    clock.advance_ms(500);
    let d = c.report(&Outcome::status(503));
    assert_eq!(d.reason, Reason::DeadlineExceeded);
}

#[test]
fn admission_refuses_work_without_min_attempt_left() {
    let (e, _) = engine("");
    let mut c = e.begin(CallSpec::new("up").deadline_ms(200));
    let s = c.next_attempt().unwrap_err();
    assert_eq!(
        (s.reason, s.class),
        (Reason::DeadlineExceeded, Some(ErrorClass::DeadlineExceeded))
    );
    assert_eq!(c.attempts(), 0);
}

#[test]
fn phases_and_effects() {
    let (e, _) = engine("");
    // Unsafe call, request written, no response: reconcile, and it lands in the reconcile list.
    let mut c = e.begin(
        CallSpec::new("up")
            .idempotency(Idempotency::Unsafe)
            .idempotency_key("k-1"),
    );
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::error(ErrorKind::ConnectionReset).phase(Phase::Sent));
    assert_eq!(
        (d.action, d.reason, d.class),
        (
            Action::Reconcile,
            Reason::EffectUnknown,
            Some(ErrorClass::ResultUnknown)
        )
    );
    let list = e.reconcile_list();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].idempotency_key.as_deref(), Some("k-1"));
    assert_eq!(e.drain_reconcile().len(), 1);
    assert!(e.reconcile_list().is_empty());
    // The same failure on a safe call is retried.
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    assert_eq!(
        c.report(&Outcome::error(ErrorKind::FirstByteTimeout)).action,
        Action::Retry
    );
    // Connect failures never reached the upstream: retried even when unsafe.
    let mut c = e.begin(CallSpec::new("up").idempotency(Idempotency::Unsafe));
    c.next_attempt().unwrap();
    assert_eq!(c.report(&Outcome::error(ErrorKind::Connect)).action, Action::Retry);
    // Visible stream output: never replayed.
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::error(ErrorKind::ConnectionReset).phase(Phase::StreamVisible));
    assert_eq!(
        (d.action, d.reason, d.class),
        (
            Action::Stop,
            Reason::StreamVisibleOutput,
            Some(ErrorClass::PartialStream)
        )
    );
    // Stream open, nothing meaningful yet: retryable.
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::error(ErrorKind::StreamIdleTimeout).phase(Phase::StreamOpen));
    assert_eq!((d.action, d.reason), (Action::Retry, Reason::StreamNotStarted));
    // Unknown effect reported by the caller always reconciles.
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    assert_eq!(
        c.report(&Outcome::status(503).effect(EffectState::Unknown)).action,
        Action::Reconcile
    );
    // Cancellation and the caller's deadline stop.
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    assert_eq!(
        c.report(&Outcome::error(ErrorKind::Cancelled)).reason,
        Reason::Cancelled
    );
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::error(ErrorKind::DeadlineExceeded));
    assert_eq!(
        (d.reason, d.class),
        (Reason::DeadlineExceeded, Some(ErrorClass::DeadlineExceeded))
    );
}

#[test]
fn should_retry_header_cannot_override_auth_or_budget() {
    let (e, _) = engine("budget: {ratio: 0.0, min_per_sec: 0}");
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    assert_eq!(
        c.report(&Outcome::status(401).header("x-should-retry", "true")).reason,
        Reason::AuthError
    );
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    assert_eq!(
        c.report(&Outcome::status(501).header("x-should-retry", "true")).reason,
        Reason::BudgetExhausted
    );
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    assert_eq!(
        c.report(&Outcome::status(503).header("x-should-retry", "false")).reason,
        Reason::ServerSaysNoRetry
    );
}

#[test]
fn propagation_headers_and_idempotency_key_on_every_attempt() {
    let (e, clock) = engine("propagation: {safety_margin_ms: 50}");
    let mut c = e.begin(
        CallSpec::new("up")
            .deadline_ms(10_000)
            .idempotency(Idempotency::Keyed)
            .idempotency_key("order-7"),
    );
    let a = c.next_attempt().unwrap();
    let h: std::collections::BTreeMap<_, _> = a.headers().into_iter().collect();
    assert_eq!(h["retrywise-deadline-ms"], "9950");
    assert_eq!(h["retrywise-attempt"], "1");
    assert_eq!(h["idempotency-key"], "order-7");
    assert_eq!(h["retrywise-request-id"], c.id());
    clock.advance_ms(1_000);
    let d = c.report(&Outcome::status(503));
    clock.advance(d.delay);
    let a2 = c.next_attempt().unwrap();
    let h2: std::collections::BTreeMap<_, _> = a2.headers().into_iter().collect();
    assert_eq!(h2["retrywise-attempt"], "2");
    assert_eq!(h2["idempotency-key"], "order-7");
    assert_eq!(h2["retrywise-request-id"], h["retrywise-request-id"]);
    let left: u64 = h2["retrywise-deadline-ms"].parse().unwrap();
    assert_eq!(left, 10_000 - 1_000 - d.delay_ms() - 50);
}

/// With propagation off only the idempotency key goes out; the attempt is
/// stamped with the engine clock's reading so bindings need no clock of their own.
#[test]
fn propagation_off_sends_only_the_key_and_attempts_carry_their_start() {
    let (e, clock) = engine("propagation: {enabled: false}");
    clock.advance_ms(1_234);
    assert_eq!(e.now(), Duration::from_millis(1_234));
    let mut c = e.begin(CallSpec::new("up").idempotency_key("k-1"));
    let a = c.next_attempt().unwrap();
    assert_eq!(a.started_at(), Duration::from_millis(1_234));
    let mut seen = Vec::new();
    a.for_each_header(|k, v| seen.push((k, v.to_string())));
    assert_eq!(seen, vec![("idempotency-key", "k-1".to_string())]);
    assert_eq!(a.headers(), seen);
    let mut bare = e.begin(CallSpec::new("up"));
    let b = bare.next_attempt().unwrap();
    let mut n = 0;
    b.for_each_header(|_, _| n += 1);
    assert_eq!(n, 0);
    clock.advance_ms(10);
    let d = c.report(&Outcome::status(503));
    clock.advance(d.delay);
    assert_eq!(c.next_attempt().unwrap().started_at(), e.now());
}

/// A downstream engine that receives propagation headers makes exactly one
/// attempt per inbound attempt, within the inherited deadline, and returns its
/// evidence instead of retrying: stacked layers never multiply.
#[test]
fn downstream_engine_is_a_non_owner() {
    let (upper, clock) = engine("max_attempts: 3");
    let down = Engine::builder(Policy::from_str_any("max_attempts: 5\ndeadline_ms: 60000").unwrap())
        .clock(Arc::new(clock.clone()))
        .seed(7)
        .read_env(false)
        .build()
        .unwrap();
    let mut outer = upper.begin(CallSpec::new("gateway").deadline_ms(8_000));
    let mut physical = 0;
    loop {
        let a = match outer.next_attempt() {
            Ok(a) => a,
            Err(s) => {
                assert_eq!(s.reason, Reason::MaxAttempts);
                break;
            }
        };
        // The gateway receives the attempt's headers.
        let headers: retrywise::Headers = a.headers().iter().map(|(k, v)| (*k, v.as_str())).collect();
        let inbound = Inbound::from_headers(&headers).unwrap().unwrap();
        let mut inner = down.begin(CallSpec::new("provider").inbound(inbound));
        assert!(!inner.is_owner());
        assert_eq!(inner.id(), outer.id());
        let ia = inner.next_attempt().unwrap();
        assert!(ia.remaining() <= a.remaining() - Duration::from_millis(50));
        // Downstream sees the owner's attempt number, not a fresh 1.
        let wire: std::collections::BTreeMap<_, _> = ia.headers().into_iter().collect();
        assert_eq!(wire["retrywise-attempt"], a.number.to_string());
        physical += 1;
        let id = inner.report(&Outcome::status(503).header("retry-after", "1"));
        assert_eq!((id.action, id.reason), (Action::Stop, Reason::NotOwner));
        assert_eq!(id.retry_after, Some(Duration::from_secs(1)));
        assert_eq!(inner.next_attempt().unwrap_err().reason, Reason::NotOwner);
        // The gateway returns the evidence; the owner decides.
        let d = outer.report(&Outcome::status(503).header("retry-after", "1"));
        if d.is_final() {
            assert_eq!(d.reason, Reason::MaxAttempts);
            break;
        }
        clock.advance(d.delay);
    }
    assert_eq!(physical, 3, "one physical attempt per inbound attempt");
    assert_eq!(down.stats().overall.attempts, 3);
    assert_eq!(upper.stats().overall.attempts, 3);
}

#[test]
fn inherited_deadline_is_the_shorter_one() {
    let (e, _) = engine("");
    let inbound = Inbound {
        deadline: Some(Duration::from_millis(1_000)),
        ..Inbound::default()
    };
    let mut c = e.begin(CallSpec::new("up").deadline_ms(20_000).inbound(inbound));
    let a = c.next_attempt().unwrap();
    assert_eq!(a.remaining(), Duration::from_millis(1_000));
    assert_eq!(a.timeouts().total, Duration::from_millis(1_000));
}

/// An attempt's timeouts are whole milliseconds, floored (never past the
/// deadline); `remaining()` and the deadline header keep what is really left.
#[test]
fn attempt_timeouts_are_whole_ms_within_what_is_left() {
    let (e, clock) = engine("timeouts: {connect_ms: 2000}\npropagation: {safety_margin_ms: 0}");
    let mut c = e.begin(CallSpec::new("up").deadline_ms(10_000));
    clock.advance(Duration::from_micros(1_500));
    let a = c.next_attempt().unwrap();
    assert_eq!(a.remaining(), Duration::from_micros(9_998_500));
    let t = a.timeouts();
    assert_eq!(t.total, Duration::from_millis(9_998));
    assert_eq!(t.connect, Duration::from_millis(2_000));
    assert!(t.first_byte <= t.total && t.idle <= t.total);
    let headers = a.headers();
    assert!(
        headers.contains(&("retrywise-deadline-ms", "9998".to_string())),
        "{headers:?}"
    );
    assert_eq!(a.started_at(), e.now());
    assert_eq!(a.request_id, c.id());
}

#[test]
fn budget_refuses_and_names_the_scope() {
    // Six failures in a row across 11 s would trip the breaker's consecutive
    // rule: the budget is what this tests.
    let (e, clock) =
        engine("budget: {ratio: 0.1, min_per_sec: 0, window_ms: 10000}\nbreaker: {consecutive_failures: null}");
    // 20 successful requests earn 2 retries.
    for _ in 0..20 {
        let mut c = e.begin(CallSpec::new("up"));
        c.next_attempt().unwrap();
        c.report(&Outcome::success());
    }
    let mut granted = 0;
    let mut refused = None;
    for _ in 0..5 {
        let mut c = e.begin(CallSpec::new("up"));
        c.next_attempt().unwrap();
        let d = c.report(&Outcome::status(503));
        if d.action == Action::Retry {
            granted += 1;
        } else {
            refused = Some(d);
        }
    }
    // 25 requests by now: 2.5 → 2 retries.
    assert_eq!(granted, 2);
    let d = refused.unwrap();
    assert_eq!((d.action, d.reason), (Action::Stop, Reason::BudgetExhausted));
    assert_eq!(d.detail.as_deref(), Some("scope up"));
    assert!(e.stats().overall.budget_refusals >= 1);
    // Refill: the window slides past the old requests and retries (retries
    // are judged over the buckets that overlap the window: one bucket more).
    clock.advance_ms(11_000);
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    assert_eq!(c.report(&Outcome::status(503)).reason, Reason::BudgetExhausted);
    for _ in 0..9 {
        let mut c = e.begin(CallSpec::new("up"));
        c.next_attempt().unwrap();
        c.report(&Outcome::success());
    }
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    assert_eq!(c.report(&Outcome::status(503)).action, Action::Retry);
}

/// Requests a thread counts on its own (no locked instruction) earn
/// retries for every thread: while it runs, and after it has exited.
#[test]
fn requests_counted_on_other_threads_earn_retries_exactly() {
    let (e, _) = engine("budget: {ratio: 0.1, min_per_sec: 0, window_ms: 10000}");
    let e = Arc::new(e);
    let failures = |e: &Engine, n: usize| {
        (0..n)
            .filter(|_| {
                let mut c = e.begin(CallSpec::new("up"));
                c.next_attempt().unwrap();
                c.report(&Outcome::status(503)).action == Action::Retry
            })
            .count()
    };
    let (go, done) = (std::sync::mpsc::channel::<()>(), std::sync::mpsc::channel::<()>());
    let (go_tx, done_rx) = (go.0, done.1);
    let (go_rx, done_tx) = (go.1, done.0);
    let worker = {
        let e = e.clone();
        std::thread::spawn(move || {
            for _ in 0..30 {
                let mut c = e.begin(CallSpec::new("up"));
                c.next_attempt().unwrap();
                c.report(&Outcome::success());
            }
            done_tx.send(()).unwrap();
            // Still alive (its counts not folded) until told to exit.
            go_rx.recv().unwrap();
        })
    };
    done_rx.recv().unwrap();
    // 30 requests there, 10 here (each failure is a request): 4 retries.
    assert_eq!(failures(&e, 10), 4);
    go_tx.send(()).unwrap();
    worker.join().unwrap();
    // After the thread exited: 50 requests in all, 5 retries, one more now.
    assert_eq!(failures(&e, 10), 1);
}

/// Threads retrying at once on one upstream, each counting its requests on
/// its own, never get more retries than the budget allows; once they have
/// exited, none of their requests is lost: the grants catch up to exactly
/// ratio × requests.
#[test]
fn concurrent_threads_never_exceed_the_budget_and_lose_no_request() {
    const THREADS: usize = 4;
    const CALLS: usize = 20_000;
    let (e, _) = engine(
        "budget: {ratio: 0.1, min_per_sec: 0, window_ms: 10000}
breaker: {enabled: false}
backoff: {base_ms: 0, cap_ms: 0}",
    );
    let e = Arc::new(e);
    // Every call fails once; a granted retry then succeeds.
    let call = |e: &Engine| {
        let mut c = e.begin(CallSpec::new("up"));
        c.next_attempt().unwrap();
        let d = c.report(&Outcome::status(503));
        if d.action == Action::Retry {
            c.next_attempt().unwrap();
            assert_eq!(c.report(&Outcome::success()).action, Action::Succeeded);
            return 1;
        }
        assert_eq!(d.reason, Reason::BudgetExhausted);
        0
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let e = e.clone();
            std::thread::spawn(move || (0..CALLS).map(|_| call(&e)).sum::<usize>())
        })
        .collect();
    let granted: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let requests = THREADS * CALLS;
    assert!(granted * 10 <= requests, "{granted} retries for {requests} requests");
    assert!(granted > 0);
    // The clock stood still: the window holds every request. A thousand more
    // calls here end with exactly a tenth of all requests granted.
    let more: usize = (0..1_000).map(|_| call(&e)).sum();
    assert_eq!(granted + more, (requests + 1_000) / 10);
}

/// A thread that exits folds the requests it counted into the budget while
/// others are deciding retries: no check in between may miss them. Every
/// tenth call fails once, and the budget (a tenth plus a floor of ten) always
/// has room, so every call must succeed, in every round.
#[test]
fn threads_exiting_while_others_retry_never_hide_requests() {
    for _ in 0..40 {
        let (e, _) = engine("backoff: {base_ms: 0, cap_ms: 0}");
        let e = Arc::new(e);
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let e = e.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        let mut c = e.begin(CallSpec::new("up").tenant("t"));
                        let a = c.next_attempt().unwrap();
                        if i % 10 == 0 {
                            let d = c.report(&Outcome::status(503));
                            assert_eq!(
                                (d.action, d.reason),
                                (Action::Retry, Reason::RetryableStatus),
                                "call {i}"
                            );
                            let a = c.next_attempt().unwrap();
                            assert_eq!(a.number, 2);
                        } else {
                            assert_eq!(a.number, 1);
                        }
                        assert_eq!(c.report(&Outcome::success()).action, Action::Succeeded);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
    }
}

#[test]
fn tenant_scoped_budgets_isolate_a_noisy_tenant() {
    let (e, _) = engine("budget: {ratio: 0.2, min_per_sec: 0, scopes: [[upstream], [tenant]]}");
    for t in ["noisy", "quiet"] {
        for _ in 0..10 {
            let mut c = e.begin(CallSpec::new("up").tenant(t));
            c.next_attempt().unwrap();
            c.report(&Outcome::success());
        }
    }
    // Each failing call is also a request: noisy has 11, 12, 13 requests → 2.2, 2.4, 2.6 retries.
    let mut got = Vec::new();
    for _ in 0..3 {
        let mut c = e.begin(CallSpec::new("up").tenant("noisy"));
        c.next_attempt().unwrap();
        let d = c.report(&Outcome::status(503));
        got.push((d.reason, d.detail));
    }
    assert_eq!(got[0].0, Reason::RetryableStatus);
    assert_eq!(got[1].0, Reason::RetryableStatus);
    assert_eq!(got[2], (Reason::BudgetExhausted, Some("scope noisy".to_string())));
    // The shared upstream budget still has room for the quiet tenant.
    let mut c = e.begin(CallSpec::new("up").tenant("quiet"));
    c.next_attempt().unwrap();
    assert_eq!(c.report(&Outcome::status(503)).action, Action::Retry);
}

#[test]
fn retry_concurrency_cap() {
    let (e, _) = engine("budget: {ratio: 1.0, min_per_sec: 100, max_concurrent_retries: 1}");
    let mut a = e.begin(CallSpec::new("up"));
    a.next_attempt().unwrap();
    assert_eq!(a.report(&Outcome::status(503)).action, Action::Retry);
    let mut b = e.begin(CallSpec::new("up"));
    b.next_attempt().unwrap();
    assert_eq!(b.report(&Outcome::status(503)).reason, Reason::RetryConcurrency);
    // a's retry finishes: the slot frees.
    a.next_attempt().unwrap();
    a.report(&Outcome::success());
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    assert_eq!(c.report(&Outcome::status(503)).action, Action::Retry);
    drop(c); // abandoning a call returns its slot too
    let mut d = e.begin(CallSpec::new("up"));
    d.next_attempt().unwrap();
    assert_eq!(d.report(&Outcome::status(503)).action, Action::Retry);
}

#[test]
fn breaker_opens_stops_calls_and_recovers_through_half_open() {
    let (e, clock) = engine(
        "breaker: {min_calls: 4, window_size: 10, failure_rate: 0.5, open_ms: 1000, open_jitter: 0, close_after: 1, half_open_probes: 1}\nbudget: {enabled: false}",
    );
    let events = Arc::new(Mutex::new(Vec::new()));
    let ev2 = events.clone();
    e.on_event(Arc::new(move |ev| {
        if let Some(b) = &ev.breaker {
            ev2.lock().unwrap().push((b.from, b.to, b.reason));
        }
    }));
    for _ in 0..4 {
        let mut c = e.begin(CallSpec::new("up"));
        c.next_attempt().unwrap();
        let _ = c.report(&Outcome::status(503).header("x-should-retry", "false"));
    }
    assert_eq!(e.breaker_state("up"), retrywise::BreakerState::Open);
    let mut c = e.begin(CallSpec::new("up"));
    let s = c.next_attempt().unwrap_err();
    assert_eq!(s.reason, Reason::BreakerOpen);
    clock.advance_ms(1_000);
    let mut probe = e.begin(CallSpec::new("up"));
    probe.next_attempt().unwrap();
    // A second caller during the probe is refused.
    let mut other = e.begin(CallSpec::new("up"));
    assert_eq!(other.next_attempt().unwrap_err().reason, Reason::BreakerOpen);
    probe.report(&Outcome::success());
    assert_eq!(e.breaker_state("up"), retrywise::BreakerState::Closed);
    let got = events.lock().unwrap().clone();
    assert_eq!(
        got,
        vec![
            ("closed", "open", "failure_rate"),
            ("open", "half_open", "open_elapsed"),
            ("half_open", "closed", "probes_succeeded")
        ]
    );
    assert_eq!(e.stats().overall.breaker_opens, 1);
}

#[test]
fn breaker_ignores_invalid_requests_and_auth() {
    let (e, _) = engine("breaker: {min_calls: 2, window_size: 10}");
    for s in [400, 401, 403, 404, 422, 400, 401] {
        let mut c = e.begin(CallSpec::new("up"));
        c.next_attempt().unwrap();
        c.report(&Outcome::status(s));
    }
    assert_eq!(e.breaker_state("up"), retrywise::BreakerState::Closed);
}

#[test]
fn breaker_override_force_open() {
    let (e, _) = engine("breaker: {overrides: {up: force_open}}");
    let mut c = e.begin(CallSpec::new("up"));
    assert_eq!(c.next_attempt().unwrap_err().reason, Reason::BreakerOpen);
    assert_eq!(e.breaker_state("up"), retrywise::BreakerState::ForcedOpen);
}

#[test]
fn kill_switch_makes_every_call_a_single_attempt() {
    let (e, _) = engine("");
    e.set_mode(Mode {
        retries: false,
        fallback: false,
        hedging: false,
    });
    for _ in 0..10 {
        let mut c = e.begin(CallSpec::new("up"));
        c.next_attempt().unwrap();
        let d = c.report(&Outcome::status(503));
        assert_eq!((d.action, d.reason), (Action::Stop, Reason::RetriesDisabled));
        assert_eq!(c.next_attempt().unwrap_err().reason, Reason::RetriesDisabled);
    }
    assert_eq!(e.stats().overall.attempts, 10);
    e.set_mode(Mode::default());
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    assert_eq!(c.report(&Outcome::status(503)).action, Action::Retry);
}

#[test]
fn kill_switch_from_environment_list() {
    let m = Mode::from_disable_list("retries, hedging").unwrap();
    assert_eq!(
        m,
        Mode {
            retries: false,
            fallback: true,
            hedging: false
        }
    );
    assert_eq!(
        Mode::from_disable_list("all").unwrap(),
        Mode {
            retries: false,
            fallback: false,
            hedging: false
        }
    );
    assert_eq!(Mode::from_disable_list("").unwrap(), Mode::default());
    let err = Mode::from_disable_list("retries,nope").unwrap_err();
    assert_eq!(err.path, "RETRYWISE_DISABLE");
}

#[test]
fn reload_is_atomic_in_flight_calls_keep_their_version() {
    let (e, clock) = engine("version: v1\nmax_attempts: 2");
    let mut old = e.begin(CallSpec::new("up"));
    old.next_attempt().unwrap();
    e.reload(Policy::from_str_any("version: v2\nmax_attempts: 5").unwrap())
        .unwrap();
    assert_eq!(e.policy_version(), "v2");
    assert_eq!(old.policy_version(), "v1");
    let d = old.report(&Outcome::status(503));
    clock.advance(d.delay);
    old.next_attempt().unwrap();
    assert_eq!(old.report(&Outcome::status(503)).reason, Reason::MaxAttempts);
    let new = e.begin(CallSpec::new("up"));
    assert_eq!(new.policy_version(), "v2");
    // A failed reload keeps the old policy.
    let bad = Policy {
        max_attempts: 0,
        ..Policy::default()
    };
    let err = e.reload(bad).unwrap_err();
    assert_eq!(err.first().path, "max_attempts");
    assert_eq!(e.policy_version(), "v2");
    let st = e.stats();
    assert!(st.per_policy_version.contains_key("v1") && st.per_policy_version.contains_key("v2"));
}

#[test]
fn events_have_exact_fields_and_never_carry_credentials() {
    let (e, clock) = engine("version: pv9\nretry_after: {jitter_ms: 0}\ntelemetry: {ring_size: 64, header_allowlist: [retry-after, authorization, x-api-key, cookie, api-key]}");
    let mut c = e.begin(CallSpec::new("up").tenant("acme").deadline_ms(10_000));
    c.next_attempt().unwrap();
    clock.advance_ms(100);
    let o = Outcome::status(503)
        .header("retry-after", "1")
        .header("authorization", "Bearer sk-secret")
        .header("x-api-key", "sk-secret")
        .header("cookie", "session=secret")
        .header("api-key", "sk-secret");
    let d = c.report(&o);
    assert_eq!(d.action, Action::Retry);
    let evs = e.events();
    let kinds: Vec<_> = evs.iter().map(|e| e.kind).collect();
    use retrywise::EventKind::*;
    assert_eq!(kinds, vec![AttemptStart, AttemptEnd, Decision]);
    let start = &evs[0];
    assert_eq!(start.logical_request_id.as_deref(), Some(c.id()));
    assert_eq!(
        start.attempt_id.as_ref().map(|a| a.to_string()),
        Some(format!("{}.1", c.id()))
    );
    assert_eq!(start.attempt, Some(1));
    assert_eq!(start.resend_count, Some(0));
    assert_eq!(start.upstream.as_deref(), Some("up"));
    assert_eq!(start.tenant.as_deref(), Some("acme"));
    assert_eq!(start.remaining_ms, Some(10_000));
    assert_eq!(&*start.policy_version, "pv9");
    let end = &evs[1];
    assert_eq!(end.status, Some(503));
    assert_eq!(end.error_class, Some(ErrorClass::Transient));
    assert_eq!(end.phase, Some(Phase::Headers));
    assert_eq!(end.headers, vec![("retry-after".to_string(), "1".to_string())]);
    let dec = &evs[2];
    assert_eq!(dec.action, Some(Action::Retry));
    assert_eq!(dec.wait_source, Some(WaitSource::RetryAfter));
    assert_eq!(dec.delay_ms, Some(1_000));
    assert_eq!(dec.reason, Some(Reason::RetryableStatus));
    let all = serde_json::to_string(&evs).unwrap();
    assert!(!all.contains("secret"), "{all}");
    assert!(all.contains("\"http.request.resend_count\":0"));
    assert!(all.contains("\"error.type\":\"transient\""));
}

#[test]
fn idempotency_conflict_is_reported() {
    let (e, _) = engine("");
    let d1 = retrywise::idempotency::params_digest(&serde_json::json!({"to": "a@x", "body": "hi"}));
    let d2 = retrywise::idempotency::params_digest(&serde_json::json!({"to": "b@x", "body": "hi"}));
    let key = retrywise::idempotency::derive_key("acme", "send_email", &d1);
    let mut c = e.begin(
        CallSpec::new("up")
            .idempotency(Idempotency::Keyed)
            .idempotency_key(key.clone())
            .params_digest(d1.clone()),
    );
    assert!(c.next_attempt().is_ok());
    let mut again = e.begin(
        CallSpec::new("up")
            .idempotency(Idempotency::Keyed)
            .idempotency_key(key.clone())
            .params_digest(d1),
    );
    assert!(again.next_attempt().is_ok());
    let mut other = e.begin(
        CallSpec::new("up")
            .idempotency(Idempotency::Keyed)
            .idempotency_key(key)
            .params_digest(d2),
    );
    let s = other.next_attempt().unwrap_err();
    assert_eq!(s.reason, Reason::IdempotencyConflict);
    assert!(s.detail.unwrap().contains("was used with parameters"));
}

const ROUTES: &str = r#"
max_attempts: 4
budget: {enabled: false}
upstreams:
  primary: {provider: openai, model: gpt-4o, region: us, capabilities: [streaming, tool_calling, json_schema], context_tokens: 128000, data_boundary: us, cost_input_per_mtok: 2.5, cost_output_per_mtok: 10}
  secondary: {provider: anthropic, model: sonnet, region: us, capabilities: [streaming, tool_calling, json_schema], context_tokens: 200000, data_boundary: us, cost_input_per_mtok: 3, cost_output_per_mtok: 15}
  tiny: {provider: local, model: tiny, capabilities: [streaming], context_tokens: 8192, data_boundary: us}
routes:
  chat:
    candidates: [primary, secondary]
    attempts_per_upstream: 1
  tools:
    candidates: [tiny, primary]
    require: [tool_calling]
  contract:
    candidates: [primary, secondary]
    fallback: forbidden
    on_failure: manual_review
  long:
    candidates: [tiny, primary, secondary]
    attempts_per_upstream: 1
"#;

#[test]
fn fallback_moves_to_the_next_eligible_candidate() {
    let (e, clock) = engine(ROUTES);
    let mut c = e.begin(CallSpec::new("chat"));
    let a = c.next_attempt().unwrap();
    assert_eq!(&*a.upstream, "primary");
    let d = c.report(&Outcome::status(503));
    assert_eq!((d.action, d.upstream.as_deref()), (Action::Fallback, Some("secondary")));
    assert_eq!(d.excluded, vec![("primary".to_string(), "already_tried".to_string())]);
    clock.advance(d.delay);
    let a = c.next_attempt().unwrap();
    assert_eq!((&*a.upstream, a.fallback), ("secondary", true));
    let d = c.report(&Outcome::status(503));
    assert_eq!((d.action, d.reason), (Action::Stop, Reason::NoEligibleUpstream));
    assert_eq!(e.stats().overall.fallbacks, 1);
}

#[test]
fn required_capabilities_pick_the_first_capable_upstream() {
    let (e, _) = engine(ROUTES);
    let mut c = e.begin(CallSpec::new("tools"));
    assert_eq!(&*c.next_attempt().unwrap().upstream, "primary");
}

#[test]
fn forbidden_route_stops_with_manual_review() {
    let (e, clock) = engine(ROUTES);
    let mut c = e.begin(CallSpec::new("contract"));
    let mut ups = Vec::new();
    while let Ok(a) = c.next_attempt() {
        ups.push(a.upstream.to_string());
        let d = c.report(&Outcome::status(503));
        if d.is_final() {
            assert_eq!(d.on_failure, Some(retrywise::OnFailure::ManualReview));
            assert_eq!(d.reason, Reason::MaxAttempts);
            break;
        }
        assert_eq!(d.action, Action::Retry);
        clock.advance(d.delay);
    }
    assert_eq!(ups, vec!["primary"; 4]);
}

#[test]
fn auth_errors_never_fall_back() {
    let (e, _) = engine(ROUTES);
    let mut c = e.begin(CallSpec::new("chat"));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::status(401));
    assert_eq!((d.action, d.reason), (Action::Stop, Reason::AuthError));
}

#[test]
fn context_length_exceeded_moves_to_a_larger_context_upstream() {
    let (e, _) = engine(ROUTES);
    let mut c = e.begin(CallSpec::new("long"));
    assert_eq!(&*c.next_attempt().unwrap().upstream, "tiny");
    let d = c.report(
        &Outcome::status(400)
            .vendor_code("context_length_exceeded")
            .input_tokens(150_000),
    );
    assert_eq!(
        (d.action, d.reason, d.upstream.as_deref()),
        (Action::Fallback, Reason::ContextLengthExceeded, Some("secondary"))
    );
    assert!(
        d.excluded
            .contains(&("primary".to_string(), "context_too_small:128000<150000".to_string())),
        "{:?}",
        d.excluded
    );
}

#[test]
fn breaker_open_primary_sends_first_attempt_to_fallback() {
    let (e, _) = engine(&format!("{ROUTES}\nbreaker: {{overrides: {{primary: force_open}}}}"));
    let mut c = e.begin(CallSpec::new("chat"));
    let a = c.next_attempt().unwrap();
    assert_eq!(&*a.upstream, "secondary");
}

#[test]
fn needs_exclude_upstreams() {
    let (e, _) = engine(ROUTES);
    let mut c = e.begin(CallSpec::new("long").needs(Needs {
        input_tokens: Some(100_000),
        ..Needs::default()
    }));
    assert_eq!(&*c.next_attempt().unwrap().upstream, "primary");
    let mut c = e.begin(CallSpec::new("long").needs(Needs {
        data_boundary: Some("eu".into()),
        ..Needs::default()
    }));
    let s = c.next_attempt().unwrap_err();
    assert_eq!(s.reason, Reason::NoEligibleUpstream);
}

#[test]
fn hedging_starts_a_parallel_attempt_on_another_upstream() {
    let (e, clock) = engine(&format!(
        "{ROUTES}\n  hedged:\n    candidates: [primary, secondary]\n    hedge_after_ms: 500\n"
    ));
    let mut c = e.begin(CallSpec::new("hedged"));
    let a1 = c.next_attempt().unwrap();
    assert_eq!(c.next_hedge(), HedgePlan::After(Duration::from_millis(500)));
    clock.advance_ms(500);
    let HedgePlan::Start(h) = c.next_hedge() else {
        panic!("expected a hedge")
    };
    assert!(h.hedge);
    assert_eq!((&*h.upstream, h.number), ("secondary", 2));
    assert_eq!(c.next_hedge(), HedgePlan::No(Reason::HedgeNotAllowed));
    let d = c.report_attempt(h.number, &Outcome::success());
    assert_eq!((d.action, d.hedge), (Action::Succeeded, true));
    // The primary's late result returns the final decision.
    assert_eq!(
        c.report_attempt(a1.number, &Outcome::status(503)).action,
        Action::Succeeded
    );
    assert_eq!(e.stats().overall.hedges, 1);
    // Never for unsafe calls.
    let mut u = e.begin(CallSpec::new("hedged").idempotency(Idempotency::Unsafe));
    u.next_attempt().unwrap();
    clock.advance_ms(1_000);
    assert_eq!(u.next_hedge(), HedgePlan::No(Reason::HedgeNotAllowed));
}

#[test]
fn misuse_is_reported_not_panicked() {
    let (e, _) = engine("");
    let mut c = e.begin(CallSpec::new("up"));
    let d = c.report(&Outcome::success());
    assert_eq!((d.action, d.reason), (Action::Stop, Reason::InvalidState));
    c.next_attempt().unwrap();
    assert_eq!(c.next_attempt().unwrap_err().reason, Reason::InvalidState);
    assert_eq!(c.report(&Outcome::success()).action, Action::Succeeded);
}

#[test]
fn cancel_stops_the_call() {
    let (e, _) = engine("");
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    let d = c.cancel();
    assert_eq!(
        (d.action, d.reason, d.class),
        (Action::Stop, Reason::Cancelled, Some(ErrorClass::Cancelled))
    );
}

#[test]
fn dynamic_timeout_from_token_counts() {
    let (e, _) = engine("timeouts: {dynamic: {base_ms: 2000, per_input_token_us: 100, per_output_token_us: 20000}}");
    let mut c = e.begin(CallSpec::new("up").deadline_ms(60_000).needs(Needs {
        input_tokens: Some(10_000),
        max_output_tokens: Some(500),
        ..Needs::default()
    }));
    let a = c.next_attempt().unwrap();
    assert_eq!(a.timeouts().total, Duration::from_millis(13_000));
}

#[test]
fn identical_inputs_clock_and_seed_give_identical_decisions() {
    let run = || {
        let (e, clock) = engine("max_attempts: 6\ndeadline_ms: 60000");
        let mut out = Vec::new();
        for i in 0..20 {
            let mut c = e.begin(CallSpec::new(format!("up{}", i % 3)));
            loop {
                if c.next_attempt().is_err() {
                    break;
                }
                let d = c.report(&Outcome::status(if i % 4 == 0 { 429 } else { 503 }));
                out.push((d.action, d.delay, d.reason));
                if d.is_final() {
                    break;
                }
                clock.advance(d.delay);
            }
        }
        out
    };
    assert_eq!(run(), run());
}

#[test]
#[cfg(feature = "test-hooks")]
fn panic_hook_panics_inside_report_and_engine_stays_usable() {
    let (e, _) = engine("testing: {panic_on_vendor_code: boom}");
    let e2 = e.clone();
    let r = std::panic::catch_unwind(move || {
        let mut c = e2.begin(CallSpec::new("up"));
        c.next_attempt().unwrap();
        c.report(&Outcome::status(500).vendor_code("boom"));
    });
    assert!(r.is_err());
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    assert_eq!(c.report(&Outcome::success()).action, Action::Succeeded);
}

#[test]
fn concurrency_gates_and_priority_pools() {
    let (e, _) = engine("concurrency: {max_first_attempts: 1, pools: {batch: 1}}");
    let mut a = e.begin(CallSpec::new("up"));
    a.next_attempt().unwrap();
    let mut b = e.begin(CallSpec::new("up"));
    assert_eq!(b.next_attempt().unwrap_err().reason, Reason::ConcurrencyLimit);
    a.report(&Outcome::success());
    let mut c = e.begin(CallSpec::new("other").priority("batch"));
    c.next_attempt().unwrap();
    let mut d = e.begin(CallSpec::new("third").priority("batch"));
    assert_eq!(d.next_attempt().unwrap_err().reason, Reason::ConcurrencyLimit);
    // Interactive traffic is not in the batch pool.
    let mut i = e.begin(CallSpec::new("fourth").priority("interactive"));
    assert!(i.next_attempt().is_ok());
}

#[test]
fn adaptive_throttling_rejects_without_touching_the_network() {
    let (e, _) = engine("throttle: {enabled: true, k: 1.0}\nbudget: {enabled: false}\nbreaker: {enabled: false}");
    let mut throttled = 0;
    for _ in 0..200 {
        let mut c = e.begin(CallSpec::new("up"));
        match c.next_attempt() {
            Ok(_) => {
                let _ = c.report(&Outcome::status(503).header("x-should-retry", "false"));
            }
            Err(s) => {
                assert_eq!(s.reason, Reason::Throttled);
                throttled += 1;
            }
        }
    }
    assert!(throttled > 100, "{throttled}");
    assert_eq!(e.stats().overall.throttled, throttled);
}

#[test]
fn begin_attempt_is_begin_then_next_attempt() {
    let yaml = "telemetry: {ring_size: 64}\nupstreams: {a: {}, b: {}, up: {}}\nroutes: {r: {candidates: [a, b]}}";
    let run = |combined: bool| {
        let (e, clock) = engine(yaml);
        let mut out = Vec::new();
        for route in ["up", "r", "up"] {
            let spec = CallSpec::new(route).deadline_ms(5_000).tenant("t");
            let (mut c, a) = if combined {
                e.begin_attempt(spec)
            } else {
                let mut c = e.begin(spec);
                let a = c.next_attempt();
                (c, a)
            };
            let a = a.unwrap();
            out.push(format!("{} {} {} {:?}", c.id(), a.number, a.upstream, a.timeouts()));
            clock.advance_ms(10);
            let d = c.report(&Outcome::status(503));
            out.push(format!("{:?} {} {:?}", d.action, d.delay_ms(), d.upstream));
        }
        let events: Vec<_> = e
            .events()
            .iter()
            .map(|ev| (ev.kind, ev.seq, ev.at_ms, ev.attempt))
            .collect();
        (out, events, serde_json::to_value(e.stats()).unwrap())
    };
    assert_eq!(run(true), run(false));
    // A stop at the door is the same too.
    let (e, _) = engine("min_attempt_ms: 100");
    let (c, a) = e.begin_attempt(CallSpec::new("up").deadline_ms(50));
    assert_eq!(a.unwrap_err().reason, Reason::DeadlineExceeded);
    assert!(c.is_finished());
}

/// An upstream this thread has cached whose breaker was evicted by a key
/// flood (its key restarts fresh, as documented): the next call there sees
/// the fresh, closed breaker, not the evicted open one.
#[test]
fn an_evicted_breaker_restarts_fresh_for_a_thread_that_cached_it() {
    let (e, clock) = engine(
        "breaker: {min_calls: 2, window_size: 10, failure_rate: 0.5, open_ms: 60000, open_max_ms: 60000, open_jitter: 0}\nbudget: {enabled: false}\nlimits: {max_keys: 16, idle_ms: 1}",
    );
    for _ in 0..2 {
        let mut c = e.begin(CallSpec::new("up"));
        c.next_attempt().unwrap();
        let _ = c.report(&Outcome::status(503).header("x-should-retry", "false"));
    }
    let mut c = e.begin(CallSpec::new("up"));
    assert_eq!(c.next_attempt().unwrap_err().reason, Reason::BreakerOpen);
    // Another thread's upstreams push "up" out of every registry (it is
    // idle, the cap is 16), while this thread still has it cached.
    clock.advance_ms(10);
    let flood = e.clone();
    std::thread::spawn(move || {
        for i in 0..200 {
            let mut c = flood.begin(CallSpec::new(format!("other-{i}")));
            c.next_attempt().unwrap();
            c.report(&Outcome::success());
        }
    })
    .join()
    .unwrap();
    assert!(e.stats().evicted_keys["breakers"] > 0);
    let mut c = e.begin(CallSpec::new("up"));
    let a = c.next_attempt().expect("a fresh breaker admits");
    assert_eq!(&*a.upstream, "up");
    assert_eq!(e.breaker_state("up"), retrywise::BreakerState::Closed);
}

/// `Attempt` promises (in its doc) to stay under 128 bytes, so returning one
/// is a few vector stores rather than a `memcpy` call; its id stays two words.
#[test]
fn an_attempt_fits_in_128_bytes() {
    assert!(
        std::mem::size_of::<retrywise::Attempt>() <= 128,
        "{}",
        std::mem::size_of::<retrywise::Attempt>()
    );
    assert!(std::mem::size_of::<retrywise::RequestId>() <= 24);
}
