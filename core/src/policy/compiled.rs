//! A policy compiled for the hot path: its values in the units a call's
//! steps compute with, worked out once per policy version instead of on
//! every call.

use super::{FallbackMode, Policy, Route};
use crate::clock::Nanos;

/// A timeout given as "half of the time left" (`first_byte_ms` /
/// `first_token_ms` null) in the compiled fixed timeouts.
pub(crate) const HALF: u64 = 0;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Compiled {
    /// `min_attempt_ms`.
    pub(crate) min_attempt: Nanos,
    /// `deadline_ms`.
    pub(crate) deadline: Nanos,
    /// Any concurrency gate or priority pool configured.
    pub(crate) gated: bool,
    /// Propagation safety margin, ms.
    pub(crate) margin_ms: u32,
    /// `timeouts` (connect, first byte, idle; ms), for attempts without a token-based timeout.
    pub(crate) fixed_timeouts_ms: [u64; 4],
    /// `timeouts.attempt_ms`; `u64::MAX` when unset.
    pub(crate) attempt_cap_ms: u64,
    /// The route of a call whose `route` names an upstream rather than a policy route.
    pub(crate) adhoc: Route,
    /// No feature the policy uses keeps calls off the fast lane
    /// (throttling, gates, a cap on retries in flight, adaptive concurrency, a test hook).
    pub(crate) lane: bool,
    /// Every rate-limit scope has an adaptive concurrency gate: `rate_limits`
    /// and its `concurrency` are enabled (`Version::aimd` holds its bounds).
    pub(crate) aimd: bool,
    /// `rate_limits.concurrency.hold_max_ms`.
    pub(crate) hold_max_ms: u64,
}

impl Compiled {
    pub(crate) fn new(policy: &Policy) -> Self {
        let gated = policy.concurrency.max_first_attempts.is_some()
            || policy.concurrency.max_retries.is_some()
            || !policy.concurrency.pools.is_empty();
        let rl = &policy.rate_limits;
        let aimd = rl.enabled && rl.concurrency.enabled;
        Compiled {
            adhoc: Route {
                fallback: FallbackMode::Forbidden,
                attempts_per_upstream: policy.max_attempts,
                ..Route::default()
            },
            min_attempt: Nanos::from_ms(policy.min_attempt_ms),
            deadline: Nanos::from_ms(policy.deadline_ms),
            gated,
            margin_ms: policy.propagation.safety_margin_ms.min(u32::MAX as u64) as u32,
            fixed_timeouts_ms: [
                policy.timeouts.connect_ms,
                policy.timeouts.first_byte_ms.unwrap_or(HALF),
                policy.timeouts.first_token_ms.unwrap_or(HALF),
                policy.timeouts.idle_ms,
            ],
            attempt_cap_ms: policy.timeouts.attempt_ms.unwrap_or(u64::MAX),
            // Every attempt in a gated scope takes a place: the general path's work.
            lane: !policy.throttle.enabled
                && !gated
                && !aimd
                && no_test_hook(policy)
                && policy.budget.max_concurrent_retries.is_none(),
            aimd,
            hold_max_ms: rl.concurrency.hold_max_ms,
        }
    }
}

/// True unless the policy sets a test hook (calls then take the general path, where the hook is).
fn no_test_hook(_policy: &Policy) -> bool {
    #[cfg(feature = "test-hooks")]
    let none = _policy.testing.panic_on_vendor_code.is_none();
    #[cfg(not(feature = "test-hooks"))]
    let none = true;
    none
}
