//! Regression tests from fuzzing (`fuzz/`, see fuzz/README.md): inputs the
//! fuzz targets found or that pin a behaviour the targets assert, run on
//! every `cargo test` without the fuzzer.

use retrywise::rules::wait::{parse_retry_after, HintProblem};
use retrywise::{Action, CallSpec, Engine, Format, Headers, Inbound, ManualClock, Outcome, Policy, Reason};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// 2025-01-01T00:00:00Z, the manual clock's default wall time.
fn wall() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_735_689_600)
}

fn hint(name: &str, value: &str) -> retrywise::rules::wait::RetryHint {
    let h: Headers = [(name, value)].into_iter().collect();
    parse_retry_after(&h, wall())
}

/// Policy documents nested far deeper than any real one are refused with an
/// error in every format, not a stack overflow, on a thread with Rust's
/// default 2 MiB stack even in a debug build (bindings decide on their
/// callers' threads: worker threads, thread pools).
#[test]
fn deeply_nested_policy_documents_are_errors() {
    let docs = [
        (Format::Json, "[".repeat(50_000)),
        (Format::Json, format!("{{\"routes\":{}", "{\"a\":".repeat(50_000))),
        (Format::Yaml, "[".repeat(50_000)),
        (Format::Yaml, "- ".repeat(50_000)),
        (Format::Yaml, format!("routes:\n{}", "{a: ".repeat(50_000))),
        (Format::Toml, format!("a = {}", "[".repeat(50_000))),
        (Format::Toml, format!("a = {}", "{b = ".repeat(50_000))),
    ];
    std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(move || {
            for (format, doc) in docs {
                assert!(Policy::parse(&doc, format).is_err(), "{format:?}");
                assert!(Policy::from_str_any(&doc).is_err(), "{format:?}");
            }
        })
        .unwrap()
        .join()
        .unwrap();
}

/// YAML alias expansion ("billion laughs") is bounded: an error, quickly.
#[test]
fn yaml_alias_bomb_is_an_error() {
    let mut doc = String::from("a: &a [\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]\n");
    let mut prev = 'a';
    for c in 'b'..='i' {
        doc.push_str(&format!(
            "{c}: &{c} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
        ));
        prev = c;
    }
    let started = std::time::Instant::now();
    assert!(Policy::parse(&doc, Format::Yaml).is_err());
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

/// The numeric oracle of the `retry_after` target: all-digit values up to a
/// year are exact seconds, above it they are absurd and ignored.
#[test]
fn retry_after_digits_are_exact_up_to_a_year() {
    let year = 365 * 24 * 3600;
    assert_eq!(hint("retry-after", "31536000").wait, Some(Duration::from_secs(year)));
    let over = hint("retry-after", "31536001");
    assert_eq!((over.wait, over.problem), (None, Some(HintProblem::Absurd)));
    let over = hint("retry-after", "212121230");
    assert_eq!((over.wait, over.problem), (None, Some(HintProblem::Absurd)));
    let ms = hint("retry-after-ms", "31536000001");
    assert_eq!((ms.wait, ms.problem), (None, Some(HintProblem::Absurd)));
}

/// A far-future HTTP-date is as absurd as a far-future number of seconds: the
/// `retry_after` target found that a date ~8 000 years ahead is accepted as a
/// wait (so `on_exceed: cap` then waits `max_ms`, or the call stops with
/// `retry_after_exceeds_deadline`), while the same wait as delta-seconds is
/// ignored as absurd and local jitter is used.
#[test]
fn far_future_http_date_is_absurd() {
    let h = hint("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT");
    assert_eq!((h.wait, h.problem), (None, Some(HintProblem::Absurd)));
    let h = hint("retry-after", "Thu, 01 Jan 2026 00:00:01 GMT");
    assert_eq!((h.wait, h.problem), (None, Some(HintProblem::Absurd)));
    // Within a year a date is still a wait.
    let h = hint("retry-after", "Wed, 01 Jan 2025 00:00:30 GMT");
    assert_eq!(h.wait, Some(Duration::from_secs(30)));
}

/// A far-future date and the same wait in delta-seconds are treated alike in
/// a call: both are absurd, and an absurd hint is a very long wait (never
/// "no hint, retry on local jitter"): inside a 10 s deadline the call stops,
/// even with `on_exceed: cap`, because the deadline comes first.
#[test]
fn far_future_http_date_versus_absurd_seconds_in_a_call() {
    let clock = ManualClock::new();
    // Pacing off: each call's own decision (with it, the first hint holds the next call).
    let policy = Policy::from_str_any("retry_after: {on_exceed: cap}\nrate_limits: {enabled: false}\n").unwrap();
    let engine = Engine::builder(policy)
        .clock(Arc::new(clock))
        .seed(3)
        .read_env(false)
        .build()
        .unwrap();
    let decide = |value: &str| {
        let mut call = engine.begin(CallSpec::new("up").deadline_ms(10_000));
        call.next_attempt().unwrap();
        call.report(&Outcome::status(429).header("retry-after", value))
    };
    for value in ["251667000000", "Fri, 31 Dec 9999 23:59:59 GMT"] {
        let d = decide(value);
        assert_eq!(
            (d.action, d.reason, d.retry_after),
            (Action::Stop, Reason::RetryAfterExceedsDeadline, None),
            "{value}"
        );
    }
}

/// The `inbound` target's round trip: what an engine sends downstream parses
/// back unchanged, and a call under it makes exactly one attempt.
#[test]
fn inbound_round_trip_and_single_attempt() {
    let h: Headers = [
        ("retrywise-deadline-ms", " 604800000 "),
        ("retrywise-request-id", "~!"),
        ("retrywise-attempt", "4294967295"),
        ("idempotency-key", " k "),
    ]
    .into_iter()
    .collect();
    let inbound = Inbound::from_headers(&h).unwrap().unwrap();
    assert_eq!(inbound.deadline, Some(Duration::from_millis(604_800_000)));
    assert_eq!(inbound.attempt, Some(u32::MAX));
    assert_eq!(inbound.idempotency_key.as_deref(), Some("k"));
    let out = retrywise::rules::deadline::outbound_headers(
        Duration::from_millis(604_800_000),
        Duration::ZERO,
        "~!",
        u32::MAX,
        Some("k"),
    );
    let back: Headers = out.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(Inbound::from_headers(&back).unwrap(), Some(inbound.clone()));
    let over: Headers = [("retrywise-deadline-ms", "604800001")].into_iter().collect();
    assert!(Inbound::from_headers(&over).is_err());

    let engine = Engine::builder(Policy::default())
        .clock(Arc::new(ManualClock::new()))
        .read_env(false)
        .build()
        .unwrap();
    let mut call = engine.begin(CallSpec::new("up").inbound(inbound));
    assert!(!call.is_owner());
    assert_eq!(call.next_attempt().unwrap().number, 1);
    assert_ne!(call.report(&Outcome::status(503)).action, Action::Retry);
    assert!(call.next_attempt().is_err());
}
