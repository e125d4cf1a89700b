//! `retrywise audit`: worst-case retry amplification of a call graph.
//!
//! Every layer multiplies the work below it: a layer that makes `attempts`
//! attempts, may try `fallbacks` other targets (each with `attempts`), may be
//! delivered `redelivery` times (queues, workflow re-runs) and sends `hedges`
//! parallel copies of each attempt has the factor
//! `f = attempts × (1 + fallbacks) × redelivery × (1 + hedges)`.
//! A user action reaches the upstream under a path of layers at most
//! `A = Π fᵢ` times (seed 000 §1: client 3 × SDK 3 × gateway 3 = 27).

use serde_json::Value;
use std::fmt::Write as _;

/// One layer of the call graph.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Node {
    /// Layer name.
    pub name: String,
    /// Attempts per call, the first included (≥ 1).
    pub attempts: u64,
    /// Other targets tried after the first gives up, each with `attempts`.
    pub fallbacks: u64,
    /// Deliveries of one call, the first included (≥ 1).
    pub redelivery: u64,
    /// Parallel copies sent with each attempt.
    pub hedges: u64,
    /// Marked as the retry owner.
    pub owner: bool,
    /// Layers this one calls, once per attempt.
    pub calls: Vec<Node>,
}

impl Node {
    /// This layer's multiplicative factor.
    pub fn factor(&self) -> u128 {
        self.attempts as u128 * (1 + self.fallbacks as u128) * self.redelivery as u128 * (1 + self.hedges as u128)
    }

    fn layer(name: String, attempts: u64) -> Node {
        Node {
            name,
            attempts,
            fallbacks: 0,
            redelivery: 1,
            hedges: 0,
            owner: false,
            calls: Vec::new(),
        }
    }
}

/// Builds a chain from `--layers 3,3,3` (outermost first).
pub fn from_layers(spec: &str) -> Result<Node, String> {
    let mut attempts = Vec::new();
    for (i, part) in spec.split(',').map(str::trim).enumerate() {
        let n: u64 = part
            .parse()
            .map_err(|_| format!("--layers: item {} ({part:?}) is not a whole number", i + 1))?;
        if n == 0 || n > 1_000 {
            return Err(format!(
                "--layers: item {} is {n}; attempts count the first one, so they are between 1 and 1000",
                i + 1
            ));
        }
        attempts.push(n);
    }
    if attempts.is_empty() {
        return Err("--layers needs at least one number, e.g. --layers 3,3,3".into());
    }
    let mut node: Option<Node> = None;
    for (i, a) in attempts.iter().enumerate().rev() {
        let mut n = Node::layer(format!("layer {}", i + 1), *a);
        if let Some(child) = node.take() {
            n.calls.push(child);
        }
        node = Some(n);
    }
    node.ok_or_else(|| "empty --layers".into())
}

fn field_u64(
    map: &serde_json::Map<String, Value>,
    key: &str,
    path: &str,
    default: u64,
    min: u64,
) -> Result<u64, String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => match v.as_u64() {
            Some(n) if n >= min && n <= 1_000 => Ok(n),
            _ => Err(format!(
                "{path}.{key}: must be a whole number between {min} and 1000, got {v}"
            )),
        },
    }
}

fn node_from(v: &Value, path: &str) -> Result<Node, String> {
    let Value::Object(map) = v else {
        return Err(format!("{path}: expected a mapping with name, attempts, ... and calls"));
    };
    for k in map.keys() {
        if ![
            "name",
            "attempts",
            "fallbacks",
            "redelivery",
            "hedges",
            "owner",
            "calls",
        ]
        .contains(&k.as_str())
        {
            return Err(format!(
                "{path}.{k}: unknown field; expected name, attempts, fallbacks, redelivery, hedges, owner, calls"
            ));
        }
    }
    let name = match map.get("name") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(other) => return Err(format!("{path}.name: must be a non-empty string, got {other}")),
        None => return Err(format!("{path}.name: missing")),
    };
    let owner = match map.get("owner") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(format!("{path}.owner: must be true or false, got {other}")),
    };
    let calls = match map.get("calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, c)| node_from(c, &format!("{path}.calls[{i}]")))
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(format!("{path}.calls: must be a list of layers, got {other}")),
    };
    Ok(Node {
        name,
        attempts: field_u64(map, "attempts", path, 1, 1)?,
        fallbacks: field_u64(map, "fallbacks", path, 0, 0)?,
        redelivery: field_u64(map, "redelivery", path, 1, 1)?,
        hedges: field_u64(map, "hedges", path, 0, 0)?,
        owner,
        calls,
    })
}

/// Parses a call graph: either one root layer (a mapping with `calls`) or
/// `layers: [...]`, a chain listed outermost first.
pub fn parse(text: &str) -> Result<Node, String> {
    let v: Value = serde_norway::from_str(text).map_err(|e| format!("not a YAML/JSON call graph: {e}"))?;
    if let Value::Object(map) = &v {
        if let Some(layers) = map.get("layers") {
            if map.len() != 1 {
                return Err("a document with `layers` must have no other top-level field".into());
            }
            let Value::Array(items) = layers else {
                return Err("layers: must be a list of layers, outermost first".into());
            };
            if items.is_empty() {
                return Err("layers: must list at least one layer".into());
            }
            let mut node: Option<Node> = None;
            for (i, item) in items.iter().enumerate().rev() {
                let mut n = node_from(item, &format!("layers[{i}]"))?;
                if !n.calls.is_empty() {
                    return Err(format!("layers[{i}].calls: a `layers` chain lists its layers in order; use a root mapping with `calls` for a tree"));
                }
                if let Some(child) = node.take() {
                    n.calls.push(child);
                }
                node = Some(n);
            }
            return node.ok_or_else(|| "empty layers".into());
        }
    }
    node_from(&v, "root")
}

/// One root-to-leaf path.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PathReport {
    /// Layer names, outermost first.
    pub layers: Vec<String>,
    /// Each layer's factor.
    pub factors: Vec<u128>,
    /// Their product.
    pub amplification: u128,
    /// The layer that should own retries on this path.
    pub owner: String,
    /// Why that one.
    pub owner_reason: String,
    /// Worst case once every other layer is set to 1.
    pub amplification_after: u128,
}

fn paths<'a>(n: &'a Node, prefix: &mut Vec<&'a Node>, out: &mut Vec<Vec<&'a Node>>) {
    prefix.push(n);
    if n.calls.is_empty() {
        out.push(prefix.clone());
    } else {
        for c in &n.calls {
            paths(c, prefix, out);
        }
    }
    prefix.pop();
}

/// Analyses every path of the graph.
pub fn analyse(root: &Node) -> Result<Vec<PathReport>, String> {
    let mut all = Vec::new();
    paths(root, &mut Vec::new(), &mut all);
    let mut out = Vec::new();
    for p in all {
        let owners: Vec<&&Node> = p.iter().filter(|n| n.owner).collect();
        if owners.len() > 1 {
            let names: Vec<&str> = owners.iter().map(|n| n.name.as_str()).collect();
            return Err(format!(
                "more than one layer marked `owner: true` on one path: {}",
                names.join(", ")
            ));
        }
        let (owner, reason) = if let Some(o) = owners.first() {
            (**o, "marked `owner: true`")
        } else if let Some(g) = p.iter().rev().find(|n| n.name.to_ascii_lowercase().contains("gateway")) {
            (*g, "the gateway: it sees upstream status, Retry-After, quotas and health for every caller, and can hold one retry budget")
        } else {
            (
                *p.last().expect("a path has a layer"),
                "nearest the upstream: it sees status codes, Retry-After and upstream health first-hand",
            )
        };
        let factors: Vec<u128> = p.iter().map(|n| n.factor()).collect();
        let amplification = factors.iter().copied().fold(1u128, |a, f| a.saturating_mul(f));
        out.push(PathReport {
            layers: p.iter().map(|n| n.name.clone()).collect(),
            factors,
            amplification,
            owner: owner.name.clone(),
            owner_reason: reason.into(),
            // retrywise counts fallbacks and hedges within max_attempts, so the owner's worst case is its attempts.
            amplification_after: owner.attempts as u128,
        });
    }
    Ok(out)
}

fn describe(n: &Node) -> String {
    let mut parts = vec![format!("attempts {}", n.attempts)];
    if n.fallbacks > 0 {
        parts.push(format!("fallbacks {}", n.fallbacks));
    }
    if n.redelivery > 1 {
        parts.push(format!("redelivery {}", n.redelivery));
    }
    if n.hedges > 0 {
        parts.push(format!("hedges {}", n.hedges));
    }
    if n.owner {
        parts.push("owner".into());
    }
    parts.join(", ")
}

fn tree(n: &Node, prefix: &str, last: bool, root: bool, cumulative: u128, o: &mut String) {
    let cum = cumulative.saturating_mul(n.factor());
    let (branch, next) = if root {
        ("", String::new())
    } else if last {
        ("└─ ", format!("{prefix}   "))
    } else {
        ("├─ ", format!("{prefix}│  "))
    };
    let label = format!("{prefix}{branch}{}", n.name);
    let _ = writeln!(o, "  {label:<32} {:<36} x{:<6} = {cum}", describe(n), n.factor());
    for (i, c) in n.calls.iter().enumerate() {
        tree(c, &next, i + 1 == n.calls.len(), false, cum, o);
    }
}

/// The human-readable audit.
pub fn text(root: &Node, reports: &[PathReport]) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "call graph, outermost caller first (factor = attempts x (1 + fallbacks) x redelivery x (1 + hedges); = running product):");
    tree(root, "", true, true, 1, &mut o);
    let _ = writeln!(o);
    let worst = reports
        .iter()
        .max_by_key(|r| r.amplification)
        .expect("at least one path");
    for r in reports {
        let f: Vec<String> = r.factors.iter().map(u128::to_string).collect();
        let _ = writeln!(
            o,
            "path {}: A = {} = {}",
            r.layers.join(" > "),
            f.join(" x "),
            r.amplification
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "worst-case amplification A = {} physical upstream calls for one logical request (path {})",
        worst.amplification,
        worst.layers.join(" > ")
    );
    let _ = writeln!(o);
    let _ = writeln!(o, "recommendation: one retry owner per path, every other layer at 1.");
    for r in reports {
        let others: Vec<&str> = r.layers.iter().filter(|l| **l != r.owner).map(String::as_str).collect();
        let _ = writeln!(o, "  path {}:", r.layers.join(" > "));
        let _ = writeln!(o, "    owner: {} ({})", r.owner, r.owner_reason);
        let _ = writeln!(o, "      keeps its attempts with a retry budget, deadline and breaker; fallbacks and hedges count within its max_attempts");
        if others.is_empty() {
            let _ = writeln!(o, "    no other layer on this path");
        } else {
            let _ = writeln!(
                o,
                "    {}: attempts 1, no fallbacks, hedges or redelivery of their own; pass the deadline, request id and idempotency key down instead",
                others.join(", ")
            );
        }
        let _ = writeln!(o, "    A becomes {} (was {})", r.amplification_after, r.amplification);
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_multiply() {
        let root = from_layers("3,3,3").unwrap();
        let r = analyse(&root).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].amplification, 27);
        assert_eq!(r[0].owner, "layer 3");
        assert_eq!(r[0].amplification_after, 3);
        assert!(from_layers("3,0").is_err());
        assert!(from_layers("3,x").is_err());
    }

    #[test]
    fn yaml_tree_with_fallbacks_hedges_and_redelivery() {
        let y = r#"
name: app
attempts: 3
calls:
  - name: queue-worker
    redelivery: 2
    calls:
      - name: llm-gateway
        attempts: 3
        fallbacks: 1
        hedges: 1
  - name: moderation
    attempts: 2
"#;
        let root = parse(y).unwrap();
        let r = analyse(&root).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].amplification, 3 * 2 * (3 * 2 * 2));
        assert_eq!(r[0].owner, "llm-gateway");
        assert_eq!(r[1].amplification, 6);
        assert_eq!(r[1].owner, "moderation");
        let t = text(&root, &r);
        assert!(t.contains("A = 72"), "{t}");
    }

    #[test]
    fn chain_form_and_errors_name_the_field() {
        let root = parse("layers:\n  - {name: client, attempts: 3}\n  - {name: sdk, attempts: 3, owner: true}\n  - {name: gw, attempts: 3}\n").unwrap();
        let r = analyse(&root).unwrap();
        assert_eq!(r[0].amplification, 27);
        assert_eq!(r[0].owner, "sdk");
        let e = parse("name: a\nattempts: 0\n").unwrap_err();
        assert!(e.contains("root.attempts"), "{e}");
        let e = parse("name: a\ncalls:\n  - {name: b, retries: 2}\n").unwrap_err();
        assert!(e.contains("root.calls[0].retries"), "{e}");
    }
}
