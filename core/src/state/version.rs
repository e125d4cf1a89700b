//! One policy version as calls see it: the policy, compiled
//! (`policy/compiled.rs`), with the classifier, the guards' parameters and
//! the upstreams' shared state resolved under it. A reload swaps in a new one; calls begun under the old one
//! finish with it.

use crate::clock::Nanos;
use crate::guards::breaker::{BreakerCell, BreakerParams};
use crate::guards::budget::{BudgetCell, BudgetParams};
use crate::guards::throttle::ThrottleParams;
use crate::policy::{Compiled, Policy};
use crate::rules::classify::Classifier;
use crate::rules::deadline::{attempt_timeouts, TimeoutsMs, TokenEstimate};
use crate::state::ratelimit::AimdConfig;
use crate::state::registry::{Registry, Slot};
use crate::state::scope::display_key;
use crate::state::shared::Shared;
use crate::state::upstream::{breaker_seed, BreakerRef, BudgetScope, Up, UpstreamState};
use crate::stats::VersionStats;
use std::sync::Arc;

/// See the module documentation.
pub(crate) struct Version {
    pub(crate) policy: Policy,
    /// The policy's values in the units calls compute with.
    pub(crate) compiled: Compiled,
    pub(crate) shared: Arc<Shared>,
    pub(crate) generation: u64,
    pub(crate) version: Arc<str>,
    /// Index of `version` in the event bus's name table.
    pub(crate) version_idx: u32,
    pub(crate) version_stats: Arc<VersionStats>,
    pub(crate) classifier: Classifier,
    pub(crate) budget: BudgetParams,
    pub(crate) breaker: BreakerParams,
    pub(crate) throttle: ThrottleParams,
    /// Per-upstream state under this version.
    pub(crate) upstreams: Registry<UpstreamState>,
    /// Calls may take the fast lane (`call/lane.rs`): the engine allows it
    /// and no feature of the policy keeps them off it.
    pub(crate) lane: bool,
    /// The bounds of every rate-limit scope's adaptive concurrency gate, when
    /// `rate_limits` and its `concurrency` are enabled.
    pub(crate) aimd: Option<AimdConfig>,
}

impl std::fmt::Debug for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Version")
            .field("version", &self.version)
            .field("generation", &self.generation)
            .finish()
    }
}

impl Version {
    pub(crate) fn new(policy: Policy, shared: Arc<Shared>, generation: u64) -> Self {
        let compiled = Compiled::new(&policy);
        let c = &policy.rate_limits.concurrency;
        let aimd = compiled.aimd.then(|| AimdConfig {
            initial: c.initial.unwrap_or(c.max),
            floor: c.min,
            ceiling: c.max,
            grow_after: c.grow_after,
        });
        Version {
            aimd,
            version_stats: shared.versions.get(&policy.version),
            version_idx: shared.bus.version_index(&policy.version),
            version: Arc::from(policy.version.as_str()),
            classifier: Classifier::new(&policy.classify, &policy.retry),
            budget: BudgetParams::new(&policy.budget),
            breaker: BreakerParams::new(&policy.breaker),
            throttle: ThrottleParams::new(&policy.throttle),
            upstreams: Registry::new(),
            lane: shared.lane && compiled.lane,
            compiled,
            generation,
            shared,
            policy,
        }
    }

    /// Whether calls to an upstream with state `up` may take the fast lane:
    /// the policy allows it, and the upstream's breaker and budget cells are
    /// resolved once for every call (no override, no per-call scope).
    pub(crate) fn lane_for(&self, up: &UpstreamState) -> bool {
        self.lane
            && matches!(up.breaker, BreakerRef::None | BreakerRef::Fixed(_, None))
            && up.budgets.iter().all(|b| matches!(b, BudgetScope::Fixed(_)))
    }

    /// One attempt's timeouts (see [`attempt_timeouts`]), without recomputing the policy's durations.
    #[inline(always)]
    pub(crate) fn timeouts(&self, remaining: Nanos, tokens: TokenEstimate) -> TimeoutsMs {
        if self.policy.timeouts.dynamic.is_some() && (tokens.input.is_some() || tokens.max_output.is_some()) {
            return TimeoutsMs::of(&attempt_timeouts(&self.policy.timeouts, remaining.dur(), tokens));
        }
        let c = &self.compiled;
        TimeoutsMs::clamped(&c.fixed_timeouts_ms, remaining.ms().min(c.attempt_cap_ms))
    }

    /// The shared state of `upstream` under this version.
    pub(crate) fn upstream(&self, upstream: &str, now_ms: u64) -> Up {
        let l = &self.policy.limits;
        let s = self
            .upstreams
            .get_or_insert(upstream, now_ms, l.max_keys, l.idle_ms, || {
                UpstreamState::resolve(self, upstream, now_ms)
            });
        if !s.value.is_stale() {
            s.value.touch(now_ms);
            return s;
        }
        let fresh = UpstreamState::resolve(self, upstream, now_ms);
        self.upstreams.replace(upstream, now_ms, l.max_keys, l.idle_ms, fresh)
    }

    /// The breaker cell for registry key `key`; a cell whose window cannot
    /// hold this version's window is replaced, keeping its state.
    pub(crate) fn breaker_cell(&self, key: &str, now_ms: u64) -> Arc<Slot<BreakerCell>> {
        let l = &self.policy.limits;
        let sh = &self.shared;
        let cell = sh.breakers.get_or_insert(key, now_ms, l.max_keys, l.idle_ms, || {
            BreakerCell::new(self.breaker.clone(), breaker_seed(sh.seed, display_key(key)))
        });
        if cell.value.fits(&self.breaker) {
            return cell;
        }
        let next = cell.value.carry_over(self.breaker.clone(), now_ms);
        sh.breakers.replace(key, now_ms, l.max_keys, l.idle_ms, next)
    }

    /// The budget cell for registry key `key`; a cell with another bucket count restarts fresh.
    pub(crate) fn budget_cell(&self, key: &str, now_ms: u64) -> Arc<Slot<BudgetCell>> {
        let l = &self.policy.limits;
        let sh = &self.shared;
        let cell = sh
            .budgets
            .get_or_insert(key, now_ms, l.max_keys, l.idle_ms, || BudgetCell::new(self.budget));
        if cell.value.fits(&self.budget) {
            return cell;
        }
        sh.budgets
            .replace(key, now_ms, l.max_keys, l.idle_ms, BudgetCell::new(self.budget))
    }
}
