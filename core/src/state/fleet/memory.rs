//! A store in memory with the semantics of [`MERGE_SCRIPT`] and
//! [`CLAIM_SCRIPT`] on a clock the caller gives (wall ms): what the
//! simulator and the core's tests run a fleet against. Not shared between
//! processes; the adapters use Redis.

use super::{Record, SyncPlan};
#[cfg(doc)]
use super::{CLAIM_SCRIPT, MERGE_SCRIPT};
use std::collections::{BTreeMap, HashMap};

/// The answers to a plan: each read key's fields, each claim's answer.
pub type Answers = (Vec<Vec<(String, String)>>, Vec<Option<String>>);

#[derive(Debug, Default)]
struct Entry {
    fields: BTreeMap<String, String>,
    value: Option<String>,
    expires: u64,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct MemoryStore {
    keys: HashMap<String, Entry>,
    /// Commands run so far (writes, reads and claims).
    pub commands: u64,
}

/// The leading number of a record or lease value (its rank).
fn rank(v: &str) -> Option<u64> {
    v.split(' ').next()?.parse().ok()
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore::default()
    }

    fn live(&mut self, key: &str, now: u64) -> Option<&mut Entry> {
        if self.keys.get(key).is_some_and(|e| e.expires <= now) {
            self.keys.remove(key);
        }
        self.keys.get_mut(key)
    }

    /// Runs a plan at wall time `now` (ms), as an adapter runs it on Redis.
    pub fn run(&mut self, plan: &SyncPlan, now: u64) -> Answers {
        for w in &plan.writes {
            self.commands += 1;
            let e = match self.live(&w.key, now) {
                Some(e) => e,
                None => self.keys.entry(w.key.clone()).or_default(),
            };
            let keep = e.fields.get(&w.field).is_some_and(|cur| {
                let (a, b) = (rank(cur), rank(&w.value));
                a > b || (a == b && cur.as_str() >= w.value.as_str())
            });
            if keep {
                continue;
            }
            e.fields.insert(w.field.clone(), w.value.clone());
            e.expires = e.expires.max(now + w.ttl_ms);
        }
        let reads = plan
            .reads
            .iter()
            .map(|k| {
                self.commands += 1;
                self.live(k, now).map_or_else(Vec::new, |e| {
                    e.fields.iter().map(|(a, b)| (a.clone(), b.clone())).collect()
                })
            })
            .collect();
        let claims = plan
            .claims
            .iter()
            .map(|c| {
                self.commands += 1;
                if let Some(cur) = self.live(&c.key, now).and_then(|e| e.value.clone()) {
                    let end = cur.rsplit_once(' ').and_then(|(_, e)| e.parse::<u64>().ok());
                    if end.is_some_and(|e| e > c.now_ms) {
                        return Some(cur);
                    }
                }
                self.keys.insert(
                    c.key.clone(),
                    Entry {
                        value: Some(c.value.clone()),
                        expires: now + c.ttl_ms,
                        ..Entry::default()
                    },
                );
                None
            })
            .collect();
        (reads, claims)
    }

    /// The records stored under `key` at `now` (for tests and inspection).
    pub fn records(&mut self, key: &str, now: u64) -> BTreeMap<String, Record> {
        self.live(key, now).map_or_else(BTreeMap::new, |e| {
            e.fields
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), Record::decode(v)?)))
                .collect()
        })
    }

    /// Forgets everything (a store restarted without persistence).
    pub fn flush(&mut self) {
        self.keys.clear();
    }
}
