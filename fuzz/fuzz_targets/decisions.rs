//! Outcome → decision over arbitrary sequences, driven by `arbitrary`: random
//! policy knobs within their valid ranges (attempts, deadline, min_attempt,
//! backoff, Retry-After, budget, breaker, throttle, gates, routes with
//! fallback and hedging), then random begins, attempts, outcomes (statuses,
//! error kinds, phases, effects, vendor codes, Retry-After in every form),
//! hedges, cancels, drops, kill-switch flips, reloads and clock advances on a
//! `ManualClock`, with up to four calls interleaved on one engine.
//!
//! Checks (the GUIDE invariants): never a panic; physical attempts of a call
//! ≤ its `max_attempts` (route override, 1 for a non-owner); no attempt starts
//! with less than `min_attempt` left (nor with nothing left); attempt
//! timeouts fit the time left; no planned wait ends after
//! deadline − min_attempt, so sleeping exactly the planned wait never ends in
//! `deadline_exceeded`; a final decision stays final; and the same inputs,
//! clock and seed give the same decisions (every input runs twice).

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use retrywise_core::policy::{BackoffKind, FallbackMode, OnExceed, Route, ScopeDim, Upstream, WindowKind};
use retrywise_core::{
    Action, Attempt, Call, CallSpec, Clock, Decision, EffectState, Engine, ErrorKind, HedgePlan, Idempotency, Inbound,
    ManualClock, Mode, Outcome, Phase, Policy, Reason,
};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

const MAX_CALLS: usize = 4;
const MAX_OPS: usize = 256;

#[derive(Arbitrary, Debug, Clone)]
struct Knobs {
    max_attempts: u8,
    deadline_ms: u32,
    min_attempt_ms: u16,
    backoff_kind: u8,
    base_ms: u16,
    cap_extra_ms: u16,
    ra_enabled: bool,
    ra_max_ms: u32,
    ra_cap: bool,
    ra_jitter_ms: u16,
    budget_enabled: bool,
    ratio_milli: u16,
    floor_milli: u16,
    budget_window_ms: u16,
    budget_buckets: u8,
    budget_tenant_scope: bool,
    max_concurrent_retries: Option<u8>,
    breaker_enabled: bool,
    breaker_time_window: bool,
    breaker_window: u16,
    breaker_min_calls: u8,
    failure_rate_pct: Option<u8>,
    consecutive_failures: Option<u8>,
    slow_call: Option<(u16, u8)>,
    open_ms: u16,
    open_jitter_pct: u8,
    probes: u8,
    close_after: u8,
    throttle: bool,
    max_first_attempts: Option<u8>,
    max_retries_in_flight: Option<u8>,
    routed: bool,
    upstreams: u8,
    capabilities: u8,
    fallback_forbidden: bool,
    attempts_per_upstream: u8,
    max_upstreams: Option<u8>,
    route_max_attempts: Option<u8>,
    hedge_after_ms: Option<u16>,
    attempt_timeout_ms: Option<u32>,
    safety_margin_ms: u8,
    ring_size: u8,
    seed: u64,
}

impl Knobs {
    /// A policy with every knob inside its documented valid range.
    fn policy(&self) -> Policy {
        let mut p = Policy::default();
        p.version = format!("fuzz-{}", self.seed % 4);
        p.max_attempts = 1 + u32::from(self.max_attempts % 12);
        p.deadline_ms = 1 + u64::from(self.deadline_ms % 120_000);
        p.min_attempt_ms = u64::from(self.min_attempt_ms) % p.deadline_ms;
        p.backoff.kind =
            [BackoffKind::Full, BackoffKind::Equal, BackoffKind::Decorrelated][usize::from(self.backoff_kind % 3)];
        p.backoff.base_ms = u64::from(self.base_ms % 10_000);
        p.backoff.cap_ms = p.backoff.base_ms + u64::from(self.cap_extra_ms);
        p.retry_after.enabled = self.ra_enabled;
        p.retry_after.max_ms = u64::from(self.ra_max_ms % 200_000);
        p.retry_after.on_exceed = if self.ra_cap { OnExceed::Cap } else { OnExceed::Stop };
        p.retry_after.jitter_ms = u64::from(self.ra_jitter_ms) % 60_001;
        p.propagation.safety_margin_ms = u64::from(self.safety_margin_ms);
        // A small event ring (0 = no events): wraps often, and is cheap to build twice per input.
        p.telemetry.ring_size = u32::from(self.ring_size % 32);
        p.timeouts.attempt_ms = self.attempt_timeout_ms.map(|a| 1 + u64::from(a % 86_400_000));

        let b = &mut p.budget;
        b.enabled = self.budget_enabled;
        b.ratio = f64::from(self.ratio_milli % 2_001) / 1000.0;
        b.min_per_sec = f64::from(self.floor_milli % 5_001) / 1000.0;
        b.window_ms = 1 + u64::from(self.budget_window_ms % 30_000);
        b.buckets = 1 + u32::from(self.budget_buckets % 60);
        if self.budget_tenant_scope {
            b.scopes = vec![vec![ScopeDim::Upstream], vec![ScopeDim::Tenant]];
        }
        b.max_concurrent_retries = self.max_concurrent_retries.map(|m| u32::from(m % 8));

        let br = &mut p.breaker;
        br.enabled = self.breaker_enabled;
        if self.breaker_time_window {
            br.window = WindowKind::Time;
            br.window_size = 1 + u64::from(self.breaker_window % 60_000);
        } else {
            br.window = WindowKind::Count;
            br.window_size = 1 + u64::from(self.breaker_window % 200);
        }
        br.buckets = 1 + u32::from(self.breaker_window % 20);
        br.min_calls = 1 + u32::from(self.breaker_min_calls % 30);
        br.failure_rate = self.failure_rate_pct.map(|r| f64::from(1 + r % 100) / 100.0);
        br.consecutive_failures = self.consecutive_failures.map(|c| 1 + u32::from(c % 10));
        if let Some((ms, pct)) = self.slow_call {
            br.slow_call_ms = Some(u64::from(ms));
            br.slow_call_rate = Some(f64::from(1 + pct % 100) / 100.0);
        }
        br.open_ms = 1 + u64::from(self.open_ms % 30_000);
        br.open_max_ms = br.open_ms.max(60_000);
        br.open_jitter = f64::from(self.open_jitter_pct % 100) / 100.0;
        br.half_open_probes = 1 + u32::from(self.probes % 4);
        br.close_after = 1 + u32::from(self.close_after % 4);

        p.throttle.enabled = self.throttle;
        p.concurrency.max_first_attempts = self.max_first_attempts.map(|m| u32::from(m % 6));
        p.concurrency.max_retries = self.max_retries_in_flight.map(|m| u32::from(m % 6));

        if self.routed {
            let n = 1 + usize::from(self.upstreams % 4);
            let mut candidates = Vec::new();
            for i in 0..n {
                let name = format!("u{i}");
                let caps = if self.capabilities & (1 << i) != 0 {
                    vec!["tool_calling".to_string()]
                } else {
                    Vec::new()
                };
                p.upstreams.insert(
                    name.clone(),
                    Upstream {
                        capabilities: Some(caps),
                        context_tokens: Some(4_000 << i),
                        ..Upstream::default()
                    },
                );
                candidates.push(name);
            }
            p.routes.insert(
                "r".into(),
                Route {
                    candidates,
                    fallback: if self.fallback_forbidden {
                        FallbackMode::Forbidden
                    } else {
                        FallbackMode::Allowed
                    },
                    attempts_per_upstream: 1 + u32::from(self.attempts_per_upstream % 4),
                    max_upstreams: self.max_upstreams.map(|m| 1 + u32::from(m % 4)),
                    max_attempts: self.route_max_attempts.map(|m| 1 + u32::from(m % 12)),
                    hedge_after_ms: self.hedge_after_ms.map(|h| 1 + u64::from(h % 5_000)),
                    ..Route::default()
                },
            );
        }
        p
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Status {
    Known(u8),
    Any(u16),
}

const STATUSES: [u16; 20] = [
    200, 201, 204, 301, 400, 401, 403, 404, 408, 409, 413, 422, 429, 500, 501, 502, 503, 504, 529, 599,
];

#[derive(Arbitrary, Debug, Clone)]
enum HeaderValue {
    Secs(u16),
    Ms(u32),
    Decimal(u16, u8),
    /// An IMF-fixdate this many seconds from the engine's wall clock.
    Date(i32),
    Text(String),
}

#[derive(Arbitrary, Debug, Clone)]
struct FuzzOutcome {
    status: Option<Status>,
    error: Option<u8>,
    phase: Option<u8>,
    headers: Vec<(u8, HeaderValue)>,
    vendor_code: Option<u8>,
    effect: Option<u8>,
    input_tokens: Option<u32>,
    ok: bool,
}

const HEADER_NAMES: [&str; 5] = [
    "retry-after",
    "retry-after-ms",
    "x-should-retry",
    "Retry-After",
    "x-request-id",
];
const VENDOR_CODES: [&str; 7] = [
    "insufficient_quota",
    "overloaded_error",
    "context_length_exceeded",
    "rate_limit_exceeded",
    "billing_hard_limit_reached",
    "server_error",
    "",
];

impl FuzzOutcome {
    fn build(&self, clock: &ManualClock) -> Outcome {
        let mut o = Outcome {
            status: self.status.map(|s| match s {
                Status::Known(i) => STATUSES[usize::from(i) % STATUSES.len()],
                Status::Any(s) => s,
            }),
            error: self.error.and_then(|e| ErrorKind::from_code(e % 13)),
            phase: self.phase.and_then(|p| Phase::from_code(p % 6)),
            vendor_code: self
                .vendor_code
                .map(|v| VENDOR_CODES[usize::from(v) % VENDOR_CODES.len()].to_string()),
            effect: self.effect.and_then(|e| EffectState::from_code(e % 5)),
            input_tokens: self.input_tokens.map(u64::from),
            ok: self.ok,
            ..Outcome::default()
        };
        for (name, value) in self.headers.iter().take(4) {
            let name = HEADER_NAMES[usize::from(*name) % HEADER_NAMES.len()];
            let v = match value {
                HeaderValue::Secs(s) => s.to_string(),
                HeaderValue::Ms(ms) => ms.to_string(),
                HeaderValue::Decimal(a, b) => format!("{a}.{b}"),
                HeaderValue::Date(off) => {
                    let wall = clock.wall();
                    let by = Duration::from_secs(off.unsigned_abs().into());
                    // HTTP-dates start at the epoch.
                    let at = if *off >= 0 {
                        wall + by
                    } else {
                        wall.checked_sub(by).filter(|t| *t >= UNIX_EPOCH).unwrap_or(UNIX_EPOCH)
                    };
                    httpdate::fmt_http_date(at)
                }
                HeaderValue::Text(t) => t.clone(),
            };
            o.headers.insert(name, &v);
        }
        o
    }
}

#[derive(Arbitrary, Debug, Clone)]
enum Op {
    Begin {
        routed: bool,
        idempotency: u8,
        tenant: u8,
        deadline_ms: Option<u32>,
        inbound_deadline_ms: Option<u32>,
        key: bool,
    },
    Next(u8),
    Report {
        call: u8,
        outcome: FuzzOutcome,
        /// Report this attempt number instead of the latest (hedging).
        attempt: Option<u8>,
        /// Then sleep exactly the planned wait (the binding loop).
        sleep: bool,
    },
    Hedge(u8),
    Cancel(u8),
    Drop(u8),
    Advance(u16),
    AdvanceLong(u32),
    Mode {
        retries: bool,
        fallback: bool,
        hedging: bool,
    },
    Reload(Box<Knobs>),
}

#[derive(Arbitrary, Debug)]
struct Input {
    knobs: Knobs,
    ops: Vec<Op>,
}

/// One live call and what its policy allows.
struct Live {
    call: Call,
    max_attempts: u32,
    min_attempt: Duration,
    /// The latest decision asked for a wait of this long and the caller slept it.
    slept_planned_wait: bool,
}

fn check_attempt(l: &Live, a: &Attempt, trace: &mut String) {
    assert!(
        a.number <= l.max_attempts,
        "attempt {} > max_attempts {}",
        a.number,
        l.max_attempts
    );
    assert!(l.call.attempts() <= l.max_attempts);
    assert!(
        a.remaining() >= l.min_attempt && !a.remaining().is_zero(),
        "attempt started with {:?} left, min_attempt {:?}",
        a.remaining(),
        l.min_attempt
    );
    assert_eq!(a.remaining(), l.call.remaining());
    let t = a.timeouts();
    assert!(t.total <= a.remaining(), "{t:?} vs {:?}", a.remaining());
    assert!(
        t.connect <= t.total && t.first_byte <= t.total && t.idle <= t.total,
        "{t:?}"
    );
    let _ = writeln!(
        trace,
        "attempt {} {} {:?} {} {:?}",
        a.number,
        a.upstream,
        a.remaining(),
        a.request_id,
        a.headers()
    );
}

fn check_decision(l: &Live, d: &Decision, trace: &mut String) {
    let _ = writeln!(trace, "decision {d:?}");
    assert!(l.call.attempts() <= l.max_attempts);
    match d.action {
        Action::Retry | Action::Fallback => {
            let sibling = d.detail.as_deref() == Some("sibling attempt in flight");
            if !sibling {
                assert!(
                    d.delay + l.min_attempt <= l.call.remaining(),
                    "planned wait {:?} ends after deadline - min_attempt ({:?} left, min_attempt {:?}): {d:?}",
                    d.delay,
                    l.call.remaining(),
                    l.min_attempt
                );
            } else {
                assert_eq!(d.delay, Duration::ZERO);
            }
            assert!(!l.call.is_finished());
        }
        Action::Wait => {
            // A failure beside a running sibling: nothing to send now.
            assert_eq!(d.delay, Duration::ZERO, "{d:?}");
            assert!(!l.call.is_finished(), "{d:?}");
        }
        Action::Succeeded | Action::Stop | Action::Reconcile => {
            assert_eq!(d.delay, Duration::ZERO, "{d:?}");
            assert!(l.call.is_finished() || d.reason == Reason::InvalidState, "{d:?}");
        }
    }
}

fn run(input: &Input) -> String {
    let mut trace = String::new();
    let mut policy = input.knobs.policy();
    if let Err(e) = policy.validate() {
        panic!("harness built an invalid policy: {e}");
    }
    let clock = ManualClock::new();
    let engine = Engine::builder(policy.clone())
        .clock(Arc::new(clock.clone()))
        .seed(input.knobs.seed)
        .mode(Mode::default())
        .build()
        .expect("valid policy");
    let mut calls: Vec<Live> = Vec::new();
    let mut attempt_allowance = 0u64;
    let pick = |calls: &Vec<Live>, i: u8| (!calls.is_empty()).then(|| usize::from(i) % calls.len());

    for op in input.ops.iter().take(MAX_OPS) {
        match op {
            Op::Begin {
                routed,
                idempotency,
                tenant,
                deadline_ms,
                inbound_deadline_ms,
                key,
            } => {
                if calls.len() >= MAX_CALLS {
                    calls.remove(0);
                }
                let route = if *routed && policy.routes.contains_key("r") {
                    "r"
                } else {
                    "u-direct"
                };
                let mut spec = CallSpec::new(route)
                    .idempotency(Idempotency::ALL[usize::from(*idempotency) % Idempotency::ALL.len()])
                    .tenant(format!("t{}", tenant % 8));
                if let Some(d) = deadline_ms {
                    spec = spec.deadline_ms(u64::from(d % 200_000));
                }
                if *key {
                    spec = spec
                        .idempotency_key(format!("k{}", tenant % 4))
                        .params_digest(format!("d{}", tenant % 3));
                }
                let owner = inbound_deadline_ms.is_none();
                if let Some(d) = inbound_deadline_ms {
                    spec = spec.inbound(Inbound {
                        deadline: Some(Duration::from_millis(u64::from(d % 200_000))),
                        request_id: Some("outer".into()),
                        attempt: Some(1),
                        idempotency_key: None,
                    });
                }
                let max_attempts = if !owner {
                    1
                } else {
                    policy
                        .routes
                        .get(route)
                        .and_then(|r| r.max_attempts)
                        .unwrap_or(policy.max_attempts)
                };
                attempt_allowance += u64::from(max_attempts);
                let call = engine.begin(spec);
                let _ = writeln!(trace, "begin {} {:?}", call.id(), call.remaining());
                calls.push(Live {
                    call,
                    max_attempts,
                    min_attempt: Duration::from_millis(policy.min_attempt_ms),
                    slept_planned_wait: false,
                });
            }
            Op::Next(i) => {
                let Some(i) = pick(&calls, *i) else { continue };
                let l = &mut calls[i];
                let was_finished = l.call.is_finished();
                match l.call.next_attempt() {
                    Ok(a) => {
                        assert!(!was_finished, "an attempt after a final decision");
                        check_attempt(l, &a, &mut trace);
                    }
                    Err(s) => {
                        let _ = writeln!(trace, "stopped {s:?}");
                        if l.slept_planned_wait && s.reason == Reason::DeadlineExceeded {
                            // The wait left min_attempt: only min_attempt 0 with nothing left may stop here.
                            assert!(
                                l.min_attempt.is_zero() && l.call.remaining().is_zero(),
                                "slept the planned wait and then ran out of deadline: {s}"
                            );
                        }
                    }
                }
                l.slept_planned_wait = false;
            }
            Op::Report {
                call,
                outcome,
                attempt,
                sleep,
            } => {
                let Some(i) = pick(&calls, *call) else { continue };
                let o = outcome.build(&clock);
                let l = &mut calls[i];
                let d = match attempt {
                    Some(n) => l.call.report_attempt(u32::from(*n % 8), &o),
                    None => l.call.report(&o),
                };
                check_decision(l, &d, &mut trace);
                l.slept_planned_wait = false;
                if *sleep && matches!(d.action, Action::Retry | Action::Fallback) {
                    clock.advance(d.delay);
                    l.slept_planned_wait = d.detail.as_deref() != Some("sibling attempt in flight");
                }
            }
            Op::Hedge(i) => {
                let Some(i) = pick(&calls, *i) else { continue };
                let l = &mut calls[i];
                match l.call.next_hedge() {
                    HedgePlan::Start(a) => {
                        assert!(a.hedge);
                        check_attempt(l, &a, &mut trace);
                    }
                    other => {
                        let _ = writeln!(trace, "hedge {other:?}");
                    }
                }
            }
            Op::Cancel(i) => {
                let Some(i) = pick(&calls, *i) else { continue };
                let l = &mut calls[i];
                let d = l.call.cancel();
                let _ = writeln!(trace, "cancel {d:?}");
                assert!(d.is_final());
                assert!(l.call.is_finished());
                assert!(l.call.next_attempt().is_err());
            }
            Op::Drop(i) => {
                if let Some(i) = pick(&calls, *i) {
                    calls.remove(i);
                }
            }
            Op::Advance(ms) => clock.advance_ms(u64::from(*ms)),
            Op::AdvanceLong(ms) => clock.advance_ms(u64::from(*ms)),
            Op::Mode {
                retries,
                fallback,
                hedging,
            } => engine.set_mode(Mode {
                retries: *retries,
                fallback: *fallback,
                hedging: *hedging,
            }),
            Op::Reload(k) => {
                let p = k.policy();
                engine.reload(p.clone()).expect("valid policy reloads");
                // Calls already begun keep their policy; new ones get this one.
                policy = p;
            }
        }
    }
    // Amplification bound: attempts engine-wide ≤ the sum of every call's max_attempts.
    let stats = engine.stats();
    assert!(
        stats.overall.attempts <= attempt_allowance,
        "{} > {attempt_allowance}",
        stats.overall.attempts
    );
    let _ = writeln!(
        trace,
        "stats {} {}",
        stats.overall.attempts, stats.overall.logical_requests
    );
    trace
}

fuzz_target!(|input: Input| {
    let first = run(&input);
    let second = run(&input);
    assert_eq!(first, second, "same inputs, clock and seed gave different decisions");
});
