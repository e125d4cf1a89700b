//! One upstream's shared state under one policy version, resolved once: its
//! counters, its breaker cell and the budget cells of every scope that
//! depends only on the upstream. A call looks this up once instead of
//! building scope keys and searching three registries on every attempt.
//!
//! The cells themselves live in the engine's registries (they outlive
//! reloads); this is a cache of pointers to them. It is rebuilt when any
//! cell it points to was evicted, so a cached pointer never diverges from
//! the registry for long.

use crate::guards::breaker::BreakerCell;
use crate::guards::budget::BudgetCell;
use crate::hash::{fnv, splitmix};
use crate::policy::{BreakerOverride, ScopeDim};
use crate::state::first_token::FirstTokenCell;
use crate::state::ratelimit::Cell;
use crate::state::registry::Slot;
use crate::state::scope::{breaker_override, display_key, rate_scope, scope_key};
use crate::state::version::Version;
use crate::stats::CounterSet;
use crate::telemetry::ring::{pack, plain_names, Packed};
use smallvec::SmallVec;
use std::sync::Arc;

/// A budget scope of an upstream: a cell resolved once, or a scope that
/// depends on the call (tenant, priority, operation), resolved per call.
#[derive(Debug)]
pub(crate) enum BudgetScope {
    Fixed(Arc<Slot<BudgetCell>>),
    PerCall(usize),
}

/// How an upstream's breaker is found.
#[derive(Debug)]
pub(crate) enum BreakerRef {
    /// Breakers off, or this upstream's breaker disabled by an override.
    None,
    /// One cell for every call to the upstream.
    Fixed(Arc<Slot<BreakerCell>>, Option<BreakerOverride>),
    /// The scope depends on the call.
    PerCall,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct UpstreamState {
    pub(crate) counters: Arc<Slot<CounterSet>>,
    /// Its learned time to first token (`state/first_token.rs`).
    pub(crate) first_token: Arc<Slot<FirstTokenCell>>,
    pub(crate) breaker: BreakerRef,
    pub(crate) budgets: SmallVec<[BudgetScope; 1]>,
    /// The provider rate-limit state of the upstream's scope
    /// (`scope::rate_scope`): blank, and never consulted, until a response
    /// says something about the limits.
    pub(crate) rate: Cell,
    /// The upstream's name as event records store it, packed once.
    pub(crate) packed: Option<Packed>,
    /// Word 9 of a plain attempt start to this upstream ([`crate::telemetry::ring::plain_names`]).
    pub(crate) plain_names: u64,
}

/// True when the scope key of `dims` depends on the call, not only on the upstream.
pub(crate) fn per_call(dims: &[ScopeDim]) -> bool {
    dims.iter()
        .any(|d| matches!(d, ScopeDim::Tenant | ScopeDim::Priority | ScopeDim::Operation))
}

impl UpstreamState {
    /// Resolves `upstream`'s cells under `pol`, creating the missing ones.
    pub(crate) fn resolve(pol: &Version, upstream: &str, now_ms: u64) -> Self {
        let p = &pol.policy;
        let sh = &pol.shared;
        let (max_keys, idle) = (p.limits.max_keys, p.limits.idle_ms);
        let counters = sh
            .upstream_stats
            .get_or_insert(upstream, now_ms, max_keys, idle, CounterSet::default);
        let first_token = sh
            .first_tokens
            .get_or_insert(upstream, now_ms, max_keys, idle, FirstTokenCell::default);
        let breaker = if !p.breaker.enabled {
            BreakerRef::None
        } else if per_call(&p.breaker.scope) {
            BreakerRef::PerCall
        } else {
            let key = scope_key(&p.breaker.scope, upstream, p, None, None, None);
            // Overrides name the key as users see it (`openai/gpt-4o/us`), without its dimension tag.
            match breaker_override(p, display_key(&key), upstream) {
                Some(BreakerOverride::Disabled) => BreakerRef::None,
                ovr => BreakerRef::Fixed(pol.breaker_cell(&key, now_ms), ovr),
            }
        };
        let budgets = if p.budget.enabled {
            p.budget
                .scopes
                .iter()
                .enumerate()
                .map(|(i, dims)| {
                    if per_call(dims) {
                        BudgetScope::PerCall(i)
                    } else {
                        BudgetScope::Fixed(pol.budget_cell(&scope_key(dims, upstream, p, None, None, None), now_ms))
                    }
                })
                .collect()
        } else {
            SmallVec::new()
        };
        let packed = pack(upstream);
        let rate = sh
            .ratelimits
            .cell(&rate_scope(p, upstream), now_ms.saturating_mul(1_000_000));
        UpstreamState {
            rate,
            plain_names: packed.as_ref().map_or(0, |p| plain_names(sh.id_prefix, p)),
            packed,
            counters,
            first_token,
            breaker,
            budgets,
        }
    }

    /// Marks every cell this points to as used (they are not looked up again while cached).
    #[inline]
    pub(crate) fn touch(&self, now_ms: u64) {
        self.counters.touch(now_ms);
        self.first_token.touch(now_ms);
        self.rate.touch(now_ms);
        if let BreakerRef::Fixed(c, _) = &self.breaker {
            c.touch(now_ms);
        }
        for b in &self.budgets {
            if let BudgetScope::Fixed(c) = b {
                c.touch(now_ms);
            }
        }
    }

    /// True when a cell this points to was evicted from its registry.
    pub(crate) fn is_stale(&self) -> bool {
        self.counters.is_evicted()
            || self.first_token.is_evicted()
            || self.rate.is_evicted()
            || matches!(&self.breaker, BreakerRef::Fixed(c, _) if c.is_evicted())
            || self
                .budgets
                .iter()
                .any(|b| matches!(b, BudgetScope::Fixed(c) if c.is_evicted()))
    }
}

/// The deterministic jitter seed of the breaker for `key`.
pub(crate) fn breaker_seed(engine_seed: u64, key: &str) -> u64 {
    splitmix(engine_seed ^ fnv(key))
}

/// An upstream's shared state, as a call holds it.
pub(crate) type Up = Arc<Slot<UpstreamState>>;
