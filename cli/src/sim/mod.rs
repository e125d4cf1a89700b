//! `retrywise simulate`: a deterministic discrete-event simulation of one
//! upstream under three retry strategies.
//!
//! * (a) naive layered retries — modelled directly in [`naive`];
//! * (b) one owner with full jitter, no budget, no breaker — the real engine;
//! * (c) retrywise with budget and breaker — the real engine.
//!
//! The three runs share the scenario, the arrival stream and the upstream model
//! (each has its own copy of the upstream); they are independent, so they run on
//! separate threads and the output does not depend on scheduling.

pub mod core;
pub mod naive;
pub mod owner;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod shared;
pub mod upstream;

use self::core::Metrics;
use scenario::{FaultKind, Scenario};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use upstream::Upstream;

/// The three strategies, in output order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// (a) client 3 × SDK 3 × gateway 3, fixed backoff.
    Naive,
    /// (b) one owner, full jitter, no budget or breaker.
    JitterOnly,
    /// (c) one owner with budget and breaker.
    Retrywise,
}

impl Strategy {
    /// All, in order.
    pub const ALL: [Strategy; 3] = [Strategy::Naive, Strategy::JitterOnly, Strategy::Retrywise];

    /// Stable key.
    pub fn key(self) -> &'static str {
        match self {
            Strategy::Naive => "naive_layered",
            Strategy::JitterOnly => "jitter_only",
            Strategy::Retrywise => "retrywise",
        }
    }

    /// Table label.
    pub fn label(self, sc: &Scenario) -> String {
        match self {
            Strategy::Naive => {
                let a: Vec<String> = sc.naive_layers.iter().map(|l| l.attempts.to_string()).collect();
                format!(
                    "(a) naive layered {}, fixed {} s",
                    a.join("x"),
                    sc.naive_backoff_ms as f64 / 1000.0
                )
            }
            Strategy::JitterOnly => "(b) one owner, full jitter only".into(),
            Strategy::Retrywise => match &sc.retrywise_policy_file {
                None => "(c) retrywise: budget + breaker".into(),
                Some(_) => format!("(c) retrywise: policy {}", sc.retrywise_policy.version),
            },
        }
    }
}

/// What the engines counted (summed over instances).
#[derive(Debug, Clone, Serialize, Default)]
pub struct EngineCounters {
    /// Policy version the engines ran.
    pub policy_version: String,
    /// Logical requests begun.
    pub logical_requests: u64,
    /// Physical attempts the engines admitted.
    pub attempts: u64,
    /// Retries granted.
    pub retries: u64,
    /// Successes won by a retry.
    pub retry_successes: u64,
    /// Retries refused by the budget.
    pub budget_refusals: u64,
    /// Breaker trips.
    pub breaker_opens: u64,
    /// Final stops by reason.
    pub stops: BTreeMap<String, u64>,
    /// Attempts admitted while a breaker was open or half-open (probes).
    pub probes: u64,
    /// Breakers opened by the fleet's quorum (`--shared`).
    pub fleet_opened: u64,
}

/// Per-second series (index = second since the run began).
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    /// Logical requests arriving.
    pub logical: Vec<u32>,
    /// Physical attempts started.
    pub attempts: Vec<u32>,
    /// attempts / logical (arrival window only).
    pub amplification: Vec<f64>,
    /// Attempts arriving at the upstream / capacity.
    pub load_vs_capacity: Vec<f64>,
    /// Share of the logical requests arriving in that second that finally succeeded.
    pub success_rate: Vec<f64>,
    /// Successful logical requests completing in that second.
    pub goodput: Vec<u32>,
    /// Attempts refused with 529 (queue full).
    pub overloaded: Vec<u32>,
    /// Attempts refused with 429.
    pub rate_limited: Vec<u32>,
    /// Longest upstream queue wait, ms.
    pub max_queue_wait_ms: Vec<u32>,
    /// Retries refused by the budget (engine strategies).
    pub budget_refusals: Vec<u32>,
    /// Calls stopped by an open breaker (engine strategies).
    pub breaker_stops: Vec<u32>,
}

/// The headline numbers of one strategy.
#[derive(Debug, Clone, Serialize)]
pub struct StrategyResult {
    /// Which strategy.
    pub strategy: Strategy,
    /// Stable key (`naive_layered`, `jitter_only`, `retrywise`).
    pub key: &'static str,
    /// Table label.
    pub label: String,
    /// Logical requests.
    pub logical_requests: u64,
    /// Physical attempts.
    pub attempts: u64,
    /// Successful logical requests.
    pub successes: u64,
    /// Highest per-second attempts / logical.
    pub peak_amplification: f64,
    /// Second of that peak.
    pub peak_amplification_at_s: u64,
    /// attempts / logical over the whole run.
    pub mean_amplification: f64,
    /// Highest per-second attempts at the upstream / capacity.
    pub peak_load_vs_capacity: f64,
    /// Second of that peak.
    pub peak_load_at_s: u64,
    /// Highest attempts per second.
    pub peak_attempts_per_sec: u32,
    /// successes / logical.
    pub final_success_rate: f64,
    /// Latency percentiles of every logical request (success or failure), ms.
    pub p50_ms: u64,
    /// 99th percentile, ms.
    pub p99_ms: u64,
    /// Latency percentiles of successful logical requests, ms.
    pub success_p50_ms: u64,
    /// 99th percentile, ms.
    pub success_p99_ms: u64,
    /// Seconds from the end of the fault until the strategy is back to its
    /// pre-fault success rate (within 1 point) with the upstream at or below
    /// capacity, for good; `None` when it never got there (or no fault ended).
    pub time_to_recover_s: Option<u64>,
    /// Whether the run had a fault that ended before the arrival window did.
    pub recovery_measured: bool,
    /// Engine counters (strategies b and c).
    pub engine: Option<EngineCounters>,
    /// Per-second series.
    pub series: Series,
}

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    /// Scenario name.
    pub scenario: &'static str,
    /// What happens in it.
    pub summary: String,
    /// Seed.
    pub seed: u64,
    /// Offered logical QPS (before surges).
    pub qps: f64,
    /// Arrival window, s.
    pub duration_s: u64,
    /// Gateway instances.
    pub instances: u32,
    /// Whether they shared breaker state (`--shared`).
    pub shared: bool,
    /// Upstream capacity, requests/s.
    pub capacity_per_sec: f64,
    /// Capacity / qps.
    pub capacity_factor: f64,
    /// Upstream model parameters.
    pub upstream: upstream::UpstreamParams,
    /// Fault schedule.
    pub faults: Vec<scenario::Fault>,
    /// Per-attempt timeout at the upstream-facing layer, ms.
    pub attempt_timeout_ms: u64,
    /// End-to-end deadline of the engine-driven strategies, ms.
    pub deadline_ms: u64,
    /// Naive layers.
    pub naive_layers: Vec<scenario::NaiveLayer>,
    /// Naive worst case attempts per logical request.
    pub naive_worst_case: u32,
    /// Policy of (b), as JSON.
    pub jitter_only_policy: serde_json::Value,
    /// Policy of (c), as JSON.
    pub retrywise_policy: serde_json::Value,
    /// `1 + ratio + instances * min_per_sec / qps`.
    pub budget_bound: f64,
    /// Longest time, s, retrywise may take after a fault to be back to its pre-fault success.
    pub recovery_bound_s: u64,
    /// Notes on tuning.
    pub notes: Vec<String>,
    /// Results in order (a), (b), (c).
    pub strategies: Vec<StrategyResult>,
    /// The acceptance relations, evaluated on this run.
    pub checks: Vec<Check>,
}

/// A relation evaluated on the run's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Stable name.
    pub name: &'static str,
    /// Whether it holds.
    pub ok: bool,
    /// Whether it is an acceptance criterion of this scenario (else it is the
    /// default scenario's, evaluated for information).
    pub acceptance: bool,
    /// The relation with the numbers.
    pub detail: String,
}

fn summarize(
    sc: &Scenario,
    s: Strategy,
    m: Metrics,
    up: Upstream,
    stats: Option<Vec<retrywise::Stats>>,
) -> StrategyResult {
    let dur = sc.duration_s as usize;
    let cap = sc.upstream.capacity_per_sec;
    let len = m.attempts.len().max(up.per_sec.len()).max(dur);
    let at = |v: &Vec<u32>, i: usize| v.get(i).copied().unwrap_or(0);
    let amplification: Vec<f64> = (0..dur)
        .map(|i| {
            let l = at(&m.logical, i);
            if l == 0 {
                0.0
            } else {
                at(&m.attempts, i) as f64 / l as f64
            }
        })
        .collect();
    let arrived: Vec<u32> = (0..len).map(|i| up.per_sec.get(i).map_or(0, |x| x.arrived)).collect();
    let load: Vec<f64> = arrived.iter().map(|&a| a as f64 / cap).collect();
    let success_rate: Vec<f64> = (0..dur)
        .map(|i| {
            let l = at(&m.logical, i);
            if l == 0 {
                0.0
            } else {
                at(&m.ok_by_arrival, i) as f64 / l as f64
            }
        })
        .collect();
    let (peak_amp_at, peak_amp) =
        amplification
            .iter()
            .copied()
            .enumerate()
            .fold((0, 0.0), |b, (i, v)| if v > b.1 { (i, v) } else { b });
    let (peak_load_at, peak_load) = load
        .iter()
        .copied()
        .enumerate()
        .fold((0, 0.0), |b, (i, v)| if v > b.1 { (i, v) } else { b });
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };

    // Time to recover: pre-fault success rate as the baseline; recovered from the
    // first second after the fault from which every later second (of the arrival
    // window) is within 1 point of it with the upstream at or below capacity.
    let mut recovery_measured = false;
    let mut time_to_recover_s = None;
    if let Some((from, to)) = sc.fault_window() {
        let from_s = (from / 1000) as usize;
        let to_s = to.div_ceil(1000) as usize;
        if to_s < dur && from_s >= 2 {
            recovery_measured = true;
            let (ok, n) = (1..from_s).fold((0u64, 0u64), |(o, n), i| {
                (o + at(&m.ok_by_arrival, i) as u64, n + at(&m.logical, i) as u64)
            });
            let baseline = ratio(ok, n);
            let good = |i: usize| success_rate[i] >= baseline - 0.01 && load[i] <= 1.0;
            let mut first_good = None;
            for i in (to_s..dur).rev() {
                if good(i) {
                    first_good = Some(i);
                } else {
                    break;
                }
            }
            time_to_recover_s = first_good.map(|i| (i - to_s) as u64);
        }
    }

    let engine = stats.map(|all| {
        let mut e = EngineCounters {
            probes: m.probes,
            fleet_opened: m.fleet_opened,
            ..EngineCounters::default()
        };
        for st in all {
            e.policy_version = st.policy_version.clone();
            let o = &st.overall;
            e.logical_requests += o.logical_requests;
            e.attempts += o.attempts;
            e.retries += o.retries;
            e.retry_successes += o.retry_successes;
            e.budget_refusals += o.budget_refusals;
            e.breaker_opens += o.breaker_opens;
            for (k, v) in &o.stops {
                *e.stops.entry(k.clone()).or_default() += v;
            }
        }
        e
    });
    let pick = |v: &Vec<u32>| (0..len).map(|i| at(v, i)).collect::<Vec<u32>>();
    StrategyResult {
        strategy: s,
        key: s.key(),
        label: s.label(sc),
        logical_requests: m.total_logical,
        attempts: m.total_attempts,
        successes: m.total_ok,
        peak_amplification: peak_amp,
        peak_amplification_at_s: peak_amp_at as u64,
        mean_amplification: ratio(m.total_attempts, m.total_logical),
        peak_load_vs_capacity: peak_load,
        peak_load_at_s: peak_load_at as u64,
        peak_attempts_per_sec: arrived.iter().copied().max().unwrap_or(0),
        final_success_rate: ratio(m.total_ok, m.total_logical),
        p50_ms: m.latency_all(0.50).unwrap_or(0),
        p99_ms: m.latency_all(0.99).unwrap_or(0),
        success_p50_ms: m.latency_ok(0.50).unwrap_or(0),
        success_p99_ms: m.latency_ok(0.99).unwrap_or(0),
        time_to_recover_s,
        recovery_measured,
        engine,
        series: Series {
            logical: pick(&m.logical),
            attempts: pick(&m.attempts),
            amplification,
            load_vs_capacity: load,
            success_rate,
            goodput: pick(&m.ok_by_completion),
            overloaded: (0..len)
                .map(|i| up.per_sec.get(i).map_or(0, |x| x.overloaded))
                .collect(),
            rate_limited: (0..len)
                .map(|i| up.per_sec.get(i).map_or(0, |x| x.rate_limited))
                .collect(),
            max_queue_wait_ms: (0..len)
                .map(|i| up.per_sec.get(i).map_or(0, |x| x.max_wait_ms))
                .collect(),
            budget_refusals: pick(&m.budget_refusals),
            breaker_stops: pick(&m.breaker_stops),
        },
    }
}

/// Runs one strategy.
pub fn run_one(sc: &Scenario, s: Strategy, progress: &AtomicU64) -> Result<StrategyResult, String> {
    match s {
        Strategy::Naive => {
            let (m, up) = naive::run(sc, progress);
            Ok(summarize(sc, s, m, up, None))
        }
        Strategy::JitterOnly | Strategy::Retrywise => {
            let policy = if s == Strategy::JitterOnly {
                &sc.jitter_policy
            } else {
                &sc.retrywise_policy
            };
            let (m, up, stats) = owner::run(sc, policy, progress)?;
            Ok(summarize(sc, s, m, up, Some(stats)))
        }
    }
}

/// Runs the three strategies on up to `jobs` threads; `on_tick` is called about
/// ten times a second with the fraction of simulated time done.
pub fn run(sc: &Scenario, jobs: usize, mut on_tick: impl FnMut(f64)) -> Result<SimReport, String> {
    let progress: Vec<AtomicU64> = Strategy::ALL.iter().map(|_| AtomicU64::new(0)).collect();
    // Arrivals last `duration`; the last measured requests finish within one deadline after it.
    let horizon_ms = (sc.duration_s * 1000 + sc.deadline_ms) as f64;
    let next = AtomicU64::new(0);
    let jobs = jobs.clamp(1, Strategy::ALL.len());
    let mut results: Vec<Option<Result<StrategyResult, String>>> = vec![None, None, None];
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..jobs)
            .map(|_| {
                let (next, progress) = (&next, &progress);
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                        if i >= Strategy::ALL.len() {
                            break;
                        }
                        mine.push((i, run_one(sc, Strategy::ALL[i], &progress[i])));
                    }
                    mine
                })
            })
            .collect();
        while handles.iter().any(|h| !h.is_finished()) {
            let done: f64 = progress
                .iter()
                .map(|p| {
                    let v = p.load(Ordering::Relaxed);
                    if v == u64::MAX {
                        1.0
                    } else {
                        (v as f64 / horizon_ms).min(1.0)
                    }
                })
                .sum::<f64>()
                / progress.len() as f64;
            on_tick(done);
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        for h in handles {
            match h.join() {
                Ok(v) => {
                    for (i, r) in v {
                        results[i] = Some(r);
                    }
                }
                Err(_) => std::panic::resume_unwind(Box::new("a simulation thread panicked")),
            }
        }
    });
    let mut strategies = Vec::new();
    for r in results {
        strategies.push(r.ok_or("a strategy did not run")??);
    }
    let checks = checks(sc, &strategies);
    Ok(SimReport {
        scenario: sc.name,
        summary: sc.summary.clone(),
        seed: sc.seed,
        qps: sc.qps,
        duration_s: sc.duration_s,
        instances: sc.instances,
        shared: sc.shared,
        capacity_per_sec: sc.upstream.capacity_per_sec,
        capacity_factor: sc.capacity_factor,
        upstream: sc.upstream,
        faults: sc.faults.clone(),
        attempt_timeout_ms: sc.attempt_timeout_ms,
        deadline_ms: sc.deadline_ms,
        naive_layers: sc.naive_layers.to_vec(),
        naive_worst_case: sc.naive_worst_case(),
        jitter_only_policy: serde_json::to_value(&sc.jitter_policy).unwrap_or_default(),
        retrywise_policy: serde_json::to_value(&sc.retrywise_policy).unwrap_or_default(),
        budget_bound: sc.budget_bound(),
        recovery_bound_s: recovery_bound_s(sc),
        notes: sc.all_notes(),
        strategies,
        checks,
    })
}

/// Longest time, s, from the end of a fault until retrywise is back to its
/// pre-fault success: the breaker probes within `open_max_ms` of the
/// recovery, a probe answers within the per-attempt timeout, and the
/// measurement counts whole seconds.
pub fn recovery_bound_s(sc: &Scenario) -> u64 {
    let p = &sc.retrywise_policy;
    let open = if p.breaker.enabled { p.breaker.open_max_ms } else { 0 };
    let attempt = p
        .timeouts
        .attempt_ms
        .or(p.timeouts.first_byte_ms)
        .unwrap_or(p.deadline_ms / 2);
    (open + attempt).div_ceil(1000) + 1
}

/// The headline relations, from the run's numbers: the default scenario's
/// amplification relations, and on every scenario that retrywise answers at
/// least what jitter alone does and recovers within [`recovery_bound_s`].
pub fn checks(sc: &Scenario, r: &[StrategyResult]) -> Vec<Check> {
    let (a, b, c) = (&r[0], &r[1], &r[2]);
    let bound = sc.budget_bound();
    let default = sc.name == "seed002";
    let recover_bound = recovery_bound_s(sc);
    let recovered = match (c.recovery_measured, c.time_to_recover_s) {
        (false, _) => None,
        (true, t) => Some(t),
    };
    let mut v = vec![
        Check {
            name: "naive_peak_amplification_at_least_3",
            ok: a.peak_amplification >= 3.0,
            acceptance: default,
            detail: format!("naive layered peak amplification {:.2}x >= 3x", a.peak_amplification),
        },
        Check {
            name: "retrywise_peak_amplification_within_budget",
            ok: c.peak_amplification <= bound + 1e-9,
            acceptance: default,
            detail: format!(
                "retrywise peak amplification {:.3}x <= 1.1 + floor effect {:.4} ({} instance(s) x {}/s x {} s / {} QPS) = {:.4}x",
                c.peak_amplification,
                sc.floor_effect(),
                sc.instances,
                sc.retrywise_policy.budget.min_per_sec,
                sc.retrywise_policy.budget.window_ms as f64 / 1000.0,
                sc.qps,
                bound
            ),
        },
        Check {
            name: "retrywise_success_not_worse_than_jitter_only",
            ok: c.successes >= b.successes,
            acceptance: true,
            detail: format!(
                "retrywise final success {:.2} % >= jitter-only {:.2} % ({} >= {} answered)",
                c.final_success_rate * 100.0,
                b.final_success_rate * 100.0,
                report::thousands(c.successes as f64),
                report::thousands(b.successes as f64)
            ),
        },
    ];
    if sc.name == "rate-limited" {
        let sent_429 = |s: &StrategyResult| s.series.rate_limited.iter().map(|&n| u64::from(n)).sum::<u64>();
        let (b429, c429) = (sent_429(b), sent_429(c));
        let limit_per_min = sc
            .faults
            .iter()
            .find_map(|f| match f.kind {
                FaultKind::RateLimit { per_sec, .. } => Some(per_sec * 60.0),
                _ => None,
            })
            .unwrap_or(f64::INFINITY);
        // Answers given while the load was offered: those after it (waiters
        // promised a later window) would credit the limit with a window the
        // run did not last.
        let in_run: u64 = c
            .series
            .goodput
            .iter()
            .take(sc.duration_s as usize)
            .map(|&n| u64::from(n))
            .sum();
        let per_min = in_run as f64 * 60.0 / sc.duration_s as f64;
        v.push(Check {
            name: "retrywise_429s_at_most_1pct_of_jitter_only",
            ok: c429 as f64 <= 0.01 * b429 as f64,
            acceptance: true,
            detail: format!(
                "retrywise sent {} 429s <= 1 % of jitter-only's {}",
                report::thousands(c429 as f64),
                report::thousands(b429 as f64)
            ),
        });
        v.push(Check {
            name: "retrywise_completes_95pct_of_the_limit",
            ok: per_min >= 0.95 * limit_per_min,
            acceptance: true,
            detail: format!(
                "retrywise completed {} requests per minute in the run's {} s >= 95 % of the limit {} rpm ({:.1} %)",
                report::thousands(per_min),
                sc.duration_s,
                report::thousands(limit_per_min),
                per_min / limit_per_min * 100.0
            ),
        });
    }
    if let Some(t) = recovered {
        v.push(Check {
            name: "retrywise_recovers_within_bound",
            ok: t.is_some_and(|t| t <= recover_bound),
            acceptance: true,
            detail: format!(
                "retrywise back to pre-fault success {} after the fault <= breaker.open_max_ms + per-attempt timeout + 1 s = {recover_bound} s",
                t.map_or("never".to_string(), |t| format!("{t} s"))
            ),
        });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::scenario::{Fault, FaultKind, Overrides};
    use super::*;

    fn small(name: &str, qps: f64, duration: u64) -> Scenario {
        let o = Overrides {
            qps: Some(qps),
            duration_s: Some(duration),
            seed: Some(3),
            ..Overrides::default()
        };
        Scenario::named(name, &o).unwrap()
    }

    fn always_down(mut sc: Scenario) -> Scenario {
        sc.faults = vec![Fault {
            from_ms: 0,
            to_ms: 1_000_000_000,
            kind: FaultKind::Outage,
        }];
        sc
    }

    #[test]
    fn against_a_dead_upstream_naive_layers_make_exactly_27_attempts_and_one_owner_3() {
        let sc = always_down(small("hard-outage", 50.0, 10));
        let p = AtomicU64::new(0);
        let a = run_one(&sc, Strategy::Naive, &p).unwrap();
        assert_eq!(a.successes, 0);
        assert_eq!(
            a.attempts,
            27 * a.logical_requests,
            "naive worst case is the product of the layers"
        );
        let b = run_one(&sc, Strategy::JitterOnly, &p).unwrap();
        assert_eq!(
            b.attempts,
            3 * b.logical_requests,
            "one owner: max_attempts, never more"
        );
        let c = run_one(&sc, Strategy::Retrywise, &p).unwrap();
        let e = c.engine.as_ref().unwrap();
        assert!(e.breaker_opens >= 1 && e.stops.contains_key("breaker_open"), "{e:?}");
        assert!(
            c.mean_amplification < 1.0,
            "the open breaker sheds load: {}",
            c.mean_amplification
        );
    }

    #[test]
    fn engine_counters_agree_with_the_simulation() {
        let sc = small("steady-5pct", 300.0, 20);
        let p = AtomicU64::new(0);
        for s in [Strategy::JitterOnly, Strategy::Retrywise] {
            let r = run_one(&sc, s, &p).unwrap();
            let e = r.engine.as_ref().unwrap();
            // The engines also saw the traffic that kept flowing while the last measured requests finished.
            assert!(
                e.logical_requests >= r.logical_requests && e.attempts >= r.attempts,
                "{e:?}"
            );
            let attempts: u64 = r.series.attempts.iter().map(|&a| a as u64).sum();
            assert_eq!(
                attempts, e.attempts,
                "every attempt the engine admitted reached the upstream"
            );
            assert!(
                r.p99_ms <= sc.deadline_ms,
                "the engine keeps every call within its deadline"
            );
            assert!(
                r.final_success_rate > 0.995,
                "5 % errors are all retried: {}",
                r.final_success_rate
            );
        }
    }

    #[test]
    fn same_seed_same_report_whatever_the_threads() {
        let sc = small("seed002", 200.0, 30);
        let a = serde_json::to_string(&run(&sc, 1, |_| {}).unwrap()).unwrap();
        let b = serde_json::to_string(&run(&sc, 3, |_| {}).unwrap()).unwrap();
        assert_eq!(a, b);
        let mut other = sc.clone();
        other.seed = 4;
        let c = serde_json::to_string(&run(&other, 2, |_| {}).unwrap()).unwrap();
        assert_ne!(a, c);
    }

    #[test]
    fn fleet_instances_each_have_an_engine() {
        let o = Overrides {
            qps: Some(400.0),
            duration_s: Some(20),
            seed: Some(5),
            instances: Some(4),
            ..Overrides::default()
        };
        let sc = Scenario::named("steady-5pct", &o).unwrap();
        let clock = retrywise::ManualClock::new();
        assert_eq!(owner::engines(&sc.retrywise_policy, &sc, &clock).unwrap().len(), 4);
        assert!((sc.floor_effect() - 4.0 / 400.0).abs() < 1e-12);
        let r = run_one(&sc, Strategy::Retrywise, &AtomicU64::new(0)).unwrap();
        assert!(r.final_success_rate > 0.99);
    }

    #[test]
    fn recovery_is_measured_after_the_fault() {
        let sc = small("hard-outage", 300.0, 45);
        let (from, to) = sc.fault_window().unwrap();
        assert_eq!((from, to), (15_000, 25_000));
        let r = run_one(&sc, Strategy::JitterOnly, &AtomicU64::new(0)).unwrap();
        assert!(r.recovery_measured);
        let t = r
            .time_to_recover_s
            .expect("a fast outage ends cleanly for a 3-attempt owner");
        assert!(t <= 3, "{t}");
        // During the outage nothing succeeds.
        assert!(r.series.success_rate[20] < 0.01);
    }

    #[test]
    fn a_shared_fleet_probes_a_down_upstream_less_than_unshared_instances() {
        let o = |shared| Overrides {
            qps: Some(1_000.0),
            duration_s: Some(45),
            seed: Some(6),
            instances: Some(10),
            shared,
            ..Overrides::default()
        };
        let p = AtomicU64::new(0);
        let run = |shared| {
            let sc = Scenario::named("hard-outage", &o(shared)).unwrap();
            run_one(&sc, Strategy::Retrywise, &p).unwrap()
        };
        let (alone, shared) = (run(false), run(true));
        let (a, s) = (alone.engine.unwrap(), shared.engine.unwrap());
        assert_eq!(a.fleet_opened, 0);
        assert!(
            s.fleet_opened >= 1,
            "some instance opened on the others' reports: {s:?}"
        );
        assert!(
            s.probes * 3 < a.probes,
            "one lease holder probes for the fleet: {} vs {}",
            s.probes,
            a.probes
        );
        assert!(
            s.breaker_opens < a.breaker_opens,
            "{} vs {}",
            s.breaker_opens,
            a.breaker_opens
        );
    }
}
