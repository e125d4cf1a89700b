//! Fleet-wide state through the in-memory store, on manual clocks: three
//! engines of one fleet, every step deterministic. The same scenarios run
//! against a real Redis in separate processes in `fleet/tests/processes.rs`.

use proptest::prelude::*;
use rand::SeedableRng;
use retrywise::fleet::memory::MemoryStore;
use retrywise::fleet::record::{merge, Body, Limits, Record, Records, WindowRecord};
use retrywise::fleet::view::breaker_view;
use retrywise::fleet::{Fleet, FleetConfig};
use retrywise::ratelimit::{Admission, RateLimits, Reading};
use retrywise::rules::deadline::TokenEstimate;
use retrywise::{BreakerState, CallSpec, Clock, Engine, EventKind, ManualClock, Outcome, Policy};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

const WALL0: u64 = 1_750_000_000_000;
const POLICY: &str = "
max_attempts: 1
breaker:
  min_calls: 4
  window_size: 4
  failure_rate: 0.5
  open_ms: 30000
  open_max_ms: 60000
  open_jitter: 0
  half_open_probes: 1
  close_after: 1
  hold: false
";

struct Node {
    engine: Engine,
    clock: Arc<ManualClock>,
    fleet: Fleet,
    limits: Arc<RateLimits>,
}

fn node(name: &str, quorum: u32) -> Node {
    let clock = Arc::new(ManualClock::at_wall(UNIX_EPOCH + Duration::from_millis(WALL0)));
    let engine = Engine::builder(Policy::from_str_any(POLICY).unwrap())
        .clock(clock.clone())
        .seed(7)
        .read_env(false)
        .build()
        .unwrap();
    let fleet = engine
        .fleet(FleetConfig {
            instance: name.into(),
            quorum,
            ..FleetConfig::default()
        })
        .unwrap();
    let limits = Arc::new(RateLimits::default());
    fleet.attach_rate_limits(limits.clone());
    Node {
        engine,
        clock,
        fleet,
        limits,
    }
}

impl Node {
    /// One call, one attempt with `status`: "sent" or the refusal's reason.
    fn call(&self, status: u16) -> String {
        let mut c = self.engine.begin(CallSpec::new("up").deadline_ms(60_000));
        match c.next_attempt() {
            Ok(_) => {
                c.report(&Outcome::status(status));
                "sent".into()
            }
            Err(s) => s.reason.as_str().into(),
        }
    }

    fn state(&self) -> BreakerState {
        self.engine.breaker_state("up")
    }

    fn now_ns(&self) -> u64 {
        self.engine.now().as_nanos() as u64
    }

    fn wall(&self) -> u64 {
        self.clock.wall().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
    }

    fn sync(&self, store: &mut MemoryStore) -> retrywise::fleet::SyncReport {
        let plan = self.fleet.plan();
        let (reads, claims) = store.run(&plan, self.wall());
        self.fleet.complete(plan.id, &reads, &claims)
    }
}

fn advance(nodes: &[&Node], ms: u64) {
    for n in nodes {
        n.clock.advance_ms(ms);
    }
}

#[test]
fn an_open_reaches_the_others_and_one_probe_recovers_the_fleet() {
    let mut store = MemoryStore::new();
    let (a, b, c) = (node("a", 1), node("b", 1), node("c", 1));
    for n in [&a, &b, &c] {
        assert_eq!(n.call(200), "sent");
        n.sync(&mut store);
    }
    // The upstream fails for a: a opens on its own evidence (3 failures of 4 calls).
    for _ in 0..3 {
        assert_eq!(a.call(503), "sent");
    }
    assert_eq!(a.state(), BreakerState::Open);
    assert_eq!(
        (b.call(200), c.call(200)),
        ("sent".into(), "sent".into()),
        "not shared yet"
    );
    // a's next cycle writes the open, the others' next cycle reads it: b and c stop sending.
    a.sync(&mut store);
    assert_eq!(b.sync(&mut store).opened, 1);
    assert_eq!(c.sync(&mut store).opened, 1);
    assert_eq!(
        (b.call(200), c.call(200)),
        ("breaker_open".into(), "breaker_open".into())
    );
    // Near the end of the open period every instance claims the probe lease: one wins.
    advance(&[&a, &b, &c], 29_800);
    let won: Vec<u32> = [&a, &b, &c].iter().map(|n| n.sync(&mut store).leases_won).collect();
    assert_eq!(won, [1, 0, 0], "a claimed first");
    advance(&[&a, &b, &c], 300);
    // Exactly one probe in the fleet: a's; b and c hold until a's lease ends.
    let mut probe = a.engine.begin(CallSpec::new("up").deadline_ms(60_000));
    assert!(probe.next_attempt().is_ok(), "a probes");
    assert_eq!(
        (b.call(200), c.call(200)),
        ("breaker_open".into(), "breaker_open".into())
    );
    assert_eq!(a.call(200), "breaker_open", "one probe at a time on a too");
    probe.report(&Outcome::status(200));
    assert_eq!(a.state(), BreakerState::Closed);
    a.sync(&mut store);
    assert_eq!(b.sync(&mut store).recovered, 1);
    assert_eq!(c.sync(&mut store).recovered, 1);
    assert_eq!((b.state(), c.state()), (BreakerState::Closed, BreakerState::Closed));
    assert_eq!((b.call(200), c.call(200)), ("sent".into(), "sent".into()));
}

#[test]
fn one_instance_below_the_quorum_opens_nobody_else() {
    let mut store = MemoryStore::new();
    let (a, b, c) = (node("a", 2), node("b", 2), node("c", 2));
    for _ in 0..4 {
        a.call(503);
    }
    a.sync(&mut store);
    assert_eq!(b.sync(&mut store).opened, 0);
    assert_eq!(c.sync(&mut store).opened, 0);
    assert_eq!((b.call(200), c.call(200)), ("sent".into(), "sent".into()));
    // A second instance with its own evidence makes the quorum: the third opens.
    for _ in 0..4 {
        b.call(503);
    }
    b.sync(&mut store);
    assert_eq!(c.sync(&mut store).opened, 1);
    assert_eq!(c.call(200), "breaker_open");
    // Adopted opens are not repeated as evidence: c wrote no open of its own.
    c.sync(&mut store);
    let recs = store.records("retrywise:b:pmr:up", c.wall());
    assert_eq!(recs.keys().collect::<Vec<_>>(), ["a", "b"]);
}

#[test]
fn a_retry_after_cooldown_defers_the_other_instances() {
    let mut store = MemoryStore::new();
    let (a, b) = (node("a", 2), node("b", 2));
    let scope = "key-1/openai/gpt-4o";
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(1);
    let est = TokenEstimate::default();
    let left = Duration::from_secs(60);
    for n in [&a, &b] {
        let Admission::Go(r) = n.limits.admit(scope, n.now_ns(), est, left, None, &mut rng) else {
            panic!()
        };
        n.limits.settle(
            scope,
            r,
            &Reading::default().answered(),
            retrywise::ratelimit::Usage::sent(),
            n.now_ns(),
        );
        n.sync(&mut store);
    }
    // a gets a 429 with Retry-After: 20.
    let Admission::Go(r) = a.limits.admit(scope, a.now_ns(), est, left, None, &mut rng) else {
        panic!()
    };
    let refusal = Reading::default().rate_limited().retry_delay(Duration::from_secs(20));
    a.limits
        .settle(scope, r, &refusal, retrywise::ratelimit::Usage::sent(), a.now_ns());
    a.sync(&mut store);
    assert_eq!(b.sync(&mut store).limits, 1);
    match b
        .limits
        .admit(scope, b.now_ns(), est, Duration::from_secs(5), None, &mut rng)
    {
        Admission::Stop(why) => assert_eq!(why.reason(), "rate_limited_until"),
        other => panic!("b was not deferred: {other:?}"),
    }
    match b.limits.admit(scope, b.now_ns(), est, left, None, &mut rng) {
        Admission::Wait { wait, .. } => assert!(wait >= Duration::from_secs(20) - Duration::from_millis(1)),
        other => panic!("b was not deferred: {other:?}"),
    }
    // Applying the same records again changes nothing.
    assert_eq!(b.sync(&mut store).limits, 0);
}

#[test]
fn with_the_store_down_decisions_are_the_local_ones_and_it_resyncs_after() {
    let mut store = MemoryStore::new();
    let (a, b) = (node("a", 1), node("b", 1));
    let twin = node("twin", 1); // never synced: what local state alone decides
    assert_eq!(b.call(200), "sent", "b knows the scope");
    let events = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let ev = events.clone();
    a.engine.on_event(Arc::new(move |e: &retrywise::Event| {
        if e.kind == EventKind::Fleet {
            ev.lock().push(e.detail.clone().unwrap_or_default());
        }
    }));
    a.sync(&mut store);
    // The store goes away: every cycle fails, every call is still decided at once, as the twin decides it.
    for i in 0..12 {
        let plan = a.fleet.plan();
        a.fleet.failed(plan.id, "connection refused");
        let status = if i < 6 { 503 } else { 200 };
        assert_eq!(a.call(status), twin.call(status), "call {i}");
        advance(&[&a, &twin], 1_000);
    }
    assert_eq!(a.state(), BreakerState::Open);
    let s = a.fleet.stats();
    assert_eq!(
        (s.healthy, s.failures, s.consecutive_failures, s.cycles),
        (false, 12, 12, 1)
    );
    assert_eq!(events.lock().as_slice(), ["store_unavailable: connection refused"]);
    // The store comes back empty: a's next cycle writes its open again and b adopts it.
    store.flush();
    advance(&[&b], 12_000);
    assert_eq!(b.sync(&mut store).opened, 0);
    a.sync(&mut store);
    assert!(a.fleet.healthy());
    assert_eq!(events.lock().len(), 2, "{:?}", events.lock());
    assert_eq!(events.lock()[1], "store_resynced");
    assert_eq!(b.sync(&mut store).opened, 1);
    assert_eq!(b.call(200), "breaker_open");
}

#[test]
fn a_dead_lease_holder_hands_the_probe_to_another_instance() {
    let mut store = MemoryStore::new();
    let (a, b) = (node("a", 1), node("b", 1));
    assert_eq!(b.call(200), "sent", "b knows the scope");
    for _ in 0..4 {
        a.call(503);
    }
    a.sync(&mut store);
    assert_eq!(b.sync(&mut store).opened, 1);
    advance(&[&a, &b], 29_800);
    assert_eq!(a.sync(&mut store).leases_won, 1);
    assert_eq!(b.sync(&mut store).leases_lost, 1);
    // a never reports again. b holds until a's lease (10 s after the open end) and a cycle more, then claims.
    advance(&[&b], 10_300);
    assert_eq!(b.call(200), "breaker_open");
    advance(&[&b], 500);
    assert_eq!(b.sync(&mut store).leases_won, 1);
    advance(&[&b], 1_000);
    assert_eq!(b.call(200), "sent", "b probes");
}

fn arb_record() -> impl Strategy<Value = Record> {
    let body = prop_oneof![
        (0u64..50, "[a-z_]{1,8}").prop_map(|(u, r)| Body::Open {
            until: u,
            reason: r.into()
        }),
        (0u64..50).prop_map(|e| Body::Closed { expiry: e }),
        (0u64..50, 0u64..50, proptest::option::of((0u64..9, 0u64..50, 0u64..50))).prop_map(|(c, q, w)| {
            let mut l = Limits {
                cooldown_until: c,
                quota_until: q,
                ..Limits::default()
            };
            l.windows[1] = w.map(|(r, s, o)| WindowRecord {
                limit: Some(10),
                remaining: r,
                reset_at: s,
                observed_at: o,
                window: None,
            });
            Body::Limits(Box::new(l))
        }),
    ];
    (0u64..20, body).prop_map(|(at, body)| Record { at, body })
}

fn arb_records() -> impl Strategy<Value = Records> {
    proptest::collection::btree_map(prop_oneof!["a", "b", "c", "d"].prop_map(Into::into), arb_record(), 0..4)
}

fn merged(a: &Records, b: &Records) -> Records {
    let mut m = a.clone();
    merge(&mut m, b);
    m
}

proptest! {
    #[test]
    fn merge_is_commutative_associative_and_idempotent(a in arb_records(), b in arb_records(), c in arb_records()) {
        prop_assert_eq!(merged(&a, &b), merged(&b, &a));
        prop_assert_eq!(merged(&merged(&a, &b), &c), merged(&a, &merged(&b, &c)));
        prop_assert_eq!(merged(&a, &a), a.clone());
        prop_assert_eq!(merged(&merged(&a, &b), &b), merged(&a, &b));
        // What an instance does with the records does not depend on the order they arrived in.
        for q in 1..4 {
            prop_assert_eq!(
                breaker_view(&merged(&a, &b), "me", 10, q, 8),
                breaker_view(&merged(&b, &a), "me", 10, q, 8)
            );
        }
    }

    #[test]
    fn records_survive_their_encoding(r in arb_record()) {
        prop_assert_eq!(Record::decode(&r.encode()), Some(r));
    }
}

/// The table an engine's own calls pace on is shared without being attached:
/// a 429 with Retry-After on one engine holds the other's next attempt.
#[test]
fn an_engines_own_rate_limits_are_shared_by_its_fleet() {
    let mut store = MemoryStore::new();
    let policy = format!("{POLICY}rate_limits: {{enabled: true, hold_on_bare_429: true}}\n");
    let clock_at = || Arc::new(ManualClock::at_wall(UNIX_EPOCH + Duration::from_millis(WALL0)));
    let engines: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|name| {
            let clock = clock_at();
            let engine = Engine::builder(Policy::from_str_any(&policy).unwrap())
                .clock(clock.clone())
                .seed(7)
                .read_env(false)
                .build()
                .unwrap();
            let fleet = engine
                .fleet(FleetConfig {
                    instance: name.into(),
                    ..FleetConfig::default()
                })
                .unwrap();
            (engine, clock, fleet)
        })
        .collect();
    let sync = |(_, clock, fleet): &(Engine, Arc<ManualClock>, Fleet), store: &mut MemoryStore| {
        let wall = clock.wall().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        let plan = fleet.plan();
        let (reads, claims) = store.run(&plan, wall);
        fleet.complete(plan.id, &reads, &claims)
    };
    let (a, b) = (&engines[0], &engines[1]);
    // An instance reads the scopes its engine tracks: each has called `up` once.
    for n in [a, b] {
        let mut c = n.0.begin(CallSpec::new("up").deadline_ms(60_000));
        c.next_attempt().unwrap();
        c.report(&Outcome::status(200).header("x-ratelimit-remaining-requests", "100"));
        sync(n, &mut store);
    }
    let mut c = a.0.begin(CallSpec::new("up").deadline_ms(60_000));
    c.next_attempt().unwrap();
    c.report(&Outcome::status(429).header("retry-after", "20"));
    sync(a, &mut store);
    assert_eq!(sync(b, &mut store).limits, 1);
    let mut c = b.0.begin(CallSpec::new("up").deadline_ms(60_000));
    let held = c.next_attempt().expect_err("b sends into a's cooldown");
    assert_eq!(held.reason.as_str(), "rate_limited", "{held:?}");
    let wait = held.wait.expect("a wait, not a stop");
    assert!(
        wait >= Duration::from_secs(19) && wait <= Duration::from_secs(21),
        "{wait:?}"
    );
}
