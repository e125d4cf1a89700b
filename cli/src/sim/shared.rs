//! `simulate --shared`: the instances' engines share breaker state through
//! a store, as `retrywise-fleet` shares it through Redis. The store is the
//! core's [`MemoryStore`] (the Redis scripts' semantics); each instance runs
//! a sync cycle every [`FleetConfig::interval`], at its own phase, so what one
//! instance learns reaches another one to two intervals later: the lag a
//! real fleet has (without the network's few ms, which the interval dwarfs).

use super::core::Queue;
use retrywise::fleet::memory::MemoryStore;
use retrywise::{Clock, Engine, Fleet, FleetConfig, ManualClock};
use std::time::UNIX_EPOCH;

/// Event kind of an instance's sync cycle (its id is the instance).
pub const EV_SYNC: u8 = 2;

/// Every instance's fleet attachment and the store they share.
pub struct Shared {
    fleets: Vec<Fleet>,
    store: MemoryStore,
    interval_us: u64,
    /// Breakers opened by the quorum's reports.
    pub opened: u64,
}

impl Shared {
    /// Attaches every engine (instances named by index) and schedules their
    /// first cycles, spread over one interval.
    pub fn attach(engines: &[Engine], q: &mut Queue) -> Result<Shared, String> {
        let cfg = FleetConfig::default();
        let interval_us = cfg.interval.as_micros() as u64;
        let fleets = engines
            .iter()
            .enumerate()
            .map(|(i, e)| {
                e.fleet(FleetConfig {
                    instance: format!("i{i}"),
                    ..cfg.clone()
                })
                .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let n = fleets.len() as u64;
        for i in 0..n {
            q.push(i * interval_us / n, EV_SYNC, i as u32, 0);
        }
        Ok(Shared {
            fleets,
            store: MemoryStore::new(),
            interval_us,
            opened: 0,
        })
    }

    /// Instance `i`'s cycle at `now` (µs, the clock already there); schedules its next.
    pub fn sync(&mut self, i: u32, now: u64, clock: &ManualClock, q: &mut Queue) {
        let wall = clock
            .wall()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let f = &self.fleets[i as usize];
        let plan = f.plan();
        let (reads, claims) = self.store.run(&plan, wall);
        self.opened += f.complete(plan.id, &reads, &claims).opened as u64;
        q.push(now + self.interval_us, EV_SYNC, i, 0);
    }
}
