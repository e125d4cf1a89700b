//! Property tests for the GUIDE invariants, over random outcome sequences:
//! attempts ≤ max_attempts; no planned wait ends after the deadline; no
//! attempt starts with less than `min_attempt` left; jitter within bounds;
//! retries granted ≤ ratio × requests + floor in every budget scope;
//! fallbacks never pick an ineligible upstream; identical inputs, clock and
//! seed give identical decisions.

use proptest::prelude::*;
use retrywise::internals::{BudgetCell, BudgetParams};
use retrywise::policy::{Backoff, BackoffKind, Budget as BudgetPolicy, Route};
use retrywise::rules::route::{match_candidates, Needs};
use retrywise::rules::wait::{ceiling_ms, jitter_ms};
use retrywise::{Action, CallSpec, Engine, ErrorKind, Idempotency, ManualClock, Outcome, Phase, Policy};
use std::sync::Arc;
use std::time::Duration;

fn outcome_strategy() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        Just(Outcome::success()),
        prop::sample::select(vec![
            400u16, 401, 403, 404, 408, 409, 413, 422, 429, 500, 501, 502, 503, 504, 529
        ])
        .prop_map(Outcome::status),
        (0u64..90_000).prop_map(|ms| Outcome::status(429).header("retry-after-ms", &ms.to_string())),
        (0u64..100).prop_map(|s| Outcome::status(503).header("retry-after", &s.to_string())),
        prop::sample::select(ErrorKind::ALL.to_vec()).prop_map(Outcome::error),
        (
            prop::sample::select(ErrorKind::ALL.to_vec()),
            prop::sample::select(Phase::ALL.to_vec())
        )
            .prop_map(|(k, p)| Outcome::error(k).phase(p)),
    ]
}

fn policy_strategy() -> impl Strategy<Value = Policy> {
    (
        1u32..8,
        500u64..60_000,
        0u64..2_000,
        0u64..2_000,
        0u64..10_000,
        any::<bool>(),
    )
        .prop_map(|(max, deadline, min_attempt, base, extra, budget)| {
            let mut p = Policy {
                max_attempts: max,
                deadline_ms: deadline,
                min_attempt_ms: min_attempt.min(deadline - 1),
                ..Policy::default()
            };
            p.backoff.base_ms = base;
            p.backoff.cap_ms = base + extra;
            p.budget.enabled = budget;
            p.retry_after.on_exceed = retrywise::policy::OnExceed::Cap;
            p
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn loop_invariants(policy in policy_strategy(), outcomes in prop::collection::vec(outcome_strategy(), 1..20),
                       gaps in prop::collection::vec(0u64..3_000, 20), seed in any::<u64>(),
                       idem in prop::sample::select(Idempotency::ALL.to_vec()), deadline in prop::option::of(100u64..60_000)) {
        let clock = ManualClock::new();
        let e = Engine::builder(policy.clone()).clock(Arc::new(clock.clone())).seed(seed).read_env(false).build().unwrap();
        let mut spec = CallSpec::new("up").idempotency(idem);
        if let Some(d) = deadline { spec = spec.deadline_ms(d); }
        let begin = clock.now_ms();
        let deadline_at = begin + deadline.unwrap_or(policy.deadline_ms);
        let mut c = e.begin(spec);
        let mut started = 0u32;
        for (i, o) in outcomes.iter().enumerate() {
            match c.next_attempt() {
                Ok(a) => {
                    started += 1;
                    // No attempt starts with less than min_attempt left.
                    prop_assert!(deadline_at - clock.now_ms() >= policy.min_attempt_ms);
                    prop_assert!(a.timeouts().total <= a.remaining());
                    prop_assert!(a.timeouts().connect <= a.timeouts().total);
                }
                Err(_) => break,
            }
            clock.advance_ms(gaps[i]);
            let d = c.report(o);
            if matches!(d.action, Action::Retry | Action::Fallback) {
                // No planned wait ends after the deadline (minus min_attempt).
                let wake = clock.now_ms() + d.delay_ms();
                prop_assert!(wake + policy.min_attempt_ms <= deadline_at, "wake {} deadline {}", wake, deadline_at);
                clock.advance(d.delay);
            } else {
                prop_assert!(d.delay.is_zero());
                break;
            }
        }
        // Physical attempts of one call ≤ max_attempts.
        prop_assert!(started <= policy.max_attempts);
        prop_assert!(c.attempts() <= policy.max_attempts);
    }

    #[test]
    fn jitter_within_bounds(kind in prop::sample::select(vec![BackoffKind::Full, BackoffKind::Equal, BackoffKind::Decorrelated]),
                            base in 0u64..10_000, extra in 0u64..100_000, n in any::<u32>(), prev in any::<u64>(), seed in any::<u64>()) {
        use rand::SeedableRng;
        let cfg = Backoff { kind, base_ms: base, cap_ms: base + extra };
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed);
        let w = jitter_ms(&cfg, n, prev, &mut rng);
        prop_assert!(w <= cfg.cap_ms);
        if kind != BackoffKind::Decorrelated {
            prop_assert!(w <= ceiling_ms(&cfg, n));
        }
        if kind == BackoffKind::Equal {
            prop_assert!(w >= ceiling_ms(&cfg, n) / 2);
        }
    }

    /// Against a reference model that keeps every event's timestamp: at each
    /// grant, retries granted in the window (this one included) ≤ ratio ×
    /// requests in the window + floor.
    #[test]
    fn budget_never_grants_beyond_ratio_plus_floor(ratio_milli in 0u64..=1000, floor_milli in 0u64..3_000,
                                                    ops in prop::collection::vec((any::<bool>(), 0u64..700), 1..400)) {
        let pol = BudgetPolicy { ratio: ratio_milli as f64 / 1000.0, min_per_sec: floor_milli as f64 / 1000.0, window_ms: 10_000, buckets: 10, ..BudgetPolicy::default() };
        let params = BudgetParams::new(&pol);
        let cell = BudgetCell::new(params);
        let mut now = 0u64;
        let mut requests: Vec<u64> = Vec::new();
        let mut grants: Vec<u64> = Vec::new();
        for (is_request, gap) in ops {
            now += gap;
            if is_request {
                cell.deposit(&params, now);
                requests.push(now);
            } else if cell.try_withdraw(&params, now).is_ok() {
                grants.push(now);
                // The window the budget uses: the current bucket and the 9 before it.
                let bucket = now / 1_000;
                let lo = bucket.saturating_sub(9) * 1_000;
                let r = requests.iter().filter(|t| **t >= lo).count() as u64;
                let g = grants.iter().filter(|t| **t >= lo).count() as u64;
                let floor = floor_milli * 10_000 / 1_000;
                prop_assert!(g * 1000 <= ratio_milli * r + floor, "grants {} requests {} ratio {} floor {}", g, r, ratio_milli, floor);
            }
        }
    }

    /// A fallback decision never selects an upstream that lacks a required
    /// capability, has an open breaker, lies outside the data boundary, or
    /// exceeds the cost cap.
    #[test]
    fn matcher_never_selects_ineligible(caps in prop::collection::vec(prop::option::of(prop::collection::vec(0usize..4, 0..4)), 1..6),
                                        apis in prop::collection::vec(prop::option::of(0usize..3), 6),
                                        wanted in prop::collection::vec(0usize..4, 0..3),
                                        want_api in prop::option::of(0usize..3),
                                        boundaries in prop::collection::vec(0usize..3, 6),
                                        costs in prop::collection::vec(0u32..50, 6),
                                        open in prop::collection::vec(any::<bool>(), 6),
                                        require in prop::collection::vec(0usize..4, 0..3),
                                        want_boundary in prop::option::of(0usize..2),
                                        cap in prop::option::of(0u32..50)) {
        let names = ["streaming", "tool_calling", "json_schema", "vision"];
        let bnames = ["eu", "us", "apac"];
        let mut p = Policy::default();
        let mut cands = Vec::new();
        for (i, c) in caps.iter().enumerate() {
            let u = retrywise::policy::Upstream {
                provider: format!("p{i}"),
                model: format!("m{i}"),
                capabilities: c.as_ref().map(|c| c.iter().map(|x| names[*x].to_string()).collect()),
                api: apis[i].map(|a| retrywise::ApiFamily::ALL[a]),
                data_boundary: Some(bnames[boundaries[i]].to_string()),
                cost_input_per_mtok: costs[i] as f64,
                ..Default::default()
            };
            p.upstreams.insert(format!("u{i}"), u);
            cands.push(format!("u{i}"));
        }
        let route = Route {
            candidates: cands,
            require: require.iter().map(|x| names[*x].to_string()).collect(),
            data_boundary: want_boundary.map(|b| bnames[b].to_string()),
            max_cost_per_call: cap.map(|c| c as f64 / 1_000_000.0 * 1_000.0),
            ..Route::default()
        };
        let needs = Needs {
            input_tokens: Some(1_000),
            capabilities: wanted.iter().map(|x| names[*x].to_string()).collect(),
            api: want_api.map(|a| retrywise::ApiFamily::ALL[a]),
            ..Needs::default()
        };
        let is_open = |u: &str| open[u[1..].parse::<usize>().unwrap_or(0) % 6];
        let m = match_candidates(&p, &route, None, &needs, &[], &is_open);
        prop_assert_eq!(m.eligible.len() + m.excluded.len(), caps.len());
        for u in &m.eligible {
            let up = &p.upstreams[u];
            for r in &route.require {
                prop_assert!(up.has(r));
            }
            // A declared list is complete; an undeclared one is never held against it.
            if up.capabilities.is_some() {
                for w in &needs.capabilities {
                    prop_assert!(up.has(w), "{} lacks {}", u, w);
                }
            }
            if let (Some(have), Some(want)) = (up.api, needs.api) {
                prop_assert!(have.takes(want));
            }
            prop_assert!(!is_open(u));
            if let Some(b) = &route.data_boundary {
                prop_assert_eq!(up.data_boundary.as_ref(), Some(b));
            }
            if let Some(c) = route.max_cost_per_call {
                prop_assert!(retrywise::rules::route::estimated_cost(up, &needs) <= c);
            }
        }
    }
}

/// Determinism across a whole workload: same policy, clock steps and seed →
/// the same decisions, delays included.
#[test]
fn determinism_under_fixed_seed_and_manual_clock() {
    let run = |seed: u64| {
        let clock = ManualClock::new();
        let e = Engine::builder(Policy::from_str_any("max_attempts: 5\nbreaker: {min_calls: 5}").unwrap())
            .clock(Arc::new(clock.clone()))
            .seed(seed)
            .read_env(false)
            .build()
            .unwrap();
        let mut log = Vec::new();
        for i in 0..300u64 {
            let mut c = e.begin(CallSpec::new(format!("u{}", i % 4)).tenant(format!("t{}", i % 7)));
            while let Ok(a) = c.next_attempt() {
                let o = if (i + a.number as u64) % 3 == 0 {
                    Outcome::success()
                } else {
                    Outcome::status(503)
                };
                let d = c.report(&o);
                log.push((i, a.number, d.action, d.delay, d.reason));
                if d.is_final() {
                    break;
                }
                clock.advance(d.delay);
            }
            clock.advance(Duration::from_millis(37));
        }
        log
    };
    assert_eq!(run(9), run(9));
    assert_ne!(run(9), run(10));
}

trait NowMs {
    fn now_ms(&self) -> u64;
}

impl NowMs for ManualClock {
    fn now_ms(&self) -> u64 {
        use retrywise::Clock;
        self.now().as_millis() as u64
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Through the engine: every attempt a routed call makes (first or
    /// fallback) goes to an upstream with the required capabilities, inside
    /// the data boundary, under the cost cap, and not forced open.
    #[test]
    fn engine_fallbacks_only_pick_eligible_upstreams(caps in prop::collection::vec(prop::option::of(prop::collection::vec(0usize..3, 0..3)), 2..6),
                                                     apis in prop::collection::vec(prop::option::of(0usize..3), 6),
                                                     wanted in prop::collection::vec(0usize..3, 0..2),
                                                     want_api in prop::option::of(0usize..3),
                                                     boundaries in prop::collection::vec(0usize..2, 6),
                                                     costs in prop::collection::vec(0u32..40, 6),
                                                     forced_open in prop::collection::vec(any::<bool>(), 6),
                                                     require in prop::collection::vec(0usize..3, 0..2),
                                                     outcomes in prop::collection::vec(outcome_strategy(), 1..8),
                                                     seed in any::<u64>()) {
        let names = ["streaming", "tool_calling", "json_schema"];
        let bnames = ["eu", "us"];
        let mut p = Policy { max_attempts: 8, ..Policy::default() };
        p.budget.enabled = false;
        let mut cands = Vec::new();
        for (i, c) in caps.iter().enumerate() {
            p.upstreams.insert(format!("u{i}"), retrywise::policy::Upstream {
                provider: format!("p{i}"),
                model: format!("m{i}"),
                capabilities: c.as_ref().map(|c| c.iter().map(|x| names[*x].to_string()).collect()),
                api: apis[i].map(|a| retrywise::ApiFamily::ALL[a]),
                data_boundary: Some(bnames[boundaries[i]].to_string()),
                cost_output_per_mtok: costs[i] as f64,
                ..Default::default()
            });
            if forced_open[i] {
                p.breaker.overrides.insert(format!("u{i}"), retrywise::policy::BreakerOverride::ForceOpen);
            }
            cands.push(format!("u{i}"));
        }
        let route = Route {
            candidates: cands,
            require: require.iter().map(|x| names[*x].to_string()).collect(),
            data_boundary: Some("eu".into()),
            max_cost_per_call: Some(0.02),
            attempts_per_upstream: 1,
            ..Route::default()
        };
        // A route mixing wire families is refused at load (its own test).
        let declared: Vec<_> = apis[..caps.len()].iter().flatten().map(|a| retrywise::ApiFamily::ALL[*a]).collect();
        prop_assume!(declared.iter().all(|a| a.takes(declared[0])));
        p.routes.insert("r".into(), route.clone());
        let needs = Needs {
            max_output_tokens: Some(1_000),
            capabilities: wanted.iter().map(|x| names[*x].to_string()).collect(),
            api: want_api.map(|a| retrywise::ApiFamily::ALL[a]),
            ..Needs::default()
        };
        let clock = ManualClock::new();
        let e = Engine::builder(p.clone()).clock(Arc::new(clock.clone())).seed(seed).read_env(false).build().unwrap();
        let mut c = e.begin(CallSpec::new("r").needs(needs.clone()));
        for o in &outcomes {
            let Ok(a) = c.next_attempt() else { break };
            let up = &p.upstreams[&*a.upstream];
            for r in &route.require {
                prop_assert!(up.has(r), "{} lacks {}", a.upstream, r);
            }
            if up.capabilities.is_some() {
                for w in &needs.capabilities {
                    prop_assert!(up.has(w), "{} lacks {}, which the request needs", a.upstream, w);
                }
            }
            if let (Some(have), Some(want)) = (up.api, needs.api) {
                prop_assert!(have.takes(want), "{} speaks {}, the request {}", a.upstream, have, want);
            }
            prop_assert_eq!(up.data_boundary.as_deref(), Some("eu"));
            prop_assert!(retrywise::rules::route::estimated_cost(up, &needs) <= 0.02);
            prop_assert!(!forced_open[a.upstream[1..].parse::<usize>().unwrap()], "{} is forced open", a.upstream);
            let d = c.report(o);
            if d.is_final() { break; }
            clock.advance(d.delay);
        }
    }
}
