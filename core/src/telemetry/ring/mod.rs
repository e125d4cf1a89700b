//! One thread's event ring: written only by its thread, with plain stores —
//! no lock and no read-modify-write, which would stall behind the record's
//! own stores — and read by anyone.
//!
//! Each slot is a small seqlock: the writer marks it busy, stores the
//! record's words and marks it done with the record's index and a count of
//! its writes; a reader that sees the mark change while copying retries,
//! and skips a slot the writer has already moved past. A record that does
//! not fit the fixed words (a name longer than 23 bytes, response headers,
//! a detail, an exclusion list) is kept whole in a side list under a lock:
//! the rare case.
//!
//! The usual attempt costs one slot: its end (and the decision right after
//! it) is written into its start record while that is still the ring's
//! newest, and read back as separate events. A change in place is plain
//! stores too: a drain never takes the ring's newest record whole while
//! its owner may still write into it (an attempt's start, or an end
//! without its decision). It takes the events that record holds so far
//! and remembers how many, so the next drain takes only the ones added
//! since: every event is drained exactly once, and no write needs a
//! locked instruction to order it against a drain.

mod codec;

use crate::id::CallId;
use crate::sync::{fence, AtomicU64, Mutex};
use crate::telemetry::{EventKind, Hot, Rec, Then};
use crate::types::{ErrorClass, ErrorKind, Phase, Reason};
use codec::*;
pub(crate) use codec::{pack, plain_names, End, Packed, Start};
use smol_str::SmolStr;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

struct Slot {
    /// The record's index (high bits), how many times it was written (bits
    /// 1..8, from 1) and, in bit 0, whether a write is under way: it changes
    /// on every write, so a reader never mistakes a changed record for the
    /// one it began to copy.
    ver: AtomicU64,
    w: [AtomicU64; W],
}

impl Slot {
    #[inline(always)]
    fn store(&self, words: &[u64; W]) {
        for (a, v) in self.w.iter().zip(words) {
            a.store(*v, Ordering::Relaxed);
        }
    }
}

/// See the module documentation.
pub(crate) struct ThreadRing {
    /// Distinguishes rings when events are merged in time order.
    pub(crate) id: u32,
    cap: usize,
    /// Records written so far (the next record's index).
    head: AtomicU64,
    /// Sequence number of the last event written (owner only).
    seq: AtomicU64,
    /// Events whose record (or change in place) is published: counted after
    /// it, so a reader that sees the count sees them (owner only writes).
    published: AtomicU64,
    /// Events drains took: counted before a drain moves its floor.
    delivered: AtomicU64,
    /// The highest count of dropped events reported: the count is a counter
    /// (Prometheus), so it never goes back.
    dropped_seen: AtomicU64,
    /// Slot of the next record, `head mod cap` kept without a division (owner only).
    next_slot: AtomicU64,
    /// What drains have taken: every record below `floor >> 2`, and the
    /// first `floor & 3` events of that record (the newest when it was
    /// drained, which its owner could still write into).
    floor: AtomicU64,
    /// One drain at a time: each takes from where the last one stopped.
    draining: Mutex<()>,
    slots: OnceLock<Box<[Slot]>>,
    spill: Mutex<VecDeque<(u64, Rec)>>,
}

impl std::fmt::Debug for ThreadRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadRing")
            .field("id", &self.id)
            .field("cap", &self.cap)
            .finish()
    }
}

impl ThreadRing {
    /// A ring of `cap` records; only the thread that asked for it may push (the caller ensures it).
    pub(crate) fn new(id: u32, cap: usize) -> Self {
        ThreadRing {
            id,
            cap: cap.max(1),
            head: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            published: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            dropped_seen: AtomicU64::new(0),
            next_slot: AtomicU64::new(0),
            floor: AtomicU64::new(0),
            draining: Mutex::new(()),
            slots: OnceLock::new(),
            spill: Mutex::new(VecDeque::new()),
        }
    }

    fn slots(&self) -> &[Slot] {
        self.slots.get_or_init(|| {
            (0..self.cap)
                .map(|_| Slot {
                    ver: AtomicU64::new(0),
                    w: std::array::from_fn(|_| AtomicU64::new(0)),
                })
                .collect()
        })
    }

    /// Appends `rec` (numbering its events) and returns its index. Only the owner thread may call this.
    #[inline]
    pub(crate) fn push(&self, rec: &mut Rec) -> u64 {
        self.append(rec.events(), |seq, i, slot| {
            rec.seq = seq;
            match encode(rec) {
                Some(words) => slot.store(&words),
                None => self.spill(i, slot, rec.clone()),
            }
        })
    }

    /// Appends an attempt's start or end (one event) and returns its index. Only the owner thread may call this.
    #[inline(always)]
    pub(crate) fn push_hot(&self, h: &Hot) -> u64 {
        self.append(1, |seq, i, slot| match store_hot(slot, h, seq) {
            Some(()) => {}
            None => {
                let mut rec = h.to_rec();
                rec.seq = seq;
                self.spill(i, slot, rec);
            }
        })
    }

    /// Appends attempt start `s` (one event) when every name in it fits a
    /// slot, and returns its index; `None`, writing nothing, when one does
    /// not (the caller then records it through [`ThreadRing::push_hot`]).
    /// Writes what [`store_hot`] writes for the same start. Only the owner thread may call this.
    #[inline(always)]
    pub(crate) fn push_start(&self, s: &Start<'_>) -> Option<u64> {
        let (id_len, prefix, id) = match s.id {
            CallId::Local { prefix, seq } => (LOCAL_ID, *prefix, [*seq, 0, 0]),
            CallId::Remote(r) => {
                let (len, w) = pack(r)?;
                (len, 0, w)
            }
        };
        let (up_len, up) = s.up?;
        let name = |n: Option<&SmolStr>| match n {
            None => Some((NONE, [0; 3])),
            Some(n) => pack(n),
        };
        let (tenant_len, tenant) = name(s.tenant)?;
        let (task_len, task) = name(s.task)?;
        let n = s.attempt;
        Some(self.append(1, |seq, _, slot| {
            let put = |at: usize, v: u64| slot.w[at].store(v, Ordering::Relaxed);
            // Names: only the words a reader looks at (see `put_names`).
            let words = |at: usize, len: u8, w: [u64; 3]| {
                if len != NONE {
                    for (i, v) in w.iter().enumerate().take((len as usize).div_ceil(8)) {
                        put(at + i, *v);
                    }
                }
            };
            if id_len == LOCAL_ID {
                put(10, id[0]);
            } else {
                words(10, id_len, id);
            }
            words(13, up_len, up);
            words(16, tenant_len, tenant);
            words(19, task_len, task);
            put(9, names_word(id_len, up_len, tenant_len, task_len, prefix));
            put(0, s.at_ns);
            put(1, seq);
            put(2, start_word(s.hedge, n, s.version));
            put(3, n as u64);
            put(4, 0);
            put(5, 0);
            put(6, s.remaining_ms);
        }))
    }

    /// [`ThreadRing::push_start`] for the usual start: an id made here, no
    /// tenant or task, and the names' word (`w9`, see [`plain_names`]) and
    /// the upstream's packed name computed once. Writes the same words.
    /// Only the owner thread may call this.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push_plain_start(
        &self,
        w9: u64,
        up: &Packed,
        id_seq: u64,
        at_ns: u64,
        version: u32,
        attempt: u32,
        remaining_ms: u64,
    ) -> u64 {
        let w2 = start_word(false, attempt, version);
        let (up_len, up) = up;
        self.append(1, |seq, _, slot| {
            let put = |at: usize, v: u64| slot.w[at].store(v, Ordering::Relaxed);
            put(0, at_ns);
            put(1, seq);
            put(2, w2);
            put(3, attempt as u64);
            put(4, 0);
            put(5, 0);
            put(6, remaining_ms);
            put(9, w9);
            put(10, id_seq);
            put(13, up[0]);
            if *up_len > 8 {
                put(14, up[1]);
                if *up_len > 16 {
                    put(15, up[2]);
                }
            }
        })
    }

    /// Claims the next slot for a record of `events` events and has `write`
    /// fill it (given the record's first sequence number and index) inside
    /// the slot's seqlock.
    #[inline(always)]
    fn append(&self, events: u64, write: impl FnOnce(u64, u64, &Slot)) -> u64 {
        let i = self.head.load(Ordering::Relaxed);
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq + events, Ordering::Relaxed);
        let slots = self.slots();
        let k = self.next_slot.load(Ordering::Relaxed) as usize;
        self.next_slot
            .store(if k + 1 >= self.cap { 0 } else { k as u64 + 1 }, Ordering::Relaxed);
        let Some(slot) = slots.get(k) else { return i };
        slot.ver.store(i << 8 | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        write(seq + 1, i, slot);
        slot.ver.store(written(i), Ordering::Release);
        self.head.store(i + 1, Ordering::Release);
        self.publish(events);
        i
    }

    /// Keeps record `i` whole in the side list; its slot says so.
    #[cold]
    fn spill(&self, i: u64, slot: &Slot, rec: Rec) {
        slot.w[0].store(SPILLED, Ordering::Relaxed);
        slot.w[4].store(if rec.then.is_some() { THEN } else { 0 }, Ordering::Relaxed);
        let mut s = self.spill.lock();
        let low = (i + 1).saturating_sub(self.cap as u64);
        while s.front().is_some_and(|(j, _)| *j < low) {
            s.pop_front();
        }
        s.push_back((i, rec));
    }

    /// The slot of record `index` when it is still the newest record. Only the owner thread may call this.
    #[inline(always)]
    fn newest(&self, index: u64) -> Option<&Slot> {
        if self.head.load(Ordering::Relaxed) != index + 1 {
            return None;
        }
        let k = match self.next_slot.load(Ordering::Relaxed) as usize {
            0 => self.cap - 1,
            k => k - 1,
        };
        self.slots.get()?.get(k)
    }

    /// Marks a slot busy for a change in place; returns its version, which
    /// [`done`] then advances. A drain takes what the record held before
    /// or after the change, never a mix, and never loses the change (see
    /// the module documentation).
    #[inline(always)]
    fn reopen(slot: &Slot) -> u64 {
        let v = slot.ver.load(Ordering::Relaxed);
        slot.ver.store(v | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        v
    }

    /// Adds `then` to record `index` when it is still the newest record, has
    /// none and was not drained (one record, two events). Only the owner thread may call this.
    #[inline]
    pub(crate) fn fold(&self, index: u64, then: Then) -> bool {
        let Some(slot) = self.newest(index) else { return false };
        let w4 = slot.w[4].load(Ordering::Relaxed);
        if slot.w[0].load(Ordering::Relaxed) == SPILLED || w4 & THEN != 0 {
            return false;
        }
        let v = Self::reopen(slot);
        slot.w[4].store(w4 | then_bits(then), Ordering::Relaxed);
        slot.w[7].store(then.delay_ms, Ordering::Relaxed);
        slot.w[8].store(then.remaining_ms, Ordering::Relaxed);
        slot.ver.store(v + 2, Ordering::Release);
        self.seq.store(self.seq.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        self.publish(1);
        true
    }

    /// Writes attempt `end` (and, with `then`, the decision right after it)
    /// into record `index`, the attempt's start, when that is still the newest
    /// record and was not drained: the usual attempt costs one slot, decoded
    /// as its two or three events. Only the owner thread may call this.
    #[cfg(test)]
    pub(crate) fn end_in_place(&self, index: u64, end: &Hot, then: Option<Then>) -> bool {
        end.kind == EventKind::AttemptEnd && self.end_at(index, end.end(), then)
    }

    /// [`ThreadRing::end_in_place`] for an end given as its fields.
    #[inline(always)]
    pub(crate) fn end_at(&self, index: u64, end: End, then: Option<Then>) -> bool {
        let Some(slot) = self.newest(index) else { return false };
        let (w2, w4) = (slot.w[2].load(Ordering::Relaxed), slot.w[4].load(Ordering::Relaxed));
        let kind = w2 & 0xff;
        let start = kind == kind_code(EventKind::AttemptStart) || kind == kind_code(EventKind::Hedge);
        // The end must be what the start record can carry: same hedge flag and remaining time.
        if !start
            || slot.w[0].load(Ordering::Relaxed) == SPILLED
            || w4 & (THEN | END) != 0
            || (w2 >> 8 & 1 == 1) != end.hedge
            || slot.w[6].load(Ordering::Relaxed) != end.remaining_ms
        {
            return false;
        }
        let v = Self::reopen(slot);
        let w3 = slot.w[3].load(Ordering::Relaxed);
        slot.w[2].store(w2 | (end.status.unwrap_or(0) as u64) << 48, Ordering::Relaxed);
        slot.w[3].store(
            w3 | code(end.error_class, ErrorClass::code) << 32 | code(end.reason, Reason::code) << 40,
            Ordering::Relaxed,
        );
        let mut w4 = w4
            | code(end.phase, Phase::code)
            | code(end.error_kind, ErrorKind::code) << 8
            | END
            | if end.status.is_some() { END_STATUS } else { 0 };
        if let Some(t) = then {
            w4 |= then_bits(t);
            slot.w[7].store(t.delay_ms, Ordering::Relaxed);
            slot.w[8].store(t.remaining_ms, Ordering::Relaxed);
        }
        slot.w[4].store(w4, Ordering::Relaxed);
        slot.w[5].store(end.delay_ms, Ordering::Relaxed);
        slot.w[22].store(end.at_ns, Ordering::Relaxed);
        slot.ver.store(v + 2, Ordering::Release);
        self.seq.store(
            self.seq.load(Ordering::Relaxed) + 1 + then.is_some() as u64,
            Ordering::Relaxed,
        );
        self.publish(1 + then.is_some() as u64);
        true
    }

    /// The records still held, oldest first; `take` marks them as drained.
    pub(crate) fn read(&self, take: bool, out: &mut Vec<Rec>) {
        let _one_drain = take.then(|| self.draining.lock());
        let base = out.len();
        let h = self.head.load(Ordering::Acquire);
        let floor = self.floor.load(Ordering::Acquire);
        let start = h.saturating_sub(self.cap as u64).max(floor >> 2);
        // Where this drain stops: past every record, or inside the newest.
        let mut next_floor = h << 2;
        let Some(slots) = self.slots.get() else { return };
        for i in start..h {
            let slot = &slots[(i % self.cap as u64) as usize];
            let mut spins = 0u32;
            loop {
                let v1 = slot.ver.load(Ordering::Acquire);
                if v1 >> 8 != i {
                    // Already replaced by a newer record: skip it.
                    break;
                }
                if v1 & 1 == 1 {
                    // Its owner is writing it (a few stores): wait, never skip it.
                    spins += 1;
                    if spins < 64 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                    continue;
                }
                let mut w = [0u64; W];
                for (x, a) in w.iter_mut().zip(slot.w.iter()) {
                    *x = a.load(Ordering::Relaxed);
                }
                fence(Ordering::Acquire);
                if slot.ver.load(Ordering::Relaxed) != v1 {
                    continue;
                }
                let from = out.len();
                if w[0] == SPILLED {
                    if let Some((_, r)) = self.spill.lock().iter().find(|(j, _)| *j == i) {
                        out.push(r.clone());
                    }
                } else {
                    decode_slot(&w, out);
                }
                if i == floor >> 2 {
                    skip_events(out, from, floor & 3);
                }
                if i + 1 == h && may_change(&w) {
                    next_floor = i << 2 | events_in(&w);
                }
                break;
            }
        }
        if take {
            // Counted as taken before they leave the held window (see `counts`).
            let taken: u64 = out[base..].iter().map(Rec::events).sum();
            self.delivered.fetch_add(taken, Ordering::Release);
            self.floor.store(next_floor, Ordering::Release);
        }
    }

    /// Counts `events` as published (owner only, after the stores that publish them).
    #[inline(always)]
    fn publish(&self, events: u64) {
        self.published
            .store(self.published.load(Ordering::Relaxed) + events, Ordering::Release);
    }

    /// Events overwritten before a drain took them (see [`ThreadRing::counts`]).
    pub(crate) fn dropped(&self) -> u64 {
        self.counts().0
    }

    /// `(dropped, held)`: events overwritten before a drain took them, and
    /// events held now (not drained, not overwritten). Dropped events are
    /// counted from the events published, held and taken, off the writer's
    /// path. Read in that order, between drains (a drain under way holds
    /// copies it has not counted as taken yet, whose slots may already be
    /// overwritten), an event written meanwhile can only be counted twice,
    /// never missed, so the count is at most the true one and exact while
    /// nothing writes the ring; the highest count reported is kept, so it
    /// never goes back.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let _between_drains = self.draining.lock();
        let published = self.published.load(Ordering::Acquire);
        let mut v = Vec::new();
        self.read(false, &mut v);
        let held: u64 = v.iter().map(Rec::events).sum();
        let taken = self.delivered.load(Ordering::Acquire);
        let dropped = published.saturating_sub(held + taken);
        let seen = self.dropped_seen.fetch_max(dropped, Ordering::Relaxed);
        (seen.max(dropped), held)
    }
}

#[cfg(test)]
mod tests;
