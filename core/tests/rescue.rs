//! Rescue decisions for the drop-in transports, through the public API on a
//! manual clock: a silent upstream is left for the next candidate, a stream
//! that broke after showing text is continued elsewhere (prefill where the
//! target takes it, an instruction otherwise, again as an instruction when a
//! prefill is refused), the first-byte and first-token timeouts leave time
//! for another attempt, a request's model picks its route, and a flapping
//! primary is served by the fallback and back in use soon after it recovers.

use retrywise::{
    Action, CallSpec, Continuation, Engine, ErrorClass, ErrorKind, Idempotency, ManualClock, Outcome, Phase, Policy,
    Reason, WaitSource,
};
use std::sync::Arc;
use std::time::Duration;

fn engine(yaml: &str) -> (Engine, ManualClock) {
    seeded(yaml, 7)
}

fn seeded(yaml: &str, seed: u64) -> (Engine, ManualClock) {
    let clock = ManualClock::new();
    let e = Engine::builder(Policy::from_str_any(yaml).unwrap())
        .clock(Arc::new(clock.clone()))
        .seed(seed)
        .read_env(false)
        .build()
        .unwrap();
    (e, clock)
}

const ROUTE: &str = "upstreams:\n  a: {model: model-a}\n  b: {model: model-b, capabilities: [assistant_prefill]}\n  c: {model: model-c}\n";

#[test]
fn a_silent_upstream_is_left_for_the_next_candidate() {
    let (e, _) = engine(&format!("{ROUTE}routes:\n  r: {{candidates: [a, b]}}\n"));
    for silence in [
        Outcome::error(ErrorKind::FirstByteTimeout),
        Outcome::error(ErrorKind::FirstByteTimeout).phase(Phase::StreamOpen),
        Outcome::error(ErrorKind::StreamIdleTimeout).phase(Phase::StreamOpen),
    ] {
        let mut c = e.begin(CallSpec::new("r"));
        assert_eq!(&*c.next_attempt().unwrap().upstream, "a");
        let d = c.report(&silence);
        assert_eq!(
            (d.action, d.upstream.as_deref(), d.delay, d.wait_source),
            (Action::Fallback, Some("b"), Duration::ZERO, WaitSource::None),
            "{silence:?}"
        );
    }
    // Any other transient failure stays on the upstream for attempts_per_upstream.
    let mut c = e.begin(CallSpec::new("r"));
    c.next_attempt().unwrap();
    assert_eq!(c.report(&Outcome::status(503)).action, Action::Retry);

    // on_silence: retry keeps the old behaviour; with nowhere else to go the same upstream is retried.
    let (e, _) = engine(&format!(
        "{ROUTE}routes:\n  r: {{candidates: [a, b], on_silence: retry}}\n"
    ));
    let mut c = e.begin(CallSpec::new("r"));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::error(ErrorKind::FirstByteTimeout));
    assert_eq!((d.action, d.upstream.as_deref()), (Action::Retry, Some("a")));
    let mut c = e.begin(CallSpec::new("a"));
    c.next_attempt().unwrap();
    assert_eq!(
        c.report(&Outcome::error(ErrorKind::FirstByteTimeout)).action,
        Action::Retry
    );
}

fn cut() -> Outcome {
    Outcome::error(ErrorKind::ConnectionReset).phase(Phase::StreamVisible)
}

#[test]
fn a_stream_cut_after_text_is_continued_elsewhere() {
    let (e, _) = engine(&format!(
        "{ROUTE}routes:\n  r: {{candidates: [a, b], stream_recovery: continue}}\n  r2: {{candidates: [a, c], stream_recovery: continue}}\n  never: {{candidates: [a, b]}}\n"
    ));
    // b takes an assistant prefill.
    let mut c = e.begin(CallSpec::new("r"));
    c.next_attempt().unwrap();
    let d = c.report(&cut().resumable(true));
    assert_eq!(
        (d.action, d.upstream.as_deref(), d.continuation, d.delay),
        (Action::Fallback, Some("b"), Some(Continuation::Prefill), Duration::ZERO)
    );
    assert_eq!(
        (d.class, d.reason),
        (Some(ErrorClass::PartialStream), Reason::StreamVisibleOutput)
    );
    let a = c.next_attempt().unwrap();
    assert_eq!((&*a.upstream, a.fallback), ("b", true));
    let d = c.report(&Outcome::status(200).continuation(Continuation::Prefill));
    assert_eq!((d.action, d.continuation), (Action::Succeeded, None));

    // c does not: an instruction.
    let mut c = e.begin(CallSpec::new("r2"));
    c.next_attempt().unwrap();
    let d = c.report(&cut().resumable(true));
    assert_eq!(
        (d.action, d.upstream.as_deref(), d.continuation),
        (Action::Fallback, Some("c"), Some(Continuation::Instruction))
    );

    // Not continuable (a tool-call delta was shown), the route says never, or
    // the call is not safe: never a replay, never a truncated success.
    let mut c = e.begin(CallSpec::new("r"));
    c.next_attempt().unwrap();
    let d = c.report(&cut().resumable(false));
    assert_eq!((d.action, d.reason), (Action::Stop, Reason::StreamVisibleOutput));
    let mut c = e.begin(CallSpec::new("never"));
    c.next_attempt().unwrap();
    let d = c.report(&cut().resumable(true));
    assert_eq!(
        (d.action, d.reason, d.continuation),
        (Action::Stop, Reason::StreamVisibleOutput, None)
    );
    let mut c = e.begin(CallSpec::new("r").idempotency(Idempotency::Keyed).idempotency_key("k"));
    c.next_attempt().unwrap();
    assert_eq!(c.report(&cut().resumable(true)).action, Action::Stop);
    let mut c = e.begin(CallSpec::new("r").idempotency(Idempotency::Unsafe));
    c.next_attempt().unwrap();
    assert_eq!(c.report(&cut().resumable(true)).action, Action::Reconcile);
}

#[test]
fn a_refused_prefill_goes_again_at_once_as_an_instruction() {
    let (e, _) = engine(&format!(
        "{ROUTE}routes:\n  r: {{candidates: [a, b], stream_recovery: continue}}\n"
    ));
    let mut c = e.begin(CallSpec::new("r"));
    c.next_attempt().unwrap();
    assert_eq!(
        c.report(&cut().resumable(true)).continuation,
        Some(Continuation::Prefill)
    );
    c.next_attempt().unwrap();
    let refused = Outcome::status(400)
        .continuation(Continuation::Prefill)
        .body(br#"{"type":"error","error":{"type":"invalid_request_error","message":"This model does not support assistant message prefill."}}"#);
    let d = c.report(&refused);
    assert_eq!(
        (d.action, d.reason, d.upstream.as_deref(), d.continuation, d.delay),
        (
            Action::Retry,
            Reason::PrefillRejected,
            Some("b"),
            Some(Continuation::Instruction),
            Duration::ZERO
        )
    );
    let a = c.next_attempt().unwrap();
    assert_eq!((a.number, &*a.upstream), (3, "b"));
    let d = c.report(&Outcome::status(400).continuation(Continuation::Instruction));
    assert_eq!(
        (d.action, d.reason),
        (Action::Stop, Reason::InvalidRequest),
        "a second refusal stops"
    );
    // A context-length refusal of a continuation is not a prefill problem.
    let mut c = e.begin(CallSpec::new("r"));
    c.next_attempt().unwrap();
    c.report(&cut().resumable(true));
    c.next_attempt().unwrap();
    let d = c.report(
        &Outcome::status(400)
            .continuation(Continuation::Prefill)
            .vendor_code("context_length_exceeded"),
    );
    assert_eq!(d.reason, Reason::ContextLengthExceeded);
}

#[test]
fn a_continuation_that_fails_before_its_output_is_continued_again() {
    let (e, _) = engine(&format!(
        "{ROUTE}max_attempts: 5\nroutes:\n  r: {{candidates: [a, b, c], stream_recovery: continue}}\n"
    ));
    let mut c = e.begin(CallSpec::new("r"));
    c.next_attempt().unwrap();
    assert_eq!(
        c.report(&cut().resumable(true)).continuation,
        Some(Continuation::Prefill)
    );
    assert_eq!(&*c.next_attempt().unwrap().upstream, "b");
    // b answers 503: the next attempt still continues (the caller holds the text), in the same form.
    let d = c.report(&Outcome::status(503).continuation(Continuation::Prefill));
    assert_eq!(
        (d.action, d.upstream.as_deref(), d.continuation),
        (Action::Retry, Some("b"), Some(Continuation::Prefill))
    );
    assert_eq!(&*c.next_attempt().unwrap().upstream, "b");
    // b goes silent: the next candidate, c, takes no prefill: an instruction.
    let d = c.report(
        &Outcome::error(ErrorKind::FirstByteTimeout)
            .phase(Phase::StreamOpen)
            .continuation(Continuation::Prefill),
    );
    assert_eq!(
        (d.action, d.upstream.as_deref(), d.continuation),
        (Action::Fallback, Some("c"), Some(Continuation::Instruction))
    );
    // A plain attempt's failure asks for no continuation.
    let mut c = e.begin(CallSpec::new("r"));
    c.next_attempt().unwrap();
    assert_eq!(c.report(&Outcome::status(503)).continuation, None);
}

#[test]
fn first_byte_and_first_token_leave_time_for_another_attempt() {
    let (e, _) = engine("");
    let mut c = e.begin(CallSpec::new("up").deadline_ms(30_000));
    let t = c.next_attempt().unwrap().timeouts();
    assert_eq!(
        (t.connect, t.first_byte, t.first_token, t.idle, t.total),
        (
            Duration::from_secs(5),
            Duration::from_secs(15),
            Duration::from_secs(15),
            Duration::from_secs(15),
            Duration::from_secs(30)
        )
    );
    // Fixed values are clamped to the time left, as before.
    let (e, _) = engine("timeouts: {first_byte_ms: 8000, first_token_ms: 12000, idle_ms: 20000}");
    let mut c = e.begin(CallSpec::new("up").deadline_ms(10_000));
    let t = c.next_attempt().unwrap().timeouts();
    assert_eq!(
        (t.first_byte, t.first_token, t.idle),
        (Duration::from_secs(8), Duration::from_secs(10), Duration::from_secs(10))
    );
}

#[test]
fn a_request_model_picks_its_route() {
    let (e, _) = engine(
        "upstreams:\n  primary: {model: gpt-4o, base_url: 'https://api.openai.com/v1', api: openai, api_key_env: OPENAI_API_KEY}\n  backup: {model: claude-sonnet, base_url: 'http://127.0.0.1:9/v1', api_key_env: BACKUP_KEY, capabilities: [assistant_prefill]}\nroutes:\n  chat: {candidates: [primary, backup]}\nmodels:\n  gpt-4o: chat\n",
    );
    assert_eq!(e.route_for_model("gpt-4o").unwrap(), "chat");
    assert_eq!(e.route_for_model("claude-sonnet").unwrap(), "backup");
    let err = e.route_for_model("gpt-5").unwrap_err();
    assert_eq!(err.path, "models.gpt-5");
    assert!(err.message.contains("models"), "{}", err.message);
    let r = e.reach("backup");
    assert_eq!(
        (
            r.base_url.as_deref(),
            r.model.as_deref(),
            r.api_key_env.as_deref(),
            r.prefill
        ),
        (
            Some("http://127.0.0.1:9/v1"),
            Some("claude-sonnet"),
            Some("BACKUP_KEY"),
            true
        )
    );
    assert!(!e.reach("unknown").rewrites());
    // No catalog at all: the model is its own upstream.
    let (e, _) = engine("");
    assert_eq!(e.route_for_model("gpt-4o-mini").unwrap(), "gpt-4o-mini");
}

#[test]
fn the_catalog_never_holds_a_secret() {
    for (yaml, path) in [
        (
            "upstreams: {a: {api_key_env: 'sk-proj-abc123'}}",
            "upstreams.a.api_key_env",
        ),
        ("upstreams: {a: {base_url: 'api.openai.com'}}", "upstreams.a.base_url"),
        ("upstreams: {a: {api_version: '2024-06-01'}}", "upstreams.a.api_version"),
        ("upstreams: {a: {}}\nmodels: {gpt-4o: ghost}", "models.gpt-4o"),
        ("upstreams: {a: {api_key: 'sk-1'}}", "upstreams.a"),
    ] {
        let err = Policy::from_str_any(yaml).unwrap_err();
        // The field is named (a parse error names it in its message).
        assert!(err.to_string().contains(path), "{yaml}: {err}");
        assert!(
            !err.to_string().contains("sk-proj-abc123") && !err.to_string().contains("sk-1"),
            "a key is never echoed: {err}"
        );
    }
}

/// A primary down for 60 s, then healthy, under requests 4 s apart, with
/// the default policy: every request is answered (by the fallback while the
/// primary is down) and within 30 s of its recovery the primary serves
/// again, in each of 10 runs (engines seeded differently: their jitter and
/// breaker timings differ).
#[test]
fn a_flapping_primary_is_served_around_and_back_within_30_s() {
    let recovers_ms = 60_000u64;
    let mut backs = Vec::new();
    for seed in 1..=10u64 {
        let (e, clock) = seeded(&format!("{ROUTE}routes:\n  r: {{candidates: [a, b]}}\n"), seed);
        let mut back_at = None;
        for i in 0..30u64 {
            let now = i * 4_000;
            let mut c = e.begin(CallSpec::new("r"));
            let answered = loop {
                let a = match c.next_attempt() {
                    Ok(a) => a,
                    Err(s) if !s.is_final() => {
                        clock.advance(s.wait.unwrap());
                        continue;
                    }
                    Err(s) => panic!("seed {seed}: request {i} stopped: {s}"),
                };
                let up = a.upstream.to_string();
                let t = e.now().as_millis() as u64;
                let d = if up == "a" && t < recovers_ms {
                    c.report(&Outcome::status(503))
                } else {
                    c.report(&Outcome::status(200))
                };
                match d.action {
                    Action::Succeeded => break up,
                    Action::Retry | Action::Fallback => clock.advance(d.delay),
                    _ => panic!("seed {seed}: request {i}: {d:?}"),
                }
            };
            if answered == "a" && now >= recovers_ms {
                back_at.get_or_insert(now);
            }
            let next = (i + 1) * 4_000;
            let t = e.now().as_millis() as u64;
            if next > t {
                clock.advance_ms(next - t);
            }
        }
        let back_at = back_at.unwrap_or_else(|| panic!("seed {seed}: the primary never serves again"));
        backs.push(back_at - recovers_ms);
    }
    assert!(
        backs.iter().all(|&b| b <= 30_000),
        "back on the primary after recovery, ms: {backs:?}"
    );
}
