//! What admission hands the caller: a [`Reservation`] to settle after the
//! attempt, a [`Ticket`] to bring back after a paced wait, or a [`StopWhy`].
//!
//! Both handles keep their scope's state alive and give back what they hold
//! when dropped unused: a reservation dropped unsettled counts as sent with
//! its estimate (the safe reading of an attempt that vanished), a ticket
//! dropped unredeemed frees its promised slot for other callers.

use super::concurrency::AimdConfig;
use super::gate::ScopeGate;
use super::reading::Kind;
use super::state::{Consumed, Promise, QueueSlot, ScopeState};
use crate::state::registry::Slot;
use parking_lot::Mutex;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// One scope's state, as the registry stores it.
#[derive(Debug, Default)]
pub(crate) struct ScopeCell {
    pub(crate) state: Mutex<ScopeState>,
    /// Set once a reading said anything about the scope: until then
    /// admission has nothing to consult, and a call's check is this one load.
    live: AtomicBool,
    /// The adaptive concurrency gate, made at the scope's first gated attempt.
    gate: OnceLock<ScopeGate>,
}

impl ScopeCell {
    /// True once a reading said anything about the scope.
    #[inline(always)]
    pub(crate) fn is_live(&self) -> bool {
        self.live.load(Ordering::Relaxed)
    }

    pub(crate) fn set_live(&self) {
        if !self.is_live() {
            self.live.store(true, Ordering::Relaxed);
        }
    }

    /// The scope's gate under `cfg` (made at first use; a reload's new
    /// bounds are adopted by the first attempt after it).
    pub(crate) fn gate(&self, cfg: &AimdConfig) -> &ScopeGate {
        let g = self.gate.get_or_init(|| ScopeGate::new(*cfg));
        g.aimd.conform(cfg);
        g
    }

    /// The scope's gate, if any attempt was gated in it.
    pub(crate) fn gate_if_any(&self) -> Option<&ScopeGate> {
        self.gate.get()
    }
}

pub(crate) type Cell = Arc<Slot<ScopeCell>>;

/// Why an attempt must not be sent at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopWhy {
    /// The provider's window has no room before the call's time runs out;
    /// the duration is how long until the caller's slot would open.
    RateLimitedUntil(Duration),
    /// A quota that does not come back within a rate window is exhausted
    /// (per-day quota, billing): stop at once, do not wait.
    QuotaExhausted,
}

impl StopWhy {
    /// Stable reason code (`rate_limited_until`, `quota_exhausted`).
    pub fn reason(self) -> &'static str {
        match self {
            StopWhy::RateLimitedUntil(_) => "rate_limited_until",
            StopWhy::QuotaExhausted => "quota_exhausted",
        }
    }
}

/// The decision before an attempt.
#[must_use]
#[derive(Debug)]
pub enum Admission {
    /// Send now; settle the reservation once the response (or its absence) is known.
    Go(Reservation),
    /// Paced: wait this long (until the caller's slot after the window
    /// resets, jittered), then ask again with the ticket.
    Wait {
        /// How long to wait; never more than the time the caller had left.
        wait: Duration,
        /// The caller's place in the windows to come.
        ticket: Ticket,
    },
    /// Do not send.
    Stop(StopWhy),
}

/// Units reserved for one admitted attempt in its scope, and when it was
/// admitted (its response's reading was produced after that).
pub struct Reservation {
    cell: Option<Cell>,
    costs: [u64; 4],
    sent_at: u64,
}

impl Reservation {
    pub(crate) fn new(cell: Cell, costs: [u64; 4], sent_at: u64) -> Self {
        Reservation {
            cell: Some(cell),
            costs,
            sent_at,
        }
    }

    /// Units reserved of `kind`.
    pub fn cost(&self, kind: Kind) -> u64 {
        self.costs[kind.index()]
    }

    /// Its scope's state (until settled or dropped), the units reserved, and the admission time.
    pub(crate) fn into_parts(mut self) -> (Option<Cell>, [u64; 4], u64) {
        (self.cell.take(), self.costs, self.sent_at)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(cell) = self.cell.take() {
            let consumed = Usage::sent().consumed(self.costs);
            cell.value
                .state
                .lock()
                .settle(self.costs, [false; 4], consumed, self.sent_at);
        }
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("scope", &self.cell.as_ref().map(|c| c.key.as_str()))
            .field("costs", &self.costs)
            .finish()
    }
}

/// A paced caller's place in the windows to come: bring it back to
/// `admit` so the slot promised to it is its own.
pub struct Ticket {
    cell: Option<Cell>,
    promises: [Promise; 4],
    /// Its places in the open window's queue, given back if it is dropped.
    slots: [QueueSlot; 4],
}

impl Ticket {
    pub(crate) fn new(cell: Cell, promises: [Promise; 4], slots: [QueueSlot; 4]) -> Self {
        Ticket {
            cell: Some(cell),
            promises,
            slots,
        }
    }

    /// True when the holder waits its turn behind the waiters of the open
    /// window (which has room) rather than for a window with room.
    pub fn queued(&self) -> bool {
        self.slots.iter().any(Option::is_some)
    }

    /// True when the ticket was issued for this scope's state.
    pub(crate) fn is_for(&self, cell: &Cell) -> bool {
        self.cell.as_ref().is_some_and(|c| Arc::ptr_eq(c, cell))
    }

    /// The promises the ticket holds.
    pub(crate) fn promises(&self) -> &[Promise; 4] {
        &self.promises
    }

    /// Gives the promises back to `state` (which the caller has locked).
    pub(crate) fn redeem(mut self, state: &mut ScopeState) {
        state.release(&self.promises);
        self.cell = None;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(cell) = self.cell.take() {
            cell.value.state.lock().give_up(&self.promises, &self.slots);
        }
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("scope", &self.cell.as_ref().map(|c| c.key.as_str()))
            .field("promises", &self.promises)
            .field("slots", &self.slots)
            .finish()
    }
}

/// What an attempt consumed, as far as the caller knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// The request may have reached the provider (false only when it
    /// provably did not: the `BeforeSend` phase).
    pub sent: bool,
    /// Input tokens the response reported.
    pub input_tokens: Option<u64>,
    /// Output tokens the response reported.
    pub output_tokens: Option<u64>,
}

impl Usage {
    /// Never reached the provider: the whole reservation is returned.
    pub fn not_sent() -> Self {
        Usage {
            sent: false,
            input_tokens: None,
            output_tokens: None,
        }
    }

    /// Sent, token usage unknown: the estimate stands.
    pub fn sent() -> Self {
        Usage {
            sent: true,
            input_tokens: None,
            output_tokens: None,
        }
    }

    /// Sent, with the usage the response reported.
    pub fn tokens(input: u64, output: u64) -> Self {
        Usage {
            sent: true,
            input_tokens: Some(input),
            output_tokens: Some(output),
        }
    }

    /// Units consumed per kind, the reservation's estimate where usage is unknown.
    pub(crate) fn consumed(self, reserved: [u64; 4]) -> Consumed {
        if !self.sent {
            return None;
        }
        let total = match (self.input_tokens, self.output_tokens) {
            (Some(i), Some(o)) => i.saturating_add(o),
            _ => reserved[1],
        };
        Some([
            1,
            total,
            self.input_tokens.unwrap_or(reserved[2]),
            self.output_tokens.unwrap_or(reserved[3]),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_falls_back_to_the_estimate() {
        let reserved = [1, 1_500, 1_000, 500];
        assert_eq!(Usage::not_sent().consumed(reserved), None);
        assert_eq!(Usage::sent().consumed(reserved), Some([1, 1_500, 1_000, 500]));
        assert_eq!(Usage::tokens(900, 20).consumed(reserved), Some([1, 920, 900, 20]));
        let half = Usage {
            input_tokens: Some(900),
            ..Usage::sent()
        };
        assert_eq!(half.consumed(reserved), Some([1, 1_500, 900, 500]));
        assert_eq!(StopWhy::RateLimitedUntil(Duration::ZERO).reason(), "rate_limited_until");
        assert_eq!(StopWhy::QuotaExhausted.reason(), "quota_exhausted");
    }
}
