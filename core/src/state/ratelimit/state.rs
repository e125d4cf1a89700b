//! One scope's rate-limit state and the admission decision over it, on
//! injected time (monotonic nanoseconds) and an injected RNG.
//!
//! The model, per [`Kind`]: the provider's last `remaining` allowance and the
//! instant its window resets; the units this process has committed that the
//! provider's number may not include yet — attempts in flight, and attempts
//! settled without a reading of their own (`unconfirmed`); and the units
//! promised to callers told to wait, per future window.
//!
//! Admission is safe against fixed windows: before the reset it never commits
//! more than the provider said remained, and at the reset the allowance is the
//! full limit. Against a token bucket not yet told from a window the same holds
//! while every answer carries its reading (a bucket refills sooner, which only
//! leaves room unused); units consumed after the last reading that no reading
//! confirms are forgotten at the assumed reset, where a bucket is not full yet.
//!
//! Responses arrive out of order, and a long generation holds its headers
//! back, so each reading is dated by its attempt's send time: one whose
//! attempt left after the last merged reading arrived is newer and replaces
//! `remaining` (a bucket may have refilled); one that may be older only lowers
//! it within the same window, and is ignored when its window had reset before
//! the current one began. A reading bounds its reset between its attempt's
//! send time and its arrival, each plus the stated reset (less a second for
//! whole seconds, which providers round up); readings of one window bound the
//! same instant, so the state keeps the overlap of their bounds and resumes
//! at its latest instant, rather than at the last reading's upper bound (which
//! would move the reset later by each answer's latency). Bounds that do not
//! overlap mean the reset moved (a draining bucket, a new window).
//!
//! The window's length is what the provider states (IETF `w`); OpenAI and
//! Anthropic state none, so it is taken to be the longest reset seen: a reset
//! never lies further than one window away (a fixed window resets at its end,
//! a bucket is full again within one window), and the first reading of a
//! fixed window, or any reading of an emptied bucket, is a whole window away.
//! Before any reading the configured default (a minute) stands.
//!
//! A token bucket is told from a window by its readings and paced on its
//! refill instead (`bucket.rs`). Where no header states the limit, it is
//! learned from the refusals (`learn.rs`).
//!
//! Callers that must wait are spread over the windows to come: with the limit
//! `L` known, the next `L` units of waiters are given distinct slots across
//! the next window (slot `i` of a unit-cost queue starts `i · window / L` after
//! the reset, plus jitter inside its slot), the next `L` across the window
//! after, and so on. No two waiters wake together, and no window is promised
//! more than its limit. A waiter that comes back with its [`Ticket`](super::Ticket)
//! redeems its slot; a newcomer is admitted only from what is left after the
//! promises of the current window, and, while the slots given out in it run
//! past now, takes the next one (`queue_end`) rather than going at once:
//! otherwise, at a window's opening, the newcomers would go together with
//! the waiters paced across it, a burst of up to the whole allowance the
//! provider's own capacity may not absorb. The queue never runs past the
//! window's end: a newcomer it cannot fit is given a slot in the windows to
//! come. A newcomer queued there that gives up (drops its ticket) gives its
//! slot back: the queue ends that much sooner when it was the last, and
//! otherwise the next newcomer takes it while it is still ahead, so the
//! callers queued after a dropped slot are not paced one slot later each. A wait must leave the scope's smoothed answer time (`answer.rs`)
//! before the caller's deadline, or the attempt it ends in would be cut
//! before its answer.

use super::admission::StopWhy;
use super::answer::AnswerTime;
use super::reading::{Kind, Window};
use rand::Rng;
use std::time::Duration;

/// Future windows whose promises are tracked; a caller queued further out
/// still waits, unpromised.
pub(crate) const RING: usize = 8;

/// `d` in nanoseconds, saturating.
#[inline]
pub(crate) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The configuration in nanoseconds, as the state computes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Params {
    pub(crate) default_reset: u64,
    pub(crate) default_window: u64,
    pub(crate) max_hold: u64,
    pub(crate) quota_hold: u64,
    pub(crate) unknown_spread: u64,
    pub(crate) same_window_slack: u64,
}

/// A promise of `units` in the window numbered `epoch`.
pub(crate) type Promise = Option<(u64, u64)>;

/// A place in the open window's queue, `start .. end` (ns): given back
/// when its holder gives up.
pub(crate) type QueueSlot = Option<(u64, u64)>;

/// One kind's window and ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KindState {
    pub(crate) limit: Option<u64>,
    /// `None`: nothing known, not constrained.
    pub(crate) remaining: Option<u64>,
    /// When the current window resets (meaningful with `remaining`).
    pub(crate) reset_at: u64,
    /// The earliest instant the reset can be, when readings (or a stated
    /// window's length added to them) bound it: a newer reading whose
    /// bounds overlap `reset_lo ..= reset_at` bounds the same instant.
    pub(crate) reset_lo: Option<u64>,
    /// Window length the provider stated, ns.
    pub(crate) window: Option<u64>,
    /// Longest reset any reading gave, ns (0: none yet): the window's length
    /// when the provider states none.
    pub(crate) longest_reset: u64,
    pub(crate) in_flight: u64,
    pub(crate) unconfirmed: u64,
    /// When the last reading merged into `remaining` arrived (or, after a
    /// reset, when the window began): a reading of an attempt sent later was
    /// produced after every reading merged so far.
    pub(crate) observed_at: u64,
    /// Start of the current window when `remaining` began as the limit
    /// assumed at a reset (not a reading).
    pub(crate) rolled_at: Option<u64>,
    /// The reset that began the current window (0: none known): a late
    /// reading whose reset lies nearer it than `reset_at` is of the window before.
    pub(crate) began: u64,
    /// Number of the current window.
    pub(crate) epoch: u64,
    /// Units promised to waiters, for windows `epoch .. epoch + RING` (index `e % RING`).
    pub(crate) promised: [u64; RING],
    /// Where the queue of the current window ends: the end of the last slot
    /// given out in it (0: none). Until then a newcomer queues behind the
    /// waiters at the window's pace instead of going ahead of them, which
    /// would send the waiters and the newcomers at once when the window opens.
    pub(crate) queue_end: u64,
    /// Slots of the open window's queue given back by newcomers that gave
    /// up, before `queue_end`, by start, none touching another: the next
    /// newcomer takes the first still ahead of it before queueing at the end.
    pub(crate) gaps: Vec<(u64, u64)>,
    /// A token bucket: how long one unit takes to come back, ns (the
    /// smallest upper bound its readings gave). `None`: a window (or not known yet).
    pub(crate) refill: Option<u64>,
    /// Bucket: when `remaining` was last brought up to date with the refill.
    pub(crate) accrued_at: u64,
    /// `remaining` as the merged readings alone left it (`None` after a
    /// reset or a hold): a newer reading above it shows a refill.
    pub(crate) read_remaining: Option<u64>,
    /// Readings that showed a bucket since the last hold ([`bucket::BUCKET_SIGNS`] make it one).
    pub(crate) bucket_signs: u8,
    /// When units were last settled as `unconfirmed`: a bucket's reading of
    /// an attempt sent after it counts them (a window forgets them at its reset).
    pub(crate) unconfirmed_at: u64,
    /// Bucket: the last reading was merged as possibly older, so it may not
    /// count its own attempt against the level held.
    pub(crate) older: bool,
    /// Learning a limit no header states (`learn.rs`): the start of the
    /// stretch, the attempts sent in it the provider took, and (set when
    /// `limit` and `window` were learned) when they are forgotten.
    pub(crate) learn_from: Option<u64>,
    pub(crate) taken: u64,
    pub(crate) learned: Option<u64>,
}

/// Where a refused caller is queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sched {
    /// From now until its slot opens.
    pub(crate) due: u64,
    /// Width of its slot (the jitter is drawn inside it).
    pub(crate) spread: u64,
    pub(crate) promise: Promise,
    /// Its place in the open window's queue (a newcomer queued behind its waiters).
    pub(crate) slot: QueueSlot,
}

impl KindState {
    fn window_ns(&self, p: &Params) -> u64 {
        let seen = (self.longest_reset > 0).then_some(self.longest_reset);
        self.window.or(seen).unwrap_or(p.default_window).max(1)
    }

    /// The part of a window its slots are spread over: the window less
    /// how uncertain its reset is (`reset_lo ..= reset_at`). Slots begin
    /// at the latest instant the window can open, so spread over the whole
    /// window the last ones could fall after it has closed and spend the
    /// next window's allowance (with whole-second resets, up to a second).
    fn pace_ns(&self, p: &Params) -> u64 {
        let w = self.window_ns(p);
        let unsure = self.reset_lo.map_or(0, |lo| self.reset_at.saturating_sub(lo));
        w.saturating_sub(unsure).max(w / 2).max(1)
    }

    #[inline]
    fn slot(e: u64) -> usize {
        (e % RING as u64) as usize
    }

    /// Moves past every window that has reset by `now`: the allowance is the
    /// full limit again, settled-but-unconfirmed units and the promises of the
    /// passed windows are dropped.
    ///
    /// With the limit unknown, a `probe`-able kind (requests) allows one
    /// attempt, whose response tells the rest, until a recheck
    /// (`default_reset`) later; once a recheck passes with no reading, or for
    /// token kinds at once, nothing constrains the kind until the next reading.
    /// One attempt at the end of a 429's hold, not every waiter.
    pub(crate) fn roll(&mut self, now: u64, p: &Params, probe: bool) {
        self.expire_learned(now);
        if let (Some(tau), Some(r), Some(l)) = (self.refill, self.remaining, self.limit) {
            self.accrue(now, tau, r, l);
            return;
        }
        if self.remaining.is_none() || now < self.reset_at {
            return;
        }
        if self.limit.is_none() {
            let start = self.reset_at;
            let recheck = start.saturating_add(p.default_reset);
            let probing = probe && self.rolled_at.is_none() && now < recheck;
            self.promised = [0; RING];
            self.epoch += 1;
            self.unconfirmed = 0;
            self.observed_at = start;
            self.rolled_at = Some(start);
            self.began = start;
            self.remaining = probing.then_some(1);
            self.reset_at = recheck;
            self.reset_lo = None;
            self.queue_end = 0;
            self.gaps.clear();
            return;
        }
        let w = self.window_ns(p);
        let n = 1 + (now - self.reset_at) / w;
        if n as usize >= RING {
            self.promised = [0; RING];
        } else {
            for i in 0..n {
                self.promised[Self::slot(self.epoch + i)] = 0;
            }
        }
        self.epoch += n;
        self.unconfirmed = 0;
        self.remaining = self.limit;
        let start = self.reset_at.saturating_add((n - 1).saturating_mul(w));
        self.observed_at = start;
        self.rolled_at = Some(start);
        self.began = start;
        self.reset_at = start.saturating_add(w);
        // Windows of a stated length reset n of them after the bounded one;
        // an inferred length may be short of the true one: no lower bound.
        self.reset_lo = match (self.window, self.reset_lo) {
            (Some(_), Some(lo)) => Some(lo.saturating_add(n.saturating_mul(w))),
            _ => None,
        };
        // The waiters promised this window hold its first slots, one after another.
        self.gaps.clear();
        let waiting = self.promised[Self::slot(self.epoch)];
        self.queue_end = match self.limit.filter(|&l| l > 0) {
            Some(l) if waiting > 0 => start.saturating_add(share(waiting, self.pace_ns(p), l)),
            _ => 0,
        };
    }

    /// Takes one response's window for this kind. The response's attempt was
    /// sent at `sent`, so the provider produced the reading at some instant
    /// between `sent` and `now`.
    ///
    /// A reading whose attempt left after the held value arrived is newer and
    /// replaces it. One that may be older (responses arrive out of order, a
    /// long generation holds its headers back) can only lower the remaining
    /// allowance of the same window, and is ignored when its window had
    /// already reset before the current one began.
    pub(crate) fn observe(&mut self, w: Window, sent: u64, now: u64, p: &Params) {
        if w.limit.is_some() {
            self.forget_learned();
            if self.limit.is_some() && self.limit != w.limit {
                self.refill = None;
                self.bucket_signs = 0;
            }
            self.limit = w.limit;
        }
        if let Some(win) = w.window {
            self.window = Some(ns(win).max(1));
        }
        let Some(r) = w.remaining else { return };
        if let Some(d) = w.reset {
            self.longest_reset = self.longest_reset.max(ns(d));
        }
        // Where the stated reset lies: the reading was produced between
        // `sent` and `now`, and its value rounded up by at most `rounding`.
        let bounds = w.reset.map(|d| {
            let lo = sent.saturating_add(ns(d)).saturating_sub(rounding(d, p));
            (lo, now.saturating_add(ns(d)))
        });
        if self.refill.is_some() {
            return self.observe_bucket(w, r, sent, now);
        }
        if self.remaining.is_some() && sent <= self.observed_at {
            match bounds {
                // Nearer the reset that began the current window than the one
                // that ends it, and clear of that one: a late reading of the
                // window before (where it could be either, it is counted).
                Some((lo, hi))
                    if self.began > 0
                        && gap(self.began, lo, hi) < gap(self.reset_at, lo, hi)
                        && hi.saturating_add(p.same_window_slack) < self.reset_at =>
                {
                    return
                }
                // Resetting after the current window: a new one (below).
                Some((lo, _)) if lo > self.reset_at.saturating_add(p.same_window_slack) => {}
                _ => {
                    if let Some(b) = bounds {
                        self.narrow(b);
                    }
                    self.remaining = self.remaining.min(Some(r));
                    self.read_remaining = self.read_remaining.min(Some(r));
                    self.observed_at = self.observed_at.max(now);
                    return;
                }
            }
        }
        if self.remaining.is_some() && sent > self.observed_at && self.shows_bucket(r, bounds, now) {
            self.bucket_signs = self.bucket_signs.saturating_add(1);
        }
        if self.bucket_signs >= bucket::BUCKET_SIGNS {
            if let Some(tau) = bucket::bucket_interval(w, self.limit) {
                self.become_bucket(tau);
                return self.observe_bucket(w, r, sent, now);
            }
        }
        // The latest instant the reset can be: resuming early would spend what is not there.
        let latest = bounds.map_or_else(|| self.assumed_reset(now, p), |(_, hi)| hi);
        let held = self.remaining.is_some().then_some(self.reset_at);
        // Bounds that do not overlap the held ones mean the reset moved (a
        // draining bucket, or a new window): the reading's hold.
        if !(held.is_some() && bounds.is_some_and(|b| self.narrow(b))) {
            self.reset_at = latest;
            self.reset_lo = bounds.map(|(lo, _)| lo);
        }
        // Certainly resetting after the held reset: a new window began there.
        if let (Some(at), Some((lo, _))) = (held, bounds) {
            if lo > at.saturating_add(p.same_window_slack) {
                self.began = at;
            }
        }
        self.remaining = Some(r);
        self.read_remaining = Some(r);
        self.observed_at = now;
        self.rolled_at = None;
    }

    /// Narrows the held reset to the part of a reading's bounds (`lo ..= hi`)
    /// it shares, when the two overlap: both then bound the same instant.
    /// Without it each reading would move the reset later by its own latency
    /// (for whole seconds, by up to a second), and callers would wait past a
    /// window that is already open. False (nothing changed) when they do not
    /// overlap or the held reset is not bounded below.
    fn narrow(&mut self, (lo, hi): (u64, u64)) -> bool {
        match self.reset_lo {
            Some(held_lo) if lo <= self.reset_at && hi >= held_lo => {
                self.reset_at = self.reset_at.min(hi);
                self.reset_lo = Some(held_lo.max(lo));
                true
            }
            _ => false,
        }
    }

    /// Records that the window is exhausted until `until` (a 429 said so).
    pub(crate) fn hold(&mut self, now: u64, until: u64) {
        let live = self.remaining.is_some() && self.reset_at > now;
        self.reset_at = if live { self.reset_at.max(until) } else { until };
        self.reset_lo = None;
        self.remaining = Some(0);
        self.read_remaining = None;
        self.observed_at = self.observed_at.max(now);
        self.rolled_at = None;
        // A refusal where the refill said there was room: not a bucket after all
        // (or not one that refills as its readings said); windows again, safe.
        self.refill = None;
        self.bucket_signs = 0;
    }

    /// Allowance left for one more caller; `None` when unconstrained.
    pub(crate) fn available(&self) -> Option<u64> {
        self.remaining.map(|r| {
            r.saturating_sub(self.in_flight)
                .saturating_sub(self.unconfirmed)
                .saturating_sub(self.promised[Self::slot(self.epoch)])
        })
    }

    /// True when a caller of `cost` fits what is left now (or nothing constrains the kind).
    pub(crate) fn fits(&self, cost: u64) -> bool {
        self.available().is_none_or(|a| a >= self.need(cost))
    }

    /// Units a caller of `cost` needs free: at least one (every attempt uses
    /// some of each limit), at most the limit (a larger estimate could never
    /// fit, and waits one full window instead).
    pub(crate) fn need(&self, cost: u64) -> u64 {
        cost.max(1).min(self.limit.unwrap_or(u64::MAX).max(1))
    }

    /// Queues a refused caller needing `need` units (does not record the promise).
    pub(crate) fn schedule(&self, need: u64, now: u64, p: &Params) -> Sched {
        let w = self.window_ns(p);
        let start = self.reset_at.max(now);
        let Some(l) = self.limit.filter(|&l| l > 0) else {
            return Sched {
                due: start - now,
                spread: p.unknown_spread,
                promise: None,
                slot: None,
            };
        };
        let c = need.min(l);
        if let Some(tau) = self.refill {
            return self.schedule_bucket(c, tau, now);
        }
        let pace = self.pace_ns(p);
        let share = |units| share(units, pace, l);
        for j in 1..RING as u64 {
            let taken = self.promised[Self::slot(self.epoch + j)];
            if taken.saturating_add(c) <= l {
                let opens = start.saturating_add((j - 1).saturating_mul(w));
                return Sched {
                    due: opens.saturating_add(share(taken)) - now,
                    spread: share(c).max(1),
                    promise: Some((self.epoch + j, c)),
                    slot: None,
                };
            }
        }
        Sched {
            due: start.saturating_add((RING as u64 - 1).saturating_mul(w)) - now,
            spread: w,
            promise: None,
            slot: None,
        }
    }

    /// For a promise of a window that has not opened by `now`: how long
    /// until it opens, and the width of one slot of its units (its holder
    /// comes back at the opening, jittered within that). `None` once the
    /// window is open (or its promise no longer tracked).
    pub(crate) fn until_open(&self, (epoch, units): (u64, u64), now: u64, p: &Params) -> Option<(u64, u64)> {
        if epoch <= self.epoch || epoch >= self.epoch + RING as u64 {
            return None;
        }
        let w = self.window_ns(p);
        let opens = self
            .reset_at
            .max(now)
            .saturating_add((epoch - self.epoch - 1).saturating_mul(w));
        let spread = match self.limit.filter(|&l| l > 0) {
            Some(l) => share(units, self.pace_ns(p), l),
            None => p.unknown_spread,
        };
        Some((opens - now, spread.clamp(1, w)))
    }

    pub(crate) fn promise(&mut self, (epoch, units): (u64, u64)) {
        let s = Self::slot(epoch);
        self.promised[s] = self.promised[s].saturating_add(units);
    }

    /// Returns a promise that is still tracked.
    pub(crate) fn release(&mut self, (epoch, units): (u64, u64)) {
        if epoch >= self.epoch && epoch < self.epoch + RING as u64 {
            let s = Self::slot(epoch);
            self.promised[s] = self.promised[s].saturating_sub(units);
        }
    }

    /// True when nothing is known or held: the kind need not be shown.
    pub(crate) fn is_blank(&self) -> bool {
        self.limit.is_none() && self.remaining.is_none() && self.in_flight == 0
    }
}

/// How much a provider may have rounded a reset up: a second for whole
/// seconds, a millisecond for whole milliseconds, else nothing.
fn rounding(d: Duration, p: &Params) -> u64 {
    match d.subsec_nanos() {
        0 => p.same_window_slack,
        n if n % 1_000_000 == 0 => 1_000_000,
        _ => 0,
    }
}

/// The part of a window of `w` ns that `units` of a limit `l` (> 0) take.
fn share(units: u64, w: u64, l: u64) -> u64 {
    (u128::from(units) * u128::from(w) / u128::from(l)) as u64
}

/// Distance from instant `x` to the interval `lo..=hi`.
fn gap(x: u64, lo: u64, hi: u64) -> u64 {
    if x < lo {
        lo - x
    } else {
        x.saturating_sub(hi)
    }
}

/// A wait of `due` plus a jitter inside the slot's `spread`, never past
/// `time_left` (`due <= time_left`).
fn jittered<R: Rng + ?Sized>(due: u64, spread: u64, time_left: u64, rng: &mut R) -> u64 {
    due.saturating_add(rng.gen_range(0..=spread)).min(time_left)
}

/// What a settled attempt consumed, per kind (`None`: never sent, nothing).
pub(crate) type Consumed = Option<[u64; 4]>;

/// Who asks for admission, as it stands against the open window's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    /// A first ask (or one whose ticket is of another scope): it queues
    /// behind the waiters of the open window.
    Newcomer,
    /// Back at its slot with its ticket: it is the queue, and goes.
    Holder,
    /// A hedge: it never waits, so where a newcomer would queue it is
    /// refused without taking a slot (a slot taken and then dropped would
    /// delay every caller queued after it).
    Hedge,
}

/// The decision before the attempt, as data (the table wraps it in handles).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    Go,
    /// `slots`: its places in the open window's queue (a newcomer queued there).
    Wait {
        wait: u64,
        promises: [Promise; 4],
        slots: [QueueSlot; 4],
    },
    Stop(StopWhy),
}

/// Everything known about one scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ScopeState {
    pub(crate) kinds: [KindState; 4],
    /// A quota (not a rate) is exhausted: calls stop until then, and then one probes.
    pub(crate) quota_until: Option<u64>,
    /// The latest end of a hold a 429 of this process asked for (what a fleet shares as a cooldown).
    pub(crate) cooldown_until: u64,
    /// How long answers take: what a paced wait leaves before the deadline.
    pub(crate) answer: AnswerTime,
}

impl ScopeState {
    pub(crate) fn roll(&mut self, now: u64, p: &Params) {
        for (i, k) in self.kinds.iter_mut().enumerate() {
            k.roll(now, p, i == Kind::Requests.index());
        }
    }

    /// Takes one response's reading (its attempt sent at `sent`; at `now`
    /// for a reading of no attempt) and, when it was an answer, how long the
    /// answer took.
    pub(crate) fn observe(&mut self, r: &super::Reading, sent: u64, now: u64, p: &Params) {
        if r.answered && now > sent {
            self.answer.sample(now - sent);
        }
        if r.taken() {
            self.kinds[Kind::Requests.index()].count_taken(sent);
        }
        self.roll(now, p);
        for k in Kind::ALL {
            self.kinds[k.index()].observe(r.window(k), sent, now, p);
        }
        if r.quota_exhausted {
            let hold = r.retry_after.map_or(0, ns).max(p.quota_hold);
            self.quota_until = Some(now.saturating_add(hold));
            return;
        }
        // A response that is not a quota refusal ends a quota hold.
        if r.answered {
            self.quota_until = None;
        }
        if !r.rate_limited {
            return;
        }
        let exhausted = Kind::ALL.iter().any(|&k| r.window(k).remaining == Some(0));
        let hint = match r.retry_after {
            Some(d) => Some(ns(d)),
            // The windows in the reading say which is exhausted and when it resets.
            None if exhausted => None,
            None => Some(
                Kind::ALL
                    .iter()
                    .filter_map(|&k| r.window(k).reset)
                    .min()
                    .map_or(p.default_reset, ns),
            ),
        };
        if let Some(h) = hint {
            // Never longer than max_hold: a per-minute limit is not a day-long cooldown.
            let until = now.saturating_add(h.min(p.max_hold));
            let k = &mut self.kinds[Kind::Requests.index()];
            k.learn(sent, until);
            k.hold(now, until);
            self.cooldown_until = self.cooldown_until.max(until);
        }
    }

    /// A ticket holder back before the window its promise is for has opened
    /// (the reset came later than its wait assumed) and with no room for it
    /// in the current one: it keeps its promise and waits for that window
    /// again, or stops when the window opens after `time_left`. `None` when
    /// the window is open or the current one has room: the ticket is
    /// redeemed. Without this it would go to the back of the queue and,
    /// near its deadline, give up a unit the window then leaves unused.
    pub(crate) fn hold_ticket<R: Rng + ?Sized>(
        &mut self,
        promises: &[Promise; 4],
        costs: [u64; 4],
        now: u64,
        time_left: u64,
        p: &Params,
        rng: &mut R,
    ) -> Option<Decision> {
        self.roll(now, p);
        let room = self.kinds.iter().zip(costs).all(|(k, c)| k.fits(c));
        if room {
            return None;
        }
        let (due, spread) = self
            .kinds
            .iter()
            .zip(promises)
            .filter_map(|(k, pr)| pr.and_then(|pr| k.until_open(pr, now, p)))
            .max()?;
        if due > time_left {
            return Some(Decision::Stop(StopWhy::RateLimitedUntil(Duration::from_nanos(due))));
        }
        Some(Decision::Wait {
            wait: jittered(due, spread, time_left, rng),
            promises: *promises,
            slots: [None; 4],
        })
    }

    /// Decides one attempt needing `costs` units per kind. On `Go` the units
    /// are reserved; on `Wait` the returned promises are recorded. A caller
    /// that fits but is not a [`Caller::Holder`] joins the current window's
    /// queue while it runs past `now`.
    pub(crate) fn decide<R: Rng + ?Sized>(
        &mut self,
        now: u64,
        costs: [u64; 4],
        time_left: u64,
        caller: Caller,
        p: &Params,
        rng: &mut R,
    ) -> Decision {
        let queues = caller != Caller::Holder;
        self.roll(now, p);
        if let Some(until) = self.quota_until {
            if now < until {
                return Decision::Stop(StopWhy::QuotaExhausted);
            }
            // One probe; the others keep stopping until its response says otherwise.
            self.quota_until = Some(now.saturating_add(p.quota_hold));
        }
        let mut binding: Option<Sched> = None;
        let mut promises: [Promise; 4] = [None; 4];
        for (i, k) in self.kinds.iter().enumerate() {
            let fits = if queues {
                k.fits(costs[i])
            } else {
                k.fits_holder(costs[i])
            };
            if fits && !(queues && k.queue_full(k.need(costs[i]), now, p)) {
                continue;
            }
            let s = k.schedule(k.need(costs[i]), now, p);
            promises[i] = s.promise;
            if binding.is_none_or(|b| s.due > b.due) {
                binding = Some(s);
            }
        }
        let Some(b) = binding else {
            if queues {
                if let Some(d) = self.join_queue(now, costs, time_left, caller, p, rng) {
                    return d;
                }
            }
            for (k, c) in self.kinds.iter_mut().zip(costs) {
                k.in_flight = k.in_flight.saturating_add(c);
            }
            return Decision::Go;
        };
        if b.due > time_left {
            return Decision::Stop(StopWhy::RateLimitedUntil(Duration::from_nanos(b.due)));
        }
        let wait = jittered(b.due, b.spread, time_left, rng);
        for (k, pr) in self.kinds.iter_mut().zip(promises) {
            if let Some(pr) = pr {
                k.promise(pr);
            }
        }
        Decision::Wait {
            wait,
            promises,
            slots: [None; 4],
        }
    }

    /// A newcomer that fits, behind the waiters of the current window: the
    /// next slot of each kind whose queue runs past `now`, the latest one
    /// binding (or a stop when it is past `time_left`: going now would send
    /// it with the waiters it jumped). A hedge is told to wait (which refuses
    /// it) without taking a slot. `None`: no queue, it may go.
    fn join_queue<R: Rng + ?Sized>(
        &mut self,
        now: u64,
        costs: [u64; 4],
        time_left: u64,
        caller: Caller,
        p: &Params,
        rng: &mut R,
    ) -> Option<Decision> {
        let mut slots: [Option<Sched>; 4] = [None; 4];
        for ((s, k), c) in slots.iter_mut().zip(&self.kinds).zip(costs) {
            *s = k.queued(k.need(c), now, p);
        }
        let b = slots.iter().flatten().max_by_key(|s| s.due).copied()?;
        if b.due > time_left {
            return Some(Decision::Stop(StopWhy::RateLimitedUntil(Duration::from_nanos(b.due))));
        }
        if caller == Caller::Hedge {
            return Some(Decision::Wait {
                wait: b.due,
                promises: [None; 4],
                slots: [None; 4],
            });
        }
        for (k, s) in self.kinds.iter_mut().zip(&slots) {
            if let Some(s) = s {
                k.enqueue(s);
            }
        }
        Some(Decision::Wait {
            wait: jittered(b.due, b.spread, time_left, rng),
            promises: slots.map(|s| s.and_then(|s| s.promise)),
            slots: slots.map(|s| s.and_then(|s| s.slot)),
        })
    }

    /// Ends a reservation of `costs`: the units leave the in-flight count;
    /// those consumed that no reading of its own confirms stay counted until
    /// the window resets.
    pub(crate) fn settle(&mut self, costs: [u64; 4], confirmed: [bool; 4], consumed: Consumed, now: u64) {
        for (i, k) in self.kinds.iter_mut().enumerate() {
            k.in_flight = k.in_flight.saturating_sub(costs[i]);
            if let Some(used) = consumed {
                let confirmed = confirmed[i] && !(k.refill.is_some() && k.older);
                if !confirmed && k.remaining.is_some() {
                    k.unconfirmed = k.unconfirmed.saturating_add(used[i]);
                    k.unconfirmed_at = now;
                }
            }
        }
    }

    /// Returns promises made by an earlier `Wait` (its holder is back).
    pub(crate) fn release(&mut self, promises: &[Promise; 4]) {
        for (k, pr) in self.kinds.iter_mut().zip(promises) {
            if let Some(pr) = pr {
                k.release(*pr);
            }
        }
    }

    /// Returns what an earlier `Wait` holds when its holder gave up: its
    /// promises, and its places in the open window's queue.
    pub(crate) fn give_up(&mut self, promises: &[Promise; 4], slots: &[QueueSlot; 4]) {
        for ((k, pr), slot) in self.kinds.iter_mut().zip(promises).zip(slots) {
            if let Some(pr) = pr {
                k.give_back(*pr, *slot);
            }
        }
    }
}

mod bucket;
mod learn;
mod queue;

#[cfg(test)]
mod tests;
