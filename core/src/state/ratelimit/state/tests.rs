//! The state's unit tests: readings, resets, slots and tickets on injected time.

use super::*;
use proptest::prelude::*;

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

impl KindState {
    fn roll_(&mut self, now: u64, p: &Params) {
        self.roll(now, p, true);
    }
}

fn params() -> Params {
    Params {
        default_reset: S,
        default_window: 60 * S,
        max_hold: 60 * S,
        quota_hold: 60 * S,
        unknown_spread: S,
        same_window_slack: S,
    }
}

fn window(limit: u64, remaining: u64, reset_s: u64) -> Window {
    Window {
        limit: Some(limit),
        remaining: Some(remaining),
        reset: Some(Duration::from_secs(reset_s)),
        window: Some(Duration::from_secs(60)),
    }
}

#[test]
fn readings_of_one_window_only_lower_remaining() {
    let p = params();
    let mut k = KindState::default();
    k.observe(window(60, 10, 30), 0, 0, &p);
    assert_eq!((k.remaining, k.reset_at), (Some(10), 30 * S));
    // Attempts sent before that reading arrived: their readings may be
    // older (more remaining): ignored; less remaining is taken.
    k.observe(window(60, 14, 29), 0, S, &p);
    assert_eq!((k.remaining, k.reset_at), (Some(10), 30 * S));
    k.observe(window(60, 7, 20), 0, 10 * S, &p);
    assert_eq!((k.remaining, k.reset_at), (Some(7), 30 * S));
    // Sent after the last merged reading arrived: newer, taken as is (a
    // bucket may have refilled), resetting at the latest instant it allows.
    k.observe(window(60, 9, 25), 11 * S, 12 * S, &p);
    assert_eq!((k.remaining, k.reset_at, k.observed_at), (Some(9), 37 * S, 12 * S));
    // A possibly older reading whose reset lies beyond the current one starts a new window.
    k.observe(window(60, 40, 60), 2 * S, 13 * S, &p);
    assert_eq!((k.remaining, k.reset_at), (Some(40), 73 * S));
    // After a reset, a late reading of the window before is ignored.
    k.roll_(73 * S, &p);
    assert_eq!(
        (k.remaining, k.observed_at, k.rolled_at),
        (Some(60), 73 * S, Some(73 * S))
    );
    k.observe(window(60, 0, 1), 70 * S, 74 * S, &p);
    assert_eq!(k.remaining, Some(60));
    // ... one of this window lowers it.
    k.observe(window(60, 30, 59), 70 * S, 75 * S, &p);
    assert_eq!(k.remaining, Some(30));
}

#[test]
fn a_reset_refills_to_the_limit_and_drops_what_it_passed() {
    let p = params();
    let mut k = KindState::default();
    k.observe(window(60, 0, 20), 0, 0, &p);
    k.unconfirmed = 3;
    k.in_flight = 2;
    k.promise((1, 5));
    k.promise((2, 7));
    k.roll_(20 * S - 1, &p);
    assert_eq!((k.remaining, k.epoch), (Some(0), 0), "not yet");
    k.roll_(20 * S, &p);
    assert_eq!((k.remaining, k.epoch, k.reset_at), (Some(60), 1, 80 * S));
    assert_eq!((k.unconfirmed, k.in_flight), (0, 2), "in flight stays counted");
    assert_eq!(k.available(), Some(60 - 2 - 5), "this window's promises are kept");
    // Idle for many windows: every promise is gone.
    k.roll_(20 * S + 10 * 60 * S, &p);
    assert_eq!((k.epoch, k.promised), (11, [0; RING]));
    assert_eq!(k.reset_at, 20 * S + 11 * 60 * S);
    // With no known limit, a reset leaves the kind unconstrained.
    let mut k = KindState::default();
    k.observe(
        Window {
            remaining: Some(0),
            ..Window::default()
        },
        0,
        0,
        &p,
    );
    assert_eq!((k.remaining, k.reset_at), (Some(0), S), "default reset");
    let mut tokens = k.clone();
    k.roll_(S, &p);
    assert_eq!(
        (k.available(), k.reset_at),
        (Some(1), 2 * S),
        "one probe until the recheck"
    );
    k.roll_(2 * S, &p);
    assert_eq!(k.available(), None, "a recheck passed with no reading");
    // Token kinds are not probed; nor is a reset found long past.
    tokens.roll(S, &p, false);
    assert_eq!(tokens.available(), None);
    let mut late = KindState {
        remaining: Some(0),
        reset_at: S,
        ..KindState::default()
    };
    late.roll_(2 * S, &p);
    assert_eq!(late.available(), None);
}

#[test]
fn waiters_get_distinct_slots_and_no_window_is_promised_past_its_limit() {
    let p = params();
    let mut k = KindState::default();
    k.observe(window(4, 0, 10), 0, 0, &p);
    let mut dues = Vec::new();
    for _ in 0..9 {
        let s = k.schedule(1, 0, &p);
        dues.push((s.due / MS, s.spread / MS, s.promise));
        if let Some(pr) = s.promise {
            k.promise(pr);
        }
    }
    // Window 1 opens at 10 s (the reset, whole seconds: known to within a
    // second), its slots spread over the 59 s it surely lasts: 14.75 s per
    // unit (59 s / 4); window 2 at 70 s.
    assert_eq!(
        dues,
        [
            (10_000, 14_750, Some((1, 1))),
            (24_750, 14_750, Some((1, 1))),
            (39_500, 14_750, Some((1, 1))),
            (54_250, 14_750, Some((1, 1))),
            (70_000, 14_750, Some((2, 1))),
            (84_750, 14_750, Some((2, 1))),
            (99_500, 14_750, Some((2, 1))),
            (114_250, 14_750, Some((2, 1))),
            (130_000, 14_750, Some((3, 1))),
        ]
    );
    // A cost larger than the limit waits one whole window for itself.
    let s = k.schedule(1_000, 0, &p);
    assert_eq!((s.due / S, s.spread / MS, s.promise), (190, 59_000, Some((4, 4))));
    // Beyond the tracked windows: a wait with no promise.
    let mut full = k.clone();
    for e in 1..RING as u64 {
        full.promise((e, 4));
    }
    let s = full.schedule(1, 0, &p);
    assert_eq!((s.due / S, s.promise), (10 + 7 * 60, None));
    // A returned promise frees its slot; a stale one is ignored.
    k.release((1, 1));
    assert_eq!(k.promised[1], 3);
    k.release((RING as u64 + 5, 1));
    assert_eq!(k.schedule(1, 0, &p).promise, Some((1, 1)));
}

fn unstated(limit: u64, remaining: u64, reset_ms: u64) -> Window {
    Window {
        limit: Some(limit),
        remaining: Some(remaining),
        reset: Some(Duration::from_millis(reset_ms)),
        window: None,
    }
}

#[test]
fn with_no_window_stated_the_longest_reset_is_the_window() {
    let p = params();
    let mut k = KindState::default();
    assert_eq!(k.window_ns(&p), 60 * S, "nothing read yet: the configured default");
    // A 2 s fixed window of 20: its first reading is almost a window away, later ones less.
    k.observe(unstated(20, 19, 1_950), 50 * MS, 50 * MS, &p);
    k.observe(unstated(20, 0, 1_200), 800 * MS, 800 * MS, &p);
    assert_eq!((k.window_ns(&p), k.reset_at), (1_950 * MS, 2_000 * MS));
    // Waiters get slots a twentieth apart of the 1 949 ms the window surely
    // lasts (its reset is known to a millisecond), from the reset on.
    let s = k.schedule(1, 800 * MS, &p);
    assert_eq!((s.due, s.spread), (1_200 * MS, 97_450_000));
    k.promise(s.promise.unwrap());
    assert_eq!(k.schedule(1, 800 * MS, &p).due, 1_200 * MS + 97_450_000);
    // A reset with no reading after it assumes the next window that far on.
    k.roll(2_000 * MS, &p, true);
    assert_eq!((k.remaining, k.reset_at), (Some(20), 3_950 * MS));
    // A stated window wins over the inference.
    k.observe(
        Window {
            window: Some(Duration::from_secs(3)),
            ..unstated(20, 5, 2_500)
        },
        2_100 * MS,
        2_100 * MS,
        &p,
    );
    assert_eq!(k.window_ns(&p), 3 * S);
}

#[test]
fn a_late_reading_of_the_window_before_never_empties_the_current_one() {
    let p = params();
    let minute = |remaining, reset_ms| Window {
        window: Some(Duration::from_secs(60)),
        ..unstated(360_000, remaining, reset_ms)
    };
    let mut k = KindState::default();
    k.observe(minute(0, 200), 59_800 * MS, 59_800 * MS, &p);
    k.roll(60_000 * MS, &p, true);
    // The new window's first readings replace the assumed full limit.
    k.observe(minute(359_000, 57_000), 63_000 * MS, 63_000 * MS, &p);
    assert_eq!(
        (k.remaining, k.reset_at / MS, k.began / MS),
        (Some(359_000), 120_000, 60_000)
    );
    // An attempt sent at 59.9 s waited 4 s in the provider's queue: its reading
    // (0 left, reset in 100 ms, rounded up to the ms) is of the window that ended at 60 s.
    k.observe(minute(0, 100), 59_900 * MS, 64_000 * MS, &p);
    assert_eq!(k.remaining, Some(359_000));
    // One of the current window sent as long ago lowers it.
    k.observe(minute(358_000, 56_500), 59_900 * MS, 64_000 * MS, &p);
    assert_eq!(k.remaining, Some(358_000));
    // A new window begun by a reading (not a roll) is dated the same way.
    k.observe(minute(359_999, 59_999), 120_001 * MS, 120_001 * MS, &p);
    assert_eq!((k.reset_at / MS, k.began / MS), (180_000, 120_000));
    k.observe(minute(0, 1), 119_990 * MS, 120_002 * MS, &p);
    assert_eq!(k.remaining, Some(359_999));
}

#[test]
fn whole_second_resets_of_one_window_keep_the_earliest_bound() {
    let p = params();
    // The window truly resets at 3.0 s; each reading's `t` is rounded up to the second.
    let ietf = |remaining, t| Window {
        limit: Some(10),
        remaining: Some(remaining),
        reset: Some(Duration::from_secs(t)),
        window: Some(Duration::from_secs(3)),
    };
    let mut k = KindState::default();
    let mut resets = Vec::new();
    for (at_ms, remaining, t) in [(300, 9, 3), (1_200, 8, 2), (2_050, 7, 1), (2_500, 6, 1)] {
        k.observe(ietf(remaining, t), (at_ms - 10) * MS, at_ms * MS, &p);
        resets.push((k.remaining, k.reset_at / MS));
    }
    assert_eq!(
        resets,
        [(Some(9), 3_300), (Some(8), 3_200), (Some(7), 3_050), (Some(6), 3_050)],
        "newer readings lower the remaining; the reset keeps the earliest bound"
    );
    // At the reset the next window is assumed one stated window on (6.05 s); its
    // first reading bounds the same instant (by 6.1 s): the earlier bound holds.
    k.roll(3_050 * MS, &p, true);
    k.observe(ietf(9, 3), 3_090 * MS, 3_100 * MS, &p);
    assert_eq!((k.remaining, k.reset_at / MS), (Some(9), 6_050));
    // A reading that cannot be of that window (it resets after 7 s at the earliest) is taken as it is.
    k.observe(ietf(9, 5), 3_200 * MS, 3_200 * MS, &p);
    assert_eq!(k.reset_at / MS, 8_200);
    // Resets with fractions are not rounded: a later one (a draining bucket) is taken.
    let mut b = KindState::default();
    b.observe(unstated(60, 10, 1_500), 0, 0, &p);
    b.observe(unstated(60, 5, 1_300), 400 * MS, 400 * MS, &p);
    assert_eq!(b.reset_at, 1_700 * MS);
}

#[test]
fn need_is_at_least_one_and_at_most_the_limit() {
    let mut k = KindState::default();
    assert_eq!((k.need(0), k.need(7)), (1, 7));
    k.limit = Some(5);
    assert_eq!((k.need(0), k.need(7)), (1, 5));
    k.limit = Some(0);
    assert_eq!(k.need(0), 1);
}

#[test]
fn readings_of_one_window_narrow_its_reset_to_their_shared_bounds() {
    let p = params();
    // The window truly resets at 60 s; each reading is produced when its
    // attempt reaches the provider and arrives one latency later.
    let mut k = KindState::default();
    let mut resets = Vec::new();
    for (sent, produced, arrived) in [(0, 100, 900), (200, 300, 400), (500, 900, 3_000), (600, 700, 750)] {
        k.observe(
            unstated(360_000, 300_000, 60_000 - produced),
            sent * MS,
            arrived * MS,
            &p,
        );
        resets.push(k.reset_at / MS);
    }
    // Each bound holds; the earliest upper bound is kept, not the newest reading's.
    assert_eq!(resets, [60_800, 60_100, 60_100, 60_050]);
    assert!(k.reset_lo.is_some_and(|lo| lo <= 60_000 * MS));
    // A reading whose bounds lie wholly after them: the reset moved (a new window).
    k.observe(unstated(360_000, 359_000, 65_000), 1_000 * MS, 1_100 * MS, &p);
    assert_eq!(k.reset_at / MS, 66_100);
    // A 429's hold is no reading's bound: the next reading is taken as it is (earlier here).
    k.hold(1_200 * MS, 61_000 * MS);
    k.observe(unstated(360_000, 0, 58_700), 1_300 * MS, 1_400 * MS, &p);
    assert_eq!(k.reset_at / MS, 60_100);
}

#[test]
fn slots_given_back_in_the_open_window_are_taken_again_or_end_the_queue_sooner() {
    let p = params();
    // 6 per stated 60 s window, open since 10 s, resetting at 70 s; the
    // waiters it opened with hold its slots to 30 s: 10 s a slot.
    let mut k = KindState {
        limit: Some(6),
        remaining: Some(6),
        reset_at: 70 * S,
        window: Some(60 * S),
        epoch: 1,
        queue_end: 30 * S,
        ..KindState::default()
    };
    let now = 12 * S;
    let queue = |k: &mut KindState, now: u64| {
        let s = k.queued(1, now, &p).expect("a queue runs past now");
        assert_eq!((s.spread, s.promise), (10 * S, Some((1, 1))));
        k.enqueue(&s);
        s.slot.unwrap()
    };
    let n1 = queue(&mut k, now);
    let n2 = queue(&mut k, now);
    let n3 = queue(&mut k, now);
    assert_eq!(
        (n1, n2, n3, k.queue_end),
        ((30 * S, 40 * S), (40 * S, 50 * S), (50 * S, 60 * S), 60 * S)
    );
    assert_eq!(k.promised[1], 3);
    // Two in the middle give up: their slots join into one gap; the queue still ends at 60 s.
    k.give_back((1, 1), Some(n1));
    k.give_back((1, 1), Some(n2));
    assert_eq!(
        (k.gaps.clone(), k.queue_end, k.promised[1]),
        (vec![(30 * S, 50 * S)], 60 * S, 1)
    );
    // At 35 s a newcomer takes the gap from now on, leaving 5 s of it: too
    // short for the next, which queues at the end.
    let a = queue(&mut k, 35 * S);
    assert_eq!((a, k.gaps.clone()), ((35 * S, 45 * S), vec![(45 * S, 50 * S)]));
    let b = queue(&mut k, 35 * S);
    assert_eq!((b, k.queue_end), ((60 * S, 70 * S), 70 * S));
    assert!(k.queue_full(1, 35 * S, &p), "the window is spoken for");
    // The last slots given back end the queue sooner, with the gap they reach.
    k.give_back((1, 1), Some(b));
    assert_eq!(k.queue_end, 60 * S);
    k.give_back((1, 1), Some(n3));
    assert_eq!((k.queue_end, k.gaps.clone()), (45 * S, vec![]));
    // A slot of a window that has passed, or past the queue's end, changes nothing.
    k.give_back((0, 1), Some((20 * S, 30 * S)));
    k.give_back((1, 1), Some((50 * S, 60 * S)));
    assert_eq!((k.queue_end, k.gaps.clone()), (45 * S, vec![]));
    // Only so many gaps are remembered (the earliest goes first); the reset forgets them.
    k.queue_end = 70 * S;
    for i in 0..(queue::MAX_GAPS as u64 + 2) {
        k.give_back((1, 0), Some((S + 2 * i * MS, S + (2 * i + 1) * MS)));
    }
    assert_eq!((k.gaps.len(), k.gaps[0].0), (queue::MAX_GAPS, S + 4 * MS));
    k.roll_(70 * S, &p);
    assert_eq!((k.epoch, k.gaps.len()), (2, 0));
}

/// One step of the queue property below.
#[derive(Debug, Clone)]
enum QueueOp {
    /// A newcomer needing this many units asks.
    Ask(u64),
    /// The holder of this slot (an index into those held) gives up.
    GiveUp(usize),
    /// Time passes (ms).
    Advance(u64),
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever newcomers ask and give up, in the open window's queue: no
    /// two held slots overlap, none runs past the window's end, the slots
    /// given back lie apart from the held ones and before the queue's end,
    /// and the window is promised exactly the units its slots hold.
    #[test]
    fn the_open_windows_queue_never_gives_one_time_twice(
        limit in 4u64..40,
        waiting in 1u64..4,
        ops in proptest::collection::vec(prop_oneof![
            3 => (1u64..4).prop_map(QueueOp::Ask),
            2 => any::<usize>().prop_map(QueueOp::GiveUp),
            1 => (0u64..8_000).prop_map(QueueOp::Advance),
        ], 0..120),
    ) {
        let p = params();
        let mut k = KindState {
            limit: Some(limit),
            remaining: Some(limit),
            reset_at: 70 * S,
            window: Some(60 * S),
            epoch: 1,
            ..KindState::default()
        };
        k.promised[1] = waiting;
        k.queue_end = 10 * S + share(waiting, 60 * S, limit);
        let mut now = 10 * S;
        let mut held: Vec<((u64, u64), u64)> = Vec::new();
        for op in ops {
            match op {
                QueueOp::Ask(need) => {
                    if k.queue_full(need, now, &p) {
                        continue;
                    }
                    if let Some(s) = k.queued(need, now, &p) {
                        k.enqueue(&s);
                        held.push((s.slot.unwrap(), s.promise.unwrap().1));
                    }
                }
                QueueOp::GiveUp(i) if !held.is_empty() => {
                    let (slot, units) = held.remove(i % held.len());
                    k.give_back((1, units), Some(slot));
                }
                QueueOp::Advance(ms) => now = (now + ms * MS).min(k.reset_at - 1),
                _ => {}
            }
            let mut slots: Vec<(u64, u64)> = held.iter().map(|h| h.0).collect();
            slots.sort();
            for w in slots.windows(2) {
                prop_assert!(w[0].1 <= w[1].0, "held slots overlap: {:?}", w);
            }
            for &(a, b) in &slots {
                prop_assert!(b <= k.reset_at && b <= k.queue_end, "slot {:?}, queue end {}", (a, b), k.queue_end);
            }
            for w in k.gaps.windows(2) {
                prop_assert!(w[0].1 < w[1].0, "gaps unsorted or touching: {:?}", k.gaps);
            }
            for &(ga, gb) in &k.gaps {
                prop_assert!(ga < gb && gb < k.queue_end, "gap {:?}, queue end {}", (ga, gb), k.queue_end);
                for &(a, b) in &slots {
                    prop_assert!(gb <= a || b <= ga, "gap {:?} over held slot {:?}", (ga, gb), (a, b));
                }
            }
            prop_assert_eq!(k.promised[1], waiting + held.iter().map(|h| h.1).sum::<u64>());
        }
    }
}

/// A bucket of 10 refilled one every 100 ms, as a provider reports it: the
/// level left (whole), and the time until full, rounded up to the ms.
fn bucket_reading(level: f64) -> Window {
    let to_full_ms = ((10.0 - level) * 100.0).ceil() as u64;
    unstated(10, level.floor() as u64, to_full_ms)
}

#[test]
fn two_readings_show_a_bucket_and_its_refill_paces_from_then_on() {
    let p = params();
    let mut k = KindState::default();
    // Full at 0; each attempt takes one, and 0.2 of one comes back between them.
    k.observe(bucket_reading(9.0), 0, 10 * MS, &p);
    assert_eq!(k.refill, None);
    // Its reset lies past the first one's bounds: one sign, not yet a bucket.
    k.observe(bucket_reading(8.2), 20 * MS, 30 * MS, &p);
    assert_eq!((k.refill, k.bucket_signs), (None, 1));
    k.observe(bucket_reading(7.4), 40 * MS, 50 * MS, &p);
    // Level 7.4 read as 7: 260 ms to full over 2 whole units is 130 ms a unit,
    // an upper bound on the true 100 ms.
    assert_eq!(k.refill, Some(130 * MS));
    assert_eq!((k.remaining, k.accrued_at), (Some(7), 50 * MS));
    // The allowance grows one unit per interval from the reading's arrival, up to the limit.
    k.roll_(179 * MS, &p);
    assert_eq!(k.remaining, Some(7));
    k.roll_(180 * MS, &p);
    assert_eq!(k.remaining, Some(8));
    k.roll_(10 * S, &p);
    assert_eq!(k.remaining, Some(10));
    // A tighter bound from a later reading: level 0.95 read as 0 is about 905 ms over 9 units.
    let w = bucket_reading(0.95);
    k.observe(w, 11 * S, 11 * S + MS, &p);
    assert_eq!(k.refill, Some(ns(w.reset.unwrap()) / 9));
    assert!(k.refill.unwrap() < 101 * MS);
    // A 429's hold: windows again, safe whatever the bucket does.
    k.hold(12 * S, 13 * S);
    assert_eq!((k.refill, k.bucket_signs, k.remaining), (None, 0, Some(0)));
}

#[test]
fn a_fixed_window_never_shows_a_bucket() {
    let p = params();
    for whole_seconds in [false, true] {
        let mut k = KindState::default();
        // The window resets at 60 s; 50 attempts, each read 50 ms after it is sent.
        for i in 0..50u64 {
            let (sent, arrived) = (i * 1_000 * MS, i * 1_000 * MS + 50 * MS);
            let left_ms = 60_000 - (i * 1_000 + 25);
            let reset_ms = if whole_seconds {
                left_ms.div_ceil(1_000) * 1_000
            } else {
                left_ms
            };
            k.observe(unstated(100, 99 - i, reset_ms), sent, arrived, &p);
        }
        assert_eq!((k.refill, k.bucket_signs), (None, 0), "whole seconds: {whole_seconds}");
        assert_eq!(k.remaining, Some(50));
    }
}

#[test]
fn a_bucket_queues_waiters_on_its_refill_one_slot_a_unit() {
    let p = params();
    let mut s = ScopeState::default();
    let k = &mut s.kinds[Kind::Requests.index()];
    k.observe(bucket_reading(9.0), 0, 10 * MS, &p);
    k.observe(bucket_reading(8.2), 20 * MS, 30 * MS, &p);
    k.observe(bucket_reading(0.5), 40 * MS, 50 * MS, &p);
    // 950 ms over 9 units: 105.5 ms a unit; nothing left now.
    let tau = 105_555_555;
    assert_eq!((k.refill, k.remaining), (Some(tau), Some(0)));
    let mut rng = <rand_pcg::Pcg64Mcg as rand::SeedableRng>::seed_from_u64(3);
    let costs = [1, 0, 0, 0];
    let now = 50 * MS;
    let mut waits = Vec::new();
    for _ in 0..3 {
        match s.decide(now, costs, 10 * S, Caller::Newcomer, &p, &mut rng) {
            Decision::Wait { wait, promises, .. } => {
                assert!(promises[0].is_some());
                waits.push(wait);
            }
            d => panic!("{d:?}"),
        }
    }
    // The i-th waiter's unit comes back i intervals after the reading, jittered within its slot.
    for (i, w) in waits.iter().enumerate() {
        let due = (i as u64 + 1) * tau;
        assert!(
            *w >= due && *w <= due + tau,
            "waiter {i}: {w} not in {due}..{}",
            due + tau
        );
    }
    // A newcomer cannot take the first unit promised to the waiters.
    assert!(matches!(
        s.decide(now + tau, costs, 10 * S, Caller::Newcomer, &p, &mut rng),
        Decision::Wait { .. }
    ));
    // The first waiter back at its slot goes (the units promised behind it are refill to come).
    let k = &mut s.kinds[Kind::Requests.index()];
    k.release((k.epoch, 1));
    assert_eq!(
        s.decide(now + tau, costs, 10 * S, Caller::Holder, &p, &mut rng),
        Decision::Go
    );
}

/// A refusal with a wait (no header), its attempt sent at `sent`, arriving at `now`.
fn refusal(s: &mut ScopeState, wait_s: u64, sent: u64, now: u64, p: &Params) {
    let r = super::super::Reading::default()
        .rate_limited()
        .retry_delay(Duration::from_secs(wait_s));
    s.observe(&r, sent, now, p);
}

fn taken(s: &mut ScopeState, sent: u64, now: u64, p: &Params) {
    s.observe(&super::super::Reading::default().answered(), sent, now, p);
}

#[test]
fn a_limit_no_header_states_is_learned_from_the_stretch_between_refusals() {
    let p = params();
    let mut s = ScopeState::default();
    let req = Kind::Requests.index();
    // Taken before any refusal: nothing is measured yet.
    taken(&mut s, 0, 10 * MS, &p);
    // The first refusal holds until 6 s and starts the stretch there; a
    // second of the same burst moves its start to the later end.
    refusal(&mut s, 3, 2 * S, 3 * S, &p);
    refusal(&mut s, 3, 2 * S, 3 * S + 500 * MS, &p);
    let k = &s.kinds[req];
    assert_eq!((k.limit, k.learn_from, k.taken), (None, Some(6 * S + 500 * MS), 0));
    // Answers of attempts sent before the stretch began are not counted; 4 after it are.
    taken(&mut s, 6 * S, 6 * S + 100 * MS, &p);
    for i in 0..4 {
        taken(&mut s, 7 * S + i * MS, 7 * S + 100 * MS, &p);
    }
    // A refusal of an attempt sent before the stretch learns nothing.
    refusal(&mut s, 1, 6 * S, 8 * S, &p);
    assert_eq!((s.kinds[req].limit, s.kinds[req].taken), (None, 4));
    // One sent in it: 4 taken over 6.5 .. 12.5 s, a window of 4 per 6 s from 12.5 s.
    refusal(&mut s, 3, 9 * S, 9 * S + 500 * MS, &p);
    let k = &s.kinds[req];
    assert_eq!(
        (k.limit, k.window, k.learned),
        (Some(4), Some(6 * S), Some(12 * S + 500 * MS + 60 * S))
    );
    assert_eq!(
        (k.remaining, k.reset_at, k.learn_from, k.taken),
        (Some(0), 12 * S + 500 * MS, Some(12 * S + 500 * MS), 0)
    );
    // It paces: at 12.5 s the window holds 4, and a fifth waits for the next.
    let mut rng = <rand_pcg::Pcg64Mcg as rand::SeedableRng>::seed_from_u64(5);
    let now = 12 * S + 500 * MS;
    let mut goes = 0;
    for _ in 0..5 {
        if s.decide(now, [1, 0, 0, 0], 60 * S, Caller::Holder, &p, &mut rng) == Decision::Go {
            goes += 1;
        }
    }
    assert_eq!(goes, 4);
    // A stated limit replaces the learned one, and its window with it.
    let k = &mut s.kinds[req];
    k.observe(unstated(50, 40, 30_000), 13 * S, 13 * S, &p);
    assert_eq!((k.limit, k.window, k.learned), (Some(50), None, None));
    // A refusal no longer learns: the headers state the limit.
    refusal(&mut s, 3, 14 * S, 14 * S, &p);
    assert_eq!(s.kinds[req].limit, Some(50));
}

#[test]
fn a_reading_without_a_reset_keeps_a_learned_windows_reset() {
    let p = params();
    let mut s = ScopeState::default();
    let req = Kind::Requests.index();
    refusal(&mut s, 1, 0, 0, &p);
    taken(&mut s, S, S + 10 * MS, &p);
    taken(&mut s, S, S + 10 * MS, &p);
    refusal(&mut s, 2, S + 20 * MS, S + 20 * MS, &p);
    let k = &mut s.kinds[req];
    // 2 per 2.02 s from 3.02 s; Azure's remaining alone (after its window opened) keeps that reset.
    assert_eq!((k.limit, k.window), (Some(2), Some(2 * S + 20 * MS)));
    k.roll_(3 * S + 100 * MS, &p);
    let w = Window {
        remaining: Some(0),
        ..Window::default()
    };
    k.observe(w, 3 * S + 100 * MS, 3 * S + 150 * MS, &p);
    assert_eq!((k.remaining, k.reset_at), (Some(0), 5 * S + 40 * MS));
}

#[test]
fn a_learned_limit_is_forgotten_after_its_time_and_learned_anew() {
    let p = params();
    let mut s = ScopeState::default();
    let req = Kind::Requests.index();
    // Learned low: 1 take over 2 s (demand was low), kept until 62 s (a minute at least).
    refusal(&mut s, 1, 0, 0, &p);
    taken(&mut s, S, S + 10 * MS, &p);
    refusal(&mut s, 1, S + 20 * MS, 2 * S, &p);
    let until = 3 * S;
    assert_eq!(s.kinds[req].learned, Some(until + 60 * S));
    // Pacing at it draws no refusal: at its time the kind is unconstrained again.
    s.roll(until + 60 * S - 1, &p);
    assert_eq!(s.kinds[req].limit, Some(1));
    let forgotten = until + 60 * S;
    s.roll(forgotten, &p);
    let k = &s.kinds[req];
    assert_eq!((k.limit, k.window, k.learned, k.remaining), (None, None, None, None));
    assert_eq!((k.learn_from, k.taken), (Some(forgotten), 0));
    let mut rng = <rand_pcg::Pcg64Mcg as rand::SeedableRng>::seed_from_u64(7);
    for _ in 0..10 {
        assert_eq!(
            s.decide(forgotten, [1, 0, 0, 0], 60 * S, Caller::Newcomer, &p, &mut rng),
            Decision::Go
        );
    }
    // The next refusal learns from the stretch that began there: 10 taken over 6 s.
    for _ in 0..10 {
        taken(&mut s, forgotten, forgotten + 50 * MS, &p);
    }
    refusal(&mut s, 5, forgotten + 100 * MS, forgotten + S, &p);
    let k = &s.kinds[req];
    assert_eq!((k.limit, k.window), (Some(10), Some(6 * S)));
}
