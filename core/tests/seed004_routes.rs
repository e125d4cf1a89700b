//! Seed 004's three routes, loaded from `tests/policies/seed004-routes.yaml`
//! through the public loader: what falls back where, what never does, and why.

use retrywise::{Action, CallSpec, Engine, ErrorKind, ManualClock, OnFailure, Outcome, Phase, Policy, Reason};
use std::path::Path;
use std::sync::Arc;

fn engine() -> (Engine, ManualClock) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/policies/seed004-routes.yaml");
    let policy = Policy::from_file(&path).expect("seed 004 policy loads");
    assert_eq!(policy.version, "seed004-routes");
    let clock = ManualClock::new();
    let e = Engine::builder(policy)
        .clock(Arc::new(clock.clone()))
        .seed(4)
        .read_env(false)
        .build()
        .unwrap();
    (e, clock)
}

#[test]
fn code_draft_falls_back_to_a_streaming_candidate_only() {
    let (e, clock) = engine();
    let mut c = e.begin(CallSpec::new("code_draft"));
    assert_eq!(&*c.next_attempt().unwrap().upstream, "primary-code-model");
    let d = c.report(&Outcome::status(503));
    assert_eq!(
        (d.action, d.upstream.as_deref()),
        (Action::Fallback, Some("secondary-code-model"))
    );
    assert_eq!(
        d.excluded,
        vec![
            ("primary-code-model".to_string(), "already_tried".to_string()),
            (
                "text-only-model".to_string(),
                "missing_capability:streaming".to_string()
            ),
        ]
    );
    clock.advance(d.delay);
    let a = c.next_attempt().unwrap();
    assert!(a.fallback);
    assert_eq!(c.report(&Outcome::success()).action, Action::Succeeded);
    let s = e.stats();
    assert_eq!(s.per_upstream["secondary-code-model"].successes, 1);
    assert_eq!(s.overall.fallbacks, 1);
}

#[test]
fn contract_decision_never_falls_back_and_asks_for_manual_review() {
    let (e, clock) = engine();
    let mut c = e.begin(CallSpec::new("contract_decision"));
    let mut upstreams = Vec::new();
    let last = loop {
        let a = c.next_attempt().unwrap();
        upstreams.push(a.upstream.to_string());
        let d = c.report(&Outcome::status(503));
        if d.is_final() {
            break d;
        }
        assert_eq!(d.action, Action::Retry);
        clock.advance(d.delay);
    };
    assert_eq!(upstreams, vec!["primary-code-model"; 3]);
    assert_eq!(
        (last.action, last.reason, last.on_failure),
        (Action::Stop, Reason::MaxAttempts, Some(OnFailure::ManualReview))
    );
    // Auth refusals are never bypassed either.
    let mut c = e.begin(CallSpec::new("contract_decision"));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::status(403));
    assert_eq!(
        (d.reason, d.on_failure),
        (Reason::AuthError, Some(OnFailure::ManualReview))
    );
}

#[test]
fn tool_agent_requires_tools_and_schema_and_never_falls_back_after_visible_output() {
    let (e, clock) = engine();
    let mut c = e.begin(CallSpec::new("tool_agent"));
    assert_eq!(&*c.next_attempt().unwrap().upstream, "primary-code-model");
    let d = c.report(&Outcome::status(529));
    assert_eq!(
        (d.action, d.reason, d.upstream.as_deref()),
        (Action::Fallback, Reason::Overloaded, Some("secondary-code-model"))
    );
    assert!(d.excluded.contains(&(
        "text-only-model".to_string(),
        "missing_capability:tool_calling".to_string()
    )));
    clock.advance(d.delay);
    c.next_attempt().unwrap();
    // The stream broke after a tool call was emitted: stop, marked partial, no replay.
    let d = c.report(&Outcome::error(ErrorKind::ConnectionReset).phase(Phase::StreamVisible));
    assert_eq!((d.action, d.reason), (Action::Stop, Reason::StreamVisibleOutput));
    assert_eq!(c.attempts(), 2);
}

#[test]
fn tool_agent_with_no_capable_upstream_left_stops_with_exclusions() {
    let (e, clock) = engine();
    let mut c = e.begin(CallSpec::new("tool_agent"));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::status(503));
    clock.advance(d.delay);
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::status(503));
    assert_eq!((d.action, d.reason), (Action::Stop, Reason::NoEligibleUpstream));
    assert_eq!(
        d.excluded,
        vec![
            ("primary-code-model".to_string(), "already_tried".to_string()),
            (
                "text-only-model".to_string(),
                "missing_capability:tool_calling".to_string()
            ),
            ("secondary-code-model".to_string(), "already_tried".to_string()),
        ]
    );
}
