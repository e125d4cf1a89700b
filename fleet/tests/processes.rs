//! Three engines in three processes sharing one real Redis (a `redis-server`
//! each test starts on a free port of 127.0.0.1 and stops; the binary is
//! `$RETRYWISE_REDIS_SERVER`, else `redis-server` on PATH).
//!
//! Each instance is this test binary run again as [`fleet_node_process`]: it
//! reads commands on stdin and answers on stdout. Clocks are manual (every
//! process starts at the same wall instant and the test advances them), and
//! the test runs each sync cycle itself, so every step is deterministic: a
//! cycle here is one tick of the adapter's background thread, and "within
//! the staleness bound" means within the cycles that bound allows.

mod common;

use common::{call, Redis, POLICY};
use retrywise::ratelimit::{Admission, RateLimits, Reading, Usage};
use retrywise::rules::deadline::TokenEstimate;
use retrywise::{CallSpec, Engine, EventKind, FleetConfig, ManualClock, Outcome, Policy};
use retrywise_fleet::RedisFleet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

const WALL0: u64 = 1_750_000_000_000;
const SCOPE: &str = "key-1/openai/gpt-4o";
/// Marks the lines of the node's protocol among the test harness's own.
const REPLY: &str = "@@ ";

/// One instance: a process running [`fleet_node_process`].
struct Proc {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Proc {
    fn spawn(name: &str, quorum: u32, redis: &Redis) -> Proc {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "fleet_node_process",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("RETRYWISE_FLEET_NODE", format!("{name} {quorum} {}", redis.url()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Proc { child, stdin, out }
    }

    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.out.read_line(&mut line).unwrap() > 0, "the node exited on {cmd:?}");
            // The harness's "test ... " may lead the first line.
            if let Some((_, reply)) = line.trim_end().split_once(REPLY) {
                return reply.to_string();
            }
        }
    }

    fn call(&mut self, status: u16) -> String {
        self.ask(&format!("call {status}"))
    }

    /// One sync cycle: `opened extended recovered won lost limits`, or `error ...`.
    fn sync(&mut self) -> String {
        self.ask("sync")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.child.wait();
    }
}

fn fleet(quorum: u32, redis: &Redis) -> (Proc, Proc, Proc) {
    (
        Proc::spawn("a", quorum, redis),
        Proc::spawn("b", quorum, redis),
        Proc::spawn("c", quorum, redis),
    )
}

fn advance(nodes: &mut [&mut Proc], ms: u64) {
    for n in nodes {
        assert_eq!(n.ask(&format!("advance {ms}")), "ok");
    }
}

#[test]
fn an_open_on_one_process_stops_the_others_within_the_staleness_bound() {
    let redis = Redis::start();
    let (mut a, mut b, mut c) = fleet(1, &redis);
    for n in [&mut a, &mut b, &mut c] {
        assert_eq!(n.call(200), "sent");
        assert_eq!(n.sync(), "0 0 0 0 0 0");
    }
    for _ in 0..3 {
        assert_eq!(a.call(503), "sent");
    }
    assert_eq!(a.ask("state"), "open");
    // The worst case: the open lands just after a's cycle began, so it goes
    // out one interval later, and b and c read it an interval after that.
    let cfg = FleetConfig::default();
    let interval = cfg.interval.as_millis() as u64;
    advance(&mut [&mut a, &mut b, &mut c], interval);
    assert_eq!(
        (b.call(200), c.call(200)),
        ("sent".into(), "sent".into()),
        "not written yet"
    );
    assert_eq!(a.sync(), "0 0 0 0 0 0");
    advance(&mut [&mut a, &mut b, &mut c], interval);
    assert_eq!(b.sync(), "1 0 0 0 0 0");
    assert_eq!(c.sync(), "1 0 0 0 0 0");
    assert!(Duration::from_millis(2 * interval) <= cfg.staleness_bound());
    assert_eq!(
        (b.call(200), c.call(200)),
        ("breaker_open".into(), "breaker_open".into())
    );
    assert_eq!((b.ask("state"), c.ask("state")), ("open".into(), "open".into()));
}

#[test]
fn exactly_one_probe_goes_fleet_wide_and_its_success_closes_every_breaker() {
    let redis = Redis::start();
    let (mut a, mut b, mut c) = fleet(1, &redis);
    for n in [&mut b, &mut c] {
        assert_eq!(n.call(200), "sent");
    }
    for _ in 0..4 {
        a.call(503);
    }
    a.sync();
    assert_eq!(b.sync(), "1 0 0 0 0 0");
    assert_eq!(c.sync(), "1 0 0 0 0 0");
    // Shortly before the open period ends every instance claims the probe lease.
    advance(&mut [&mut a, &mut b, &mut c], 29_800);
    let claims: Vec<String> = [&mut b, &mut a, &mut c].into_iter().map(|n| n.sync()).collect();
    assert_eq!(
        claims,
        ["0 0 0 1 0 0", "0 1 0 0 1 0", "0 1 0 0 1 0"],
        "b won, a and c hold"
    );
    advance(&mut [&mut a, &mut b, &mut c], 300);
    // Every instance has calls to make while b's probe is in flight: none goes.
    assert_eq!(b.ask("begin"), "sent", "b probes");
    for _ in 0..3 {
        for n in [&mut a, &mut c, &mut b] {
            assert_eq!(n.call(200), "breaker_open");
        }
    }
    assert_eq!(b.ask("finish 200"), "closed");
    assert_eq!(b.call(200), "sent");
    assert_eq!(
        (a.call(200), c.call(200)),
        ("breaker_open".into(), "breaker_open".into()),
        "until they sync"
    );
    // b's recovery reaches the others at their next cycle.
    b.sync();
    assert_eq!(a.sync(), "0 0 1 0 0 0");
    assert_eq!(c.sync(), "0 0 1 0 0 0");
    assert_eq!((a.call(200), c.call(200)), ("sent".into(), "sent".into()));
}

#[test]
fn a_retry_after_on_one_process_defers_the_others() {
    let redis = Redis::start();
    let (mut a, mut b, mut c) = fleet(2, &redis);
    for n in [&mut a, &mut b, &mut c] {
        assert_eq!(n.ask("limit ok"), "go");
        n.sync();
    }
    assert_eq!(a.ask("limit 429 20"), "go");
    a.sync();
    assert_eq!(b.sync(), "0 0 0 0 0 1");
    assert_eq!(c.sync(), "0 0 0 0 0 1");
    for n in [&mut b, &mut c] {
        // A call with 5 s left cannot outwait the 20 s cooldown; one with 60 s
        // waits it out, spread within the unknown limit's 1 s slot.
        assert_eq!(n.ask("limit admit 5000"), "stop rate_limited_until");
        let wait = n.ask("limit admit 60000");
        let ms: u64 = wait.strip_prefix("wait ").and_then(|w| w.parse().ok()).expect(&wait);
        assert!((20_000..=21_000).contains(&ms), "{wait}");
    }
    // Reading the same records again changes nothing.
    assert_eq!(b.sync(), "0 0 0 0 0 0");
}

#[test]
fn one_process_below_the_quorum_opens_nobody_else() {
    let redis = Redis::start();
    let (mut a, mut b, mut c) = fleet(2, &redis);
    for _ in 0..4 {
        a.call(503);
    }
    assert_eq!(a.ask("state"), "open");
    a.sync();
    for n in [&mut b, &mut c] {
        assert_eq!(n.sync(), "0 0 0 0 0 0");
        assert_eq!(n.call(200), "sent");
        assert_eq!(n.ask("state"), "closed");
    }
    // A second instance's own evidence makes the quorum of two: the third opens.
    for _ in 0..4 {
        b.call(503);
    }
    b.sync();
    assert_eq!(c.sync(), "1 0 0 0 0 0");
    assert_eq!(c.call(200), "breaker_open");
}

#[test]
fn killing_redis_loses_no_call_and_changes_no_local_decision_then_the_fleet_resyncs() {
    let mut redis = Redis::start();
    let port = redis.port;
    let (mut a, mut b, _c) = fleet(1, &redis);
    assert_eq!(b.call(200), "sent", "b knows the scope");
    assert_eq!(a.sync(), "0 0 0 0 0 0");
    assert_eq!(b.sync(), "0 0 0 0 0 0");
    redis.kill();
    // Every cycle fails; every call is answered at once, as a twin engine
    // with no fleet (same clock, same seed) answers it.
    for i in 0..12 {
        assert!(a.sync().starts_with("error "), "cycle {i}");
        let status = if i < 6 { 503 } else { 200 };
        let (own, twin) = (a.call(status), a.ask(&format!("twin {status}")));
        assert_eq!(own, twin, "call {i}");
        advance(&mut [&mut a], 1_000);
    }
    assert_eq!(a.ask("calls"), "12 12");
    assert_eq!(a.ask("state"), "open");
    assert_eq!(a.ask("stats"), "unhealthy 12 failures 1 cycles");
    assert!(b.sync().starts_with("error "));
    // Redis comes back empty on the same port: a writes its open again, b adopts it.
    let _redis = Redis::on(port);
    advance(&mut [&mut b], 12_000);
    assert_eq!(b.sync(), "0 0 0 0 0 0");
    assert_eq!(a.sync(), "0 0 0 0 0 0");
    assert_eq!(a.ask("stats"), "healthy 12 failures 2 cycles");
    let events = a.ask("events");
    assert!(
        events.starts_with("store_unavailable: ") && events.ends_with("|store_resynced"),
        "{events}"
    );
    assert_eq!(events.matches('|').count(), 1, "one event each way: {events}");
    assert_eq!(b.sync(), "1 0 0 0 0 0");
    assert_eq!(b.call(200), "breaker_open");
}

/// One instance of the fleet (run by the tests above with
/// `RETRYWISE_FLEET_NODE="<name> <quorum> <redis url>"`; does nothing without it).
#[test]
#[ignore = "a fleet instance the other tests run as a process"]
fn fleet_node_process() {
    let Ok(args) = std::env::var("RETRYWISE_FLEET_NODE") else {
        return;
    };
    let mut args = args.split(' ');
    let (name, quorum, url) = (args.next().unwrap(), args.next().unwrap(), args.next().unwrap());
    let clock = Arc::new(ManualClock::at_wall(UNIX_EPOCH + Duration::from_millis(WALL0)));
    let build = || {
        Engine::builder(Policy::from_str_any(POLICY).unwrap())
            .clock(clock.clone())
            .seed(7)
            .read_env(false)
            .build()
            .unwrap()
    };
    let (engine, twin) = (build(), build());
    let cfg = FleetConfig {
        instance: name.into(),
        quorum: quorum.parse().unwrap(),
        ..FleetConfig::default()
    };
    let fleet = RedisFleet::connect(engine.fleet(cfg).unwrap(), url).unwrap();
    let limits = Arc::new(RateLimits::default());
    fleet.fleet().attach_rate_limits(limits.clone());
    let events = Arc::new(Mutex::new(Vec::<String>::new()));
    let ev = events.clone();
    engine.on_event(Arc::new(move |e: &retrywise::Event| {
        if e.kind == EventKind::Fleet {
            ev.lock().unwrap().push(e.detail.clone().unwrap_or_default());
        }
    }));
    let mut rng = <rand_pcg::Pcg64Mcg as rand::SeedableRng>::seed_from_u64(1);
    let mut calls = (0u32, 0u32);
    let mut held: Option<retrywise::Call> = None;
    let now = || engine.now().as_nanos() as u64;
    let mut limit = |left_ms: u64, reading: Option<Reading>| {
        let left = Duration::from_millis(left_ms);
        match limits.admit(SCOPE, now(), TokenEstimate::default(), left, None, &mut rng) {
            Admission::Go(r) => {
                let reading = reading.unwrap_or_else(|| Reading::default().answered());
                limits.settle(SCOPE, r, &reading, Usage::sent(), now());
                "go".to_string()
            }
            Admission::Wait { wait, .. } => format!("wait {}", wait.as_millis()),
            Admission::Stop(why) => format!("stop {}", why.reason()),
        }
    };
    let stdout = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let cmd: Vec<&str> = line.split(' ').collect();
        let reply = match cmd.as_slice() {
            ["quit"] => break,
            ["call", s] => {
                calls.0 += 1;
                call(&engine, s.parse().unwrap())
            }
            ["twin", s] => {
                calls.1 += 1;
                call(&twin, s.parse().unwrap())
            }
            ["begin"] => {
                calls.0 += 1;
                let mut c = engine.begin(CallSpec::new("up").deadline_ms(60_000));
                match c.next_attempt() {
                    Ok(_) => {
                        held = Some(c);
                        "sent".into()
                    }
                    Err(s) => s.reason.as_str().to_string(),
                }
            }
            ["finish", s] => {
                held.take().unwrap().report(&Outcome::status(s.parse().unwrap()));
                engine.breaker_state("up").as_str().to_string()
            }
            ["calls"] => format!("{} {}", calls.0, calls.1),
            ["state"] => engine.breaker_state("up").as_str().to_string(),
            ["advance", ms] => {
                clock.advance_ms(ms.parse().unwrap());
                "ok".into()
            }
            ["sync"] => match fleet.sync_once() {
                Ok(r) => format!(
                    "{} {} {} {} {} {}",
                    r.opened, r.extended, r.recovered, r.leases_won, r.leases_lost, r.limits
                ),
                Err(e) => format!("error {e}"),
            },
            ["stats"] => {
                let s = fleet.fleet().stats();
                let health = if s.healthy { "healthy" } else { "unhealthy" };
                format!("{health} {} failures {} cycles", s.failures, s.cycles)
            }
            ["events"] => events.lock().unwrap().join("|"),
            ["limit", "ok"] => limit(60_000, None),
            ["limit", "429", secs] => {
                let d = Duration::from_secs(secs.parse().unwrap());
                limit(60_000, Some(Reading::default().rate_limited().retry_delay(d)))
            }
            ["limit", "admit", ms] => limit(ms.parse().unwrap(), None),
            _ => format!("unknown command {line:?}"),
        };
        let mut out = stdout.lock();
        writeln!(out, "{REPLY}{}", reply.replace('\n', " ")).unwrap();
        out.flush().unwrap();
    }
}
