//! Scope keys: the registry key of a breaker, budget, throttle or gate
//! scope for an upstream and a call's tenant, priority and task.

use crate::policy::{BreakerOverride, Policy, ScopeDim};

pub(crate) fn breaker_override(p: &Policy, key: &str, upstream: &str) -> Option<BreakerOverride> {
    if p.breaker.overrides.is_empty() {
        return None;
    }
    p.breaker
        .overrides
        .get(key)
        .or_else(|| p.breaker.overrides.get(upstream))
        .copied()
}

/// Separates a registry key's dimension tag from the key as users see it.
const TAG_END: char = '\u{1f}';

fn dim_tag(d: ScopeDim) -> char {
    match d {
        ScopeDim::Global => 'g',
        ScopeDim::Upstream => 'u',
        ScopeDim::Provider => 'p',
        ScopeDim::Model => 'm',
        ScopeDim::Region => 'r',
        ScopeDim::Tenant => 't',
        ScopeDim::Priority => 'q',
        ScopeDim::Operation => 'o',
    }
}

/// The registry key of scope `dims` for `upstream` and the call's tenant,
/// priority and task: a tag naming the dimensions, then their values joined
/// by `/` (the upstream name alone when nothing else applies). The tag keeps
/// scopes of different dimensions apart, so a tenant named like an upstream
/// never shares that upstream's budget. [`display_key`] strips it.
pub(crate) fn scope_key(
    dims: &[ScopeDim],
    upstream: &str,
    p: &Policy,
    tenant: Option<&str>,
    priority: Option<&str>,
    task: Option<&str>,
) -> String {
    let mut k = String::with_capacity(dims.len() + 1 + upstream.len());
    k.extend(dims.iter().map(|d| dim_tag(*d)));
    k.push(TAG_END);
    let cat = p.upstreams.get(upstream);
    let upstream_only = dims.iter().all(|d| {
        matches!(
            d,
            ScopeDim::Provider | ScopeDim::Model | ScopeDim::Region | ScopeDim::Upstream
        )
    });
    if upstream_only && cat.is_none_or(|u| u.provider.is_empty() && u.model.is_empty()) {
        k.push_str(upstream);
        return k;
    }
    let mut first = true;
    for d in dims {
        let v = match d {
            ScopeDim::Global => "*",
            ScopeDim::Upstream => upstream,
            ScopeDim::Provider => cat
                .map(|u| u.provider.as_str())
                .filter(|s| !s.is_empty())
                .unwrap_or(upstream),
            ScopeDim::Model => cat.map(|u| u.model.as_str()).unwrap_or(""),
            ScopeDim::Region => cat.map(|u| u.region.as_str()).unwrap_or(""),
            ScopeDim::Tenant => tenant.unwrap_or("-"),
            ScopeDim::Priority => priority.unwrap_or("-"),
            ScopeDim::Operation => task.unwrap_or("-"),
        };
        if !v.is_empty() {
            if !first {
                k.push('/');
            }
            k.push_str(v);
            first = false;
        }
    }
    k
}

/// A registry key as users see it (in details, events and stats): without its dimension tag.
pub(crate) fn display_key(key: &str) -> &str {
    key.split_once(TAG_END).map_or(key, |(_, d)| d)
}

/// The provider rate-limit scope of `upstream` (see [`crate::ratelimit`]):
/// what the provider limits, the account (the catalog's `api_key_env`) ×
/// provider × model, as `account/provider/model` (the upstream's name for
/// the parts the catalog does not give). Region variants of one model on
/// one key share it, as the provider's limit does; two models never do.
pub(crate) fn rate_scope(p: &Policy, upstream: &str) -> String {
    let cat = p.upstreams.get(upstream);
    let account = cat.and_then(|u| u.api_key_env.as_deref()).unwrap_or("-");
    match cat.filter(|u| !u.provider.is_empty() && !u.model.is_empty()) {
        Some(u) => format!("{account}/{}/{}", u.provider, u.model),
        None => format!("{account}/{upstream}"),
    }
}
