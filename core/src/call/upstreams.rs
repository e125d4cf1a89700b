//! Which upstreams a call may go to now: breaker states as the call sees
//! them, and the route's candidates (matched by `rules/route.rs`).

use super::Call;
use crate::hot::ThreadUp;
use crate::policy::{BreakerOverride, Route};
use crate::rules::route::{self, MatchResult, Needs};
use crate::state::scope::{breaker_override, display_key, scope_key};
use crate::state::upstream::BreakerRef;
use crate::state::version::Version;

/// The call's dimensions that scope keys may use besides the upstream.
pub(super) struct Who<'a> {
    pub(super) tenant: Option<&'a str>,
    pub(super) priority: Option<&'a str>,
    pub(super) task: Option<&'a str>,
}

/// Whether the breaker of `tu`'s upstream refuses every attempt now, when
/// that breaker depends on the upstream only (`None`: it depends on the call).
#[inline]
pub(super) fn fixed_open(tu: &ThreadUp, now_ms: u64) -> Option<bool> {
    match &tu.up.value.breaker {
        BreakerRef::None => Some(false),
        BreakerRef::Fixed(c, ovr) => Some(match ovr {
            Some(BreakerOverride::ForceOpen) => true,
            Some(_) => false,
            None => c.value.is_open(now_ms),
        }),
        BreakerRef::PerCall => None,
    }
}

/// Whether `upstream`'s breaker refuses every attempt now. `current` is the
/// call's own upstream, whose cell is at hand.
fn upstream_open(pol: &Version, upstream: &str, who: &Who, now_ms: u64, current: Option<&ThreadUp>) -> bool {
    let p = &pol.policy;
    if !p.breaker.enabled {
        return false;
    }
    if let Some(open) = current
        .filter(|tu| tu.up.key == upstream)
        .and_then(|tu| fixed_open(tu, now_ms))
    {
        return open;
    }
    let key = scope_key(&p.breaker.scope, upstream, p, who.tenant, who.priority, who.task);
    match breaker_override(p, display_key(&key), upstream) {
        Some(BreakerOverride::ForceOpen) => return true,
        Some(_) => return false,
        None => {}
    }
    pol.shared.breakers.get(&key).is_some_and(|c| c.value.is_open(now_ms))
}

/// The route's eligible candidates now, with every exclusion; `larger_than`
/// also drops candidates whose context window is not above that many tokens.
#[allow(clippy::too_many_arguments)]
pub(super) fn match_route(
    pol: &Version,
    route: &Route,
    who: &Who,
    needs: &Needs,
    tried: &[&str],
    larger_than: Option<u64>,
    now_ms: u64,
    current: Option<&ThreadUp>,
) -> MatchResult {
    route::candidates(&pol.policy, route, who.task, needs, tried, larger_than, &|u| {
        upstream_open(pol, u, who, now_ms, current)
    })
}

impl Call {
    pub(super) fn who(&self) -> Who<'_> {
        Who {
            tenant: self.tenant.as_deref(),
            priority: self.priority(),
            task: self.task.as_deref(),
        }
    }

    pub(super) fn is_open(&self, upstream: &str, now_ms: u64) -> bool {
        upstream_open(self.pol(), upstream, &self.who(), now_ms, Some(&self.tu))
    }

    pub(super) fn match_now(&self, tried: &[&str], larger_than: Option<u64>, now_ms: u64) -> MatchResult {
        match_route(
            self.pol(),
            self.route(),
            &self.who(),
            self.needs(),
            tried,
            larger_than,
            now_ms,
            Some(&self.tu),
        )
    }
}
