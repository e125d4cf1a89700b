//! Which upstream takes the next attempt. The fallback capability matcher:
//! from a route's candidates and the call's needs, the ordered eligible
//! upstreams and, for every excluded one, why (a fallback that cannot do
//! what the request needs is a delayed failure); and `next`, the route's
//! rule after a failure: stay, move to the next eligible candidate, or stop.

use super::{Failed, Failure, Halt, Target};
use crate::policy::{FallbackMode, Policy, Route, Upstream};
use crate::types::{ApiFamily, Reason};
use smol_str::SmolStr;
use std::fmt;

/// What the call needs from any upstream that serves it: given per call,
/// or read from the request by [`crate::wire::RequestFacts`] (the drop-in
/// transports), or both ([`Needs::merged`]).
///
/// A need is checked only against what an upstream declares: a candidate
/// with no `capabilities` list, no `context_tokens` or no `api` is not
/// excluded for it (unknown is not a refusal); a declared one that falls
/// short is, with the reason ([`Exclusion`]).
///
/// As JSON (`serde`, what every binding accepts as `needs`): `capabilities`,
/// `api`, `input_tokens`, `max_output_tokens`, `data_boundary`, `max_cost`;
/// any other key is an error naming it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Needs {
    /// Capabilities beyond the route's `require` (e.g. `vision` for this request).
    pub capabilities: Vec<String>,
    /// The wire family the request is built for: a candidate declaring an
    /// `api` that cannot take it (Anthropic messages for an OpenAI body) is skipped.
    pub api: Option<ApiFamily>,
    /// Input tokens (estimated, or the real count after `context_length_exceeded`).
    pub input_tokens: Option<u64>,
    /// Requested output tokens.
    pub max_output_tokens: Option<u64>,
    /// Required data boundary, on top of the route's.
    pub data_boundary: Option<String>,
    /// Cost cap for this call, USD, on top of the route's.
    pub max_cost: Option<f64>,
}

impl Needs {
    /// These needs with `over` laid on top: capabilities of both (each
    /// once, in order), and each of `over`'s other fields where it sets one.
    /// What a caller's per-request needs do to the needs read from the body.
    ///
    /// ```
    /// use retrywise::Needs;
    /// let read = Needs { capabilities: vec!["streaming".into()], input_tokens: Some(900), ..Needs::default() };
    /// let given = Needs { capabilities: vec!["vision".into()], input_tokens: Some(5_000), ..Needs::default() };
    /// let n = read.merged(&given);
    /// assert_eq!(n.capabilities, ["streaming", "vision"]);
    /// assert_eq!(n.input_tokens, Some(5_000));
    /// ```
    pub fn merged(&self, over: &Needs) -> Needs {
        let mut capabilities = self.capabilities.clone();
        for c in &over.capabilities {
            if !capabilities.contains(c) {
                capabilities.push(c.clone());
            }
        }
        Needs {
            capabilities,
            api: over.api.or(self.api),
            input_tokens: over.input_tokens.or(self.input_tokens),
            max_output_tokens: over.max_output_tokens.or(self.max_output_tokens),
            data_boundary: over.data_boundary.clone().or_else(|| self.data_boundary.clone()),
            max_cost: over.max_cost.or(self.max_cost),
        }
    }

    /// Nothing is needed.
    pub fn is_empty(&self) -> bool {
        self.capabilities.is_empty()
            && self.api.is_none()
            && self.input_tokens.is_none()
            && self.max_output_tokens.is_none()
            && self.data_boundary.is_none()
            && self.max_cost.is_none()
    }
}

/// Why a candidate was excluded. `Display` gives the stable string form
/// (`missing_capability:tool_calling`, `context_too_small:8192<12000`, ...).
#[derive(Debug, Clone, PartialEq)]
pub enum Exclusion {
    /// Lacks a required capability.
    MissingCapability(String),
    /// Speaks a wire family that cannot take the request's body.
    ApiFamily {
        /// The candidate's `api`.
        have: ApiFamily,
        /// The request's family.
        want: ApiFamily,
    },
    /// Context window smaller than input + output tokens.
    ContextTooSmall {
        /// The candidate's window.
        have: u64,
        /// What the call needs.
        need: u64,
    },
    /// Output limit below the requested output tokens.
    OutputTooSmall {
        /// The candidate's limit.
        have: u64,
        /// What the call asks for.
        need: u64,
    },
    /// Outside the required data boundary.
    DataBoundary {
        /// The candidate's boundary (`unknown` when not declared).
        have: String,
        /// The required one.
        want: String,
    },
    /// Estimated cost above the cap.
    CostCap,
    /// Eval score for the task below the route's minimum (or missing).
    EvalBelowMin,
    /// Circuit breaker open.
    BreakerOpen,
    /// Already used by this logical request.
    AlreadyTried,
    /// The route's `max_upstreams` is reached.
    MaxUpstreams,
    /// Fallback is forbidden on this route.
    FallbackForbidden,
}

impl fmt::Display for Exclusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exclusion::MissingCapability(c) => write!(f, "missing_capability:{c}"),
            Exclusion::ApiFamily { have, want } => write!(f, "api_family:{have}!={want}"),
            Exclusion::ContextTooSmall { have, need } => {
                write!(f, "context_too_small:{have}<{need}")
            }
            Exclusion::OutputTooSmall { have, need } => write!(f, "output_too_small:{have}<{need}"),
            Exclusion::DataBoundary { have, want } => write!(f, "data_boundary:{have}!={want}"),
            Exclusion::CostCap => f.write_str("cost_cap"),
            Exclusion::EvalBelowMin => f.write_str("eval_below_min"),
            Exclusion::BreakerOpen => f.write_str("breaker_open"),
            Exclusion::AlreadyTried => f.write_str("already_tried"),
            Exclusion::MaxUpstreams => f.write_str("max_upstreams"),
            Exclusion::FallbackForbidden => f.write_str("fallback_forbidden"),
        }
    }
}

/// Matcher output.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MatchResult {
    /// Eligible candidates, in the route's preference order.
    pub eligible: Vec<String>,
    /// Excluded candidates with the first reason that excluded each.
    pub excluded: Vec<(String, Exclusion)>,
}

impl MatchResult {
    /// Exclusions as `(upstream, reason string)` pairs.
    pub fn exclusion_strings(&self) -> Vec<(String, String)> {
        self.excluded.iter().map(|(u, e)| (u.clone(), e.to_string())).collect()
    }
}

/// Estimated cost of one call on `u`, USD.
pub fn estimated_cost(u: &Upstream, needs: &Needs) -> f64 {
    let i = needs.input_tokens.unwrap_or(0) as f64;
    let o = needs.max_output_tokens.unwrap_or(0) as f64;
    (i * u.cost_input_per_mtok + o * u.cost_output_per_mtok) / 1_000_000.0
}

/// Static eligibility of one upstream (everything but breaker state and
/// history). The route's `require` needs a declared capability; the call's
/// needs are checked against what the upstream declares (see [`Needs`]).
pub fn check_upstream(u: &Upstream, route: &Route, task: Option<&str>, needs: &Needs) -> Result<(), Exclusion> {
    for cap in &route.require {
        if !u.has(cap) {
            return Err(Exclusion::MissingCapability(cap.clone()));
        }
    }
    if let (Some(have), Some(want)) = (u.api, needs.api) {
        if !have.takes(want) {
            return Err(Exclusion::ApiFamily { have, want });
        }
    }
    if let Some(declared) = &u.capabilities {
        if let Some(cap) = needs.capabilities.iter().find(|c| !declared.contains(c)) {
            return Err(Exclusion::MissingCapability(cap.clone()));
        }
    }
    let need = needs
        .input_tokens
        .unwrap_or(0)
        .saturating_add(needs.max_output_tokens.unwrap_or(0));
    if let (Some(have), true) = (u.context_tokens, need > 0) {
        if have < need {
            return Err(Exclusion::ContextTooSmall { have, need });
        }
    }
    if let (Some(have), Some(need)) = (u.max_output_tokens, needs.max_output_tokens) {
        if have < need {
            return Err(Exclusion::OutputTooSmall { have, need });
        }
    }
    for want in route.data_boundary.iter().chain(needs.data_boundary.iter()) {
        match &u.data_boundary {
            Some(have) if have == want => {}
            other => {
                return Err(Exclusion::DataBoundary {
                    have: other.clone().unwrap_or_else(|| "unknown".into()),
                    want: want.clone(),
                })
            }
        }
    }
    for cap in route.max_cost_per_call.iter().chain(needs.max_cost.iter()) {
        if estimated_cost(u, needs) > *cap {
            return Err(Exclusion::CostCap);
        }
    }
    if let Some(min) = route.min_eval {
        let score = task.and_then(|t| u.evals.get(t)).copied();
        if score.is_none_or(|s| s < min) {
            return Err(Exclusion::EvalBelowMin);
        }
    }
    Ok(())
}

/// Orders a route's candidates into eligible ones and exclusions.
/// `tried` lists upstreams this logical request already used; `is_open` says
/// whether an upstream's breaker refuses traffic now.
pub fn match_candidates(
    policy: &Policy,
    route: &Route,
    task: Option<&str>,
    needs: &Needs,
    tried: &[&str],
    is_open: &dyn Fn(&str) -> bool,
) -> MatchResult {
    let mut out = MatchResult::default();
    for name in &route.candidates {
        let verdict = if tried.contains(&name.as_str()) {
            Err(Exclusion::AlreadyTried)
        } else {
            match policy.upstreams.get(name) {
                Some(u) => check_upstream(u, route, task, needs),
                None => Ok(()),
            }
        }
        .and_then(|_| {
            if is_open(name) {
                Err(Exclusion::BreakerOpen)
            } else {
                Ok(())
            }
        });
        match verdict {
            Ok(()) => out.eligible.push(name.clone()),
            Err(e) => out.excluded.push((name.clone(), e)),
        }
    }
    out
}

/// The route's eligible candidates now ([`match_candidates`]); with
/// `larger_than`, a candidate whose context window is not above that many
/// tokens is excluded too (the failure said the context was too small).
pub(crate) fn candidates(
    policy: &Policy,
    route: &Route,
    task: Option<&str>,
    needs: &Needs,
    tried: &[&str],
    larger_than: Option<u64>,
    is_open: &dyn Fn(&str) -> bool,
) -> MatchResult {
    let mut m = match_candidates(policy, route, task, needs, tried, is_open);
    if let Some(min_ctx) = larger_than {
        let mut keep = Vec::new();
        for u in m.eligible.drain(..) {
            let ctx = policy.upstreams.get(&u).and_then(|x| x.context_tokens);
            match ctx {
                Some(c) if c > min_ctx => keep.push(u),
                Some(c) => m.excluded.push((
                    u,
                    Exclusion::ContextTooSmall {
                        have: c,
                        need: min_ctx + 1,
                    },
                )),
                None => m.excluded.push((
                    u,
                    Exclusion::ContextTooSmall {
                        have: 0,
                        need: min_ctx + 1,
                    },
                )),
            }
        }
        m.eligible = keep;
    }
    m
}

/// The route (or upstream) that serves requests for `model`, so one
/// transport serves many models: the policy's `models` map, then a route
/// named like the model, then an upstream named like it or whose `model`
/// (or `request_model`) it is. With no catalog and no routes at all, the
/// model is its own upstream (its own breaker and budget, never a shared
/// key). Anything else is an error naming what to add.
///
/// ```
/// use retrywise::{rules::route::route_for_model, Policy};
/// let p = Policy::from_str_any("upstreams: {mini: {model: gpt-4o-mini}}\nroutes: {chat: {candidates: [mini]}}\nmodels: {gpt-4o: chat}").unwrap();
/// assert_eq!(route_for_model(&p, "gpt-4o").unwrap(), "chat");
/// assert_eq!(route_for_model(&p, "gpt-4o-mini").unwrap(), "mini");
/// assert_eq!(route_for_model(&p, "o3").unwrap_err().path, "models.o3");
/// ```
pub fn route_for_model(policy: &Policy, model: &str) -> Result<String, crate::policy::PolicyError> {
    if let Some(r) = policy.models.get(model) {
        return Ok(r.clone());
    }
    if policy.routes.contains_key(model) || policy.upstreams.contains_key(model) {
        return Ok(model.to_string());
    }
    if let Some((name, _)) = policy
        .upstreams
        .iter()
        .find(|(_, u)| u.wire_model() == Some(model) || u.model == model)
    {
        return Ok(name.clone());
    }
    if policy.upstreams.is_empty() && policy.routes.is_empty() && !model.is_empty() {
        return Ok(model.to_string());
    }
    Err(crate::policy::PolicyError {
        path: format!("models.{model}"),
        message: format!(
            "no route serves model {model:?}: add it to `models` (model: route), name a route or an upstream after it, or give an upstream `model: {model}`"
        ),
    })
}

/// Whether a call may begin on `route`: a route of the policy, an upstream
/// of its catalog (called alone: the documented way to ask for one upstream
/// with no route), an empty name (a task may name the route, else the
/// request goes where the caller sent it), or any name when the policy
/// declares no routes (each name is its own upstream). Anything else is a `PolicyError` naming the known
/// routes: a misspelt route must not silently become a bare upstream with
/// no fallback.
///
/// ```
/// use retrywise::{rules::route::check_route, Policy};
/// let p = Policy::from_str_any("upstreams: {a: {}, b: {}}\nroutes: {chat: {candidates: [a, b]}}").unwrap();
/// assert!(check_route(&p, "chat").is_ok());
/// assert!(check_route(&p, "").is_ok());
/// assert!(check_route(&p, "b").is_ok());
/// let e = check_route(&p, "caht").unwrap_err();
/// assert_eq!(e.path, "routes.caht");
/// assert!(e.message.contains("known routes: chat"));
/// ```
pub fn check_route(policy: &Policy, route: &str) -> Result<(), crate::policy::PolicyError> {
    let routes = &policy.routes;
    // An empty route (with no task naming one) is the caller's own
    // upstream, as it was asked: a request that names no model (`GET /v1/models`).
    if routes.is_empty() || route.is_empty() || routes.contains_key(route) || policy.upstreams.contains_key(route) {
        return Ok(());
    }
    let known = routes.keys().map(String::as_str).collect::<Vec<_>>().join(", ");
    let message = format!(
        "no route {route:?} in `routes` and no upstream {route:?} in `upstreams`; known routes: {known} \
         (to call one upstream with no route, declare it under `upstreams`)"
    );
    Err(crate::policy::PolicyError {
        path: format!("routes.{route}"),
        message,
    })
}

/// The route's rule after a failure: the same upstream while it has
/// attempts left on it (`attempts_per_upstream`) and its breaker admits,
/// unless the failure demands another; otherwise the first eligible
/// candidate the call has not tried — when the route and the kill switch
/// allow a fallback and `max_upstreams` is not reached.
///
/// A failure that prefers another upstream (`Failure::prefer_switch`: the
/// upstream went silent) takes the next eligible candidate when there is
/// one, and stays otherwise.
///
/// `stay_blocked`: the failed upstream asked for a wait the call cannot
/// honour (longer than its deadline allows, or above the policy's maximum).
/// That keeps the call off that upstream only: with an eligible candidate it
/// falls back; with none it stays, and the wait rule stops it with the hint's
/// own reason.
pub(crate) fn next<C: Failed>(c: &C, f: &Failure, stay_blocked: bool) -> Result<Target, Halt> {
    let stay = || Target {
        upstream: c.target().clone(),
        fallback: false,
        excluded: Vec::new(),
    };
    let may_stay = stay_possible(c, f);
    if may_stay && !stay_blocked && !f.prefer_switch {
        return Ok(stay());
    }
    match elsewhere(c, f) {
        Err(_) if may_stay => Ok(stay()),
        other => other,
    }
}

/// The same upstream may take the next attempt: the failure does not demand
/// another, it has attempts left on it and its breaker admits.
fn stay_possible<C: Failed>(c: &C, f: &Failure) -> bool {
    let route = c.route();
    let per_upstream_cap = if route.fallback == FallbackMode::Forbidden {
        c.attempts().1
    } else {
        route.attempts_per_upstream
    };
    // The call's target, not the failed attempt's upstream: a hedge to another upstream does not move the call.
    !f.force_switch && c.target_attempts() < per_upstream_cap && !c.target_open()
}

/// The next eligible candidate, or why there is none.
fn elsewhere<C: Failed>(c: &C, f: &Failure) -> Result<Target, Halt> {
    let route = c.route();
    let forbidden = route.fallback == FallbackMode::Forbidden;
    let max_up = route.max_upstreams.unwrap_or(u32::MAX);
    let tried = c.tried();
    let m = c.candidates(&tried, f.larger_than);
    let excluded = m.exclusion_strings();
    let distinct = tried.len() as u32;
    // Why staying is refused, when no other upstream may be tried.
    let refused = || {
        if f.force_switch {
            f.reason
        } else if c.target_open() {
            Reason::BreakerOpen
        } else {
            Reason::FallbackForbidden
        }
    };
    if forbidden || !c.routed() {
        // Only one upstream is allowed; it has attempts left, so it is refused by its breaker or the failure demands another upstream.
        return Err(Halt::Stop {
            reason: refused(),
            detail: None,
            excluded,
        });
    }
    if !c.fallbacks_on() {
        let detail = Some("fallback switched off (kill switch)".to_string());
        return Err(Halt::stop(refused(), detail));
    }
    if distinct >= max_up {
        return Err(Halt::Stop {
            reason: Reason::MaxUpstreams,
            detail: None,
            excluded,
        });
    }
    match m.eligible.first() {
        Some(u) => Ok(Target {
            upstream: SmolStr::from(u.as_str()),
            fallback: true,
            excluded,
        }),
        None => Err(Halt::Stop {
            reason: if f.force_switch {
                f.reason
            } else {
                Reason::NoEligibleUpstream
            },
            detail: None,
            excluded,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy::from_str_any(
            r#"
upstreams:
  big:
    provider: a
    model: big
    capabilities: [streaming, tool_calling, json_schema]
    context_tokens: 128000
    max_output_tokens: 16000
    data_boundary: eu
    cost_input_per_mtok: 5
    cost_output_per_mtok: 15
    evals: { code: 0.9 }
  small:
    provider: b
    model: small
    capabilities: [streaming]
    context_tokens: 8192
    data_boundary: us
    cost_input_per_mtok: 0.1
    cost_output_per_mtok: 0.4
    evals: { code: 0.6 }
routes:
  r:
    candidates: [big, small]
"#,
        )
        .unwrap()
    }

    fn run(route: &Route, needs: &Needs, tried: &[&str], open: &[&str]) -> Vec<(String, String)> {
        let p = policy();
        let open: Vec<String> = open.iter().map(|s| s.to_string()).collect();
        let m = match_candidates(&p, route, Some("code"), needs, tried, &|u| open.iter().any(|o| o == u));
        let mut v: Vec<(String, String)> = m.eligible.iter().map(|e| (e.clone(), "ok".to_string())).collect();
        v.extend(m.exclusion_strings());
        v
    }

    fn pair(a: &str, b: &str) -> (String, String) {
        (a.to_string(), b.to_string())
    }

    #[test]
    fn every_exclusion_reason() {
        let p = policy();
        let base = p.routes["r"].clone();
        let tools = Route {
            require: vec!["tool_calling".into()],
            ..base.clone()
        };
        assert_eq!(
            run(&tools, &Needs::default(), &[], &[]),
            vec![pair("big", "ok"), pair("small", "missing_capability:tool_calling")]
        );
        let needs = Needs {
            input_tokens: Some(10_000),
            max_output_tokens: Some(2_000),
            ..Needs::default()
        };
        assert_eq!(
            run(&base, &needs, &[], &[])[1],
            pair("small", "context_too_small:8192<12000")
        );
        let eu = Route {
            data_boundary: Some("eu".into()),
            ..base.clone()
        };
        assert_eq!(
            run(&eu, &Needs::default(), &[], &[])[1],
            pair("small", "data_boundary:us!=eu")
        );
        let cheap = Route {
            max_cost_per_call: Some(0.01),
            ..base.clone()
        };
        let needs = Needs {
            input_tokens: Some(1_000),
            max_output_tokens: Some(1_000),
            ..Needs::default()
        };
        // big: (1000*5 + 1000*15)/1e6 = 0.02 > 0.01
        assert_eq!(
            run(&cheap, &needs, &[], &[]),
            vec![pair("small", "ok"), pair("big", "cost_cap")]
        );
        let eval = Route {
            min_eval: Some(0.8),
            ..base.clone()
        };
        assert_eq!(
            run(&eval, &Needs::default(), &[], &[])[1],
            pair("small", "eval_below_min")
        );
        assert_eq!(
            run(&base, &Needs::default(), &[], &["big"]),
            vec![pair("small", "ok"), pair("big", "breaker_open")]
        );
        assert_eq!(
            run(&base, &Needs::default(), &["big"], &[]),
            vec![pair("small", "ok"), pair("big", "already_tried")]
        );
        let out = Needs {
            max_output_tokens: Some(20_000),
            ..Needs::default()
        };
        assert_eq!(
            run(&base, &out, &[], &[]),
            vec![
                pair("big", "output_too_small:16000<20000"),
                pair("small", "context_too_small:8192<20000")
            ]
        );
    }
}
