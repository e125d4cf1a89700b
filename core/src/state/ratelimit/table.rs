//! The process-wide table of provider rate limits, keyed by what the
//! provider limits: a scope string the caller builds from account or key,
//! provider and model (`"key-a/openai/gpt-4o"`). Different scopes never share
//! state, so a per-model 429 does not slow other models and one key's
//! quota does not stop another key.

use super::admission::{Admission, Cell, Reservation, ScopeCell, Ticket, Usage};
use super::fleet::Changes;
use super::reading::{Kind, Reading};
use super::snapshot::{ConcurrencySnapshot, KindSnapshot, RateLimitCounters, RateLimitSnapshot, ScopeSnapshot};
use super::state::{ns, Caller, Decision, Params};
use crate::rules::deadline::TokenEstimate;
use crate::state::registry::Registry;
use rand::Rng;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How late a sleeper may wake from a paced wait: waits end at least this
/// long before the latest instant they could. A waiter given a slot at the
/// edge of its deadline and woken a millisecond late (asyncio and libuv
/// timers do; under load, by more) would find less than `min_attempt` left
/// and stop, and the slot promised to it would go unused.
pub(super) const WAKE_SLACK: u64 = 20_000_000;

/// Who asks [`RateLimits::admit_in`], and how long it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Asker {
    /// Until the call's deadline.
    pub(crate) remaining: Duration,
    /// What its attempts need at least (`min_attempt_ms`).
    pub(crate) min_attempt: Duration,
    /// A hedge: refused, never queued, where a first attempt would wait.
    pub(crate) hedge: bool,
}

/// Rate-limit knobs. Every default is chosen for the per-minute RPM/TPM
/// limits of OpenAI, Azure OpenAI and Anthropic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitConfig {
    /// Reset assumed when a reading gives `remaining` without a reset (Azure
    /// OpenAI). Default 1 s: Azure enforces its per-minute quota over 1–10 s
    /// intervals, so a second is the shortest useful recheck.
    pub default_reset: Duration,
    /// Window length assumed when the provider states none (only IETF
    /// `RateLimit-Policy` does) and no reading has given a reset yet; after
    /// that, the longest reset read is the window (a reset is never further
    /// than one window away). Default 60 s: RPM and TPM limits are per
    /// minute. It paces waiters across the windows to come.
    pub default_window: Duration,
    /// Longest a 429 without quota exhaustion holds its scope, whatever its
    /// Retry-After says. Default 60 s: a per-minute window resets within a
    /// minute, and a longer hint is re-asked by one attempt rather than turned
    /// into a long cooldown for every call. Explicit reset headers are not capped.
    pub max_hold: Duration,
    /// How long an exhausted quota (per day, billing) stops its scope before
    /// one attempt probes it again (or the server's hint, if longer).
    /// Default 60 s: one refused probe a minute costs nothing, and a raised
    /// quota is noticed within a minute.
    pub quota_hold: Duration,
    /// Width over which waiters are spread when the limit is unknown (and
    /// their slots cannot be computed). Default 1 s.
    pub unknown_spread: Duration,
    /// Two readings whose resets differ by at most this much describe the
    /// same window (resets are whole seconds in most headers). Default 1 s.
    pub same_window_slack: Duration,
    /// Scopes tracked at most; idle ones are evicted first. Default 4096.
    pub max_scopes: u32,
    /// A scope unused this long is the first to go when the table is full. Default 15 min.
    pub idle: Duration,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            default_reset: Duration::from_secs(1),
            default_window: Duration::from_secs(60),
            max_hold: Duration::from_secs(60),
            quota_hold: Duration::from_secs(60),
            unknown_spread: Duration::from_secs(1),
            same_window_slack: Duration::from_secs(1),
            max_scopes: 4096,
            idle: Duration::from_secs(15 * 60),
        }
    }
}

impl RateLimitConfig {
    fn params(&self) -> Params {
        Params {
            default_reset: ns(self.default_reset),
            default_window: ns(self.default_window).max(1),
            max_hold: ns(self.max_hold),
            quota_hold: ns(self.quota_hold),
            unknown_spread: ns(self.unknown_spread),
            same_window_slack: ns(self.same_window_slack),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    observed: AtomicU64,
    rate_limited: AtomicU64,
    quota_exhausted: AtomicU64,
    malformed_headers: AtomicU64,
    admitted: AtomicU64,
    paced_waits: AtomicU64,
    stops_rate_limited: AtomicU64,
    stops_quota: AtomicU64,
    concurrency_holds: AtomicU64,
    concurrency_cuts: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Provider rate limits for every scope the process talks to.
///
/// The cycle: [`RateLimits::admit`] before each attempt, then
/// [`RateLimits::settle`] with the response's [`Reading`]. Time is the engine's monotonic clock in nanoseconds, passed
/// in; randomness comes from the caller's RNG. An admission costs one map
/// lookup and one short lock of its scope's state.
#[derive(Debug)]
pub struct RateLimits {
    cfg: RateLimitConfig,
    pub(super) params: Params,
    pub(super) scopes: Registry<ScopeCell>,
    counters: Counters,
    /// Scopes with new evidence since a fleet last looked (`fleet.rs`).
    pub(super) changes: Changes,
}

impl Default for RateLimits {
    fn default() -> Self {
        RateLimits::new(RateLimitConfig::default())
    }
}

/// Units an attempt needs per kind: one request, and the caller's token
/// estimate (input + max output for the combined limit). Unknown is zero.
fn costs(t: TokenEstimate) -> [u64; 4] {
    let (i, o) = (t.input.unwrap_or(0), t.max_output.unwrap_or(0));
    [1, i.saturating_add(o), i, o]
}

impl RateLimits {
    /// An empty table.
    pub fn new(cfg: RateLimitConfig) -> Self {
        RateLimits {
            params: cfg.params(),
            cfg,
            scopes: Registry::new(),
            counters: Counters::default(),
            changes: Changes::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RateLimitConfig {
        &self.cfg
    }

    /// Scopes tracked now.
    pub fn scopes(&self) -> usize {
        self.scopes.len()
    }

    /// Takes a reading for `scope` that belongs to no admitted attempt, at
    /// `now` (monotonic ns); it is taken as the newest. A response to an
    /// admitted attempt goes to [`RateLimits::settle`] instead.
    pub fn observe(&self, scope: &str, reading: &Reading, now: u64) {
        if let Some(cell) = self.cell_for(scope, reading, now) {
            cell.value.state.lock().observe(reading, now, now, &self.params);
        }
    }

    /// Counts a reading and finds (or, when it says anything, makes) its scope's state.
    fn cell_for(&self, scope: &str, reading: &Reading, now: u64) -> Option<Cell> {
        self.count(reading);
        if reading.is_empty() {
            // Nothing to learn; only a quota hold to end, if the scope has one.
            return self.scopes.get(scope);
        }
        let cell = self.cell(scope, now);
        cell.value.set_live();
        self.changes.mark(scope);
        Some(cell)
    }

    fn count(&self, reading: &Reading) {
        let c = &self.counters;
        bump(&c.observed, 1);
        bump(&c.malformed_headers, reading.problems() as u64);
        if reading.quota_exhausted {
            bump(&c.quota_exhausted, 1);
        } else if reading.rate_limited {
            bump(&c.rate_limited, 1);
        }
    }

    /// The state of `scope`, made if absent (the engine resolves it once per
    /// upstream and keeps it with the upstream's other cells).
    pub(crate) fn cell(&self, scope: &str, now: u64) -> Cell {
        let (max, idle) = (self.cfg.max_scopes, ns(self.cfg.idle) / 1_000_000);
        self.scopes
            .get_or_insert(scope, now / 1_000_000, max, idle, ScopeCell::default)
    }

    /// [`RateLimits::observe`] on a scope's state already at hand, for the
    /// response to an attempt sent at `sent` without a reservation (its
    /// scope was blank): the provider produced it between `sent` and `now`.
    pub(crate) fn observe_in(&self, cell: &Cell, reading: &Reading, sent: u64, now: u64) {
        self.count(reading);
        if !reading.is_empty() {
            cell.value.set_live();
            self.changes.mark(&cell.key);
            cell.value
                .state
                .lock()
                .observe(reading, sent.min(now), now, &self.params);
        }
    }

    /// [`RateLimits::settle`] on a scope's state already at hand (the one
    /// the reservation was made in).
    pub(crate) fn settle_in(&self, cell: &Cell, reservation: Reservation, reading: &Reading, usage: Usage, now: u64) {
        let (own, costs, sent) = reservation.into_parts();
        self.count(reading);
        if !reading.is_empty() {
            cell.value.set_live();
            self.changes.mark(&cell.key);
        }
        let confirmed = Kind::ALL.map(|k| reading.confirms(k));
        let consumed = usage.consumed(costs);
        let mut st = cell.value.state.lock();
        st.observe(reading, sent, now, &self.params);
        match &own {
            Some(o) if !Arc::ptr_eq(o, cell) => {
                drop(st);
                o.value.state.lock().settle(costs, confirmed, consumed, now);
            }
            _ => st.settle(costs, confirmed, consumed, now),
        }
    }

    /// Decides whether an attempt in `scope` may be sent at `now`.
    ///
    /// `tokens` is the caller's estimate (input, max output) to reserve
    /// against token limits; `time_left` is how long the call may still wait
    /// (its deadline less the minimum attempt window); `ticket` is the one a
    /// previous [`Admission::Wait`] of this call returned. A wait that does
    /// not fit `time_left` less the scope's smoothed answer time (what its
    /// attempt then needs to be answered) and 20 ms (a timer may wake late) stops with
    /// [`StopWhy::RateLimitedUntil`](super::StopWhy).
    pub fn admit<R: Rng + ?Sized>(
        &self,
        scope: &str,
        now: u64,
        tokens: TokenEstimate,
        time_left: Duration,
        ticket: Option<Ticket>,
        rng: &mut R,
    ) -> Admission {
        // The scope's state is made at its first attempt, so the attempts in
        // flight when its first reading arrives are counted against it.
        let cell = self.cell(scope, now);
        let asker = Asker {
            remaining: time_left,
            min_attempt: Duration::ZERO,
            hedge: false,
        };
        self.admit_in(&cell, now, tokens, asker, ticket, rng)
    }

    /// [`RateLimits::admit`] on a scope's state already at hand, for a call
    /// with `remaining` until its deadline whose attempts need at least
    /// `min_attempt`: a wait must leave the longer of that and the scope's
    /// smoothed answer time, and [`WAKE_SLACK`] for its sleeper to wake late.
    pub(crate) fn admit_in<R: Rng + ?Sized>(
        &self,
        cell: &Cell,
        now: u64,
        tokens: TokenEstimate,
        Asker {
            remaining,
            min_attempt,
            hedge,
        }: Asker,
        ticket: Option<Ticket>,
        rng: &mut R,
    ) -> Admission {
        // A ticket of another scope (the call moved on) is dropped before this
        // scope is locked: it locks its own.
        let ticket = ticket.filter(|t| t.is_for(cell));
        let costs = costs(tokens);
        let (decision, kept) = {
            let mut st = cell.value.state.lock();
            let p = &self.params;
            let left = ns(remaining)
                .saturating_sub(ns(min_attempt).max(st.answer.needed()))
                .saturating_sub(WAKE_SLACK);
            match ticket {
                Some(t) => match st.hold_ticket(t.promises(), costs, now, left, p, rng) {
                    Some(d @ Decision::Wait { .. }) => (d, Some(t)),
                    Some(d) => {
                        t.redeem(&mut st);
                        (d, None)
                    }
                    None => {
                        t.redeem(&mut st);
                        (st.decide(now, costs, left, Caller::Holder, p, rng), None)
                    }
                },
                None => {
                    let caller = if hedge { Caller::Hedge } else { Caller::Newcomer };
                    (st.decide(now, costs, left, caller, p, rng), None)
                }
            }
        };
        match decision {
            Decision::Go => {
                bump(&self.counters.admitted, 1);
                Admission::Go(Reservation::new(cell.clone(), costs, now))
            }
            Decision::Wait { wait, promises, slots } => {
                bump(&self.counters.paced_waits, 1);
                Admission::Wait {
                    wait: Duration::from_nanos(wait),
                    ticket: kept.unwrap_or_else(|| Ticket::new(cell.clone(), promises, slots)),
                }
            }
            Decision::Stop(why) => {
                let c = match why {
                    super::StopWhy::QuotaExhausted => &self.counters.stops_quota,
                    super::StopWhy::RateLimitedUntil(_) => &self.counters.stops_rate_limited,
                };
                bump(c, 1);
                Admission::Stop(why)
            }
        }
    }

    /// Takes the response to an admitted attempt in `scope` at `now`, and
    /// ends its reservation. `reading` is the response's (empty when there was
    /// no response): kinds whose remaining it states count the attempt from
    /// now on; for the others the attempt's `usage` (its estimate where usage
    /// is unknown) stays counted until the window resets. Call it once per
    /// admitted attempt, whatever the outcome (a response that is no refusal
    /// also ends a quota hold).
    pub fn settle(&self, scope: &str, reservation: Reservation, reading: &Reading, usage: Usage, now: u64) {
        let (own, costs, sent) = reservation.into_parts();
        let confirmed = Kind::ALL.map(|k| reading.confirms(k));
        let consumed = usage.consumed(costs);
        let target = self.cell_for(scope, reading, now);
        match (&target, &own) {
            // One lock: no other caller sees the reading without the settlement.
            (Some(t), Some(o)) if Arc::ptr_eq(t, o) => {
                let mut st = t.value.state.lock();
                st.observe(reading, sent, now, &self.params);
                st.settle(costs, confirmed, consumed, now);
            }
            _ => {
                if let Some(t) = &target {
                    t.value.state.lock().observe(reading, sent, now, &self.params);
                }
                if let Some(o) = &own {
                    o.value.state.lock().settle(costs, confirmed, consumed, now);
                }
            }
        }
    }

    /// Every tracked scope's limits at `now`, sorted by scope, with the counters.
    pub fn snapshot(&self, now: u64) -> RateLimitSnapshot {
        let mut scopes = Vec::new();
        self.scopes.for_each(|slot| {
            let mut st = slot.value.state.lock().clone();
            st.roll(now, &self.params);
            let kinds: Vec<KindSnapshot> = Kind::ALL
                .iter()
                .zip(&st.kinds)
                .filter(|(_, k)| !k.is_blank())
                .map(|(&kind, k)| KindSnapshot {
                    kind,
                    limit: k.limit,
                    remaining: k.remaining,
                    available: k.available(),
                    reset_in: k
                        .remaining
                        .map(|_| Duration::from_nanos(k.reset_at.saturating_sub(now))),
                    in_flight: k.in_flight,
                })
                .collect();
            let quota_exhausted = st.quota_until.is_some_and(|u| now < u);
            let concurrency = slot.value.gate_if_any().map(|g| ConcurrencySnapshot {
                limit: g.aimd.limit(),
                in_flight: g.aimd.in_flight(),
                cuts: g.aimd.cuts(),
                mean_hold: g.mean_hold(),
            });
            if !kinds.is_empty() || quota_exhausted || concurrency.is_some() {
                scopes.push(ScopeSnapshot {
                    scope: slot.key.to_string(),
                    kinds,
                    quota_exhausted,
                    concurrency,
                });
            }
        });
        scopes.sort_by(|a, b| a.scope.cmp(&b.scope));
        RateLimitSnapshot {
            scopes,
            counters: self.counters(),
        }
    }

    /// Counts an attempt held by its scope's adaptive concurrency gate.
    pub(crate) fn count_hold(&self) {
        bump(&self.counters.concurrency_holds, 1);
    }

    /// Counts a cut of a scope's adaptive concurrency limit.
    pub(crate) fn count_cut(&self) {
        bump(&self.counters.concurrency_cuts, 1);
    }

    /// The counters alone (cheap: no scope is visited).
    pub fn counters(&self) -> RateLimitCounters {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RateLimitCounters {
            observed: g(&c.observed),
            rate_limited: g(&c.rate_limited),
            quota_exhausted: g(&c.quota_exhausted),
            malformed_headers: g(&c.malformed_headers),
            admitted: g(&c.admitted),
            paced_waits: g(&c.paced_waits),
            stops_rate_limited: g(&c.stops_rate_limited),
            stops_quota: g(&c.stops_quota),
            concurrency_holds: g(&c.concurrency_holds),
            concurrency_cuts: g(&c.concurrency_cuts),
        }
    }
}
