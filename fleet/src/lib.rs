//! Redis for a retrywise fleet: runs the sync cycles a [`Fleet`] plans on a
//! background thread, against Redis or Valkey (see the README's "Running a fleet").
//!
//! ```no_run
//! use retrywise::{Engine, Policy, RateLimits};
//! use std::sync::Arc;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::new(Policy::default())?;
//! let rate_limits = Arc::new(RateLimits::default());
//! // The README's "Running a fleet" lines:
//! let fleet = engine.fleet(retrywise::FleetConfig::default())?;
//! let fleet = retrywise_fleet::RedisFleet::connect(fleet, "redis://127.0.0.1/")?.start();
//! fleet.fleet().attach_rate_limits(rate_limits.clone()); // share a RateLimits table too
//! # Ok(())
//! # }
//! ```
//!
//! Decisions never wait on Redis: they read the engine's own cells, which
//! the background thread updates. Every command of a cycle is one pipeline
//! on one connection with the fleet's `timeout` on connecting, reading and
//! writing; a cycle that fails (Redis down, slow, or refusing) is reported
//! to the fleet (counted, evented, records written again at the next
//! success) and the connection is made again at the next cycle.

#![deny(missing_docs)]

use retrywise::fleet::{SyncPlan, SyncReport, CLAIM_SCRIPT, MERGE_SCRIPT};
use retrywise::Fleet;
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The answers to a plan: each read key's fields, each claim's answer.
type Answers = (Vec<Vec<(String, String)>>, Vec<Option<String>>);

struct Inner {
    fleet: Fleet,
    client: redis::Client,
    con: Mutex<Option<redis::Connection>>,
    stop: Mutex<bool>,
    wake: Condvar,
}

/// A fleet synced through Redis (see the crate documentation).
pub struct RedisFleet {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RedisFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisFleet")
            .field("fleet", &self.inner.fleet)
            .field("running", &self.thread.is_some())
            .finish()
    }
}

impl RedisFleet {
    /// A fleet synced through the Redis at `url` (`redis://host:port/db`).
    /// Nothing connects yet: the first cycle does, and a failure to connect
    /// is a failed cycle like any other.
    pub fn connect(fleet: Fleet, url: &str) -> redis::RedisResult<RedisFleet> {
        Ok(RedisFleet {
            inner: Arc::new(Inner {
                fleet,
                client: redis::Client::open(url)?,
                con: Mutex::new(None),
                stop: Mutex::new(false),
                wake: Condvar::new(),
            }),
            thread: None,
        })
    }

    /// Starts the background thread: one cycle every `interval`.
    pub fn start(mut self) -> Self {
        if self.thread.is_none() {
            let inner = self.inner.clone();
            let t = std::thread::Builder::new()
                .name("retrywise-fleet".into())
                .spawn(move || inner.run())
                .expect("spawn the fleet sync thread");
            self.thread = Some(t);
        }
        self
    }

    /// Runs one cycle now, on this thread (tests; a caller without the thread).
    pub fn sync_once(&self) -> Result<SyncReport, String> {
        self.inner.cycle()
    }

    /// The fleet (stats, health, rate-limit tables to attach).
    pub fn fleet(&self) -> &Fleet {
        &self.inner.fleet
    }

    /// Stops the background thread (also on drop).
    pub fn stop(&mut self) {
        *self.inner.stop.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.inner.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RedisFleet {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Inner {
    fn run(&self) {
        let interval = self.fleet.config().interval;
        loop {
            let started = Instant::now();
            let _ = self.cycle();
            let mut stop = self.stop.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if *stop {
                    return;
                }
                let left = interval.saturating_sub(started.elapsed());
                if left.is_zero() {
                    break;
                }
                stop = self
                    .wake
                    .wait_timeout(stop, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        }
    }

    fn cycle(&self) -> Result<SyncReport, String> {
        let plan = self.fleet.plan();
        match self.exec(&plan) {
            Ok((reads, claims)) => Ok(self.fleet.complete(plan.id, &reads, &claims)),
            Err(e) => {
                *self.con.lock().unwrap_or_else(PoisonError::into_inner) = None;
                let e = e.to_string();
                self.fleet.failed(plan.id, &e);
                Err(e)
            }
        }
    }

    /// The plan as one pipeline: writes (answers ignored), reads, claims.
    fn exec(&self, plan: &SyncPlan) -> redis::RedisResult<Answers> {
        let timeout = self.fleet.config().timeout;
        let mut guard = self.con.lock().unwrap_or_else(PoisonError::into_inner);
        let con = match guard.as_mut() {
            Some(c) => c,
            None => guard.insert(connect(&self.client, timeout)?),
        };
        let mut p = redis::pipe();
        for w in &plan.writes {
            let args = (&w.key, &w.field, &w.value, w.ttl_ms);
            p.cmd("EVAL").arg(MERGE_SCRIPT).arg(1).arg(args).ignore();
        }
        for k in &plan.reads {
            p.cmd("HGETALL").arg(k);
        }
        for c in &plan.claims {
            let args = (&c.key, &c.value, c.now_ms, c.ttl_ms);
            p.cmd("EVAL").arg(CLAIM_SCRIPT).arg(1).arg(args);
        }
        if plan.writes.is_empty() && plan.reads.is_empty() && plan.claims.is_empty() {
            // Nothing to say or read: a PING keeps the health honest.
            redis::cmd("PING").query::<()>(con)?;
            return Ok((Vec::new(), Vec::new()));
        }
        let vals: Vec<redis::Value> = p.query(con)?;
        let (reads, claims) = vals.split_at(plan.reads.len().min(vals.len()));
        let reads = reads
            .iter()
            .map(|v| redis::from_redis_value::<BTreeMap<String, String>>(v).map(|m| m.into_iter().collect()))
            .collect::<Result<_, _>>()?;
        let claims = claims
            .iter()
            .map(redis::from_redis_value::<Option<String>>)
            .collect::<Result<_, _>>()?;
        Ok((reads, claims))
    }
}

fn connect(client: &redis::Client, timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let con = client.get_connection_with_timeout(timeout)?;
    con.set_read_timeout(Some(timeout))?;
    con.set_write_timeout(Some(timeout))?;
    Ok(con)
}
