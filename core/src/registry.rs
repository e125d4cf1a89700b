//! Bounded, sharded map from scope key to shared state.
//!
//! Scope keys come from tenants and model names, so their number is
//! attacker-influenced. Each registry tracks at most `max_keys` keys: when a
//! shard is full, idle keys go first, then the least recently used eighth of
//! the shard. An evicted key restarts fresh the next time it is seen; calls
//! that still hold its state finish against the old copy.

use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const SHARDS: usize = 16;

/// One tracked key's state plus its last-use time.
#[derive(Debug)]
pub struct Slot<T> {
    /// The key.
    pub key: Arc<str>,
    /// The state.
    pub value: T,
    last_used_ms: AtomicU64,
}

impl<T> Slot<T> {
    /// Marks the slot used at `now_ms` (relaxed: an approximate LRU is enough).
    pub fn touch(&self, now_ms: u64) {
        if self.last_used_ms.load(Ordering::Relaxed) < now_ms {
            self.last_used_ms.store(now_ms, Ordering::Relaxed);
        }
    }
}

type Shard<T> = RwLock<HashMap<Arc<str>, Arc<Slot<T>>, ahash::RandomState>>;

/// A bounded map of scope key → `Arc<Slot<T>>`.
#[derive(Debug)]
pub struct Registry<T> {
    shards: Box<[Shard<T>]>,
    hasher: ahash::RandomState,
    evicted: AtomicU64,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Registry<T> {
    /// An empty registry.
    pub fn new() -> Self {
        let hasher = ahash::RandomState::new();
        let shards = (0..SHARDS)
            .map(|_| RwLock::new(HashMap::with_hasher(hasher.clone())))
            .collect::<Vec<_>>()
            .into_boxed_slice();
        Registry {
            shards,
            hasher,
            evicted: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: &str) -> &Shard<T> {
        let h = self.hasher.hash_one(key) as usize;
        &self.shards[h % SHARDS]
    }

    /// The slot for `key`, if tracked.
    pub fn get(&self, key: &str) -> Option<Arc<Slot<T>>> {
        self.shard(key).read().get(key).cloned()
    }

    /// The slot for `key`, created with `make` if absent. Keeps the registry
    /// within `max_keys` (split evenly across shards).
    pub fn get_or_insert(
        &self,
        key: &str,
        now_ms: u64,
        max_keys: u32,
        idle_ms: u64,
        make: impl FnOnce() -> T,
    ) -> Arc<Slot<T>> {
        let shard = self.shard(key);
        if let Some(s) = shard.read().get(key) {
            s.touch(now_ms);
            return s.clone();
        }
        let mut map = shard.write();
        if let Some(s) = map.get(key) {
            return s.clone();
        }
        let per_shard = ((max_keys as usize) / SHARDS).max(1);
        if map.len() >= per_shard {
            let before = map.len();
            evict(&mut map, now_ms, idle_ms, per_shard);
            self.evicted.fetch_add((before - map.len()) as u64, Ordering::Relaxed);
        }
        let k: Arc<str> = Arc::from(key);
        let slot = Arc::new(Slot {
            key: k.clone(),
            value: make(),
            last_used_ms: AtomicU64::new(now_ms),
        });
        map.insert(k, slot.clone());
        slot
    }

    /// Keys tracked now.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    /// True when no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys evicted so far.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Calls `f` on every tracked slot (for stats; takes each shard's read lock briefly).
    pub fn for_each(&self, mut f: impl FnMut(&Slot<T>)) {
        for shard in self.shards.iter() {
            let slots: Vec<Arc<Slot<T>>> = shard.read().values().cloned().collect();
            for s in slots {
                f(&s);
            }
        }
    }
}

/// Frees room in a full shard: idle keys first, then the least recently used eighth.
fn evict<T>(
    map: &mut HashMap<Arc<str>, Arc<Slot<T>>, ahash::RandomState>,
    now_ms: u64,
    idle_ms: u64,
    per_shard: usize,
) {
    map.retain(|_, s| now_ms.saturating_sub(s.last_used_ms.load(Ordering::Relaxed)) < idle_ms);
    if map.len() < per_shard {
        return;
    }
    let mut ages: Vec<u64> = map.values().map(|s| s.last_used_ms.load(Ordering::Relaxed)).collect();
    let n = (per_shard / 8).max(1).min(ages.len());
    let (_, cut, _) = ages.select_nth_unstable(n - 1);
    let cut = *cut;
    let mut removed = 0;
    map.retain(|_, s| {
        if removed < n && s.last_used_ms.load(Ordering::Relaxed) <= cut {
            removed += 1;
            false
        } else {
            true
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_cap_and_evicts_idle_first() {
        let r: Registry<u32> = Registry::new();
        for i in 0..100_000u64 {
            r.get_or_insert(&format!("tenant-{i}"), i, 1_000, 1_000_000, || 0);
        }
        assert!(r.len() <= 1_000, "{}", r.len());
        assert!(r.evicted() >= 99_000);
        // A recently used key survives a flood of new keys when older ones are idle.
        let r: Registry<u32> = Registry::new();
        r.get_or_insert("hot", 0, 160, 10, || 7);
        for i in 0..10_000u64 {
            r.get_or_insert("hot", 100 + i, 160, 10, || 7).touch(100 + i);
            r.get_or_insert(&format!("k{i}"), 100 + i, 160, 10, || 0);
        }
        assert_eq!(r.get("hot").map(|s| s.value), Some(7));
    }

    #[test]
    fn same_key_same_slot() {
        let r: Registry<u32> = Registry::new();
        let a = r.get_or_insert("a", 0, 100, 10, || 1);
        let b = r.get_or_insert("a", 1, 100, 10, || 2);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(b.value, 1);
    }
}
