//! The state's unit tests: readings, resets, slots and tickets on injected time.

use super::*;

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
