//! How a record is laid out in a slot's 23 words: names packed inline,
//! enums as one-byte codes, and the flag bits an attempt's end and a folded
//! decision set. Encoding and decoding are exact inverses
//! (`tests.rs`: records round-trip through words).

use super::Slot;
use crate::id::CallId;
use crate::telemetry::{EventKind, Hot, Rec, Then};
use crate::types::{Action, ErrorClass, ErrorKind, Phase, Reason, WaitSource};
use smol_str::SmolStr;
use std::sync::atomic::Ordering;

/// Words per record.
pub(super) const W: usize = 23;
pub(super) const NONE: u8 = 0xff;
/// Length mark of a call id made here (`prefix` and `seq` stored as numbers).
pub(super) const LOCAL_ID: u8 = 0xfe;
/// Word 4 bits: a decision folded in (`then`), an attempt's end written into
/// its start record (`END`, its time in word 22), and that end's status is set.
pub(super) const THEN: u64 = 1 << 48;
pub(super) const END: u64 = 1 << 49;
pub(super) const END_STATUS: u64 = 1 << 50;

#[inline(always)]
pub(super) fn code<T: Copy>(v: Option<T>, f: impl Fn(T) -> u8) -> u64 {
    v.map_or(0, |x| f(x) as u64 + 1)
}

pub(super) fn decode<T>(c: u64, f: impl Fn(u8) -> Option<T>) -> Option<T> {
    match c & 0xff {
        0 => None,
        n => f((n - 1) as u8),
    }
}

#[inline(always)]
pub(super) fn kind_code(k: EventKind) -> u64 {
    EventKind::ALL.iter().position(|x| *x == k).unwrap_or(0) as u64
}

/// Word 4's bits for a folded decision.
#[inline(always)]
pub(super) fn then_bits(t: Then) -> u64 {
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
pub(super) fn names_word(id_len: u8, up_len: u8, tenant_len: u8, task_len: u8, prefix: u32) -> u64 {
    id_len as u64 | (up_len as u64) << 8 | (tenant_len as u64) << 16 | (task_len as u64) << 24 | (prefix as u64) << 32
}

/// Word 2 of a start record (a hedge's when `hedge`) of attempt `attempt`
/// under policy version `version`: its kind, flags and version.
#[inline(always)]
pub(super) fn start_word(hedge: bool, attempt: u32, version: u32) -> u64 {
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

pub(super) fn unpack_str(len: u8, w: &[u64]) -> Option<SmolStr> {
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
pub(super) fn put_names(
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
pub(super) fn encode(r: &Rec) -> Option<[u64; W]> {
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
pub(super) fn store_hot(slot: &Slot, h: &Hot, seq: u64) -> Option<()> {
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

pub(super) fn decode_rec(w: &[u64; W]) -> Rec {
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
pub(super) fn decode_slot(w: &[u64; W], out: &mut Vec<Rec>) {
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
pub(super) const SPILLED: u64 = u64::MAX;

/// A slot's version once record `index` is written for the first time (see [`Slot::ver`]).
#[inline(always)]
pub(super) fn written(index: u64) -> u64 {
    index << 8 | 2
}

/// Events a slot's words stand for (an in-place end and a folded decision add one each).
pub(super) fn events_in(w: &[u64; W]) -> u64 {
    1 + (w[4] & THEN != 0) as u64 + (w[4] & END != 0) as u64
}

/// Whether the owner may still write into this record while it is its
/// ring's newest: an attempt's start (its end may follow) or an end
/// without a decision (one may be folded in).
pub(super) fn may_change(w: &[u64; W]) -> bool {
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
pub(super) fn skip_events(out: &mut Vec<Rec>, from: usize, mut n: u64) {
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
