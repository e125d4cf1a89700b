//! [`EventBus`]: where records go — each thread's ring (`ring/`), the
//! shared ring for everything else, and the sinks — and how a snapshot or
//! a drain merges the rings back into events in time order.

use super::ring::ThreadRing;
use super::{Event, Extra, Hot, Rec, Sink};
use crate::id::CallId;
use parking_lot::{Mutex, RwLock};
use smol_str::SmolStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The shared ring's records: a circular buffer that overwrites its oldest
/// record in place once full (no allocation after it filled up).
#[derive(Debug, Default)]
struct Ring {
    buf: Vec<Rec>,
    /// Index of the oldest record once `buf` is full.
    head: usize,
    seq: u64,
    dropped: u64,
}

impl Ring {
    fn push(&mut self, rec: Rec, cap: usize) {
        if self.buf.len() < cap {
            if self.head != 0 {
                // The ring grew (a reload raised the cap): put it back in order first.
                self.buf = self.take();
            }
            self.buf.push(rec);
        } else if !self.buf.is_empty() {
            let i = self.head % self.buf.len();
            self.dropped += self.buf[i].events();
            self.buf[i] = rec;
            self.head = (i + 1) % self.buf.len();
        }
    }

    fn held(&self) -> u64 {
        self.buf.iter().map(Rec::events).sum()
    }

    /// Records oldest first.
    fn iter(&self) -> impl Iterator<Item = &Rec> {
        let h = if self.buf.is_empty() {
            0
        } else {
            self.head % self.buf.len()
        };
        self.buf[h..].iter().chain(self.buf[..h].iter())
    }

    fn take(&mut self) -> Vec<Rec> {
        let h = if self.buf.is_empty() {
            0
        } else {
            self.head % self.buf.len()
        };
        let mut v = std::mem::take(&mut self.buf);
        v.rotate_left(h);
        self.head = 0;
        v
    }

    /// Keeps the newest `n` records.
    fn keep_newest(&mut self, n: usize) {
        if self.buf.len() > n {
            let mut v = self.take();
            let excess = v.len() - n;
            self.dropped += v.drain(..excess).map(|r| r.events()).sum::<u64>();
            self.buf = v;
        }
    }
}

/// Ring buffers + sinks.
pub(crate) struct EventBus {
    /// Records of calls used off their thread, reloads, mode changes, and
    /// the records of thread rings that were retired.
    shared: Mutex<Ring>,
    /// The rings of threads that run calls.
    rings: Mutex<Vec<Arc<ThreadRing>>>,
    next_ring: AtomicU64,
    cap: AtomicU64,
    /// Events a drain left out because the rings together held more than `cap`.
    hidden: AtomicU64,
    names: RwLock<Vec<Arc<str>>>,
    sinks: RwLock<Vec<(u64, Sink)>>,
    next_sink: AtomicU64,
    sink_panics: AtomicU64,
    active: AtomicBool,
    has_sinks: AtomicBool,
}

impl std::fmt::Debug for EventBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventBus")
            .field("cap", &self.cap)
            .field("dropped", &self.dropped())
            .finish()
    }
}

/// Policy version names kept for events at most; later ones share the last index.
const MAX_NAMES: usize = 4096;

impl EventBus {
    /// A bus keeping at most `cap` events.
    pub(crate) fn new(cap: u32) -> Self {
        EventBus {
            shared: Mutex::new(Ring::default()),
            rings: Mutex::new(Vec::new()),
            next_ring: AtomicU64::new(1),
            cap: AtomicU64::new(cap as u64),
            hidden: AtomicU64::new(0),
            names: RwLock::new(Vec::new()),
            sinks: RwLock::new(Vec::new()),
            next_sink: AtomicU64::new(1),
            sink_panics: AtomicU64::new(0),
            active: AtomicBool::new(cap > 0),
            has_sinks: AtomicBool::new(false),
        }
    }

    /// True when anyone will see events (skip building them otherwise).
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    fn refresh_active(&self) {
        let sinks = !self.sinks.read().is_empty();
        self.has_sinks.store(sinks, Ordering::Relaxed);
        self.active
            .store(self.cap.load(Ordering::Relaxed) > 0 || sinks, Ordering::Relaxed);
    }

    /// The index events use for the policy version `name`.
    pub(crate) fn version_index(&self, name: &str) -> u32 {
        if let Some(i) = self.names.read().iter().position(|n| &**n == name) {
            return i as u32;
        }
        let mut names = self.names.write();
        if let Some(i) = names.iter().position(|n| &**n == name) {
            return i as u32;
        }
        if names.len() >= MAX_NAMES {
            let last = names.len() - 1;
            names[last] = Arc::from(name);
            return last as u32;
        }
        names.push(Arc::from(name));
        (names.len() - 1) as u32
    }

    /// Changes the ring size (on reload); excess old events are dropped and
    /// counted. Threads' rings take the new size when their calls move to the
    /// new policy version.
    pub(crate) fn set_capacity(&self, cap: u32) {
        self.cap.store(cap as u64, Ordering::Relaxed);
        self.shared.lock().keep_newest(cap as usize);
        self.refresh_active();
    }

    /// A ring for the current thread, when the bus keeps events.
    pub(crate) fn new_ring(&self) -> Option<Arc<ThreadRing>> {
        let cap = self.cap.load(Ordering::Relaxed) as usize;
        if cap == 0 {
            return None;
        }
        let id = self.next_ring.fetch_add(1, Ordering::Relaxed) as u32;
        let ring = Arc::new(ThreadRing::new(id, cap));
        self.rings.lock().push(ring.clone());
        Some(ring)
    }

    /// A thread stops writing `ring`: its records move to the shared ring.
    pub(crate) fn retire_ring(&self, ring: &Arc<ThreadRing>) {
        let mut recs = Vec::new();
        ring.read(true, &mut recs);
        let dropped = ring.dropped();
        self.rings.lock().retain(|r| !Arc::ptr_eq(r, ring));
        let cap = self.cap.load(Ordering::Relaxed) as usize;
        let mut sh = self.shared.lock();
        sh.dropped += dropped;
        for r in recs {
            sh.push(r, cap);
        }
    }

    /// Registers a sink; returns its id for [`EventBus::remove_sink`].
    pub(crate) fn add_sink(&self, sink: Sink) -> u64 {
        let id = self.next_sink.fetch_add(1, Ordering::Relaxed);
        self.sinks.write().push((id, sink));
        self.refresh_active();
        id
    }

    /// Removes a sink; true when it existed.
    pub(crate) fn remove_sink(&self, id: u64) -> bool {
        let mut s = self.sinks.write();
        let before = s.len();
        s.retain(|(i, _)| *i != id);
        let removed = s.len() != before;
        drop(s);
        self.refresh_active();
        removed
    }

    /// Publishes a full event (reloads, mode changes) through the shared ring.
    pub(crate) fn emit(&self, ev: Event) {
        let mut rec = Rec::new(
            ev.kind,
            ev.at_ms.saturating_mul(1_000_000),
            self.version_index(&ev.policy_version),
        );
        rec.id = ev
            .logical_request_id
            .as_deref()
            .map(|i| CallId::Remote(SmolStr::new(i)));
        rec.upstream = ev.upstream.as_deref().map(SmolStr::new);
        rec.tenant = ev.tenant.as_deref().map(SmolStr::new);
        rec.task = ev.task.as_deref().map(SmolStr::new);
        rec.attempt = ev.attempt;
        rec.attempt_id = ev.attempt_id.as_ref().map(|a| a.attempt);
        rec.parent_attempt = ev.parent_attempt_id.as_ref().map(|a| a.attempt);
        rec.resend_count = ev.resend_count;
        rec.status = ev.status;
        rec.error_class = ev.error_class;
        rec.reason = ev.reason;
        rec.action = ev.action;
        rec.wait_source = ev.wait_source;
        rec.phase = ev.phase;
        rec.error_kind = ev.error_kind;
        rec.hedge = ev.hedge;
        rec.delay_ms = ev.delay_ms;
        rec.remaining_ms = ev.remaining_ms;
        if !ev.headers.is_empty() || ev.breaker.is_some() || ev.detail.is_some() || !ev.excluded.is_empty() {
            rec.extra = Some(Box::new(Extra {
                headers: ev.headers,
                breaker: ev.breaker,
                detail: ev.detail,
                excluded: ev.excluded,
            }));
        }
        self.write(None, &mut rec);
    }

    /// Publishes a record: into `ring` (the calling thread's own, lock-free)
    /// or else the shared ring, then to the sinks (outside any engine lock; a
    /// panicking sink is counted and does not disturb the decision). Returns
    /// the record's index in `ring` when a following decision may fold into
    /// it (nobody has seen it yet: no sink).
    #[inline]
    pub(crate) fn write(&self, ring: Option<&ThreadRing>, rec: &mut Rec) -> Option<u64> {
        let cap = self.cap.load(Ordering::Relaxed) as usize;
        let at = match ring.filter(|_| cap > 0) {
            Some(ring) => Some(ring.push(rec)),
            None => {
                self.write_shared(rec, cap);
                None
            }
        };
        if self.has_sinks.load(Ordering::Relaxed) {
            self.to_sinks(std::slice::from_ref(rec));
            return None;
        }
        at
    }

    /// Publishes an attempt's start or end like [`EventBus::write`]; encoded
    /// straight into the thread's ring when nothing else needs a record.
    #[inline(always)]
    pub(crate) fn write_hot(&self, ring: Option<&ThreadRing>, h: &Hot) -> Option<u64> {
        if let Some(ring) = ring {
            if self.ring_only() {
                return Some(ring.push_hot(h));
            }
        }
        self.write_hot_rec(ring, h)
    }

    /// [`EventBus::write_hot`] when a record is needed (sinks, or the shared ring).
    #[cold]
    #[inline(never)]
    fn write_hot_rec(&self, ring: Option<&ThreadRing>, h: &Hot) -> Option<u64> {
        self.write(ring, &mut h.to_rec())
    }

    /// True when events are kept and no sink needs a record: a thread's
    /// ring then takes attempt events encoded (and changed) in place.
    #[inline(always)]
    pub(crate) fn ring_only(&self) -> bool {
        self.cap.load(Ordering::Relaxed) > 0 && !self.has_sinks.load(Ordering::Relaxed)
    }

    #[cold]
    fn write_shared(&self, rec: &mut Rec, cap: usize) {
        let mut r = self.shared.lock();
        rec.seq = r.seq + 1;
        r.seq += rec.events();
        if cap > 0 {
            r.push(rec.clone(), cap);
        }
    }

    #[cold]
    fn to_sinks(&self, batch: &[Rec]) {
        let list: Vec<Sink> = self.sinks.read().iter().map(|(_, f)| f.clone()).collect();
        let names = self.names.read().clone();
        let mut events = Vec::with_capacity(batch.len() + 1);
        for rec in batch.iter() {
            rec.push_events(&names, &mut events);
        }
        for ev in &events {
            for f in &list {
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(ev))).is_err() {
                    self.sink_panics.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Every ring's events merged oldest first (time, then ring, then
    /// recording order), newest `cap` kept.
    fn merged(&self, take: bool) -> Vec<Event> {
        let cap = self.cap.load(Ordering::Relaxed) as usize;
        let names = self.names.read().clone();
        let mut all: Vec<(u64, u32, u64, Event)> = Vec::new();
        let mut out = Vec::new();
        let mut add = |src: u32, recs: &[Rec]| {
            for rec in recs {
                out.clear();
                rec.push_events(&names, &mut out);
                all.extend(out.drain(..).map(|e| (rec.at_ns, src, e.seq, e)));
            }
        };
        {
            let mut r = self.shared.lock();
            let recs: Vec<Rec> = if take { r.take() } else { r.iter().cloned().collect() };
            drop(r);
            add(0, &recs);
        }
        let rings: Vec<Arc<ThreadRing>> = self.rings.lock().clone();
        for ring in &rings {
            let mut recs = Vec::new();
            ring.read(take, &mut recs);
            add(ring.id, &recs);
        }
        all.sort_by_key(|(at, src, seq, _)| (*at, *src, *seq));
        let excess = all.len().saturating_sub(cap);
        if take && excess > 0 {
            self.hidden.fetch_add(excess as u64, Ordering::Relaxed);
        }
        all.drain(..excess);
        all.into_iter().map(|(_, _, _, e)| e).collect()
    }

    /// A copy of the ring, oldest first.
    pub(crate) fn snapshot(&self) -> Vec<Event> {
        self.merged(false)
    }

    /// Takes every event out of the ring, oldest first.
    pub(crate) fn drain(&self) -> Vec<Event> {
        self.merged(true)
    }

    /// Events dropped from the ring so far.
    pub(crate) fn dropped(&self) -> u64 {
        let (mut dropped, mut held) = {
            let r = self.shared.lock();
            (r.dropped, r.held())
        };
        for ring in self.rings.lock().iter() {
            let (d, h) = ring.counts();
            dropped += d;
            held += h;
        }
        let cap = self.cap.load(Ordering::Relaxed);
        // Held beyond the cap: a snapshot would not show them, so they count as dropped.
        dropped + self.hidden.load(Ordering::Relaxed) + held.saturating_sub(cap)
    }

    /// Sink calls that panicked.
    pub(crate) fn sink_panics(&self) -> u64 {
        self.sink_panics.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::EventKind;

    fn ev(at_ms: u64) -> Event {
        Event::new(EventKind::Decision, at_ms, Arc::from("v"))
    }

    #[test]
    fn ring_is_bounded_and_counts_drops() {
        let bus = EventBus::new(3);
        for i in 0..10 {
            bus.emit(ev(i));
        }
        let evs = bus.snapshot();
        assert_eq!(evs.len(), 3);
        assert_eq!(evs.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![8, 9, 10]);
        assert_eq!(bus.dropped(), 7);
        bus.set_capacity(1);
        assert_eq!(bus.snapshot().len(), 1);
        assert_eq!(bus.dropped(), 9);
    }

    #[test]
    fn thread_rings_and_the_shared_ring_merge_in_time_order_within_the_cap() {
        let bus = EventBus::new(4);
        let r1 = bus.new_ring().unwrap();
        let r2 = bus.new_ring().unwrap();
        let rec = |at: u64| Rec::new(EventKind::AttemptStart, at * 1_000_000, 0);
        for (ring, at) in [
            (Some(&r1), 1),
            (Some(&r2), 2),
            (None, 3),
            (Some(&r1), 4),
            (Some(&r2), 5),
            (Some(&r1), 6),
        ] {
            bus.write(ring.map(|r| &**r), &mut rec(at));
        }
        let at: Vec<u64> = bus.snapshot().iter().map(|e| e.at_ms).collect();
        assert_eq!(at, vec![3, 4, 5, 6]);
        assert_eq!(bus.dropped(), 2);
        // A retired ring's records stay visible, now in the shared ring.
        bus.retire_ring(&r2);
        assert_eq!(
            bus.snapshot().iter().map(|e| e.at_ms).collect::<Vec<_>>(),
            vec![3, 4, 5, 6]
        );
        assert_eq!(bus.drain().len(), 4);
        assert!(bus.snapshot().is_empty());
        assert_eq!(bus.dropped(), 2);
        let v = bus.version_index("v");
        assert_eq!(bus.version_index("w"), v + 1);
        assert_eq!(bus.version_index("v"), v);
    }

    #[test]
    fn sinks_receive_and_panics_are_contained() {
        let bus = EventBus::new(0);
        assert!(!bus.active());
        let seen = Arc::new(AtomicU64::new(0));
        let s2 = seen.clone();
        let id = bus.add_sink(Arc::new(move |_e: &Event| {
            s2.fetch_add(1, Ordering::Relaxed);
        }));
        bus.add_sink(Arc::new(|_e: &Event| panic!("sink bug")));
        assert!(bus.active());
        bus.emit(ev(0));
        assert_eq!(seen.load(Ordering::Relaxed), 1);
        assert_eq!(bus.sink_panics(), 1);
        assert!(bus.remove_sink(id));
        assert!(!bus.remove_sink(id));
    }
}
