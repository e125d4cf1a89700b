//! Scenarios: offered load, the upstream's capacity, a fault schedule, and the
//! policies the two engine-driven strategies run with.

use super::upstream::{Conditions, UpstreamParams};
use retrywise::Policy;

/// Names accepted by `--scenario`.
pub const NAMES: [&str; 6] = [
    "seed002",
    "steady-5pct",
    "hard-outage",
    "429-storm",
    "overload",
    "rate-limited",
];

/// One change to the world during `[from_ms, to_ms)`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Fault {
    /// Start, ms since the run began.
    pub from_ms: u64,
    /// End, ms.
    pub to_ms: u64,
    /// What changes.
    pub kind: FaultKind,
}

/// What a fault changes.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum FaultKind {
    /// Errors and latency rise (admitted requests fail more and take longer).
    Degrade {
        /// Error probability of an admitted request.
        error_rate: f64,
        /// Status of those errors.
        error_status: u16,
        /// Mean latency after the queue, ms.
        latency_mean_ms: f64,
    },
    /// Every request gets a fast 503; nothing is admitted.
    Outage,
    /// Provider-side rate limit with `retry-after`.
    RateLimit {
        /// Requests per second admitted.
        per_sec: f64,
        /// `retry-after` on 429s, seconds (a token bucket's; a window's 429 says its reset).
        retry_after_s: u32,
        /// Fixed windows of this many seconds, stated on every answer; 0 = a
        /// token bucket that states nothing but `retry-after`.
        window_s: u32,
    },
    /// Offered logical traffic multiplied.
    Surge {
        /// Multiplier on the offered QPS.
        factor: f64,
    },
}

/// One naive layer: total attempts (first included) and its per-attempt timeout.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct NaiveLayer {
    /// Layer name.
    pub name: &'static str,
    /// Attempts, the first included.
    pub attempts: u8,
    /// Per-attempt timeout, ms.
    pub timeout_ms: u64,
}

/// A complete simulation setup.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// `--scenario` name.
    pub name: &'static str,
    /// One line on what happens.
    pub summary: String,
    /// Offered logical requests per second (before surges).
    pub qps: f64,
    /// Arrival window, seconds (the run then drains in-flight work).
    pub duration_s: u64,
    /// Independent gateway instances, each with its own engine.
    pub instances: u32,
    /// The instances share breaker state through a store (`shared.rs`).
    pub shared: bool,
    /// Seed of every random choice (arrivals, upstream, engines).
    pub seed: u64,
    /// Capacity as a multiple of `qps`.
    pub capacity_factor: f64,
    /// The upstream.
    pub upstream: UpstreamParams,
    /// Conditions outside faults.
    pub baseline: Conditions,
    /// Fault schedule.
    pub faults: Vec<Fault>,
    /// Per-attempt timeout of the layer that calls the upstream (all strategies), ms.
    pub attempt_timeout_ms: u64,
    /// End-to-end deadline of the engine-driven strategies, ms.
    pub deadline_ms: u64,
    /// Naive layers, outermost first; the last one calls the upstream.
    pub naive_layers: [NaiveLayer; 3],
    /// Fixed backoff of every naive layer, ms.
    pub naive_backoff_ms: u64,
    /// Policy of strategy (b).
    pub jitter_policy: Policy,
    /// Policy of strategy (c).
    pub retrywise_policy: Policy,
    /// What the scenario sets up and why (printed with the results).
    pub notes: Vec<String>,
    /// What (c)'s policy tunes and why; replaced by `--policy`.
    pub policy_notes: Vec<String>,
    /// The file (c)'s policy came from (`--policy`); `None` for the scenario's own.
    pub retrywise_policy_file: Option<String>,
}

/// Command-line overrides.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--qps`.
    pub qps: Option<f64>,
    /// `--duration`.
    pub duration_s: Option<u64>,
    /// `--seed`.
    pub seed: Option<u64>,
    /// `--instances`.
    pub instances: Option<u32>,
    /// `--capacity`.
    pub capacity_factor: Option<f64>,
    /// `--shared`.
    pub shared: bool,
}

const ATTEMPT_TIMEOUT_MS: u64 = 4_000;
const MAX_QUEUE_MS: f64 = 5_000.0;
/// The target: retries add at most 10 % to the upstream's load (plus the budget floor).
pub const TARGET_RATIO: f64 = 0.1;

impl Scenario {
    /// The named scenario with overrides applied; fault times scale with the duration.
    pub fn named(name: &str, o: &Overrides) -> Result<Scenario, String> {
        let (name, default_duration, summary) = match name {
            "seed002" => (
                "seed002",
                90,
                "seed 002: a provider blip raises errors 0.01 % -> 5 % and mean latency 800 -> 2 500 ms for 30 s, then recovers",
            ),
            "steady-5pct" => ("steady-5pct", 60, "5 % transient 503s for the whole run, latency unchanged: what retries cost when nothing overloads"),
            "hard-outage" => ("hard-outage", 90, "the provider is down for 20 s (fast 503s, nothing admitted), then recovers"),
            "429-storm" => ("429-storm", 90, "the provider's rate limit drops to 60 % of offered load (429, retry-after: 2) for 30 s"),
            "rate-limited" => ("rate-limited", 120, "the provider limits requests per minute to half the offered load (L rpm, offered 2 L) and states the limit, its remaining allowance and its reset on every answer"),
            "overload" => ("overload", 90, "offered traffic surges to 1.3x for 30 s, above the upstream's capacity"),
            other => return Err(format!("unknown scenario {other:?}; expected one of {}", NAMES.join(", "))),
        };
        let qps = o.qps.unwrap_or(12_000.0);
        if !(qps.is_finite() && (10.0..=1e7).contains(&qps)) {
            return Err(format!("--qps must be between 10 and 10 000 000, got {qps}"));
        }
        let duration_s = o.duration_s.unwrap_or(default_duration);
        if !(10..=3_600).contains(&duration_s) {
            return Err(format!("--duration must be between 10 and 3 600 s, got {duration_s}"));
        }
        let instances = o.instances.unwrap_or(1);
        if instances == 0 || instances > 10_000 {
            return Err(format!("--instances must be between 1 and 10 000, got {instances}"));
        }
        let capacity_factor = o.capacity_factor.unwrap_or(1.15);
        if !(capacity_factor.is_finite() && (0.1..=100.0).contains(&capacity_factor)) {
            return Err(format!(
                "--capacity must be between 0.1 and 100 (a multiple of --qps), got {capacity_factor}"
            ));
        }
        // Fault times are given for the default duration and scale with --duration.
        let at = |s: u64| s * duration_s * 1000 / default_duration;
        let faults = match name {
            "seed002" => vec![Fault {
                from_ms: at(20),
                to_ms: at(50),
                kind: FaultKind::Degrade {
                    error_rate: 0.05,
                    error_status: 503,
                    latency_mean_ms: 2_500.0,
                },
            }],
            "steady-5pct" => vec![Fault {
                from_ms: 0,
                to_ms: at(60),
                kind: FaultKind::Degrade {
                    error_rate: 0.05,
                    error_status: 503,
                    latency_mean_ms: 800.0,
                },
            }],
            "hard-outage" => vec![Fault {
                from_ms: at(30),
                to_ms: at(50),
                kind: FaultKind::Outage,
            }],
            "429-storm" => vec![Fault {
                from_ms: at(30),
                to_ms: at(60),
                kind: FaultKind::RateLimit {
                    per_sec: 0.6 * qps,
                    retry_after_s: 2,
                    window_s: 0,
                },
            }],
            "rate-limited" => vec![Fault {
                from_ms: 0,
                to_ms: at(120),
                kind: FaultKind::RateLimit {
                    per_sec: 0.5 * qps,
                    retry_after_s: 2,
                    window_s: 60,
                },
            }],
            _ => vec![Fault {
                from_ms: at(30),
                to_ms: at(60),
                kind: FaultKind::Surge { factor: 1.3 },
            }],
        };
        let upstream = UpstreamParams {
            capacity_per_sec: capacity_factor * qps,
            max_queue_ms: MAX_QUEUE_MS,
            reject_ms: 20.0,
            latency_sigma: 0.6,
        };
        let deadline_ms = 30_000;
        let mut jitter = Policy {
            version: "sim-jitter-only".into(),
            deadline_ms,
            ..Policy::default()
        };
        jitter.timeouts.attempt_ms = Some(ATTEMPT_TIMEOUT_MS);
        jitter.telemetry.ring_size = 0;
        jitter.budget.enabled = false;
        jitter.breaker.enabled = false;
        jitter.rate_limits.enabled = false;
        let mut rw = Policy {
            version: "sim-retrywise".into(),
            deadline_ms,
            ..Policy::default()
        };
        rw.timeouts.attempt_ms = Some(ATTEMPT_TIMEOUT_MS);
        rw.telemetry.ring_size = 0;
        rw.budget.window_ms = 1_000;
        rw.budget.ratio = 0.09;
        let notes = vec![
            format!(
                "(b) and (c) share: max_attempts {}, deadline {} ms, timeouts.attempt_ms {} (the same per-attempt timeout as the naive gateway), full jitter {}-{} ms; (b) sets budget.enabled, breaker.enabled and rate_limits.enabled to false",
                rw.max_attempts, deadline_ms, ATTEMPT_TIMEOUT_MS, rw.backoff.base_ms, rw.backoff.cap_ms
            ),
            format!(
                "upstream: capacity {:.2}x offered (normal utilization {:.0} %); requests may queue up to {} ms, longer than the {} ms clients wait, since a server cannot know its clients' timeouts: once the queue passes the timeout, admitted requests are work nobody waits for",
                capacity_factor,
                100.0 / capacity_factor,
                MAX_QUEUE_MS,
                ATTEMPT_TIMEOUT_MS
            ),
        ];
        let br = &rw.breaker;
        let mut policy_notes = vec![
            format!(
                "(c) budget.window_ms {} (default 10 000): the budget bounds retries per window, and a 10 s window lets the allowance saved in quiet seconds be spent within one second, well above 1 + ratio; a 1 s window matches the 1 s buckets reported here",
                rw.budget.window_ms
            ),
            format!(
                "(c) budget.ratio {} (default 0.1): the budget counts a retry when it grants it, but the retry starts after its jitter wait, possibly in the next second, and arrivals are Poisson, so with 0.1 a saturated one-second bucket can land a fraction of a percent above 1.1x; 0.09 keeps the measured peak under the 1.1x target",
                rw.budget.ratio
            ),
            format!(
                "(c) breaker: core defaults (count window {} calls, trips at {:.0} % failures, open {} s growing x{} on each failed probe up to {} s, {} half-open probes, {} successes to close)",
                br.window_size,
                br.failure_rate.unwrap_or(0.0) * 100.0,
                br.open_ms / 1000,
                br.open_factor,
                br.open_max_ms / 1000,
                br.half_open_probes,
                br.close_after
            ),
        ];
        match name {
            "hard-outage" => policy_notes.push(format!("(c) with one upstream and no fallback: the breaker opens for {} ms, growing x{} up to {} s, so it probes again within seconds of the recovery; a call it refuses waits for its probe window when that is at most {} ms away (breaker.hold_max_ms) instead of failing, so the calls arriving in the outage's last second are answered after it, without the whole outage's calls arriving at once; the budget ({} % of requests) refuses most retries during the outage", br.open_ms, br.open_factor, br.open_max_ms / 1000, br.hold_max_ms, rw.budget.ratio * 100.0)),
            "429-storm" => policy_notes.push("(c) a 429 retried on the same upstream after its retry-after draws no budget (budget.exempt_rate_limited, default true): the provider said when to come back, so (c) retries these 429s as jitter-only does, and the requests rejected late in the storm are answered after it; the budget still guards 503s, 529s and timeouts (with exempt_rate_limited false, the budget refuses most of these retries and (c) answers 87.35 %)".into()),
            "rate-limited" => policy_notes.push("(c) rate_limits at its default (enabled): every answer's x-ratelimit-* and RateLimit-Policy fields update the provider's limit as (c) knows it, and an attempt the window has no room for waits for its slot after the reset (or stops when that is after the deadline) instead of being sent for a 429".into()),
            "steady-5pct" => policy_notes.push("(c) 5 % errors need 5 % retries, under the budget's 9 %: every strategy retries every failure".into()),
            _ => {}
        }
        jitter.validate().map_err(|e| e.to_string())?;
        rw.validate().map_err(|e| e.to_string())?;
        Ok(Scenario {
            name,
            summary: summary.to_string(),
            qps,
            duration_s,
            instances,
            shared: o.shared,
            seed: o.seed.unwrap_or(42),
            capacity_factor,
            upstream,
            baseline: Conditions::default(),
            faults,
            attempt_timeout_ms: ATTEMPT_TIMEOUT_MS,
            deadline_ms,
            naive_layers: [
                NaiveLayer {
                    name: "client",
                    attempts: 3,
                    timeout_ms: 30_000,
                },
                NaiveLayer {
                    name: "sdk",
                    attempts: 3,
                    timeout_ms: 10_000,
                },
                NaiveLayer {
                    name: "gateway",
                    attempts: 3,
                    timeout_ms: ATTEMPT_TIMEOUT_MS,
                },
            ],
            naive_backoff_ms: 1_000,
            jitter_policy: jitter,
            retrywise_policy: rw,
            notes,
            policy_notes,
            retrywise_policy_file: None,
        })
    }

    /// Replays the scenario with `policy` (read from `file`) for strategy (c)
    /// instead of the scenario's own; the notes on that policy no longer apply.
    pub fn with_retrywise_policy(mut self, policy: Policy, file: &str) -> Scenario {
        self.policy_notes = vec![format!(
            "(c) runs the policy in {file} (version {}) as written, with the scenario's {} ms deadline; the scenario's own (c) policy sets timeouts.attempt_ms {}, budget.window_ms 1000 and budget.ratio 0.09 over the core defaults",
            policy.version, self.deadline_ms, ATTEMPT_TIMEOUT_MS
        )];
        self.retrywise_policy = policy;
        self.retrywise_policy_file = Some(file.to_string());
        self
    }

    /// Every note, the scenario's first.
    pub fn all_notes(&self) -> Vec<String> {
        self.notes.iter().chain(&self.policy_notes).cloned().collect()
    }

    /// Conditions at `t_ms`.
    #[inline]
    pub fn conditions(&self, t_ms: u64) -> Conditions {
        let mut c = self.baseline;
        for f in &self.faults {
            if t_ms >= f.from_ms && t_ms < f.to_ms {
                match f.kind {
                    FaultKind::Degrade {
                        error_rate,
                        error_status,
                        latency_mean_ms,
                    } => {
                        c.error_rate = error_rate;
                        c.error_status = error_status;
                        c.latency_mean_ms = latency_mean_ms;
                    }
                    FaultKind::Outage => c.outage = true,
                    FaultKind::RateLimit {
                        per_sec,
                        retry_after_s,
                        window_s,
                    } => {
                        c.rate_limit_per_sec = Some(per_sec);
                        c.retry_after_s = retry_after_s;
                        c.rate_window_s = window_s;
                    }
                    FaultKind::Surge { factor } => c.qps_factor = factor,
                }
            }
        }
        c
    }

    /// First fault start and last fault end, ms.
    pub fn fault_window(&self) -> Option<(u64, u64)> {
        let from = self.faults.iter().map(|f| f.from_ms).min()?;
        let to = self.faults.iter().map(|f| f.to_ms).max()?;
        Some((from, to))
    }

    /// Physical attempts one logical request may make under the naive layering.
    pub fn naive_worst_case(&self) -> u32 {
        self.naive_layers.iter().map(|l| l.attempts as u32).product()
    }

    /// The floor's share of one second's logical requests: every instance's
    /// budget may grant `min_per_sec × window` retries regardless of traffic.
    pub fn floor_effect(&self) -> f64 {
        let b = &self.retrywise_policy.budget;
        self.instances as f64 * b.min_per_sec * (b.window_ms as f64 / 1000.0) / self.qps
    }

    /// `1 + TARGET_RATIO + floor effect`: the acceptance bound on retrywise's per-second amplification.
    pub fn budget_bound(&self) -> f64 {
        1.0 + TARGET_RATIO + self.floor_effect()
    }
}
