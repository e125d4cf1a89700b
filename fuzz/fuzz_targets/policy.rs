//! Policy loading from arbitrary bytes: `Policy::parse` as JSON, YAML and
//! TOML, and `Policy::from_str_any` (format guessed), exactly as the bindings
//! receive a document. Every accepted policy then builds an engine and runs
//! one short call.
//!
//! Checks: never a panic or hang (deep nesting, YAML aliases, huge numbers);
//! an accepted policy validates; it survives a JSON round trip unchanged (the
//! bindings hand `policy()` back as a dict / object); an engine builds from
//! it; one call under it never exceeds `max_attempts` and never starts an
//! attempt with less than `min_attempt_ms` left.

#![no_main]

use libfuzzer_sys::fuzz_target;
use retrywise_core::{Action, CallSpec, Engine, Format, ManualClock, Outcome, Policy};
use std::sync::Arc;
use std::time::Duration;

fn exercise(p: Policy) {
    p.validate().expect("an accepted policy validates");
    let json = serde_json::to_string(&p).expect("a policy serializes");
    let back = Policy::parse(&json, Format::Json).unwrap_or_else(|e| panic!("round trip rejected: {e}\n{json}"));
    assert_eq!(back, p, "JSON round trip changed the policy");

    let clock = ManualClock::new();
    let engine = Engine::builder(p.clone())
        .clock(Arc::new(clock.clone()))
        .seed(7)
        .read_env(false)
        .build()
        .expect("an accepted policy builds an engine");
    let route = p
        .routes
        .keys()
        .next()
        .cloned()
        .unwrap_or_else(|| "fuzz/upstream".into());
    let max = p
        .routes
        .get(&route)
        .and_then(|r| r.max_attempts)
        .unwrap_or(p.max_attempts);
    let min_attempt = Duration::from_millis(p.min_attempt_ms);
    let mut call = engine.begin(CallSpec::new(route).tenant("t"));
    for _ in 0..8 {
        let Ok(a) = call.next_attempt() else { break };
        assert!(a.number <= max, "attempt {} > max_attempts {max}", a.number);
        assert!(a.remaining() >= min_attempt && !a.remaining().is_zero());
        let d = call.report(&Outcome::status(503).header("retry-after-ms", "1"));
        match d.action {
            Action::Retry | Action::Fallback => {
                assert!(d.delay + min_attempt <= call.remaining());
                clock.advance(d.delay);
            }
            _ => break,
        }
    }
    assert!(call.attempts() <= max);
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for format in [Format::Json, Format::Yaml, Format::Toml] {
        if let Ok(p) = Policy::parse(&text, format) {
            exercise(p);
        }
    }
    if let Ok(p) = Policy::from_str_any(&text) {
        exercise(p);
    }
});
