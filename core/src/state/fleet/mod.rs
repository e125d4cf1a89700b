//! Fleet-wide state: breakers, Retry-After cooldowns and provider rate-limit
//! evidence shared by every process of a fleet through a store (Redis or
//! Valkey), without the core doing any I/O or ever waiting on the store.
//!
//! The core keeps deciding on its own cells. A [`Fleet`] attached to an
//! engine (and to any [`RateLimits`] table) tells an adapter, once per sync
//! cycle, what to write and read ([`Fleet::plan`]); the adapter runs those
//! commands on a background thread or task and hands back the answers
//! ([`Fleet::complete`]) or the failure ([`Fleet::failed`]). A decision reads
//! only local cells, so a slow or dead store costs no call anything: the
//! engine decides on local state (fail-open), the failure is counted and
//! evented, and the next successful cycle writes everything again.
//!
//! What is shared, per scope and instance (`record.rs`, one Redis hash per
//! scope whose fields are instance ids):
//! - a breaker that opened on the instance's own evidence (a trip or a
//!   failed probe), until when and why; and a recovery (its probes
//!   succeeded), which cancels every open reported before it;
//! - a rate-limit scope's Retry-After cooldown, quota exhaustion and the
//!   last reading of each window.
//!
//! What an instance does with it (`view.rs`):
//! - a closed breaker opens only when `quorum` distinct instances reported
//!   an open within `quorum_window`, until the `quorum`-th latest end (one
//!   bad node cannot cut the fleet off, nor make it wait longer than the
//!   others say); never longer than its own `open_max_ms` from now;
//! - an open breaker is extended to the latest open end reported, and closes
//!   when an instance reports a recovery after it opened;
//! - the half-open probe is owned by one instance: shortly before an open
//!   period ends, each instance claims a lease (`SET NX PX` semantics, see
//!   [`CLAIM_SCRIPT`]); the losers stay open until the lease ends, the
//!   winner probes, and its recovery (or its new open) reaches the others;
//! - a cooldown holds the scope's requests until it ends (latest expiry
//!   wins, never longer than the table's `max_hold`), a quota exhaustion
//!   stops it, a reading is taken like one of the instance's own.
//!
//! Staleness: a change reaches the store at the writer's next cycle and the
//! others at their next; each cycle starts every `interval` and gives up
//! after `timeout`, so the bound is `2 × (interval + timeout)` (900 ms by
//! default, [`FleetConfig::staleness_bound`]).

mod apply;
pub mod memory;
mod outbox;
pub mod record;
pub mod view;

use crate::clock::ms;
use crate::state::ratelimit::RateLimits;
use crate::state::shared::Shared;
use crate::state::version::Version;
use crate::telemetry::{Event, EventKind};
pub(crate) use outbox::Outbox;
use outbox::{Pending, Space};
use parking_lot::Mutex;
use smol_str::SmolStr;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

pub use record::{Body, Limits, Record, Records, WindowRecord};
pub use view::{BreakerView, LimitsView};

/// Merges one instance's record into a scope's hash: `KEYS[1]` the scope's
/// key, `ARGV` the instance id, the record and its TTL in ms. The record is
/// kept only if it is later than the instance's stored one (its leading
/// number, then its text), and the key lives as long as its latest record.
/// One key per script: atomic, and valid on Redis Cluster.
pub const MERGE_SCRIPT: &str = r#"local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local a = tonumber(string.match(cur, '^(%d+)'))
  local b = tonumber(string.match(ARGV[2], '^(%d+)'))
  if a and b and (a > b or (a == b and cur >= ARGV[2])) then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local ttl = tonumber(ARGV[3])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1"#;

/// Claims a scope's probe lease: `KEYS[1]` the lease key, `ARGV` the
/// claimant's value (`<instance> <lease end, wall ms>`), its wall time in ms
/// and the lease's TTL in ms. `SET NX PX`, where a lease past the end its
/// holder stated counts as absent too (so a lease never outlives what it
/// says, whatever the key's TTL). Returns nil when the claim took the lease,
/// else the holder's value.
pub const CLAIM_SCRIPT: &str = r#"local cur = redis.call('GET', KEYS[1])
if cur then
  local e = tonumber(string.match(cur, ' (%d+)$'))
  if e and e > tonumber(ARGV[2]) then return cur end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return false"#;

/// How an instance takes part in a fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetConfig {
    /// This instance's id, unique in the fleet (the adapters default to
    /// `host:pid`). Empty: the process id and a random suffix.
    pub instance: String,
    /// Prefix of every key, so fleets (or environments) sharing a store stay
    /// apart. Default `retrywise`.
    pub namespace: String,
    /// Distinct instances that must report an open within `quorum_window`
    /// before a closed breaker elsewhere opens. Default 2: one instance with
    /// a bad network path cannot open the fleet's breakers. 1 shares every open.
    pub quorum: u32,
    /// How recent an open report must be to count toward the quorum. Default 30 s.
    pub quorum_window: Duration,
    /// Time between sync cycles. Default 250 ms.
    pub interval: Duration,
    /// Longest a sync cycle's commands may take; a slower store counts as
    /// down for that cycle. Default 200 ms.
    pub timeout: Duration,
    /// How long the instance that won a probe lease has, after its open
    /// period ends, to report the probe's outcome before another may probe.
    /// Default 10 s.
    pub probe_lease: Duration,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            instance: String::new(),
            namespace: "retrywise".into(),
            quorum: 2,
            quorum_window: Duration::from_secs(30),
            interval: Duration::from_millis(250),
            timeout: Duration::from_millis(200),
            probe_lease: Duration::from_secs(10),
        }
    }
}

impl FleetConfig {
    /// Longest a change on one instance takes to reach another while the
    /// store is up: `2 × (interval + timeout)`.
    pub fn staleness_bound(&self) -> Duration {
        (self.interval + self.timeout) * 2
    }
}

/// One write: `EVAL MERGE_SCRIPT 1 key field value ttl_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The scope's key.
    pub key: String,
    /// This instance's id.
    pub field: String,
    /// The record.
    pub value: String,
    /// The record's time to live, ms (until its expiry).
    pub ttl_ms: u64,
}

/// One probe-lease claim: `EVAL CLAIM_SCRIPT 1 key value now_ms ttl_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The lease's key.
    pub key: String,
    /// `<instance> <lease end, wall ms>`.
    pub value: String,
    /// The claimant's wall time, ms.
    pub now_ms: u64,
    /// The lease's time to live, ms.
    pub ttl_ms: u64,
}

/// One sync cycle's commands. Run the writes, then `HGETALL` each read key,
/// then the claims, and hand the answers to [`Fleet::complete`] in the same
/// order (or report a failure to [`Fleet::failed`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncPlan {
    /// Names this plan in `complete` / `failed`.
    pub id: u64,
    /// This instance's changed records.
    pub writes: Vec<Write>,
    /// Scope keys to read (hashes: instance → record).
    pub reads: Vec<String>,
    /// Probe leases to claim.
    pub claims: Vec<Claim>,
}

/// What one completed cycle changed locally.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Closed breakers opened by a quorum.
    pub opened: u32,
    /// Open breakers extended (a later open, or another instance's probe lease).
    pub extended: u32,
    /// Open breakers closed by another instance's recovery.
    pub recovered: u32,
    /// Probe leases this instance took.
    pub leases_won: u32,
    /// Probe leases another instance holds.
    pub leases_lost: u32,
    /// Rate-limit scopes whose state took remote evidence.
    pub limits: u32,
}

/// Counters of a fleet attachment.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct FleetStats {
    /// This instance's id.
    pub instance: String,
    /// The last cycle succeeded.
    pub healthy: bool,
    /// Cycles completed.
    pub cycles: u64,
    /// Cycles failed (store down, slow or refusing): decisions stayed local.
    pub failures: u64,
    /// Failures since the last completed cycle.
    pub consecutive_failures: u64,
    /// Wall time of the last completed cycle, ms (0: none yet).
    pub last_sync_ms: u64,
    /// Records written.
    pub writes: u64,
    /// Breakers opened by a quorum.
    pub opened: u64,
    /// Breakers extended.
    pub extended: u64,
    /// Breakers closed by another instance's recovery.
    pub recovered: u64,
    /// Probe leases won.
    pub leases_won: u64,
    /// Probe leases lost.
    pub leases_lost: u64,
    /// Rate-limit scopes that took remote evidence.
    pub limits: u64,
}

/// A plan in flight: what its answers belong to.
#[derive(Debug, Default)]
struct InFlight {
    id: u64,
    writes: Vec<Pending>,
    breakers: Vec<SmolStr>,
    limits: Vec<(usize, SmolStr)>,
    /// Registry key, the open end claimed for (engine ms), the lease's end (wall ms).
    claims: Vec<(SmolStr, u64, u64)>,
}

#[derive(Debug, Default)]
struct SyncState {
    next_id: u64,
    in_flight: Option<InFlight>,
    /// Registry key → the open end (engine ms) a lease was taken for.
    claimed: HashMap<SmolStr, u64>,
    /// Registry key → when an adopted open began (wall ms).
    since: HashMap<SmolStr, u64>,
    healthy: bool,
    stats: FleetStats,
}

/// The current policy version (the engine's, swapped by reloads).
pub(crate) type VersionFn = Arc<dyn Fn() -> Arc<Version> + Send + Sync>;

/// An engine's attachment to a fleet (see the module documentation).
/// `Send + Sync`: the adapter's background thread owns it, or shares it.
pub struct Fleet {
    cfg: FleetConfig,
    shared: Arc<Shared>,
    version: VersionFn,
    outbox: Arc<Outbox>,
    tables: Mutex<Vec<Arc<RateLimits>>>,
    state: Mutex<SyncState>,
    writes: AtomicU64,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").field("config", &self.cfg).finish()
    }
}

/// Why a fleet could not be attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetError(pub String);

impl std::fmt::Display for FleetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FleetError {}

/// Wall clock in ms since the epoch.
pub(crate) fn wall_ms(sh: &Shared) -> u64 {
    sh.clock.wall().duration_since(UNIX_EPOCH).map_or(0, ms)
}

/// The store key of a registry key: its dimension tag becomes a path segment.
fn breaker_key(ns: &str, space: &str, reg: &str) -> String {
    format!("{ns}:{space}:{}", reg.replace('\u{1f}', ":"))
}

impl Fleet {
    /// Attaches to an engine's shared state (see [`crate::Engine::fleet`]).
    pub(crate) fn attach(shared: Arc<Shared>, version: VersionFn, mut cfg: FleetConfig) -> Result<Fleet, FleetError> {
        if cfg.quorum == 0 {
            return Err(FleetError("fleet quorum must be at least 1".into()));
        }
        if cfg.namespace.is_empty() || cfg.namespace.contains(char::is_whitespace) {
            return Err(FleetError("fleet namespace must be non-empty, without spaces".into()));
        }
        if cfg.instance.is_empty() {
            cfg.instance = format!("{}-{:08x}", std::process::id(), shared.seed as u32);
        }
        if cfg.interval.is_zero() || cfg.timeout.is_zero() {
            return Err(FleetError("fleet interval and timeout must be positive".into()));
        }
        let close_ttl = ms(cfg.quorum_window) + version().policy.breaker.open_max_ms;
        let outbox = Arc::new(Outbox::new(close_ttl));
        if shared.fleet.set(outbox.clone()).is_err() {
            return Err(FleetError("this engine already has a fleet attached".into()));
        }
        let stats = FleetStats {
            instance: cfg.instance.clone(),
            ..FleetStats::default()
        };
        // The engine's own rate-limit table (what its calls pace on) is
        // shared from the start when the policy paces; otherwise nothing
        // reads it and the fleet leaves it out of every cycle.
        let mut tables = Vec::new();
        if version().policy.rate_limits.enabled {
            let own = shared.ratelimits.clone();
            own.fleet_attach();
            tables.push(own);
        }
        Ok(Fleet {
            cfg,
            shared,
            version,
            outbox,
            tables: Mutex::new(tables),
            state: Mutex::new(SyncState {
                stats,
                ..SyncState::default()
            }),
            writes: AtomicU64::new(0),
        })
    }

    /// The configuration (the adapters read `interval` and `timeout` here).
    pub fn config(&self) -> &FleetConfig {
        &self.cfg
    }

    /// Shares another rate-limit table's cooldowns and readings too (the
    /// engine's own, which its calls pace on, is shared already when the
    /// policy at attach time has `rate_limits.enabled`). The
    /// table's time must be the engine clock's (`Engine::now`, in ns).
    pub fn attach_rate_limits(&self, table: Arc<RateLimits>) {
        table.fleet_attach();
        let mut t = self.tables.lock();
        if !t.iter().any(|x| Arc::ptr_eq(x, &table)) {
            t.push(table);
        }
    }

    /// The commands of the next sync cycle. A plan not yet answered is
    /// abandoned (its writes are planned again).
    pub fn plan(&self) -> SyncPlan {
        let sh = &self.shared;
        let (now_wall, now_ns) = (wall_ms(sh), sh.clock.now_ns().0);
        let now_ms = now_ns / 1_000_000;
        let ns = &self.cfg.namespace;
        let tables = self.tables.lock().clone();
        // New readings of the tables become this instance's records.
        for (i, t) in tables.iter().enumerate() {
            for scope in t.take_changed() {
                if let Some(e) = t.evidence(&scope, now_ns) {
                    self.outbox
                        .limits(i, &scope, now_wall, apply::to_wall(&e, now_ns, now_wall));
                }
            }
        }
        let mut st = self.state.lock();
        st.next_id += 1;
        let mut f = InFlight {
            id: st.next_id,
            writes: self.outbox.dirty(now_wall),
            ..InFlight::default()
        };
        let writes = f
            .writes
            .iter()
            .map(|(space, scope, r)| Write {
                key: match space {
                    Space::Breaker => breaker_key(ns, "b", scope),
                    Space::Limits(_) => format!("{ns}:r:{scope}"),
                },
                field: self.cfg.instance.clone(),
                value: r.encode(),
                ttl_ms: r.expiry().saturating_sub(now_wall).max(1),
            })
            .collect();
        let lead = ms(self.cfg.interval + self.cfg.timeout);
        let lease = ms(self.cfg.probe_lease);
        let mut reads = Vec::new();
        let mut claims = Vec::new();
        let claimed = &st.claimed;
        sh.breakers.for_each(|slot| {
            f.breakers.push(slot.key.clone());
            reads.push(breaker_key(ns, "b", &slot.key));
            let Some(until) = slot.value.open_until() else { return };
            if until.saturating_sub(now_ms) > lead || claimed.get(&slot.key) == Some(&until) {
                return;
            }
            let end = now_wall + until.saturating_sub(now_ms) + lease;
            claims.push(Claim {
                key: breaker_key(ns, "p", &slot.key),
                value: format!("{} {end}", self.cfg.instance),
                now_ms: now_wall,
                ttl_ms: end - now_wall,
            });
            f.claims.push((slot.key.clone(), until, end));
        });
        for (i, t) in tables.iter().enumerate() {
            for scope in t.scope_names() {
                reads.push(format!("{ns}:r:{scope}"));
                f.limits.push((i, scope));
            }
        }
        let plan = SyncPlan {
            id: f.id,
            writes,
            reads,
            claims,
        };
        st.in_flight = Some(f);
        plan
    }

    /// Takes a plan's answers: `reads[i]` the fields of `plan.reads[i]`
    /// (instance → record; empty when the key does not exist), `claims[i]`
    /// the answer to `plan.claims[i]` (`None`: the lease is this instance's;
    /// else the holder's value). Answers of an abandoned plan are ignored.
    pub fn complete(&self, id: u64, reads: &[Vec<(String, String)>], claims: &[Option<String>]) -> SyncReport {
        let mut st = self.state.lock();
        let Some(f) = st.in_flight.take_if(|f| f.id == id) else {
            return SyncReport::default();
        };
        if reads.len() != f.breakers.len() + f.limits.len() || claims.len() != f.claims.len() {
            drop(st);
            self.failed(id, "answers do not match the plan");
            return SyncReport::default();
        }
        self.outbox.written(&f.writes);
        self.writes.fetch_add(f.writes.len() as u64, Ordering::Relaxed);
        let report = apply::cycle(self, &mut st, &f, reads, claims);
        let was = st.healthy;
        let s = &mut st.stats;
        s.cycles += 1;
        s.consecutive_failures = 0;
        s.last_sync_ms = wall_ms(&self.shared);
        s.opened += report.opened as u64;
        s.extended += report.extended as u64;
        s.recovered += report.recovered as u64;
        s.leases_won += report.leases_won as u64;
        s.leases_lost += report.leases_lost as u64;
        s.limits += report.limits as u64;
        st.healthy = true;
        if !was && st.stats.failures > 0 {
            self.event("store_resynced".into());
        }
        report
    }

    /// The cycle `id` failed (store unreachable, too slow, or an error):
    /// decisions stay on local state, the failure is counted (and evented
    /// when the store was up), and every record is written again next time.
    pub fn failed(&self, id: u64, error: &str) {
        let mut st = self.state.lock();
        if st.in_flight.as_ref().is_some_and(|f| f.id == id) {
            st.in_flight = None;
        }
        st.stats.failures += 1;
        st.stats.consecutive_failures += 1;
        let was = std::mem::replace(&mut st.healthy, false);
        drop(st);
        self.outbox.resend_all();
        if was || self.stats().failures == 1 {
            self.event(format!("store_unavailable: {error}"));
        }
    }

    /// True while the last cycle succeeded.
    pub fn healthy(&self) -> bool {
        self.state.lock().healthy
    }

    /// The counters.
    pub fn stats(&self) -> FleetStats {
        let st = self.state.lock();
        let mut s = st.stats.clone();
        s.healthy = st.healthy;
        s.writes = self.writes.load(Ordering::Relaxed);
        s
    }

    /// Records this instance holds (its own live records).
    pub fn own_records(&self) -> usize {
        self.outbox.len()
    }

    /// Publishes a fleet event (`detail` says what happened).
    fn event(&self, detail: String) {
        let bus = &self.shared.bus;
        if bus.active() {
            let v = (self.version)();
            let mut e = Event::new(EventKind::Fleet, ms(self.shared.clock.now()), v.version.clone());
            e.detail = Some(detail);
            bus.emit(e);
        }
    }
}
