//! Slots: where waiters and newcomers are placed in the windows to come and
//! in the open one, what a ticket keeps, and what a wait must leave before
//! the deadline.

use super::*;

#[test]
fn sixty_rpm_exhausted_waits_for_the_reset_plus_jitter_or_stops() {
    let l = RateLimits::default();
    l.observe(SCOPE, &per_minute(60, 0, secs(20)), 0);
    let mut r = rng();
    // Reset in 20 s, 5 s left: stop, saying when the slot would open.
    let a = ask(&l, SCOPE, 0, secs(5), &mut r);
    assert_eq!(kind_of(&a), D::Stop(StopWhy::RateLimitedUntil(secs(20))));
    // With time: the reset plus a jitter drawn inside the caller's slot: the
    // 59 s the window surely lasts (its whole-second reset is known to a
    // second) over 60 requests.
    let slot = 59 * S / 60;
    let mut expect = r.clone();
    let jitter = expect.gen_range(0..=slot);
    let a = ask(&l, SCOPE, 0, secs(60), &mut r);
    assert_eq!(kind_of(&a), D::Wait(secs(20) + Duration::from_nanos(jitter)));
    // A wait never exceeds the time left: the next slot, opening one slot
    // after 20 s, with 21.5 s left is clamped.
    let a = ask(&l, SCOPE, 0, Duration::from_millis(21_500), &mut r);
    match kind_of(&a) {
        D::Wait(w) => assert!(
            w >= secs(20) + Duration::from_nanos(slot) && w <= Duration::from_millis(21_500),
            "{w:?}"
        ),
        d => panic!("{d:?}"),
    }
    let c = l.counters();
    assert_eq!((c.paced_waits, c.stops_rate_limited, c.admitted), (2, 1, 0));
}

#[test]
fn waiters_get_one_slot_each_across_the_windows_to_come() {
    let l = RateLimits::default();
    l.observe(SCOPE, &per_minute(60, 0, secs(20)), 0);
    let mut r = rng();
    let mut tickets = Vec::new();
    for i in 0..130u64 {
        match ask(&l, SCOPE, 0, secs(3600), &mut r) {
            Admission::Wait { wait, ticket } => {
                // 60 per window, 59 s / 60 apart (the part of the window surely
                // open): window 1 opens at 20 s, window 2 at 80 s.
                let slot = 20 * S + (i / 60) * 60 * S + (i % 60) * 59 * S / 60;
                let w = wait.as_nanos() as u64;
                assert!(w >= slot && w <= slot + 59 * S / 60, "waiter {i}: {wait:?}");
                tickets.push(ticket);
            }
            a => panic!("waiter {i}: {a:?}"),
        }
    }
}

#[test]
fn a_ticket_keeps_its_slot_against_newcomers() {
    let mut r = rng();
    let l = RateLimits::default();
    l.observe(SCOPE, &per_minute(2, 0, secs(10)), 0);
    let (Admission::Wait { ticket: a, .. }, Admission::Wait { ticket: b, .. }) = (
        ask(&l, SCOPE, 0, secs(600), &mut r),
        ask(&l, SCOPE, 0, secs(600), &mut r),
    ) else {
        panic!()
    };
    // After the reset both slots of the window are promised: a newcomer waits for the next window.
    match kind_of(&ask(&l, SCOPE, 10 * S, secs(600), &mut r)) {
        D::Wait(w) => assert!(w >= secs(60) && w <= secs(90), "{w:?}"),
        d => panic!("{d:?}"),
    }
    // The ticket holders go.
    assert_eq!(
        kind_of(&l.admit(SCOPE, 10 * S, none(), secs(600), Some(a), &mut r)),
        D::Go
    );
    assert_eq!(
        kind_of(&l.admit(SCOPE, 40 * S, none(), secs(600), Some(b), &mut r)),
        D::Go
    );
}

#[test]
fn newcomers_queue_behind_the_waiters_of_an_open_window_and_never_past_its_end() {
    fn waits(a: &Admission, lo: u64, hi: u64) {
        match kind_of(a) {
            D::Wait(w) => assert!(w >= secs(lo) && w <= secs(hi), "{w:?} not in {lo}..={hi} s"),
            d => panic!("{d:?}"),
        }
    }
    let mut r = rng();
    let l = RateLimits::default();
    // 6 per window of 61 s whose reset (at 10 s, whole seconds) is known to
    // a second: slots are spread over the 60 s the window surely lasts, 10 s
    // each. Two waiters hold the first two slots.
    let window = Window {
        limit: Some(6),
        remaining: Some(0),
        reset: Some(secs(10)),
        window: Some(secs(61)),
    };
    l.observe(SCOPE, &Reading::default().with_window(Kind::Requests, window), 0);
    let a = ask(&l, SCOPE, 0, secs(600), &mut r);
    waits(&a, 10, 20);
    // (Each admission is kept: a dropped ticket hands its slot back.)
    let b = ask(&l, SCOPE, 0, secs(600), &mut r);
    waits(&b, 20, 30);
    // A hedge at 11 s would queue: it is refused (told to wait) and takes no slot.
    let hedge = Asker {
        remaining: secs(600),
        min_attempt: Duration::ZERO,
        hedge: true,
    };
    let h = l.admit_in(&l.cell(SCOPE, 11 * S), 11 * S, none(), hedge, None, &mut r);
    assert_eq!(kind_of(&h), D::Wait(secs(19)));
    drop(h);
    // At 11 s the window has room for 4, but its queue runs to 30 s: a
    // newcomer takes the next slot (30 s) instead of going with the waiters.
    let c = ask(&l, SCOPE, 11 * S, secs(600), &mut r);
    waits(&c, 19, 29);
    // One whose deadline that slot would not leave time for stops, naming it.
    assert_eq!(
        kind_of(&ask(&l, SCOPE, 11 * S, secs(20), &mut r)),
        D::Stop(StopWhy::RateLimitedUntil(secs(29)))
    );
    // A ticket holder at its slot goes: it is the queue.
    let Admission::Wait { ticket, .. } = a else {
        unreachable!()
    };
    assert_eq!(
        kind_of(&l.admit(SCOPE, 11 * S, none(), secs(600), Some(ticket), &mut r)),
        D::Go
    );
    // Two more newcomers take the slots at 40 s and 50 s; the last unit, 60 s.
    let e = ask(&l, SCOPE, 12 * S, secs(600), &mut r);
    waits(&e, 28, 38);
    let f = ask(&l, SCOPE, 12 * S, secs(600), &mut r);
    waits(&f, 38, 48);
    let g = ask(&l, SCOPE, 12 * S, secs(600), &mut r);
    waits(&g, 48, 58);
    // A newcomer that gives up hands its unit and its slot back: the next
    // newcomer takes that slot (40 s), not one after the queue's end.
    drop(e);
    let h = ask(&l, SCOPE, 12 * S, secs(600), &mut r);
    waits(&h, 28, 38);
    // The queue ends at 70 s, and one more slot would end past the reset
    // (71 s): the next newcomer waits for the window after, behind nobody
    // there: 71 s. It holds that window's first slot (not a slot past this
    // one's end), so the next takes its second.
    let i = ask(&l, SCOPE, 12 * S, secs(600), &mut r);
    waits(&i, 59, 69);
    waits(&ask(&l, SCOPE, 12 * S, secs(600), &mut r), 69, 79);
    // The last of the queue gives up: it ends one slot sooner (60 s), and
    // the window has room for one more there.
    drop(g);
    let j = ask(&l, SCOPE, 12 * S, secs(600), &mut r);
    waits(&j, 48, 58);
    drop((b, c, f, h, i, j));
    // Once the queue has drained, a newcomer with room goes at once.
    let mut quiet = rng();
    let q = RateLimits::default();
    q.observe(SCOPE, &Reading::default().with_window(Kind::Requests, window), 0);
    let Admission::Wait { ticket, .. } = ask(&q, SCOPE, 0, secs(600), &mut quiet) else {
        panic!()
    };
    assert_eq!(
        kind_of(&q.admit(SCOPE, 15 * S, none(), secs(600), Some(ticket), &mut quiet)),
        D::Go
    );
    assert_eq!(kind_of(&ask(&q, SCOPE, 21 * S, secs(600), &mut quiet)), D::Go);
}

#[test]
fn a_paced_wait_leaves_the_scopes_answer_time_before_the_deadline() {
    let mut r = rng();
    let l = RateLimits::default();
    // The first attempt is answered in 2 s: the last of the window, which resets at 12 s at the latest.
    let Admission::Go(first) = ask(&l, SCOPE, 0, secs(600), &mut r) else {
        panic!()
    };
    l.settle(
        SCOPE,
        first,
        &per_minute(6, 0, secs(10)).answered(),
        Usage::sent(),
        2 * S,
    );
    // A wait until 12 s is 10 s; after it an answer needs 2 s + 4 x 1 s
    // (RFC 6298's first sample: deviation half the mean) = 6 s.
    assert_eq!(
        kind_of(&ask(&l, SCOPE, 2 * S, secs(15), &mut r)),
        D::Stop(StopWhy::RateLimitedUntil(secs(10)))
    );
    match kind_of(&ask(&l, SCOPE, 2 * S, secs(17), &mut r)) {
        D::Wait(w) => assert!(w >= secs(10) && w <= secs(11), "{w:?}"),
        d => panic!("{d:?}"),
    }
    // A reading that belongs to no attempt says nothing about answer times.
    let blank = RateLimits::default();
    blank.observe(SCOPE, &per_minute(6, 0, secs(10)).answered(), 0);
    assert!(matches!(kind_of(&ask(&blank, SCOPE, 0, secs(11), &mut r)), D::Wait(_)));
}

#[test]
fn a_ticket_back_before_its_window_opens_keeps_its_place() {
    let mut r = rng();
    let l = RateLimits::default();
    l.observe(SCOPE, &per_minute(2, 0, secs(10)), 0);
    let (Admission::Wait { ticket: a, wait }, Admission::Wait { ticket: b, .. }) = (
        ask(&l, SCOPE, 0, secs(600), &mut r),
        ask(&l, SCOPE, 0, secs(600), &mut r),
    ) else {
        panic!()
    };
    assert!(wait >= secs(10) && wait <= secs(40), "{wait:?}");
    // A newer reading moves the reset from 10 s to 13 s: `a` comes back at 10 s, too early.
    l.observe(SCOPE, &per_minute(2, 0, secs(4)), 9 * S);
    let Admission::Wait { ticket: a, wait } = l.admit(SCOPE, 10 * S, none(), secs(600), Some(a), &mut r) else {
        panic!("still promised a slot of the window that opens at 13 s")
    };
    // It waits for that window's opening, jittered within one slot (60 s / 2).
    assert!(wait >= secs(3) && wait <= secs(33), "{wait:?}");
    // A newcomer at the reset finds both units promised; the holders go.
    assert!(matches!(
        ask(&l, SCOPE, 13 * S, secs(600), &mut r),
        Admission::Wait { .. }
    ));
    assert_eq!(
        kind_of(&l.admit(SCOPE, 13 * S, none(), secs(600), Some(a), &mut r)),
        D::Go
    );
    assert_eq!(
        kind_of(&l.admit(SCOPE, 13 * S, none(), secs(600), Some(b), &mut r)),
        D::Go
    );
    // Early and out of time: it stops saying when the window opens, and its unit is free again.
    let l = RateLimits::default();
    l.observe(SCOPE, &per_minute(1, 0, secs(10)), 0);
    let Admission::Wait { ticket, .. } = ask(&l, SCOPE, 0, secs(600), &mut r) else {
        panic!()
    };
    l.observe(SCOPE, &per_minute(1, 0, secs(6)), 9 * S);
    assert_eq!(
        kind_of(&l.admit(SCOPE, 10 * S, none(), secs(2), Some(ticket), &mut r)),
        D::Stop(StopWhy::RateLimitedUntil(secs(5)))
    );
    assert_eq!(kind_of(&ask(&l, SCOPE, 15 * S, secs(600), &mut r)), D::Go);
    let c = l.counters();
    assert_eq!((c.paced_waits, c.stops_rate_limited, c.admitted), (1, 1, 1));
}
