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

use crate::id::CallId;
use crate::sync::{fence, AtomicU64, Mutex};
use crate::telemetry::{EventKind, Hot, Rec, Then};
use crate::types::{Action, ErrorClass, ErrorKind, Phase, Reason, WaitSource};
use smol_str::SmolStr;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

/// Words per record.
const W: usize = 23;
const NONE: u8 = 0xff;
/// Length mark of a call id made here (`prefix` and `seq` stored as numbers).
const LOCAL_ID: u8 = 0xfe;
/// Word 4 bits: a decision folded in (`then`), an attempt's end written into
/// its start record (`END`, its time in word 22), and that end's status is set.
const THEN: u64 = 1 << 48;
const END: u64 = 1 << 49;
const END_STATUS: u64 = 1 << 50;

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

#[inline(always)]
fn code<T: Copy>(v: Option<T>, f: impl Fn(T) -> u8) -> u64 {
    v.map_or(0, |x| f(x) as u64 + 1)
}

fn decode<T>(c: u64, f: impl Fn(u8) -> Option<T>) -> Option<T> {
    match c & 0xff {
        0 => None,
        n => f((n - 1) as u8),
    }
}

#[inline(always)]
fn kind_code(k: EventKind) -> u64 {
    EventKind::ALL.iter().position(|x| *x == k).unwrap_or(0) as u64
}

/// Word 4's bits for a folded decision.
#[inline(always)]
fn then_bits(t: Then) -> u64 {
    code(Some(t.action), Action::code) << 16
        | code(Some(t.reason), Reason::code) << 24
        | code(t.error_class, ErrorClass::code) << 32
        | code(Some(t.wait_source), WaitSource::code) << 40
        | THEN
}

/// A name as a slot stores it: its length byte and three words.
pub(crate) type Packed = (u8, [u64; 3]);

/// Word 9 of a record: the lengths of its id, upstream, tenant and task
/// names ([`NONE`] when absent, [`LOCAL_ID`] for an id made here) and the
/// prefix of an id made here.
#[inline(always)]
fn names_word(id_len: u8, up_len: u8, tenant_len: u8, task_len: u8, prefix: u32) -> u64 {
    id_len as u64 | (up_len as u64) << 8 | (tenant_len as u64) << 16 | (task_len as u64) << 24 | (prefix as u64) << 32
}

/// Word 2 of a start record (a hedge's when `hedge`) of attempt `attempt`
/// under policy version `version`: its kind, flags and version.
#[inline(always)]
fn start_word(hedge: bool, attempt: u32, version: u32) -> u64 {
    let flags = hedge as u64 | 1 << 1 | 1 << 2 | ((attempt > 1) as u64) << 3 | 1 << 4 | 1 << 7;
    let kind = if hedge {
        EventKind::Hedge
    } else {
        EventKind::AttemptStart
    };
    kind_code(kind) | flags << 8 | (version as u64) << 16
}

/// Word 9 of a start record by [`ThreadRing::push_plain_start`]: an id made
/// by the engine with id prefix `prefix`, upstream name `up`, no tenant or task.
pub(crate) fn plain_names(prefix: u32, up: &Packed) -> u64 {
    names_word(LOCAL_ID, up.0, NONE, NONE, prefix)
}

/// An attempt's start as [`ThreadRing::push_start`] writes it.
#[derive(Debug)]
pub(crate) struct Start<'a> {
    pub(crate) at_ns: u64,
    pub(crate) version: u32,
    pub(crate) id: &'a CallId,
    /// The upstream's name, packed (`None`: too long for a slot).
    pub(crate) up: Option<Packed>,
    pub(crate) tenant: Option<&'a SmolStr>,
    pub(crate) task: Option<&'a SmolStr>,
    pub(crate) attempt: u32,
    pub(crate) hedge: bool,
    pub(crate) remaining_ms: u64,
}

/// An attempt's end as [`ThreadRing::end_at`] writes it into the start record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct End {
    pub(crate) at_ns: u64,
    pub(crate) status: Option<u16>,
    pub(crate) error_class: Option<ErrorClass>,
    pub(crate) reason: Option<Reason>,
    pub(crate) phase: Option<Phase>,
    pub(crate) error_kind: Option<ErrorKind>,
    pub(crate) hedge: bool,
    /// Time left at the attempt's start (the start record's), ms.
    pub(crate) remaining_ms: u64,
    /// The attempt's duration, ms.
    pub(crate) delay_ms: u64,
}

/// A name as a length byte and three words, when it fits.
#[inline(always)]
pub(crate) fn pack(s: &str) -> Option<Packed> {
    let b = s.as_bytes();
    let n = b.len();
    if n > 23 {
        return None;
    }
    // Whole words read straight from the string and the tail with one
    // overlapping load, assembled in registers: no byte loop, and no byte
    // buffer stored and read back (that stalls the CPU).
    let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
    let mut w = [0u64; 3];
    let full = n / 8;
    for (i, x) in w.iter_mut().enumerate().take(full) {
        *x = word(8 * i);
    }
    let tail = n % 8;
    if tail > 0 {
        w[full] = if n >= 8 {
            word(n - 8) >> (8 * (8 - tail))
        } else if n >= 4 {
            let lo = u32::from_le_bytes(b[..4].try_into().unwrap_or_default()) as u64;
            let hi = u32::from_le_bytes(b[n - 4..n].try_into().unwrap_or_default()) as u64;
            lo | hi << (8 * (n - 4))
        } else {
            b[0] as u64 | (b[n / 2] as u64) << (8 * (n / 2)) | (b[n - 1] as u64) << (8 * (n - 1))
        };
    }
    Some((n as u8, w))
}

fn unpack_str(len: u8, w: &[u64]) -> Option<SmolStr> {
    if len == NONE || len > 23 {
        return None;
    }
    let mut buf = [0u8; 24];
    for (i, x) in w.iter().take(3).enumerate() {
        buf[i * 8..i * 8 + 8].copy_from_slice(&x.to_le_bytes());
    }
    std::str::from_utf8(&buf[..len as usize]).ok().map(SmolStr::new)
}

/// Writes a record's names through `put(word, value)` into words 9..22
/// (their lengths, the id, upstream, tenant and task), only the words a
/// reader looks at: none for an absent name, none past a name's length.
/// `None` when one is too long to pack (the record is then kept whole).
/// [`encode`] puts into zeroed words, [`store_hot`] straight into a slot.
#[inline(always)]
fn put_names(
    mut put: impl FnMut(usize, u64),
    id: Option<&CallId>,
    upstream: Option<Option<Packed>>,
    tenant: Option<&SmolStr>,
    task: Option<&SmolStr>,
) -> Option<()> {
    /// Puts packed name `p` (`None`: absent) from word `at` on; its length byte.
    #[inline(always)]
    fn packed(put: &mut impl FnMut(usize, u64), at: usize, p: Option<Option<Packed>>) -> Option<u8> {
        let Some(p) = p else { return Some(NONE) };
        let (len, w) = p?;
        for (i, v) in w.iter().enumerate().take((len as usize).div_ceil(8)) {
            put(at + i, *v);
        }
        Some(len)
    }
    /// Puts name `s` from word `at` on; its length byte.
    #[inline(always)]
    fn name(put: &mut impl FnMut(usize, u64), at: usize, s: Option<&SmolStr>) -> Option<u8> {
        packed(put, at, s.map(|s| pack(s)))
    }
    let (id_len, prefix) = match id {
        None => (NONE, 0u32),
        Some(CallId::Local { prefix, seq }) => {
            put(10, *seq);
            (LOCAL_ID, *prefix)
        }
        Some(CallId::Remote(s)) => (name(&mut put, 10, Some(s))?, 0),
    };
    let up_len = packed(&mut put, 13, upstream)?;
    let tenant_len = name(&mut put, 16, tenant)?;
    let task_len = name(&mut put, 19, task)?;
    put(9, names_word(id_len, up_len, tenant_len, task_len, prefix));
    Some(())
}

/// The record as words, or `None` when it must be kept whole.
#[inline(always)]
fn encode(r: &Rec) -> Option<[u64; W]> {
    if r.extra.is_some() {
        return None;
    }
    let mut w = [0u64; W];
    put_names(
        |i, v| w[i] = v,
        r.id.as_ref(),
        r.upstream.as_ref().map(|u| pack(u)),
        r.tenant.as_ref(),
        r.task.as_ref(),
    )?;
    let flags = r.hedge as u64
        | (r.attempt.is_some() as u64) << 1
        | (r.attempt_id.is_some() as u64) << 2
        | (r.parent_attempt.is_some() as u64) << 3
        | (r.resend_count.is_some() as u64) << 4
        | (r.status.is_some() as u64) << 5
        | (r.delay_ms.is_some() as u64) << 6
        | (r.remaining_ms.is_some() as u64) << 7;
    let t = r.then;
    w[0] = r.at_ns;
    w[1] = r.seq;
    w[2] = kind_code(r.kind) | flags << 8 | (r.version as u64) << 16 | (r.status.unwrap_or(0) as u64) << 48;
    w[3] = r
        .attempt
        .or(r.attempt_id)
        .or(r.parent_attempt.map(|p| p + 1))
        .unwrap_or(0) as u64
        | code(r.error_class, ErrorClass::code) << 32
        | code(r.reason, Reason::code) << 40
        | code(r.action, Action::code) << 48
        | code(r.wait_source, WaitSource::code) << 56;
    w[4] = code(r.phase, Phase::code) | code(r.error_kind, ErrorKind::code) << 8 | t.map_or(0, then_bits);
    w[5] = r.delay_ms.unwrap_or(0);
    w[6] = r.remaining_ms.unwrap_or(0);
    w[7] = t.map_or(0, |t| t.delay_ms);
    w[8] = t.map_or(0, |t| t.remaining_ms);
    Some(w)
}

/// Writes attempt event `h` with sequence number `seq` straight into `slot`
/// (inside its seqlock), as [`encode`] would write `h.to_rec()` — but only
/// the words a reader of this record looks at: names that are absent, words
/// past a name's length and the words of a folded decision or an end keep
/// whatever an older record left, which the lengths and flags tell a reader
/// to ignore. `None` (some words already written) when a name is too long to
/// pack: the caller then keeps the record whole.
#[inline(always)]
fn store_hot(slot: &Slot, h: &Hot, seq: u64) -> Option<()> {
    let put = |at: usize, v: u64| slot.w[at].store(v, Ordering::Relaxed);
    put_names(put, Some(h.id), Some(h.up_packed), h.tenant, h.task)?;
    let n = h.attempt;
    let flags = h.hedge as u64
        | 1 << 1
        | 1 << 2
        | ((h.start && n > 1) as u64) << 3
        | 1 << 4
        | (h.status.is_some() as u64) << 5
        | (h.delay_ms.is_some() as u64) << 6
        | 1 << 7;
    put(0, h.at_ns);
    put(1, seq);
    put(
        2,
        kind_code(h.kind) | flags << 8 | (h.version as u64) << 16 | (h.status.unwrap_or(0) as u64) << 48,
    );
    put(
        3,
        n as u64 | code(h.error_class, ErrorClass::code) << 32 | code(h.reason, Reason::code) << 40,
    );
    put(4, code(h.phase, Phase::code) | code(h.error_kind, ErrorKind::code) << 8);
    put(5, h.delay_ms.unwrap_or(0));
    put(6, h.remaining_ms);
    Some(())
}

fn decode_rec(w: &[u64; W]) -> Rec {
    let kind = EventKind::ALL
        .get((w[2] & 0xff) as usize)
        .copied()
        .unwrap_or(EventKind::Decision);
    let flags = (w[2] >> 8) & 0xff;
    let has = |bit: u64| flags >> bit & 1 == 1;
    let mut r = Rec::new(kind, w[0], (w[2] >> 16) as u32);
    r.seq = w[1];
    r.hedge = has(0);
    let n = w[3] as u32;
    r.attempt = has(1).then_some(n);
    r.attempt_id = has(2).then_some(n);
    r.parent_attempt = has(3).then_some(n.saturating_sub(1));
    r.resend_count = has(4).then_some(n.saturating_sub(1));
    r.status = has(5).then_some((w[2] >> 48) as u16);
    r.error_class = decode(w[3] >> 32, ErrorClass::from_code);
    r.reason = decode(w[3] >> 40, Reason::from_code);
    r.action = decode(w[3] >> 48, Action::from_code);
    r.wait_source = decode(w[3] >> 56, WaitSource::from_code);
    r.phase = decode(w[4], Phase::from_code);
    r.error_kind = decode(w[4] >> 8, ErrorKind::from_code);
    r.delay_ms = has(6).then_some(w[5]);
    r.remaining_ms = has(7).then_some(w[6]);
    if w[4] & THEN != 0 {
        r.then = Some(Then {
            action: decode(w[4] >> 16, Action::from_code).unwrap_or(Action::Stop),
            reason: decode(w[4] >> 24, Reason::from_code).unwrap_or(Reason::Success),
            error_class: decode(w[4] >> 32, ErrorClass::from_code),
            wait_source: decode(w[4] >> 40, WaitSource::from_code).unwrap_or(WaitSource::None),
            delay_ms: w[7],
            remaining_ms: w[8],
        });
    }
    let lens = w[9];
    let id_len = lens as u8;
    r.id = match id_len {
        NONE => None,
        LOCAL_ID => Some(CallId::Local {
            prefix: (lens >> 32) as u32,
            seq: w[10],
        }),
        l => unpack_str(l, &w[10..13]).map(CallId::Remote),
    };
    r.upstream = unpack_str((lens >> 8) as u8, &w[13..16]);
    r.tenant = unpack_str((lens >> 16) as u8, &w[16..19]);
    r.task = unpack_str((lens >> 24) as u8, &w[19..22]);
    r
}

/// A slot's records: one, or an attempt's start and its end written in place
/// (with the decision folded into the end).
fn decode_slot(w: &[u64; W], out: &mut Vec<Rec>) {
    if w[4] & END == 0 {
        out.push(decode_rec(w));
        return;
    }
    // The start as it was written: the end's fields cleared.
    let mut s = *w;
    s[2] &= !(0xffff << 48);
    s[3] &= !(0xffff << 32);
    s[4] &= !(0xffff | THEN | END | END_STATUS);
    s[5] = 0;
    out.push(decode_rec(&s));
    // The end: its own time and sequence number, no parent attempt, a duration, maybe a status.
    let mut e = *w;
    let flags = (w[2] >> 8 & 0xff) & !(1 << 3) | 1 << 6 | if w[4] & END_STATUS != 0 { 1 << 5 } else { 0 };
    e[0] = w[22];
    e[1] = w[1] + 1;
    e[2] = w[2] & !0xffff | kind_code(EventKind::AttemptEnd) | flags << 8;
    out.push(decode_rec(&e));
}

/// Marks a slot whose record is in the side list.
const SPILLED: u64 = u64::MAX;

/// A slot's version once record `index` is written for the first time (see [`Slot::ver`]).
#[inline(always)]
fn written(index: u64) -> u64 {
    index << 8 | 2
}

/// Events a slot's words stand for (an in-place end and a folded decision add one each).
fn events_in(w: &[u64; W]) -> u64 {
    1 + (w[4] & THEN != 0) as u64 + (w[4] & END != 0) as u64
}

/// Whether the owner may still write into this record while it is its
/// ring's newest: an attempt's start (its end may follow) or an end
/// without a decision (one may be folded in).
fn may_change(w: &[u64; W]) -> bool {
    if w[0] == SPILLED {
        return false;
    }
    let kind = w[2] & 0xff;
    let start = kind == kind_code(EventKind::AttemptStart) || kind == kind_code(EventKind::Hedge);
    if start && w[4] & END == 0 {
        return true;
    }
    (start || kind == kind_code(EventKind::AttemptEnd)) && w[4] & THEN == 0
}

/// Drops the first `n` events of the records from `out[from..]` (one slot's).
fn skip_events(out: &mut Vec<Rec>, from: usize, mut n: u64) {
    while n > 0 && from < out.len() {
        let r = &mut out[from];
        if r.then.is_some() && !r.only_then && n == 1 {
            r.only_then = true;
            return;
        }
        n -= r.events();
        out.remove(from);
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
    #[inline]
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
mod tests {
    use super::*;
    use crate::types::{Action, Reason};

    fn rec(at: u64, name: &str) -> Rec {
        let mut r = Rec::new(EventKind::AttemptEnd, at, 3);
        r.id = Some(CallId::Local { prefix: 7, seq: at });
        r.upstream = Some(SmolStr::new(name));
        r.tenant = Some(SmolStr::new("acme"));
        r.attempt = Some(2);
        r.attempt_id = Some(2);
        r.resend_count = Some(1);
        r.status = Some(503);
        r.error_class = Some(ErrorClass::Transient);
        r.reason = Some(Reason::RetryableStatus);
        r.delay_ms = Some(12);
        r.remaining_ms = Some(900);
        r.then = Some(Then {
            action: Action::Retry,
            reason: Reason::RetryableStatus,
            error_class: Some(ErrorClass::Transient),
            remaining_ms: 880,
            delay_ms: 250,
            wait_source: WaitSource::Jitter,
        });
        r
    }

    /// Attempt events encoded from borrowed fields are stored exactly as
    /// their records would be, including the long-name and remote-id cases.
    #[test]
    fn hot_events_encode_as_their_records() {
        let long = SmolStr::new("an-upstream-name-longer-than-twenty-three-bytes");
        let (up, tenant, task) = (
            SmolStr::new("openai/gpt-4o"),
            SmolStr::new("acme"),
            SmolStr::new("chat"),
        );
        let ids = [
            CallId::Local { prefix: 9, seq: 41 },
            CallId::Remote(SmolStr::new("req-from-upstream")),
            CallId::Remote(long.clone()),
        ];
        let full = SmolStr::new("twenty-three-bytes-long");
        let junk_id = CallId::Remote(full.clone());
        let mut junk = Hot {
            kind: EventKind::AttemptEnd,
            at_ns: 7,
            version: 5,
            id: &junk_id,
            upstream: &full,
            up_packed: pack(&full),
            tenant: Some(&full),
            task: Some(&full),
            attempt: 9,
            start: false,
            hedge: true,
            status: Some(599),
            error_class: Some(ErrorClass::Overloaded),
            reason: Some(Reason::RetryableStatus),
            phase: Some(Phase::StreamVisible),
            error_kind: Some(ErrorKind::StreamIdleTimeout),
            delay_ms: Some(u64::MAX),
            remaining_ms: u64::MAX,
        }
        .to_rec();
        junk.then = Some(Then {
            action: Action::Stop,
            reason: Reason::BudgetExhausted,
            error_class: Some(ErrorClass::Overloaded),
            wait_source: WaitSource::RetryAfter,
            delay_ms: u64::MAX,
            remaining_ms: u64::MAX,
        });
        let mut n = 0;
        let mut plain = 0;
        for id in &ids {
            for upstream in [&up, &long] {
                for (kind, start) in [
                    (EventKind::AttemptStart, true),
                    (EventKind::Hedge, true),
                    (EventKind::AttemptEnd, false),
                ] {
                    for attempt in [1, 2, 3] {
                        let h = Hot {
                            kind,
                            at_ns: 1_000 + n,
                            version: 2,
                            id,
                            upstream,
                            up_packed: pack(upstream),
                            tenant: (attempt == 3).then_some(&tenant),
                            task: (attempt == 1).then_some(&task),
                            attempt,
                            start,
                            hedge: kind == EventKind::Hedge,
                            status: (!start).then_some(503),
                            error_class: (!start).then_some(ErrorClass::Transient),
                            reason: (!start).then_some(Reason::RetryableStatus),
                            phase: (!start).then_some(Phase::BeforeSend),
                            error_kind: (!start && attempt == 3).then_some(ErrorKind::FirstByteTimeout),
                            delay_ms: (!start).then_some(17),
                            remaining_ms: 900,
                        };
                        n += 1;
                        // One slot, last written with every word set: the
                        // event must read back the same although its slot
                        // keeps words the event does not use.
                        let (a, b) = (ThreadRing::new(1, 1), ThreadRing::new(2, 1));
                        a.push(&mut junk.clone());
                        b.push(&mut junk.clone());
                        a.push_hot(&h);
                        b.push(&mut h.to_rec());
                        let (mut ra, mut rb) = (Vec::new(), Vec::new());
                        a.read(false, &mut ra);
                        b.read(false, &mut rb);
                        assert_eq!(format!("{ra:?}"), format!("{rb:?}"));
                        assert_eq!(ra[0].parent_attempt, (start && attempt > 1).then(|| attempt - 1));
                        // A start written field by field reads back the same,
                        // or is refused (nothing written) when a name is too long.
                        if start {
                            let c = ThreadRing::new(3, 1);
                            c.push(&mut junk.clone());
                            let s = Start {
                                at_ns: h.at_ns,
                                version: h.version,
                                id: h.id,
                                up: h.up_packed,
                                tenant: h.tenant,
                                task: h.task,
                                attempt: h.attempt,
                                hedge: h.hedge,
                                remaining_ms: h.remaining_ms,
                            };
                            // The usual start, from its precomputed words, reads back the same too.
                            if let (CallId::Local { prefix, seq }, Some(up), None, None, false) =
                                (h.id, h.up_packed, h.tenant, h.task, h.hedge)
                            {
                                let d = ThreadRing::new(5, 1);
                                d.push(&mut junk.clone());
                                d.push_plain_start(
                                    plain_names(*prefix, &up),
                                    &up,
                                    *seq,
                                    h.at_ns,
                                    h.version,
                                    h.attempt,
                                    h.remaining_ms,
                                );
                                let mut rd = Vec::new();
                                d.read(false, &mut rd);
                                assert_eq!(format!("{rd:?}"), format!("{rb:?}"));
                                plain += 1;
                            }
                            let fits = h.up_packed.is_some() && !matches!(h.id, CallId::Remote(r) if r.len() > 23);
                            assert_eq!(c.push_start(&s).is_some(), fits);
                            let mut rc = Vec::new();
                            c.read(false, &mut rc);
                            let expected = if fits {
                                rb.clone()
                            } else {
                                let d = ThreadRing::new(4, 1);
                                d.push(&mut junk.clone());
                                let mut rd = Vec::new();
                                d.read(false, &mut rd);
                                rd
                            };
                            assert_eq!(format!("{rc:?}"), format!("{expected:?}"));
                        }
                    }
                }
            }
        }
        assert_eq!(n, 54);
        assert!(plain > 0, "the usual start was checked");
    }

    fn attempt(kind: EventKind, at_ns: u64, id: &CallId, up: &SmolStr, n: u32, status: Option<u16>) -> Hot<'static> {
        let id: &'static CallId = Box::leak(Box::new(id.clone()));
        let up: &'static SmolStr = Box::leak(Box::new(up.clone()));
        let end = kind == EventKind::AttemptEnd;
        Hot {
            kind,
            at_ns,
            version: 1,
            id,
            upstream: up,
            up_packed: pack(up),
            tenant: None,
            task: None,
            attempt: n,
            start: !end,
            hedge: kind == EventKind::Hedge,
            status: if end { status } else { None },
            error_class: end.then_some(ErrorClass::Transient).filter(|_| status != Some(200)),
            reason: end.then_some(if status == Some(200) {
                Reason::Success
            } else {
                Reason::RetryableStatus
            }),
            phase: (end && status != Some(200)).then_some(Phase::BeforeSend),
            error_kind: (end && status.is_none()).then_some(ErrorKind::FirstByteTimeout),
            delay_ms: end.then_some(40),
            remaining_ms: 700,
        }
    }

    /// Every length a name can be packed at round-trips (the tail's overlapping loads).
    #[test]
    fn names_of_every_length_pack_and_unpack() {
        let text = "abcdefghijklmnopqrstuvwxyz";
        for n in 0..=23 {
            let s = SmolStr::new(&text[..n]);
            let (len, w) = pack(&s).expect("fits");
            assert_eq!(len as usize, n);
            let mut bytes = Vec::new();
            for x in w {
                bytes.extend_from_slice(&x.to_le_bytes());
            }
            assert!(
                bytes[n..].iter().all(|b| *b == 0),
                "bytes past the name are zero at {n}"
            );
            assert_eq!(unpack_str(len, &w), Some(s));
        }
        assert_eq!(pack(&SmolStr::new(&text[..24])), None);
    }

    /// An end written into its start record reads back exactly as the start,
    /// the end and the folded decision written as records of their own.
    #[test]
    fn an_end_written_into_its_start_reads_as_separate_records() {
        let id = CallId::Local { prefix: 3, seq: 11 };
        let up = SmolStr::new("openai/gpt-4o");
        let then = Then {
            action: Action::Retry,
            reason: Reason::RetryableStatus,
            error_class: Some(ErrorClass::Transient),
            remaining_ms: 650,
            delay_ms: 120,
            wait_source: WaitSource::Jitter,
        };
        for kind in [EventKind::AttemptStart, EventKind::Hedge] {
            for n in [1, 2] {
                for status in [Some(200), Some(503), None] {
                    for folded in [None, Some(then)] {
                        let start = attempt(kind, 1_000, &id, &up, n, None);
                        let mut end = attempt(EventKind::AttemptEnd, 41_000_000, &id, &up, n, status);
                        end.hedge = kind == EventKind::Hedge;
                        let (a, b) = (ThreadRing::new(1, 4), ThreadRing::new(1, 4));
                        let i = a.push_hot(&start);
                        assert!(a.end_in_place(i, &end, folded));
                        b.push_hot(&start);
                        let j = b.push_hot(&end);
                        if let Some(t) = folded {
                            assert!(b.fold(j, t));
                        }
                        let (mut ra, mut rb) = (Vec::new(), Vec::new());
                        a.read(false, &mut ra);
                        b.read(false, &mut rb);
                        assert_eq!(
                            format!("{ra:?}"),
                            format!("{rb:?}"),
                            "{kind:?} {n} {status:?} {folded:?}"
                        );
                        assert_eq!(a.counts().1, 2 + folded.is_some() as u64);
                        // The next record numbers its events after the folded ones, as in b.
                        let (x, y) = (a.push_hot(&start), b.push_hot(&start));
                        let (mut ra, mut rb) = (Vec::new(), Vec::new());
                        a.read(false, &mut ra);
                        b.read(false, &mut rb);
                        assert_eq!((ra.last().unwrap().seq, x + 1), (rb.last().unwrap().seq, y));
                    }
                }
            }
        }
    }

    /// Not newest, drained, an end already there, or an end the start
    /// record cannot carry: the end is refused (and written on its own by the caller).
    #[test]
    fn an_end_goes_into_its_start_only_when_nothing_came_between() {
        let id = CallId::Local { prefix: 3, seq: 11 };
        let up = SmolStr::new("up");
        let start = attempt(EventKind::AttemptStart, 1, &id, &up, 1, None);
        let end = attempt(EventKind::AttemptEnd, 2, &id, &up, 1, Some(503));
        let ring = ThreadRing::new(1, 8);
        let i = ring.push_hot(&start);
        ring.push_hot(&start);
        assert!(!ring.end_in_place(i, &end, None), "another record came after the start");
        // A drain took the start: the end still goes into it, and the next
        // drain takes only the end.
        let i = ring.push_hot(&start);
        let mut out = Vec::new();
        ring.read(true, &mut out);
        assert_eq!(out.last().map(|r| r.kind), Some(EventKind::AttemptStart));
        assert!(ring.end_in_place(i, &end, None));
        let mut out = Vec::new();
        ring.read(true, &mut out);
        assert_eq!(out.iter().map(|r| r.kind).collect::<Vec<_>>(), [EventKind::AttemptEnd]);
        assert!(ring.fold(i, fold_then()));
        let mut out = Vec::new();
        ring.read(true, &mut out);
        assert_eq!(
            (out.len(), out[0].events(), out[0].then.is_some()),
            (1, 1, true),
            "only the decision"
        );
        let mut out = Vec::new();
        ring.read(true, &mut out);
        assert!(out.is_empty(), "each event once");
        let i = ring.push_hot(&start);
        assert!(ring.end_in_place(i, &end, None));
        assert!(!ring.end_in_place(i, &end, None), "the start already has its end");
        let i = ring.push_hot(&start);
        let mut other = end.clone();
        other.remaining_ms = 1;
        assert!(!ring.end_in_place(i, &other, None), "a different remaining time");
        other = end.clone();
        other.hedge = true;
        assert!(!ring.end_in_place(i, &other, None), "a hedge's end for a plain start");
        let j = ring.push_hot(&end);
        assert!(!ring.end_in_place(j, &end, None), "not a start record");
        // An overwritten start-with-end counts its two events as dropped.
        let ring = ThreadRing::new(1, 1);
        let i = ring.push_hot(&start);
        assert!(ring.end_in_place(i, &end, None));
        ring.push_hot(&start);
        assert_eq!(ring.dropped(), 2);
    }

    fn fold_then() -> Then {
        Then {
            action: Action::Retry,
            reason: Reason::RetryableStatus,
            error_class: Some(ErrorClass::Transient),
            remaining_ms: 5,
            delay_ms: 7,
            wait_source: WaitSource::Jitter,
        }
    }

    /// One writer recording `n` attempts (start, end written into it when it
    /// can, every third with its decision folded in) into a ring of `cap`
    /// records, and two drainers taking events meanwhile. Returns the events
    /// written, the sequence numbers drained (sorted) and the ring's count
    /// of dropped events once everything stopped.
    fn race(cap: usize, n: u64) -> (u64, Vec<u64>, u64) {
        let ring = std::sync::Arc::new(ThreadRing::new(1, cap));
        let w = ring.clone();
        let writer = std::thread::spawn(move || {
            let id = CallId::Local { prefix: 1, seq: 1 };
            let up = SmolStr::new("up");
            let mut events = 0u64;
            for k in 0..n {
                let start = attempt(EventKind::AttemptStart, 2 * k, &id, &up, 1, None);
                let end = attempt(EventKind::AttemptEnd, 2 * k + 1, &id, &up, 1, Some(200));
                let i = w.push_hot(&start);
                // The attempt's I/O: drains run meanwhile.
                for _ in 0..k % 64 {
                    std::hint::spin_loop();
                }
                let at = if w.end_in_place(i, &end, None) {
                    i
                } else {
                    w.push_hot(&end)
                };
                events += 2;
                if k % 3 == 0 && w.fold(at, fold_then()) {
                    events += 1;
                }
            }
            events
        });
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let drain = |ring: std::sync::Arc<ThreadRing>| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                loop {
                    let done = stop.load(Ordering::Acquire);
                    let mut out = Vec::new();
                    ring.read(true, &mut out);
                    for r in &out {
                        // A record's events: its own, then a folded decision's (seq + 1).
                        if !r.only_then {
                            got.push(r.seq);
                        }
                        if r.then.is_some() {
                            got.push(r.seq + 1);
                        }
                    }
                    if done {
                        return got;
                    }
                }
            })
        };
        let (a, b) = (drain(ring.clone()), drain(ring.clone()));
        // The count of dropped events, read meanwhile, never goes back.
        let watch = {
            let (ring, stop) = (ring.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut last = 0;
                while !stop.load(Ordering::Acquire) {
                    let d = ring.dropped();
                    assert!(d >= last, "the dropped count went back from {last} to {d}");
                    last = d;
                }
                last
            })
        };
        let written = writer.join().unwrap();
        stop.store(true, Ordering::Release);
        let mut seqs = a.join().unwrap();
        seqs.extend(b.join().unwrap());
        let seen = watch.join().unwrap();
        let mut rest = Vec::new();
        ring.read(true, &mut rest);
        assert!(rest.is_empty(), "{} events left after the drainers stopped", rest.len());
        seqs.sort_unstable();
        let dropped = ring.dropped();
        assert!(
            seen <= dropped,
            "a count read meanwhile ({seen}) was above the final one ({dropped})"
        );
        (written, seqs, dropped)
    }

    /// Drains racing the owner's in-place ends and decisions lose and repeat
    /// nothing: every event written is drained exactly once.
    #[test]
    fn drains_racing_in_place_ends_see_every_event_once() {
        let (written, seqs, dropped) = race(1 << 16, 60_000);
        assert!(seqs.windows(2).all(|p| p[0] < p[1]), "events repeated");
        assert_eq!((seqs.len() as u64, dropped), (written, 0), "events lost");
    }

    /// A ring the drainers cannot keep up with overwrites records: each
    /// event is then drained once or counted as dropped, never both.
    #[test]
    fn events_a_full_ring_overwrites_are_counted_once() {
        let (written, seqs, dropped) = race(4, 60_000);
        assert!(seqs.windows(2).all(|p| p[0] < p[1]), "events repeated");
        assert!(dropped > 0, "the writer outran the drainers");
        assert_eq!(seqs.len() as u64 + dropped, written);
    }

    #[test]
    fn records_round_trip_through_words_or_the_side_list() {
        let ring = ThreadRing::new(1, 4);
        let long = "an-upstream-name-longer-than-twenty-three-bytes";
        for (i, name) in ["up", long, "up", "up", "up", "up"].iter().enumerate() {
            let mut r = rec(i as u64, name);
            ring.push(&mut r);
        }
        let mut out = Vec::new();
        ring.read(false, &mut out);
        assert_eq!(out.len(), 4);
        assert_eq!(out.iter().map(|r| r.at_ns).collect::<Vec<_>>(), vec![2, 3, 4, 5]);
        let r = &out[0];
        let want = rec(2, "up");
        assert_eq!(
            (
                r.id.clone(),
                r.upstream.clone(),
                r.tenant.clone(),
                r.attempt,
                r.attempt_id,
                r.resend_count,
                r.parent_attempt
            ),
            (want.id, want.upstream, want.tenant, Some(2), Some(2), Some(1), None)
        );
        assert_eq!(
            (r.status, r.error_class, r.reason, r.delay_ms, r.remaining_ms),
            (
                Some(503),
                Some(ErrorClass::Transient),
                Some(Reason::RetryableStatus),
                Some(12),
                Some(900)
            )
        );
        assert_eq!(r.then, want.then);
        // Two events per record: seqs 1, 3, 5, ...; two records (four events) overwritten.
        assert_eq!(out.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![5, 7, 9, 11]);
        assert_eq!(ring.dropped(), 4);
        // The long name went through the side list and round-trips too.
        let ring = ThreadRing::new(2, 4);
        let mut r = rec(1, long);
        ring.push(&mut r);
        let mut out = Vec::new();
        ring.read(true, &mut out);
        assert_eq!(out[0].upstream.as_deref(), Some(long));
        let mut again = Vec::new();
        ring.read(false, &mut again);
        assert!(again.is_empty(), "drained");
    }

    #[test]
    fn a_reader_sees_whole_records_while_the_writer_runs() {
        let ring = std::sync::Arc::new(ThreadRing::new(1, 64));
        let w = ring.clone();
        let writer = std::thread::spawn(move || {
            for i in 0..200_000u64 {
                let mut r = rec(i, "up");
                r.remaining_ms = Some(i * 3);
                w.push(&mut r);
            }
        });
        let mut seen = 0;
        while !writer.is_finished() {
            let mut out = Vec::new();
            ring.read(false, &mut out);
            for r in &out {
                assert_eq!(r.remaining_ms, Some(r.at_ns * 3), "a torn record");
            }
            seen += out.len();
        }
        writer.join().unwrap();
        assert!(seen > 0);
    }
}
