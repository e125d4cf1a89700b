//! Events for each decision kind with exact fields, budget refusals and
//! fallback choices, a bounded ring, Prometheus output, reload atomicity under
//! concurrent calls, and the environment kill switch.

use retrywise::{
    Action, CallSpec, Engine, ErrorClass, ErrorKind, Event, EventKind, Idempotency, ManualClock, Outcome, Phase,
    Policy, Reason, WaitSource,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

fn engine(yaml: &str) -> (Engine, ManualClock) {
    let clock = ManualClock::new();
    let e = Engine::builder(Policy::from_str_any(yaml).unwrap())
        .clock(Arc::new(clock.clone()))
        .seed(3)
        .read_env(false)
        .build()
        .unwrap();
    (e, clock)
}

fn last(e: &Engine, kind: EventKind) -> Event {
    e.events().into_iter().rev().find(|ev| ev.kind == kind).expect("event")
}

#[test]
fn succeeded_decision_event() {
    let (e, clock) = engine("version: v1");
    let mut c = e.begin(CallSpec::new("up").tenant("t").task("chat").deadline_ms(5_000));
    c.next_attempt().unwrap();
    clock.advance_ms(40);
    c.report(&Outcome::status(200));
    let end = last(&e, EventKind::AttemptEnd);
    assert_eq!(
        (end.status, end.error_class, end.phase, end.reason),
        (Some(200), None, None, Some(Reason::Success))
    );
    assert_eq!(end.delay_ms, Some(40), "attempt duration");
    let d = last(&e, EventKind::Decision);
    assert_eq!(d.action, Some(Action::Succeeded));
    assert_eq!(d.reason, Some(Reason::Success));
    assert_eq!(d.wait_source, Some(WaitSource::None));
    assert_eq!(d.delay_ms, Some(0));
    assert_eq!(d.attempt, Some(1));
    assert_eq!(d.task.as_deref(), Some("chat"));
    assert_eq!(d.tenant.as_deref(), Some("t"));
    assert_eq!(d.remaining_ms, Some(4_960));
    assert_eq!(&*d.policy_version, "v1");
}

#[test]
fn stop_and_reconcile_decision_events() {
    let (e, _) = engine("");
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    c.report(&Outcome::status(401));
    let d = last(&e, EventKind::Decision);
    assert_eq!(
        (d.action, d.reason, d.error_class),
        (
            Some(Action::Stop),
            Some(Reason::AuthError),
            Some(ErrorClass::AuthOrPolicy)
        )
    );
    let mut c = e.begin(CallSpec::new("up").idempotency(Idempotency::Unsafe));
    c.next_attempt().unwrap();
    c.report(&Outcome::error(ErrorKind::ConnectionReset).phase(Phase::Sent));
    let end = last(&e, EventKind::AttemptEnd);
    assert_eq!(
        (end.error_kind, end.phase),
        (Some(ErrorKind::ConnectionReset), Some(Phase::Sent))
    );
    let d = last(&e, EventKind::Decision);
    assert_eq!(
        (d.action, d.reason, d.error_class),
        (
            Some(Action::Reconcile),
            Some(Reason::EffectUnknown),
            Some(ErrorClass::ResultUnknown)
        )
    );
}

#[test]
fn budget_refusal_event_names_the_scope() {
    let (e, _) = engine("budget: {ratio: 0, min_per_sec: 0}");
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    c.report(&Outcome::status(503));
    let r = last(&e, EventKind::BudgetRefusal);
    assert_eq!(
        (r.reason, r.detail.as_deref(), r.upstream.as_deref()),
        (Some(Reason::BudgetExhausted), Some("scope up"), Some("up"))
    );
    assert_eq!(last(&e, EventKind::Decision).reason, Some(Reason::BudgetExhausted));
}

#[test]
fn fallback_event_lists_exclusions() {
    let (e, _) = engine(
        r#"
upstreams:
  a: {provider: x, model: a, capabilities: [tool_calling]}
  b: {provider: y, model: b, capabilities: []}
  c: {provider: z, model: c, capabilities: [tool_calling]}
routes:
  r: {candidates: [a, b, c], require: [tool_calling], attempts_per_upstream: 1}
"#,
    );
    let mut c = e.begin(CallSpec::new("r"));
    c.next_attempt().unwrap();
    let d = c.report(&Outcome::status(503));
    assert_eq!((d.action, d.upstream.as_deref()), (Action::Fallback, Some("c")));
    let f = last(&e, EventKind::Fallback);
    assert_eq!(f.upstream.as_deref(), Some("c"));
    assert_eq!(f.action, Some(Action::Fallback));
    assert_eq!(
        f.excluded,
        vec![
            ("a".to_string(), "already_tried".to_string()),
            ("b".to_string(), "missing_capability:tool_calling".to_string())
        ]
    );
    let start = e
        .events()
        .into_iter()
        .filter(|ev| ev.kind == EventKind::AttemptStart)
        .collect::<Vec<_>>();
    assert_eq!(start.len(), 1);
    c.next_attempt().unwrap();
    let s2 = last(&e, EventKind::AttemptStart);
    assert_eq!((s2.attempt, s2.upstream.as_deref()), (Some(2), Some("c")));
    assert_eq!(
        s2.parent_attempt_id.map(|a| a.to_string()),
        Some(format!("{}.1", c.id()))
    );
}

#[test]
fn ring_buffer_is_bounded_with_a_dropped_counter() {
    let (e, _) = engine("telemetry: {ring_size: 5}");
    for _ in 0..10 {
        let mut c = e.begin(CallSpec::new("up"));
        c.next_attempt().unwrap();
        c.report(&Outcome::success());
    }
    assert_eq!(e.events().len(), 5);
    assert_eq!(e.stats().events_dropped, 25);
    assert_eq!(e.drain_events().len(), 5);
    assert!(e.events().is_empty());
}

#[test]
fn sink_sees_every_event_and_its_panics_are_contained() {
    let (e, _) = engine("telemetry: {ring_size: 0}");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let id = e.on_event(Arc::new(move |ev: &Event| s2.lock().unwrap().push(ev.kind)));
    e.on_event(Arc::new(|_ev: &Event| panic!("a buggy sink")));
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    assert_eq!(c.report(&Outcome::success()).action, Action::Succeeded);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![EventKind::AttemptStart, EventKind::AttemptEnd, EventKind::Decision]
    );
    assert_eq!(e.stats().sink_panics, 3);
    assert!(e.remove_sink(id));
}

#[test]
fn prometheus_exposition() {
    let (e, _) = engine("version: p1");
    let mut c = e.begin(CallSpec::new("up").tenant("acme"));
    c.next_attempt().unwrap();
    c.report(&Outcome::status(400));
    let text = e.prometheus();
    assert!(text.contains("# TYPE retrywise_attempts_total counter"));
    assert!(text.contains("retrywise_attempts_total 1\n"));
    assert!(text.contains("retrywise_logical_requests_total{tenant=\"acme\"} 1"));
    assert!(text.contains("retrywise_attempts_total{upstream=\"up\"} 1"));
    assert!(text.contains("retrywise_logical_requests_total{policy_version=\"p1\"} 1"));
    assert!(text.contains("retrywise_stops_total{reason=\"invalid_request\"} 1"));
}

/// Threads keep making calls while another swaps policies: every call runs
/// under exactly one version from begin to end (v1 allows 2 attempts, v2 allows 4).
#[test]
fn reload_is_atomic_under_concurrent_calls() {
    let p1 = Policy::from_str_any("version: v1\nmax_attempts: 2\nbackoff: {base_ms: 0, cap_ms: 0}\nbudget: {enabled: false}\nbreaker: {enabled: false}").unwrap();
    let p2 = Policy::from_str_any("version: v2\nmax_attempts: 4\nbackoff: {base_ms: 0, cap_ms: 0}\nbudget: {enabled: false}\nbreaker: {enabled: false}").unwrap();
    let e = Engine::builder(p1.clone()).seed(1).read_env(false).build().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reloader = {
        let (e, stop, p1, p2) = (e.clone(), stop.clone(), p1.clone(), p2.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            // At least one round even when the workers finish first (a loaded machine).
            while n == 0 || !stop.load(Ordering::Relaxed) {
                e.reload(if n % 2 == 0 { p2.clone() } else { p1.clone() }).unwrap();
                // Invalid policies interleaved: never take effect.
                assert!(e
                    .reload(Policy {
                        max_attempts: 0,
                        ..p2.clone()
                    })
                    .is_err());
                n += 1;
            }
            n
        })
    };
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let e = e.clone();
            std::thread::spawn(move || {
                for _ in 0..5_000 {
                    let mut c = e.begin(CallSpec::new("up"));
                    let version = c.policy_version().to_string();
                    let mut n = 0;
                    while c.next_attempt().is_ok() {
                        n += 1;
                        if c.report(&Outcome::status(503)).is_final() {
                            break;
                        }
                    }
                    let want = if version == "v1" { 2 } else { 4 };
                    assert_eq!(n, want, "a {version} call made {n} attempts");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reloader.join().unwrap() > 0);
    let s = e.stats();
    assert!(["v1", "v2"].contains(&s.policy_version.as_str()));
    assert_eq!(s.overall.logical_requests, 10_000);
}

#[test]
fn kill_switch_from_the_environment() {
    // The only test in this binary that reads RETRYWISE_DISABLE.
    std::env::set_var("RETRYWISE_DISABLE", "retries");
    let e = Engine::new(Policy::default()).unwrap();
    std::env::remove_var("RETRYWISE_DISABLE");
    assert!(!e.mode().retries && e.mode().fallback && e.mode().hedging);
    let mut c = e.begin(CallSpec::new("up"));
    c.next_attempt().unwrap();
    assert_eq!(c.report(&Outcome::status(503)).reason, Reason::RetriesDisabled);
    std::env::set_var("RETRYWISE_DISABLE", "bogus");
    let err = Engine::new(Policy::default()).unwrap_err();
    std::env::remove_var("RETRYWISE_DISABLE");
    assert_eq!(err.first().path, "RETRYWISE_DISABLE");
}

/// Worker threads run calls (some retried once) while another thread keeps
/// draining: every call's events come out exactly once, complete and in
/// order — start, end, decision per attempt — however the drains fall
/// between an attempt's start and its end (which then cannot share its
/// start's record).
#[test]
fn drains_racing_calls_see_every_event_exactly_once() {
    let (e, _) = engine("telemetry: {ring_size: 1000000}\nbudget: {ratio: 1.0, min_per_sec: 0}\nbreaker: {enabled: false}\nbackoff: {base_ms: 0, cap_ms: 0}");
    const THREADS: usize = 2;
    const CALLS: usize = 20_000;
    let done = Arc::new(AtomicBool::new(false));
    let drained = Arc::new(Mutex::new(Vec::new()));
    let drainer = {
        let (e, done, drained) = (e.clone(), done.clone(), drained.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                let batch = e.drain_events();
                drained.lock().unwrap().extend(batch);
            }
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let e = e.clone();
            std::thread::spawn(move || {
                for i in 0..CALLS {
                    let mut c = e.begin(CallSpec::new(format!("up-{t}")));
                    let retried = i % 3 == 0;
                    c.next_attempt().unwrap();
                    if retried {
                        assert_eq!(c.report(&Outcome::status(503)).action, Action::Retry);
                        c.next_attempt().unwrap();
                    }
                    assert_eq!(c.report(&Outcome::success()).action, Action::Succeeded);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    done.store(true, Ordering::Release);
    drainer.join().unwrap();
    let mut all = std::mem::take(&mut *drained.lock().unwrap());
    all.extend(e.drain_events());
    type Seen = Vec<(EventKind, Option<u32>, Option<Action>)>;
    let mut by_call: std::collections::HashMap<Arc<str>, Seen> = std::collections::HashMap::new();
    for ev in &all {
        let id = ev.logical_request_id.clone().expect("attempt events name their call");
        by_call.entry(id).or_default().push((ev.kind, ev.attempt, ev.action));
    }
    assert_eq!(by_call.len(), THREADS * CALLS, "a call lost all its events");
    use EventKind::{AttemptEnd as E, AttemptStart as S, Decision as D};
    let once = vec![
        (S, Some(1), None),
        (E, Some(1), None),
        (D, Some(1), Some(Action::Succeeded)),
    ];
    let twice = vec![
        (S, Some(1), None),
        (E, Some(1), None),
        (D, Some(1), Some(Action::Retry)),
        (S, Some(2), None),
        (E, Some(2), None),
        (D, Some(2), Some(Action::Succeeded)),
    ];
    let (mut ones, mut twos) = (0, 0);
    for (id, evs) in &by_call {
        if evs == &once {
            ones += 1;
        } else if evs == &twice {
            twos += 1;
        } else {
            panic!("call {id}: {evs:?}");
        }
    }
    assert_eq!(twos, THREADS * CALLS.div_ceil(3));
    assert_eq!(ones + twos, THREADS * CALLS);
    assert_eq!(e.stats().events_dropped, 0);
}

/// Records a consumer already drained are not lost when the ring later
/// overwrites their slots: they do not count as dropped.
#[test]
fn drained_events_never_count_as_dropped() {
    let (e, _) = engine("telemetry: {ring_size: 8}\nbreaker: {enabled: false}\nbudget: {enabled: false}");
    let mut drained = 0;
    for _ in 0..20 {
        let mut c = e.begin(CallSpec::new("up"));
        c.next_attempt().unwrap();
        c.report(&Outcome::status(503));
        c.next_attempt().unwrap();
        c.report(&Outcome::success());
        drained += e.drain_events().len();
    }
    assert_eq!(drained, 20 * 6);
    assert_eq!(e.stats().events_dropped, 0);
    // Without a drain, the ring keeps the newest 8 events and counts the rest as dropped.
    for _ in 0..4 {
        let mut c = e.begin(CallSpec::new("up"));
        c.next_attempt().unwrap();
        c.report(&Outcome::success());
    }
    assert_eq!(e.events().len(), 8);
    assert_eq!(e.stats().events_dropped, 12 - 8);
}
