use super::*;
use crate::types::{Action, Reason, WaitSource};

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
