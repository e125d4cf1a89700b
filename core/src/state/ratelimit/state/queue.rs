//! The open window's queue: a newcomer that fits while the slots given out
//! in the window still run past now queues behind them, in the first slot
//! given back that is still ahead or at the queue's end, and a newcomer that
//! gives up gives its slot back (see the parent module's documentation).

use super::{share, KindState, Params, QueueSlot, Sched};

/// Slots given back in the open window that are remembered; past this many
/// the earliest is forgotten (its time, at worst, goes unused).
pub(super) const MAX_GAPS: usize = 32;

impl KindState {
    /// When the slots of the current window's queue run past `now`: the
    /// units a newcomer needing `need` takes (at most the limit), where its
    /// slot starts (in the first slot given back that is still ahead and
    /// wide enough, else at the queue's end) and the share of the window it
    /// takes. `None`: no queue.
    fn queue_place(&self, need: u64, now: u64, p: &Params) -> Option<(u64, u64, u64)> {
        let l = self.limit.filter(|&l| l > 0)?;
        if self.queue_end <= now || self.remaining.is_none() {
            return None;
        }
        let units = need.min(l);
        let width = share(units, self.pace_ns(p), l);
        let start = self
            .gaps
            .iter()
            .map(|&(a, b)| (a.max(now), b))
            .find(|&(a, b)| a.saturating_add(width.max(1)) <= b)
            .map_or(self.queue_end, |(a, _)| a);
        Some((units, start, width))
    }

    /// Queues a newcomer needing `need` units behind the waiters of the
    /// current window when their slots still run past `now` (does not record
    /// the promise: see [`KindState::enqueue`]). `None`: no queue, it may go.
    pub(crate) fn queued(&self, need: u64, now: u64, p: &Params) -> Option<Sched> {
        let (units, start, width) = self.queue_place(need, now, p)?;
        let spread = width.max(1);
        Some(Sched {
            due: start - now,
            spread,
            promise: Some((self.epoch, units)),
            slot: Some((start, start.saturating_add(spread))),
        })
    }

    /// True when the current window's queue would put a newcomer needing
    /// `need` units past the window's end: the window is spoken for, and the
    /// newcomer is scheduled in the windows to come. Without it, units
    /// handed back by callers that gave up would be promised again at slots
    /// the window no longer has, ahead of the next window's waiters.
    pub(crate) fn queue_full(&self, need: u64, now: u64, p: &Params) -> bool {
        self.queue_place(need, now, p)
            .is_some_and(|(_, start, width)| start.saturating_add(width) > self.reset_at)
    }

    /// Records a newcomer queued in the current window: the queue ends one
    /// slot later, or the slot given back it took is taken (what of it lies
    /// before the slot has passed).
    pub(crate) fn enqueue(&mut self, s: &Sched) {
        let Some(pr) = s.promise else { return };
        self.promise(pr);
        match s.slot {
            Some((a, b)) if a < self.queue_end => {
                if let Some(i) = self.gaps.iter().position(|&(ga, gb)| ga <= a && a < gb) {
                    if b < self.gaps[i].1 {
                        self.gaps[i].0 = b;
                    } else {
                        self.gaps.remove(i);
                    }
                }
            }
            _ => self.queue_end = self.queue_end.saturating_add(s.spread),
        }
    }

    /// A newcomer queued in window `epoch` at `slot` gave up: its promise
    /// is returned, and its slot, while that window is open, goes back to
    /// the queue (which ends sooner when it was the last).
    pub(crate) fn give_back(&mut self, promise: (u64, u64), slot: QueueSlot) {
        self.release(promise);
        let Some((a, b)) = slot else { return };
        if promise.0 != self.epoch || b > self.queue_end {
            return;
        }
        if b == self.queue_end {
            self.queue_end = a;
            // Slots given back before it that now end the queue go with it.
            while let Some(&(ga, gb)) = self.gaps.last() {
                if gb < self.queue_end {
                    break;
                }
                self.queue_end = ga;
                self.gaps.pop();
            }
            return;
        }
        let i = self.gaps.partition_point(|&(ga, _)| ga < a);
        self.gaps.insert(i, (a, b));
        // Joined with the slots given back on either side that touch it.
        if i + 1 < self.gaps.len() && self.gaps[i + 1].0 <= b {
            self.gaps[i].1 = self.gaps[i + 1].1;
            self.gaps.remove(i + 1);
        }
        if i > 0 && self.gaps[i - 1].1 >= a {
            self.gaps[i - 1].1 = self.gaps[i].1;
            self.gaps.remove(i);
        }
        if self.gaps.len() > MAX_GAPS {
            self.gaps.remove(0);
        }
    }
}
