//! Fallback capability matcher: from a route's candidates and the call's
//! needs, the ordered eligible upstreams and, for every excluded one, why.
//! A fallback that cannot do what the request needs is a delayed failure.

use crate::policy::{Policy, Route, Upstream};
use std::fmt;

/// What the call needs from any upstream that serves it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Needs {
    /// Capabilities beyond the route's `require` (e.g. `vision` for this request).
    pub capabilities: Vec<String>,
    /// Input tokens (estimated, or the real count after `context_length_exceeded`).
    pub input_tokens: Option<u64>,
    /// Requested output tokens.
    pub max_output_tokens: Option<u64>,
    /// Required data boundary, on top of the route's.
    pub data_boundary: Option<String>,
    /// Cost cap for this call, USD, on top of the route's.
    pub max_cost: Option<f64>,
}

/// Why a candidate was excluded. `Display` gives the stable string form
/// (`missing_capability:tool_calling`, `context_too_small:8192<12000`, ...).
#[derive(Debug, Clone, PartialEq)]
pub enum Exclusion {
    /// Lacks a required capability.
    MissingCapability(String),
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

/// Static eligibility of one upstream (everything but breaker state and history).
pub fn check_upstream(u: &Upstream, route: &Route, task: Option<&str>, needs: &Needs) -> Result<(), Exclusion> {
    for cap in route.require.iter().chain(needs.capabilities.iter()) {
        if !u.capabilities.iter().any(|c| c == cap) {
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
