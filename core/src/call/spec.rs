//! [`CallSpec`]: what one logical request is, as given to [`crate::Engine::begin`].

use crate::name::IntoName;
use crate::rules::deadline::Inbound;
use crate::rules::route::Needs;
use crate::types::Idempotency;
use smol_str::SmolStr;
use std::time::Duration;

/// What one logical request is, as given to [`crate::Engine::begin`].
///
/// ```
/// use retrywise::{CallSpec, Idempotency};
/// let spec = CallSpec::new("openai/gpt-4o")
///     .deadline_ms(10_000)
///     .idempotency(Idempotency::Safe)
///     .tenant("acme");
/// # let _ = spec;
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallSpec {
    /// A route name from the policy, or an upstream name.
    pub route: SmolStr,
    /// End-to-end deadline from now; the policy's `deadline_ms` when absent.
    pub deadline: Option<Duration>,
    /// Whether repeating is safe. Default `Safe` (pure generation).
    pub idempotency: Idempotency,
    /// Tenant (budgets, gates, counters).
    pub tenant: Option<SmolStr>,
    /// Task (route lookup when `route` names none, eval scores, operation scope).
    pub task: Option<SmolStr>,
    /// Priority pool (e.g. `interactive`, `batch`).
    pub priority: Option<SmolStr>,
    /// Business idempotency key, carried unchanged on every attempt.
    pub idempotency_key: Option<String>,
    /// Digest of the normalized parameters ([`crate::idempotency::params_digest`]); a key reused with another digest is a conflict.
    pub params_digest: Option<String>,
    /// Propagation from an upstream owner (inbound headers or an enclosing call).
    pub inbound: Option<Inbound>,
    /// What any upstream must offer.
    pub needs: Needs,
}

impl CallSpec {
    /// Nothing but the route, deadline, idempotency, tenant, task and key is set.
    #[inline]
    pub(crate) fn is_plain(&self) -> bool {
        self.priority.is_none() && self.params_digest.is_none() && self.inbound.is_none() && self.needs.is_empty()
    }

    /// A spec for `route` with every other field at its default.
    #[inline]
    pub fn new(route: impl IntoName) -> Self {
        CallSpec {
            route: route.into_name(),
            ..CallSpec::default()
        }
    }
    /// Sets the deadline.
    pub fn deadline(mut self, d: Duration) -> Self {
        self.deadline = Some(d);
        self
    }
    /// Sets the deadline in ms.
    pub fn deadline_ms(self, ms: u64) -> Self {
        self.deadline(Duration::from_millis(ms))
    }
    /// Sets the idempotency.
    pub fn idempotency(mut self, i: Idempotency) -> Self {
        self.idempotency = i;
        self
    }
    /// Sets the tenant.
    pub fn tenant(mut self, t: impl IntoName) -> Self {
        self.tenant = Some(t.into_name());
        self
    }
    /// Sets the task.
    pub fn task(mut self, t: impl IntoName) -> Self {
        self.task = Some(t.into_name());
        self
    }
    /// Sets the priority.
    pub fn priority(mut self, p: impl IntoName) -> Self {
        self.priority = Some(p.into_name());
        self
    }
    /// Sets the idempotency key.
    pub fn idempotency_key(mut self, k: impl Into<String>) -> Self {
        self.idempotency_key = Some(k.into());
        self
    }
    /// Sets the parameter digest.
    pub fn params_digest(mut self, d: impl Into<String>) -> Self {
        self.params_digest = Some(d.into());
        self
    }
    /// Marks the call as running under an upstream owner.
    pub fn inbound(mut self, i: Inbound) -> Self {
        self.inbound = Some(i);
        self
    }
    /// Sets the needs.
    pub fn needs(mut self, n: Needs) -> Self {
        self.needs = n;
        self
    }
}
