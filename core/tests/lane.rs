//! The fast lane (`engine::lane`) decides nothing the general path would
//! decide differently: random call sequences run on two engines built
//! alike, one with the lane and one without, and every step's result, the
//! counters and the events must match exactly.

use proptest::prelude::*;
use retrywise::{CallSpec, Engine, Event, Idempotency, ManualClock, Outcome, Policy};
use std::sync::{Arc, Mutex};

/// One thing the test does to both engines.
#[derive(Debug, Clone)]
enum Op {
    /// Begin a call on upstream `up` (0 or 1), with a tenant or not, and run
    /// its attempts: each attempt's outcome is taken from `outcomes` in turn;
    /// `abandon` drops the call with its last attempt still in flight.
    Call {
        up: u8,
        tenant: bool,
        /// Also a task and an idempotency key (still a plain call), or a priority (not one).
        extras: u8,
        unsafe_call: bool,
        outcomes: Vec<(u64, Outcome)>,
        abandon: bool,
    },
    /// Let time pass.
    Wait(u64),
    /// Take the events out of the ring (a start may then be drained before its end).
    Drain,
    /// Register an event sink (records then go to it as whole events).
    Sink,
    /// Begin a call and ask for its attempt, but report only after `gap` ms and a drain.
    Straddle { gap: u64 },
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        4 => Just(Outcome::success()),
        1 => Just(Outcome::status(200).header("x-request-id", "req-1")),
        1 => Just(Outcome::status(204).header("x-other", "1")),
        2 => prop::sample::select(vec![429u16, 500, 503, 400, 401]).prop_map(Outcome::status),
        1 => Just(Outcome::error(retrywise::ErrorKind::ConnectionReset)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..2, any::<bool>(), 0u8..3, prop::bool::weighted(0.1), prop::collection::vec((0u64..400, outcome()), 1..4), prop::bool::weighted(0.1))
            .prop_map(|(up, tenant, extras, unsafe_call, outcomes, abandon)| Op::Call { up, tenant, extras, unsafe_call, outcomes, abandon }),
        2 => (0u64..3_000).prop_map(Op::Wait),
        1 => Just(Op::Drain),
        1 => (0u64..500).prop_map(|gap| Op::Straddle { gap }),
        1 => Just(Op::Sink),
    ]
}

/// Policies that keep calls on the lane and ones that keep them off it.
fn policy() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec![
            "",
            "breaker: {window_size: 4, min_calls: 2, failure_rate: 0.5, open_ms: 1000, close_after: 1}",
            "breaker: {slow_call_ms: 100, slow_call_rate: 0.5, min_calls: 2, window_size: 4, open_ms: 500}",
            "breaker: {window: time, window_size: 2000, buckets: 4, min_calls: 2, failure_rate: 0.5, open_ms: 700}",
            "breaker: {enabled: false}",
            "breaker: {overrides: {up0: metrics_only}}",
            "breaker: {scope: [upstream, tenant]}",
            "budget: {scopes: [[upstream], [tenant]]}",
            "budget: {enabled: false}",
            "budget: {max_concurrent_retries: 1}",
            "throttle: {enabled: true}",
            "concurrency: {max_first_attempts: 2}",
        ]),
        prop::sample::select(vec![
            "",
            "telemetry: {ring_size: 0}",
            "telemetry: {ring_size: 3}",
            "telemetry: {header_allowlist: []}",
        ]),
        1u32..4,
        prop::sample::select(vec![0u64, 50, 900]),
    )
        .prop_map(|(a, b, max, min_attempt)| {
            let mut lines = vec![
                format!("max_attempts: {max}"),
                "deadline_ms: 2000".to_string(),
                format!("min_attempt_ms: {min_attempt}"),
            ];
            lines.extend([a, b].iter().filter(|s| !s.is_empty()).map(|s| s.to_string()));
            lines.join("\n")
        })
}

/// Everything a run shows, as text.
fn run(yaml: &str, ops: &[Op], lane: bool) -> Vec<String> {
    let clock = ManualClock::new();
    let engine = Engine::builder(Policy::from_str_any(yaml).expect("policy"))
        .clock(Arc::new(clock.clone()))
        .seed(7)
        .read_env(false)
        .fast_lane(lane)
        .build()
        .expect("engine");
    let sunk: Arc<Mutex<Vec<Event>>> = Arc::default();
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::Call {
                up,
                tenant,
                extras,
                unsafe_call,
                outcomes,
                abandon,
            } => {
                let mut spec = CallSpec::new(format!("up{up}")).deadline_ms(1_500);
                if *tenant {
                    spec = spec.tenant("acme");
                }
                match extras {
                    1 => spec = spec.task("chat").idempotency_key("key-1"),
                    2 => spec = spec.priority("batch"),
                    _ => {}
                }
                if *unsafe_call {
                    spec = spec.idempotency(Idempotency::Unsafe);
                }
                let mut call = engine.begin(spec);
                for (i, (took, o)) in outcomes.iter().enumerate() {
                    let a = call.next_attempt();
                    out.push(format!("{a:?}"));
                    if a.is_err() || (*abandon && i + 1 == outcomes.len()) {
                        break;
                    }
                    clock.advance_ms(*took);
                    let d = call.report(o);
                    out.push(format!("{d:?}"));
                    if d.is_final() {
                        break;
                    }
                    clock.advance(d.delay);
                }
                out.push(format!("{:?} {}", call.final_decision(), call.attempts()));
            }
            Op::Wait(ms) => clock.advance_ms(*ms),
            Op::Drain => out.push(format!("{:?}", engine.drain_events())),
            Op::Sink => {
                let s = sunk.clone();
                engine.on_event(Arc::new(move |e| s.lock().unwrap().push(e.clone())));
            }
            Op::Straddle { gap } => {
                let mut call = engine.begin(CallSpec::new("up0"));
                out.push(format!("{:?}", call.next_attempt()));
                clock.advance_ms(*gap);
                out.push(format!("{:?}", engine.drain_events()));
                out.push(format!("{:?}", call.report(&Outcome::success())));
            }
        }
    }
    out.push(serde_json::to_string(&engine.stats()).expect("stats"));
    out.push(format!("{:?}", engine.drain_events()));
    out.push(format!("{:?}", sunk.lock().unwrap()));
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn the_lane_decides_as_the_general_path(yaml in policy(), ops in prop::collection::vec(op(), 1..40)) {
        let with = run(&yaml, &ops, true);
        let without = run(&yaml, &ops, false);
        prop_assert_eq!(with, without);
    }
}
