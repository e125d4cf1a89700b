//! Adaptive concurrency per rate-limit scope: AIMD (additive increase,
//! multiplicative decrease) on the number of attempts in flight.
//!
//! - **Decrease**: a 429 without quota exhaustion, or an overload (529, 503
//!   `overloaded_error`), halves the limit — from the concurrency actually in
//!   use when it came (halving an unused ceiling of 1024 while 10 are in flight
//!   would change nothing) — down to the floor. Attempts that were already in
//!   flight when the limit was cut belong to the same congestion event: their
//!   refusals do not cut it again (each [`Permit`] carries the generation it
//!   was issued in, as TCP cuts its window once per round trip).
//! - **Increase**: +1 after `grow_after` successes (default: as many as the
//!   current limit, i.e. one window's worth — TCP's congestion avoidance),
//!   only while the limit is in use (at least half of it in flight), up to the
//!   ceiling, so an idle upstream does not accumulate a limit it never proved.
//! - Quota exhaustion, client errors and cancellations say nothing about
//!   capacity ([`Feedback::Neutral`]).
//!
//! Lock-free: one compare-and-swap to acquire, one to release. The limit and
//! its generation share one atomic word, so a cut and its generation move
//! together. Starting at the ceiling, the gate refuses nothing until the
//! first refusal. Its bounds may change while it runs ([`AdaptiveConcurrency::conform`]:
//! a policy reload).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// AIMD knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AimdConfig {
    /// Limit at start. Default: the ceiling (no limit until the first refusal).
    pub initial: u32,
    /// Lowest limit. Default 1: a refused upstream still gets one attempt at a time.
    pub floor: u32,
    /// Highest limit. Default 1024.
    pub ceiling: u32,
    /// Successes per +1; `None` = the current limit (one window).
    pub grow_after: Option<u32>,
}

impl Default for AimdConfig {
    fn default() -> Self {
        AimdConfig {
            initial: 1024,
            floor: 1,
            ceiling: 1024,
            grow_after: None,
        }
    }
}

/// How an attempt ended, for the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feedback {
    /// A response that was not a refusal.
    Success,
    /// A 429 without quota exhaustion.
    RateLimited,
    /// The upstream said it is overloaded (529, `overloaded_error`).
    Overloaded,
    /// Nothing about capacity (quota exhausted, client error, cancelled).
    Neutral,
}

/// One attempt's place in flight; give it back with [`AdaptiveConcurrency::release`].
#[must_use = "a permit not released keeps its slot in flight"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permit {
    generation: u32,
}

/// The in-flight limit of one rate-limit scope.
#[derive(Debug)]
pub struct AdaptiveConcurrency {
    /// High 32 bits: generation (cuts so far); low 32 bits: the limit.
    state: AtomicU64,
    in_flight: AtomicU32,
    successes: AtomicU32,
    cuts: AtomicU64,
    /// The bounds, as [`AdaptiveConcurrency::conform`] last set them (`grow_after` 0 = one window).
    initial: AtomicU32,
    floor: AtomicU32,
    ceiling: AtomicU32,
    grow_after: AtomicU32,
}

fn pack(generation: u32, limit: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(limit)
}

fn unpack(s: u64) -> (u32, u32) {
    ((s >> 32) as u32, s as u32)
}

/// A floor of at least 1, a ceiling of at least the floor, `initial` between them, `grow_after` at least 1.
fn normalised(cfg: AimdConfig) -> AimdConfig {
    let floor = cfg.floor.max(1);
    let ceiling = cfg.ceiling.max(floor);
    AimdConfig {
        initial: cfg.initial.clamp(floor, ceiling),
        floor,
        ceiling,
        grow_after: cfg.grow_after.map(|n| n.max(1)),
    }
}

impl AdaptiveConcurrency {
    /// A limit at `cfg.initial`, kept within `[floor, ceiling]` (a floor of 0 is 1).
    pub fn new(cfg: AimdConfig) -> Self {
        let cfg = normalised(cfg);
        AdaptiveConcurrency {
            state: AtomicU64::new(pack(0, cfg.initial)),
            in_flight: AtomicU32::new(0),
            successes: AtomicU32::new(0),
            cuts: AtomicU64::new(0),
            initial: AtomicU32::new(cfg.initial),
            floor: AtomicU32::new(cfg.floor),
            ceiling: AtomicU32::new(cfg.ceiling),
            grow_after: AtomicU32::new(cfg.grow_after.unwrap_or(0)),
        }
    }

    /// The bounds in force ([`AdaptiveConcurrency::new`] normalises them).
    pub fn config(&self) -> AimdConfig {
        let grow_after = self.grow_after.load(Ordering::Relaxed);
        AimdConfig {
            initial: self.initial.load(Ordering::Relaxed),
            floor: self.floor.load(Ordering::Relaxed),
            ceiling: self.ceiling.load(Ordering::Relaxed),
            grow_after: (grow_after > 0).then_some(grow_after),
        }
    }

    /// Adopts `cfg` when it differs from the bounds in force (a few loads
    /// when it does not). A limit never cut starts over at the new `initial`;
    /// a limit learned from refusals is kept, within the new bounds.
    pub fn conform(&self, cfg: &AimdConfig) {
        let cfg = normalised(*cfg);
        if self.config() == cfg {
            return;
        }
        self.initial.store(cfg.initial, Ordering::Relaxed);
        self.floor.store(cfg.floor, Ordering::Relaxed);
        self.ceiling.store(cfg.ceiling, Ordering::Relaxed);
        self.grow_after.store(cfg.grow_after.unwrap_or(0), Ordering::Relaxed);
        let never_cut = self.cuts() == 0;
        let _ = self.state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
            let (generation, limit) = unpack(s);
            let next = if never_cut {
                cfg.initial
            } else {
                limit.clamp(cfg.floor, cfg.ceiling)
            };
            Some(pack(generation, next))
        });
    }

    /// Takes a place if fewer than the limit are in flight.
    pub fn try_acquire(&self) -> Option<Permit> {
        let (generation, limit) = unpack(self.state.load(Ordering::Acquire));
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| (v < limit).then_some(v + 1))
            .ok()
            .map(|_| Permit { generation })
    }

    /// Gives a place back, adjusting the limit by how the attempt ended;
    /// true when this release cut the limit.
    pub fn release(&self, permit: Permit, feedback: Feedback) -> bool {
        let before = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1))
            .unwrap_or(0);
        match feedback {
            Feedback::Success => {
                self.grow(before);
                false
            }
            Feedback::RateLimited | Feedback::Overloaded => self.cut(permit, before),
            Feedback::Neutral => false,
        }
    }

    fn grow(&self, in_flight: u32) {
        let s = self.state.load(Ordering::Acquire);
        let (generation, limit) = unpack(s);
        if limit >= self.ceiling.load(Ordering::Relaxed) || in_flight.saturating_mul(2) < limit {
            return;
        }
        let need = match self.grow_after.load(Ordering::Relaxed) {
            0 => limit.max(1),
            n => n,
        };
        let n = self.successes.fetch_add(1, Ordering::AcqRel).saturating_add(1);
        if n < need {
            return;
        }
        if self
            .state
            .compare_exchange(s, pack(generation, limit + 1), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let _ = self
                .successes
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(need)));
        }
    }

    fn cut(&self, permit: Permit, in_flight: u32) -> bool {
        let s = self.state.load(Ordering::Acquire);
        let (generation, limit) = unpack(s);
        if permit.generation != generation {
            return false;
        }
        let used = limit.min(in_flight.max(1));
        let next = pack(
            generation.wrapping_add(1),
            (used / 2).max(self.floor.load(Ordering::Relaxed)),
        );
        if self
            .state
            .compare_exchange(s, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.successes.store(0, Ordering::Release);
            self.cuts.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// The current limit.
    pub fn limit(&self) -> u32 {
        unpack(self.state.load(Ordering::Acquire)).1
    }

    /// Attempts in flight.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Times the limit was cut.
    pub fn cuts(&self) -> u64 {
        self.cuts.load(Ordering::Relaxed)
    }
}

impl Default for AdaptiveConcurrency {
    fn default() -> Self {
        AdaptiveConcurrency::new(AimdConfig::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    fn cfg(initial: u32, floor: u32, ceiling: u32, grow_after: Option<u32>) -> AimdConfig {
        AimdConfig {
            initial,
            floor,
            ceiling,
            grow_after,
        }
    }

    #[test]
    fn a_429_halves_the_concurrency_in_use_once_per_generation() {
        let g = AdaptiveConcurrency::default();
        let permits: Vec<Permit> = (0..10).map(|_| g.try_acquire().unwrap()).collect();
        assert_eq!((g.limit(), g.in_flight()), (1024, 10));
        // Ten in flight when the first 429 comes: the limit becomes 5, not 512.
        g.release(permits[0], Feedback::RateLimited);
        assert_eq!((g.limit(), g.cuts()), (5, 1));
        // The other nine were issued before the cut: same congestion event.
        for p in &permits[1..] {
            g.release(*p, Feedback::RateLimited);
        }
        assert_eq!((g.limit(), g.cuts(), g.in_flight()), (5, 1, 0));
        // A permit of the new generation cuts again.
        let p = g.try_acquire().unwrap();
        let q = g.try_acquire().unwrap();
        g.release(p, Feedback::Overloaded);
        assert_eq!(g.limit(), 1, "two in flight, halved");
        g.release(q, Feedback::Overloaded);
        assert_eq!((g.limit(), g.cuts()), (1, 2));
        // At the limit, no more places.
        let p = g.try_acquire().unwrap();
        assert!(g.try_acquire().is_none());
        g.release(p, Feedback::Neutral);
        assert_eq!((g.limit(), g.in_flight()), (1, 0));
    }

    #[test]
    fn successes_grow_the_limit_by_one_per_window_while_it_is_used() {
        let g = AdaptiveConcurrency::new(cfg(4, 1, 6, None));
        let round = |g: &AdaptiveConcurrency| {
            let ps: Vec<Permit> = (0..4).map(|_| g.try_acquire().unwrap()).collect();
            for p in ps {
                g.release(p, Feedback::Success);
            }
        };
        round(&g);
        assert_eq!(
            g.limit(),
            4,
            "three successes counted: the last came with one of four in flight"
        );
        round(&g);
        assert_eq!(g.limit(), 5);
        // Successes with one in flight (limit 5 not in use): no growth.
        for _ in 0..50 {
            let p = g.try_acquire().unwrap();
            g.release(p, Feedback::Success);
        }
        assert_eq!(g.limit(), 5);
        // Fixed N: +1 every 2 successes in use, up to the ceiling.
        let g = AdaptiveConcurrency::new(cfg(2, 1, 3, Some(2)));
        for _ in 0..10 {
            let a = g.try_acquire().unwrap();
            let b = g.try_acquire().unwrap();
            g.release(a, Feedback::Success);
            g.release(b, Feedback::Success);
        }
        assert_eq!(g.limit(), 3);
    }

    #[test]
    fn bounds_are_normalised() {
        let g = AdaptiveConcurrency::new(cfg(0, 0, 0, Some(0)));
        assert_eq!(g.limit(), 1);
        let g = AdaptiveConcurrency::new(cfg(100, 4, 8, None));
        assert_eq!(g.limit(), 8);
        let p = g.try_acquire().unwrap();
        g.release(p, Feedback::RateLimited);
        assert_eq!(g.limit(), 4, "never below the floor");
    }

    #[test]
    fn conform_keeps_a_learned_limit_within_the_new_bounds() {
        let g = AdaptiveConcurrency::new(cfg(8, 1, 8, None));
        g.conform(&cfg(8, 1, 8, None));
        assert_eq!(g.limit(), 8, "the same bounds change nothing");
        // Never cut: the limit starts over at the new initial.
        g.conform(&cfg(20, 2, 32, Some(3)));
        assert_eq!((g.limit(), g.config()), (20, cfg(20, 2, 32, Some(3))));
        let ps: Vec<Permit> = (0..6).map(|_| g.try_acquire().unwrap()).collect();
        g.release(ps[0], Feedback::RateLimited);
        assert_eq!(g.limit(), 3, "six in flight, halved");
        for p in &ps[1..] {
            g.release(*p, Feedback::Neutral);
        }
        // Learned: kept, within the new bounds.
        g.conform(&cfg(50, 1, 64, None));
        assert_eq!(g.limit(), 3);
        g.conform(&cfg(50, 5, 64, None));
        assert_eq!(g.limit(), 5, "raised to the new floor");
        g.conform(&cfg(0, 0, 2, None));
        assert_eq!(
            (g.limit(), g.config()),
            (2, cfg(1, 1, 2, None)),
            "lowered to the new ceiling"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire,
        Release(usize, u8),
    }

    proptest! {
        /// Any interleaving of acquires and releases on one thread: the limit
        /// stays in [floor, ceiling], and a place is granted exactly when
        /// fewer than the limit are in flight.
        #[test]
        fn aimd_stays_within_its_bounds(
            floor in 1u32..5, span in 0u32..20, initial in 0u32..40, grow in proptest::option::of(1u32..4),
            ops in proptest::collection::vec(prop_oneof![
                3 => Just(Op::Acquire),
                4 => (any::<usize>(), 0u8..4).prop_map(|(i, f)| Op::Release(i, f)),
            ], 0..300)
        ) {
            let ceiling = floor + span;
            let g = AdaptiveConcurrency::new(cfg(initial, floor, ceiling, grow));
            let mut held: Vec<Permit> = Vec::new();
            for op in ops {
                match op {
                    Op::Acquire => {
                        let (limit, n) = (g.limit(), g.in_flight());
                        let got = g.try_acquire();
                        prop_assert_eq!(got.is_some(), n < limit);
                        held.extend(got);
                    }
                    Op::Release(i, f) if !held.is_empty() => {
                        let p = held.swap_remove(i % held.len());
                        let fb = [Feedback::Success, Feedback::RateLimited, Feedback::Overloaded, Feedback::Neutral][f as usize];
                        g.release(p, fb);
                    }
                    Op::Release(..) => {}
                }
                prop_assert!(g.limit() >= floor && g.limit() <= ceiling, "{} not in [{floor}, {ceiling}]", g.limit());
                prop_assert_eq!(g.in_flight() as usize, held.len());
            }
        }
    }

    #[test]
    fn threads_never_exceed_the_ceiling_and_leave_nothing_in_flight() {
        let g = Arc::new(AdaptiveConcurrency::new(cfg(8, 2, 8, Some(1))));
        let peak = Arc::new(AtomicU32::new(0));
        let handles: Vec<_> = (0..4u32)
            .map(|t| {
                let (g, peak) = (g.clone(), peak.clone());
                std::thread::spawn(move || {
                    for i in 0..20_000u32 {
                        if let Some(p) = g.try_acquire() {
                            peak.fetch_max(g.in_flight(), Ordering::Relaxed);
                            let fb = if (i ^ t) % 97 == 0 {
                                Feedback::RateLimited
                            } else {
                                Feedback::Success
                            };
                            g.release(p, fb);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert!(peak.load(Ordering::Relaxed) <= 8);
        assert_eq!(g.in_flight(), 0);
        assert!((2..=8).contains(&g.limit()));
        assert!(g.cuts() > 0);
    }
}
