//! Bounded, sharded map from scope key to shared state.
//!
//! Scope keys come from tenants and model names, so their number is
//! attacker-influenced. Each registry tracks at most `max_keys` keys: when a
//! shard is full, idle keys go first, then the least recently used eighth of
//! the shard. An evicted key restarts fresh the next time it is seen; calls
//! that still hold its state finish against the old copy, and the old copy is
//! marked so that caches holding it know to look the key up again.
//!
//! Each key is stored once, inside its slot (inline when it is at most 23
//! bytes), and the map holds only a pointer per key: a tracked key costs its
//! state plus about 60 bytes.

use hashbrown::HashTable;
use parking_lot::RwLock;
use smol_str::SmolStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const SHARDS: usize = 16;
/// High bit of `Slot::used`: the slot was evicted from its registry.
const EVICTED: u64 = 1 << 63;

/// Slots evicted so far by every registry of the process: a cache that saw
/// the same count when it last checked its slots knows none of them was
/// evicted since, with one load.
static EVICTIONS: AtomicU64 = AtomicU64::new(0);

/// The process-wide eviction count (see [`EVICTIONS`]); read it before checking slots.
#[inline]
pub(crate) fn evictions() -> u64 {
    EVICTIONS.load(Ordering::Acquire)
}

/// One tracked key's state plus its last-use time.
#[derive(Debug)]
pub struct Slot<T> {
    /// The key.
    pub key: SmolStr,
    /// The state.
    pub value: T,
    /// Last use, ms; the high bit marks an evicted slot.
    used: AtomicU64,
}

impl<T> Slot<T> {
    /// A slot outside any registry (tests, benchmarks).
    pub fn new(key: &str, value: T, now_ms: u64) -> Self {
        Slot {
            key: SmolStr::new(key),
            value,
            used: AtomicU64::new(now_ms & !EVICTED),
        }
    }

    /// Marks the slot used at `now_ms` (relaxed: an approximate LRU is enough).
    #[inline]
    pub fn touch(&self, now_ms: u64) {
        let u = self.used.load(Ordering::Relaxed);
        if u & !EVICTED < now_ms && u & EVICTED == 0 {
            self.used.store(now_ms & !EVICTED, Ordering::Relaxed);
        }
    }

    /// True once the registry dropped this slot: a holder should look the key up again.
    #[inline]
    pub fn is_evicted(&self) -> bool {
        self.used.load(Ordering::Relaxed) & EVICTED != 0
    }

    fn last_used(&self) -> u64 {
        self.used.load(Ordering::Relaxed) & !EVICTED
    }

    fn mark_evicted(&self) {
        self.used.fetch_or(EVICTED, Ordering::Relaxed);
        // After the mark: whoever sees the new count sees the mark.
        EVICTIONS.fetch_add(1, Ordering::Release);
    }
}

type Shard<T> = RwLock<HashTable<Arc<Slot<T>>>>;

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
        let shards = (0..SHARDS)
            .map(|_| RwLock::new(HashTable::new()))
            .collect::<Vec<_>>()
            .into_boxed_slice();
        Registry {
            shards,
            hasher: ahash::RandomState::new(),
            evicted: AtomicU64::new(0),
        }
    }

    #[inline]
    fn locate(&self, key: &str) -> (u64, &Shard<T>) {
        let h = self.hasher.hash_one(key);
        (h, &self.shards[(h >> 59) as usize % SHARDS])
    }

    /// The slot for `key`, if tracked.
    pub fn get(&self, key: &str) -> Option<Arc<Slot<T>>> {
        let (h, shard) = self.locate(key);
        shard.read().find(h, |s| s.key == key).cloned()
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
        let (h, shard) = self.locate(key);
        if let Some(s) = shard.read().find(h, |s| s.key == key) {
            s.touch(now_ms);
            return s.clone();
        }
        let mut map = shard.write();
        if let Some(s) = map.find(h, |s| s.key == key) {
            return s.clone();
        }
        self.make_room(&mut map, now_ms, max_keys, idle_ms);
        let slot = Arc::new(Slot::new(key, make(), now_ms));
        map.insert_unique(h, slot.clone(), |s| self.hasher.hash_one(&*s.key));
        slot
    }

    /// Puts a new slot for `key` in place of the tracked one (which is marked
    /// evicted), e.g. when a reload changed the shape of its state.
    pub fn replace(&self, key: &str, now_ms: u64, max_keys: u32, idle_ms: u64, value: T) -> Arc<Slot<T>> {
        let (h, shard) = self.locate(key);
        let mut map = shard.write();
        if let Ok(old) = map.find_entry(h, |s| s.key == key) {
            let (old, _) = old.remove();
            old.mark_evicted();
        } else {
            self.make_room(&mut map, now_ms, max_keys, idle_ms);
        }
        let slot = Arc::new(Slot::new(key, value, now_ms));
        map.insert_unique(h, slot.clone(), |s| self.hasher.hash_one(&*s.key));
        slot
    }

    fn make_room(&self, map: &mut HashTable<Arc<Slot<T>>>, now_ms: u64, max_keys: u32, idle_ms: u64) {
        let per_shard = ((max_keys as usize) / SHARDS).max(1);
        if map.len() >= per_shard {
            let before = map.len();
            evict(map, now_ms, idle_ms, per_shard);
            self.evicted.fetch_add((before - map.len()) as u64, Ordering::Relaxed);
        }
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
            let slots: Vec<Arc<Slot<T>>> = shard.read().iter().cloned().collect();
            for s in slots {
                f(&s);
            }
        }
    }
}

/// Frees room in a full shard: idle keys first, then the least recently used eighth.
fn evict<T>(map: &mut HashTable<Arc<Slot<T>>>, now_ms: u64, idle_ms: u64, per_shard: usize) {
    map.retain(|s| {
        let keep = now_ms.saturating_sub(s.last_used()) < idle_ms;
        if !keep {
            s.mark_evicted();
        }
        keep
    });
    if map.len() < per_shard {
        return;
    }
    let mut ages: Vec<u64> = map.iter().map(|s| s.last_used()).collect();
    let n = (per_shard / 8).max(1).min(ages.len());
    let (_, cut, _) = ages.select_nth_unstable(n - 1);
    let cut = *cut;
    let mut removed = 0;
    map.retain(|s| {
        if removed < n && s.last_used() <= cut {
            removed += 1;
            s.mark_evicted();
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
        let first = r.get_or_insert("tenant-first", 0, 1_000, 1_000_000, || 0);
        for i in 0..100_000u64 {
            r.get_or_insert(&format!("tenant-{i}"), i, 1_000, 1_000_000, || 0);
        }
        assert!(r.len() <= 1_000, "{}", r.len());
        assert!(r.evicted() >= 99_000);
        assert!(first.is_evicted(), "a dropped slot is marked for its holders");
        // A recently used key survives a flood of new keys when older ones are idle.
        let r: Registry<u32> = Registry::new();
        r.get_or_insert("hot", 0, 160, 10, || 7);
        for i in 0..10_000u64 {
            r.get_or_insert("hot", 100 + i, 160, 10, || 7).touch(100 + i);
            r.get_or_insert(&format!("k{i}"), 100 + i, 160, 10, || 0);
        }
        assert_eq!(r.get("hot").map(|s| s.value), Some(7));
        assert!(!r.get("hot").unwrap().is_evicted());
    }

    #[test]
    fn same_key_same_slot_and_replace() {
        let r: Registry<u32> = Registry::new();
        let a = r.get_or_insert("a", 0, 100, 10, || 1);
        let b = r.get_or_insert("a", 1, 100, 10, || 2);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(b.value, 1);
        let c = r.replace("a", 2, 100, 10, 3);
        assert!(a.is_evicted() && !c.is_evicted());
        assert_eq!(r.get("a").map(|s| s.value), Some(3));
        assert_eq!(r.len(), 1);
        // Keys longer than the inline limit are stored too.
        let long = "a-tenant-name-longer-than-twenty-three-bytes";
        r.get_or_insert(long, 0, 100, 10, || 9);
        assert_eq!(r.get(long).map(|s| s.value), Some(9));
    }
}
