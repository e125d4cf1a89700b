//! `NativeFleet`: the core's [`retrywise::Fleet`] for JS. The core plans each
//! sync cycle and applies its answers; `lib/fleet.js` runs the plan's
//! commands on a Redis client on an unref'd timer. This file only converts
//! the plan, the answers and the counters (numbers are ms, as f64).

use crate::engine::NativeEngine;
use crate::errors::{guard, throw, throw_type};
use napi::bindgen_prelude::*;
use napi_derive::napi;
use retrywise::fleet::{SyncPlan, CLAIM_SCRIPT, MERGE_SCRIPT};
use retrywise::{Fleet, FleetConfig};
use std::collections::HashMap;
use std::time::Duration;

/// How an engine takes part in a fleet (`FleetConfig`; absent fields keep the core's defaults).
#[napi(object)]
pub struct FleetOptions {
    /// This instance's id, unique in the fleet (default: pid and a random suffix).
    pub instance: Option<String>,
    /// Prefix of every key (default `retrywise`).
    pub namespace: Option<String>,
    /// Instances that must report an open before a closed breaker here opens (default 2).
    pub quorum: Option<u32>,
    /// How recent an open report must be to count toward the quorum, ms (default 30 000).
    pub quorum_window_ms: Option<f64>,
    /// Time between sync cycles, ms (default 250).
    pub interval_ms: Option<f64>,
    /// Longest a cycle's commands may take, ms (default 200).
    pub timeout_ms: Option<f64>,
    /// How long a probe lease's winner has to report its probe, ms (default 10 000).
    pub probe_lease_ms: Option<f64>,
}

/// The configuration in force, every field set.
#[napi(object)]
pub struct FleetSettings {
    pub instance: String,
    pub namespace: String,
    pub quorum: u32,
    pub quorum_window_ms: f64,
    pub interval_ms: f64,
    pub timeout_ms: f64,
    pub probe_lease_ms: f64,
}

/// `EVAL MERGE_SCRIPT 1 key field value ttlMs`.
#[napi(object)]
pub struct FleetWrite {
    pub key: String,
    pub field: String,
    pub value: String,
    pub ttl_ms: f64,
}

/// `EVAL CLAIM_SCRIPT 1 key value nowMs ttlMs`.
#[napi(object)]
pub struct FleetClaim {
    pub key: String,
    pub value: String,
    pub now_ms: f64,
    pub ttl_ms: f64,
}

/// One cycle's commands: the writes, `HGETALL` of each read, the claims, in that order.
#[napi(object)]
pub struct FleetPlan {
    pub id: f64,
    pub writes: Vec<FleetWrite>,
    pub reads: Vec<String>,
    pub claims: Vec<FleetClaim>,
}

/// What one completed cycle changed locally (`SyncReport`).
#[napi(object)]
pub struct FleetReport {
    pub opened: u32,
    pub extended: u32,
    pub recovered: u32,
    pub leases_won: u32,
    pub leases_lost: u32,
    pub limits: u32,
}

/// The attachment's counters (`FleetStats`).
#[napi(object)]
pub struct FleetCounters {
    pub instance: String,
    pub healthy: bool,
    pub cycles: f64,
    pub failures: f64,
    pub consecutive_failures: f64,
    pub last_sync_ms: f64,
    pub writes: f64,
    pub opened: f64,
    pub extended: f64,
    pub recovered: f64,
    pub leases_won: f64,
    pub leases_lost: f64,
    pub limits: f64,
}

/// The Lua scripts a plan's writes and claims run.
#[napi(object)]
pub struct FleetScripts {
    pub merge: String,
    pub claim: String,
}

/// The merge and claim scripts (`MERGE_SCRIPT`, `CLAIM_SCRIPT`).
#[napi]
pub fn fleet_scripts() -> FleetScripts {
    FleetScripts {
        merge: MERGE_SCRIPT.to_string(),
        claim: CLAIM_SCRIPT.to_string(),
    }
}

fn millis(env: &Env, name: &str, v: Option<f64>, default: Duration) -> Result<Duration> {
    match v {
        None => Ok(default),
        Some(ms) if ms.is_finite() && ms >= 0.0 => Ok(Duration::from_micros((ms * 1000.0) as u64)),
        Some(ms) => Err(throw_type(
            env,
            &format!("fleet.{name} must be a finite number >= 0, got {ms}"),
        )),
    }
}

fn config(env: &Env, o: FleetOptions) -> Result<FleetConfig> {
    let d = FleetConfig::default();
    Ok(FleetConfig {
        quorum_window: millis(env, "quorumWindowMs", o.quorum_window_ms, d.quorum_window)?,
        interval: millis(env, "intervalMs", o.interval_ms, d.interval)?,
        timeout: millis(env, "timeoutMs", o.timeout_ms, d.timeout)?,
        probe_lease: millis(env, "probeLeaseMs", o.probe_lease_ms, d.probe_lease)?,
        instance: o.instance.unwrap_or(d.instance),
        namespace: o.namespace.unwrap_or(d.namespace),
        quorum: o.quorum.unwrap_or(d.quorum),
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Lean native fleet attachment. Use `engine.fleet()` from `index.js` instead.
#[napi]
pub struct NativeFleet {
    fleet: Fleet,
}

#[napi]
impl NativeFleet {
    /// Attaches a fleet to `engine` (once per engine; throws `ERR_RETRYWISE_FLEET` otherwise).
    #[napi(constructor)]
    pub fn new(env: Env, engine: &NativeEngine, options: FleetOptions) -> Result<Self> {
        guard(&env, || {
            let cfg = config(&env, options)?;
            let fleet = engine
                .st(&env)?
                .engine
                .fleet(cfg)
                .map_err(|e| throw(&env, "ERR_RETRYWISE_FLEET", &e.0))?;
            Ok(NativeFleet { fleet })
        })
    }

    /// The configuration in force.
    #[napi(getter)]
    pub fn config(&self) -> FleetSettings {
        let c = self.fleet.config();
        FleetSettings {
            instance: c.instance.clone(),
            namespace: c.namespace.clone(),
            quorum: c.quorum,
            quorum_window_ms: ms(c.quorum_window),
            interval_ms: ms(c.interval),
            timeout_ms: ms(c.timeout),
            probe_lease_ms: ms(c.probe_lease),
        }
    }

    /// Longest a change on one instance takes to reach another while the store is up, ms.
    #[napi(getter)]
    pub fn staleness_bound_ms(&self) -> f64 {
        ms(self.fleet.config().staleness_bound())
    }

    /// The next cycle's commands (an unanswered plan is abandoned).
    #[napi]
    pub fn plan(&self, env: Env) -> Result<FleetPlan> {
        guard(&env, || Ok(to_js(self.fleet.plan())))
    }

    /// A plan's answers: each read key's fields (`{}` when absent), each
    /// claim's answer (`null`: this instance holds the lease).
    #[napi]
    pub fn complete(
        &self,
        env: Env,
        id: f64,
        reads: Vec<HashMap<String, String>>,
        claims: Vec<Option<String>>,
    ) -> Result<FleetReport> {
        guard(&env, || {
            // Sorted, as the Rust adapter hands them: a cycle's outcome never
            // depends on the order a client listed a hash's fields in.
            let reads: Vec<Vec<(String, String)>> = reads
                .into_iter()
                .map(|m| {
                    let mut v: Vec<_> = m.into_iter().collect();
                    v.sort_unstable();
                    v
                })
                .collect();
            let r = self.fleet.complete(id as u64, &reads, &claims);
            Ok(FleetReport {
                opened: r.opened,
                extended: r.extended,
                recovered: r.recovered,
                leases_won: r.leases_won,
                leases_lost: r.leases_lost,
                limits: r.limits,
            })
        })
    }

    /// The cycle `id` failed: decisions stay local, the failure is counted and evented.
    #[napi]
    pub fn failed(&self, env: Env, id: f64, error: String) -> Result<()> {
        guard(&env, || {
            self.fleet.failed(id as u64, &error);
            Ok(())
        })
    }

    /// True while the last cycle succeeded.
    #[napi]
    pub fn healthy(&self) -> bool {
        self.fleet.healthy()
    }

    /// The counters.
    #[napi]
    pub fn stats(&self, env: Env) -> Result<FleetCounters> {
        guard(&env, || {
            let s = self.fleet.stats();
            Ok(FleetCounters {
                instance: s.instance,
                healthy: s.healthy,
                cycles: s.cycles as f64,
                failures: s.failures as f64,
                consecutive_failures: s.consecutive_failures as f64,
                last_sync_ms: s.last_sync_ms as f64,
                writes: s.writes as f64,
                opened: s.opened as f64,
                extended: s.extended as f64,
                recovered: s.recovered as f64,
                leases_won: s.leases_won as f64,
                leases_lost: s.leases_lost as f64,
                limits: s.limits as f64,
            })
        })
    }
}

fn to_js(p: SyncPlan) -> FleetPlan {
    FleetPlan {
        id: p.id as f64,
        writes: p
            .writes
            .into_iter()
            .map(|w| FleetWrite {
                key: w.key,
                field: w.field,
                value: w.value,
                ttl_ms: w.ttl_ms as f64,
            })
            .collect(),
        reads: p.reads,
        claims: p
            .claims
            .into_iter()
            .map(|c| FleetClaim {
                key: c.key,
                value: c.value,
                now_ms: c.now_ms as f64,
                ttl_ms: c.ttl_ms as f64,
            })
            .collect(),
    }
}
