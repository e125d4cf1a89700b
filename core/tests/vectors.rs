//! Cross-language conformance vectors (`tests/vectors/*.json`, format 1),
//! run through the public API of the `retrywise` crate with a manual clock and
//! a fixed seed. The Python, Node and C runners in `tests/vectors/` run the
//! same files through their bindings; every runner builds the same canonical
//! view of each result and compares it with the vector's expectations, so the
//! rules below (subset match, `null` = absent, `{i}` substitution) must stay
//! identical in all four. See `tests/vectors/README.md` for the format.
//!
//! `RETRYWISE_VECTOR=name` runs one vector; `RETRYWISE_VECTORS_DIR` points at
//! another directory of vectors. A vector with a top-level `skip` (a known
//! core bug, with the reason) is reported and not run, unless
//! `RETRYWISE_VECTORS_RUN_SKIPPED=1`.

use retrywise::wire::RequestFacts;
use retrywise::{
    Attempt, CallSpec, Continuation, Decision, EffectState, Engine, ErrorKind, Headers, HedgePlan, Idempotency,
    Inbound, ManualClock, Mode, Needs, Outcome, Phase, Policy, Stopped, StreamGate,
};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const FORMAT: u64 = 1;

fn vectors_dir() -> PathBuf {
    match std::env::var_os("RETRYWISE_VECTORS_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors"),
    }
}

/// One mismatch: where, what was expected, what the engine did.
struct Mismatch {
    vector: String,
    step: String,
    field: String,
    expected: String,
    actual: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "vector {} step {}: {}: expected {}, got {}",
            self.vector, self.step, self.field, self.expected, self.actual
        )
    }
}

// ---------------------------------------------------------------- comparison

/// Subset comparison shared by every runner: each key of an expected object
/// must match the actual value; `null` matches an absent key; integers are
/// exact, other numbers within 1e-9; arrays match element by element.
fn compare(path: &str, expected: &Value, actual: Option<&Value>, out: &mut Vec<(String, String, String)>) {
    let actual_or_null = actual.unwrap_or(&Value::Null);
    match expected {
        Value::Object(em) => match actual_or_null {
            Value::Object(am) => {
                for (k, ev) in em {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    compare(&p, ev, am.get(k), out);
                }
            }
            other => out.push((path.to_string(), expected.to_string(), other.to_string())),
        },
        Value::Array(ea) => match actual_or_null {
            Value::Array(aa) if aa.len() == ea.len() => {
                for (i, (e, a)) in ea.iter().zip(aa).enumerate() {
                    compare(&format!("{path}[{i}]"), e, Some(a), out);
                }
            }
            other => out.push((path.to_string(), expected.to_string(), other.to_string())),
        },
        Value::Number(en) => {
            let int = |n: &serde_json::Number| n.as_i64().map(i128::from).or(n.as_u64().map(i128::from));
            let ok = match actual_or_null {
                Value::Number(an) => match (int(en), int(an)) {
                    (Some(e), Some(a)) => e == a,
                    _ => {
                        matches!((en.as_f64(), an.as_f64()), (Some(e), Some(a)) if (e - a).abs() <= 1e-9)
                    }
                },
                _ => false,
            };
            if !ok {
                out.push((path.to_string(), expected.to_string(), actual_or_null.to_string()));
            }
        }
        _ => {
            if expected != actual_or_null {
                out.push((path.to_string(), expected.to_string(), actual_or_null.to_string()));
            }
        }
    }
}

/// Replaces `{i}` in every string of `v` (repeat steps).
fn substitute(v: &Value, i: u64) -> Value {
    match v {
        Value::String(s) => Value::String(s.replace("{i}", &i.to_string())),
        Value::Array(a) => Value::Array(a.iter().map(|x| substitute(x, i)).collect()),
        Value::Object(m) => Value::Object(m.iter().map(|(k, x)| (k.clone(), substitute(x, i))).collect()),
        other => other.clone(),
    }
}

// ------------------------------------------------------- canonical views

fn ms(d: std::time::Duration) -> u64 {
    d.as_millis() as u64
}

fn canon_attempt(a: &Attempt) -> Value {
    let headers: Map<String, Value> = a
        .headers()
        .into_iter()
        .map(|(k, v)| (k.to_string(), Value::String(v)))
        .collect();
    json!({
        "number": a.number,
        "upstream": &*a.upstream,
        "fallback": a.fallback,
        "hedge": a.hedge,
        "remaining_ms": ms(a.remaining()),
        "idempotency_key": a.idempotency_key.as_deref(),
        "timeouts_ms": {
            "connect": ms(a.timeouts().connect),
            "first_byte": ms(a.timeouts().first_byte),
            "first_token": ms(a.timeouts().first_token),
            "idle": ms(a.timeouts().idle),
            "total": ms(a.timeouts().total),
        },
        "headers": headers,
    })
}

fn canon_stop(s: &Stopped) -> Value {
    json!({
        "stop": {
            "reason": s.reason.as_str(),
            "class": s.class.map(|c| c.as_str()),
            "on_failure": s.on_failure.map(|o| serde_json::to_value(o).unwrap_or(Value::Null)),
            "detail": s.detail,
            "wait_ms": s.wait.map(|w| w.as_millis() as u64),
        }
    })
}

fn canon_decision(d: &Decision) -> Value {
    let excluded: Map<String, Value> = d
        .excluded
        .iter()
        .map(|(u, r)| (u.clone(), Value::String(r.clone())))
        .collect();
    json!({
        "action": d.action.as_str(),
        "delay_ms": d.delay_ms(),
        "class": d.class.map(|c| c.as_str()),
        "reason": d.reason.as_str(),
        "upstream": d.upstream.as_deref(),
        "wait_source": d.wait_source.as_str(),
        "retry_after_ms": d.retry_after.map(ms),
        "on_failure": d.on_failure.map(|o| serde_json::to_value(o).unwrap_or(Value::Null)),
        "detail": d.detail,
        "attempt": d.attempt,
        "hedge": d.hedge,
        "excluded": excluded,
        "continuation": d.continuation.map(|c| c.as_str()),
    })
}

fn canon_hedge(p: &HedgePlan) -> Value {
    match p {
        HedgePlan::Start(a) => json!({"action": "start", "attempt": canon_attempt(a)}),
        HedgePlan::After(d) => json!({"action": "after", "after_ms": ms(*d)}),
        HedgePlan::No(r) => json!({"action": "no", "reason": r.as_str()}),
    }
}

// ------------------------------------------------------------- inputs

fn s(v: &Value, k: &str) -> Option<String> {
    v.get(k).and_then(Value::as_str).map(str::to_string)
}

fn u(v: &Value, k: &str) -> Option<u64> {
    v.get(k).and_then(Value::as_u64)
}

fn headers_of(v: Option<&Value>) -> Headers {
    let mut h = Headers::new();
    if let Some(Value::Object(m)) = v {
        for (k, val) in m {
            h.insert(k, val.as_str().unwrap_or_default());
        }
    }
    h
}

fn spec_of(v: &Value) -> Result<CallSpec, String> {
    let mut spec = CallSpec::new(s(v, "route").unwrap_or_default());
    if let Some(d) = u(v, "deadline_ms") {
        spec = spec.deadline_ms(d);
    }
    if let Some(i) = s(v, "idempotency") {
        spec = spec.idempotency(i.parse::<Idempotency>().map_err(|e| e.to_string())?);
    }
    if let Some(t) = s(v, "tenant") {
        spec = spec.tenant(t);
    }
    if let Some(t) = s(v, "task") {
        spec = spec.task(t);
    }
    if let Some(p) = s(v, "priority") {
        spec = spec.priority(p);
    }
    if let Some(k) = s(v, "idempotency_key") {
        spec = spec.idempotency_key(k);
    }
    if let Some(p) = v.get("params") {
        spec = spec.params_digest(retrywise::idempotency::params_digest(p));
    }
    // The needs a drop-in transport reads from its request, under the caller's own.
    let read = v.get("request").map(|r| facts_of(r).needs).unwrap_or_default();
    let given: Needs = match v.get("needs") {
        Some(n) => serde_json::from_value(n.clone()).map_err(|e| format!("spec.needs: {e}"))?,
        None => Needs::default(),
    };
    spec = spec.needs(read.merged(&given));
    if let Some(h) = v.get("inbound_headers") {
        if let Some(i) = Inbound::from_headers(&headers_of(Some(h))).map_err(|e| e.to_string())? {
            spec = spec.inbound(i);
        }
    }
    Ok(spec)
}

/// A `request` object (`url`, `headers`, `body` as text) read as a transport reads it.
fn facts_of(r: &Value) -> RequestFacts {
    let url = s(r, "url").unwrap_or_default();
    let headers: Vec<(String, String)> = r
        .get("headers")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default();
    RequestFacts::read(&url, &headers, s(r, "body").unwrap_or_default().as_bytes())
}

/// The canonical view of `read_request`: family, endpoint, model and the
/// needs, capabilities joined with commas in the order read.
fn canon_request(step: &Value) -> Value {
    let f = facts_of(step);
    json!({
        "family": f.family.as_str(),
        "endpoint": f.endpoint.map(|e| e.as_str()),
        "model": f.model,
        "needs": {
            "capabilities": f.needs.capabilities.join(","),
            "api": f.needs.api.map(|a| a.as_str()),
            "input_tokens": f.needs.input_tokens,
            "max_output_tokens": f.needs.max_output_tokens,
        },
    })
}

fn outcome_of(v: &Value) -> Result<Outcome, String> {
    let parse = |k: &str| s(v, k);
    Ok(Outcome {
        status: u(v, "status").map(|x| x as u16),
        error: parse("error")
            .map(|e| e.parse::<ErrorKind>())
            .transpose()
            .map_err(|e| e.to_string())?,
        phase: parse("phase")
            .map(|p| p.parse::<Phase>())
            .transpose()
            .map_err(|e| e.to_string())?,
        headers: headers_of(v.get("headers")),
        vendor_code: s(v, "vendor_code"),
        effect: parse("effect")
            .map(|e| e.parse::<EffectState>())
            .transpose()
            .map_err(|e| e.to_string())?,
        input_tokens: u(v, "input_tokens"),
        output_tokens: None,
        ok: v.get("ok").and_then(Value::as_bool).unwrap_or(false),
        retry_delay: None,
        resumable: v.get("resumable").and_then(Value::as_bool).unwrap_or(false),
        continuation: parse("continuation")
            .map(|c| c.parse::<Continuation>())
            .transpose()
            .map_err(|e| e.to_string())?,
        first_token: u(v, "first_token_ms").map(std::time::Duration::from_millis),
    })
    .map(|o| match s(v, "body") {
        // After the headers: a 2xx body is judged by its content-type.
        Some(body) => o.body(body.as_bytes()),
        None => o,
    })
}

/// A `stream_gate` step's view: what the consumer saw and the phase a
/// failure would have now.
fn canon_gate(step: &Value) -> Value {
    let mut g = StreamGate::new(s(step, "content_type").as_deref());
    let mut released = Vec::new();
    for c in step.get("chunks").and_then(Value::as_array).into_iter().flatten() {
        released.extend_from_slice(&g.feed(c.as_str().unwrap_or_default().as_bytes()));
    }
    if step.get("finish").and_then(Value::as_bool).unwrap_or(false) {
        released.extend(g.finish());
    }
    json!({"released": String::from_utf8_lossy(&released), "phase": g.phase().as_str()})
}

// ------------------------------------------------------------- the runner

struct Run {
    name: String,
    engine: Engine,
    clock: ManualClock,
    calls: BTreeMap<String, retrywise::Call>,
    mismatches: Vec<Mismatch>,
}

impl Run {
    fn fail(&mut self, step: &str, field: &str, expected: impl Into<String>, actual: impl Into<String>) {
        self.mismatches.push(Mismatch {
            vector: self.name.clone(),
            step: step.to_string(),
            field: field.to_string(),
            expected: expected.into(),
            actual: actual.into(),
        });
    }

    fn check(&mut self, step: &str, expected: Option<&Value>, actual: &Value) {
        let Some(exp) = expected else { return };
        let mut diffs = Vec::new();
        let mut exp = exp.clone();
        // delay_within_ms: [lo, hi] is a bounds check on delay_ms, not a field.
        if let Some(bounds) = exp.as_object_mut().and_then(|m| m.remove("delay_within_ms")) {
            let d = actual.get("delay_ms").and_then(Value::as_u64);
            let lo = bounds.get(0).and_then(Value::as_u64).unwrap_or(0);
            let hi = bounds.get(1).and_then(Value::as_u64).unwrap_or(u64::MAX);
            if !d.is_some_and(|d| (lo..=hi).contains(&d)) {
                diffs.push(("delay_within_ms".to_string(), bounds.to_string(), format!("{d:?}")));
            }
        }
        compare("", &exp, Some(actual), &mut diffs);
        for (field, e, a) in diffs {
            self.fail(step, &field, e, a);
        }
    }

    /// `{"ok": true}` or `{"ok": false, "error": message}` against `expect`
    /// (default `{"ok": true}`), whose `error_contains` checks a part of the message.
    fn check_result(&mut self, label: &str, expected: Option<&Value>, actual: &Value) {
        let mut exp = expected.cloned().unwrap_or(json!({"ok": true}));
        if let Some(needle) = exp.as_object_mut().and_then(|m| m.remove("error_contains")) {
            let needle = needle.as_str().unwrap_or_default().to_string();
            let got = actual
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if !got.contains(&needle) {
                self.fail(
                    label,
                    "error_contains",
                    Value::String(needle).to_string(),
                    Value::String(got).to_string(),
                );
            }
        }
        self.check(label, Some(&exp), actual);
    }

    fn steps(&mut self, steps: &[Value], prefix: &str) {
        for (idx, step) in steps.iter().enumerate() {
            let label = if prefix.is_empty() {
                idx.to_string()
            } else {
                format!("{prefix}.{idx}")
            };
            self.step(step, &label);
        }
    }

    fn step(&mut self, step: &Value, label: &str) {
        let op = s(step, "op").unwrap_or_default();
        let call = s(step, "call").unwrap_or_default();
        let label = if call.is_empty() {
            format!("{label} ({op})")
        } else {
            format!("{label} ({op} {call})")
        };
        match op.as_str() {
            "advance" => self.clock.advance_ms(u(step, "ms").unwrap_or(0)),
            // The bindings' begin refuses a route the policy does not know
            // (`try_begin`): a `begin` expecting `{"ok": false}` checks the error.
            "begin" => match spec_of(step.get("spec").unwrap_or(&Value::Null)) {
                Ok(spec) => {
                    let (actual, call_made) = match self.engine.try_begin(spec) {
                        Ok(c) => (json!({"ok": true}), Some(c)),
                        Err(e) => (json!({"ok": false, "error": e.to_string()}), None),
                    };
                    self.check_result(&label, step.get("expect"), &actual);
                    if let Some(c) = call_made {
                        self.calls.insert(call, c);
                    }
                }
                Err(e) => self.fail(&label, "spec", "a valid call spec", e),
            },
            "read_request" => self.check(&label, step.get("expect"), &canon_request(step)),
            "next_attempt" => {
                let Some(c) = self.calls.get_mut(&call) else {
                    return self.fail(&label, "call", "a begun call", "none");
                };
                let actual = match c.next_attempt() {
                    Ok(a) => canon_attempt(&a),
                    Err(stop) => canon_stop(&stop),
                };
                self.check_attempt(&label, step.get("expect"), &actual);
            }
            "report" => {
                let outcome = match outcome_of(step.get("outcome").unwrap_or(&Value::Null)) {
                    Ok(o) => o,
                    Err(e) => return self.fail(&label, "outcome", "a valid outcome", e),
                };
                let Some(c) = self.calls.get_mut(&call) else {
                    return self.fail(&label, "call", "a begun call", "none");
                };
                // `attempt`: report that attempt (hedging), else the latest in flight.
                let d = match u(step, "attempt") {
                    Some(n) => c.report_attempt(n as u32, &outcome),
                    None => c.report(&outcome),
                };
                let actual = canon_decision(&d);
                self.check(&label, step.get("expect"), &actual);
            }
            "next_hedge" => {
                let Some(c) = self.calls.get_mut(&call) else {
                    return self.fail(&label, "call", "a begun call", "none");
                };
                let actual = canon_hedge(&c.next_hedge());
                self.check(&label, step.get("expect"), &actual);
            }
            "cancel" => {
                let Some(c) = self.calls.get_mut(&call) else {
                    return self.fail(&label, "call", "a begun call", "none");
                };
                let actual = canon_decision(&c.cancel());
                self.check(&label, step.get("expect"), &actual);
            }
            "reload" => {
                let result = Policy::from_json_value(step.get("policy").cloned().unwrap_or(json!({})))
                    .and_then(|p| self.engine.reload(p));
                let actual = match &result {
                    Ok(()) => json!({"ok": true}),
                    Err(e) => json!({"ok": false, "error": e.to_string()}),
                };
                self.check_result(&label, step.get("expect"), &actual);
            }
            "set_mode" => {
                let m = step.get("mode").cloned().unwrap_or(json!({}));
                let flag = |k: &str| m.get(k).and_then(Value::as_bool).unwrap_or(true);
                self.engine.set_mode(Mode {
                    retries: flag("retries"),
                    fallback: flag("fallback"),
                    hedging: flag("hedging"),
                });
            }
            "stream_gate" => self.check(&label, step.get("expect"), &canon_gate(step)),
            "stats" => {
                let actual = serde_json::to_value(self.engine.stats()).unwrap_or(Value::Null);
                self.check(&label, step.get("expect"), &actual);
            }
            "repeat" => {
                let times = u(step, "times").unwrap_or(0);
                let inner = step.get("steps").and_then(Value::as_array).cloned().unwrap_or_default();
                let base = label.split(' ').next().unwrap_or_default().to_string();
                for i in 0..times {
                    let sub: Vec<Value> = inner.iter().map(|x| substitute(x, i)).collect();
                    self.steps(&sub, &format!("{base}[{i}]"));
                }
            }
            other => self.fail(&label, "op", "a known op", other.to_string()),
        }
    }

    fn check_attempt(&mut self, label: &str, expected: Option<&Value>, actual: &Value) {
        let Some(exp) = expected else { return };
        let wants_stop = exp.get("stop").is_some();
        let got_stop = actual.get("stop").is_some();
        if wants_stop != got_stop {
            let e = if wants_stop {
                format!("stop {}", exp["stop"])
            } else {
                format!("attempt {exp}")
            };
            let a = if got_stop {
                format!("stop {}", actual["stop"])
            } else {
                format!("attempt {actual}")
            };
            return self.fail(label, "result", e, a);
        }
        self.check(label, Some(exp), actual);
    }
}

/// What running one vector gave.
enum Ran {
    Mismatches(Vec<Mismatch>),
    Skipped(String),
}

fn run_skipped() -> bool {
    std::env::var("RETRYWISE_VECTORS_RUN_SKIPPED").is_ok_and(|v| v == "1")
}

fn run_vector(path: &Path) -> Result<Ran, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if v.get("format").and_then(Value::as_u64) != Some(FORMAT) {
        return Err(format!("{}: format must be {FORMAT}", path.display()));
    }
    let name = s(&v, "name").ok_or_else(|| format!("{}: no name", path.display()))?;
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
    if name != stem {
        return Err(format!("{}: name {name:?} differs from the file name", path.display()));
    }
    if let Some(reason) = v.get("skip") {
        let reason = reason
            .as_str()
            .ok_or_else(|| format!("{name}: skip must be a string"))?;
        if !run_skipped() {
            return Ok(Ran::Skipped(format!("vector {name} skipped: {reason}")));
        }
    }
    let seed = u(&v, "seed").ok_or_else(|| format!("{name}: no seed"))?;
    let policy = Policy::from_json_value(v.get("policy").cloned().unwrap_or(json!({})))
        .map_err(|e| format!("{name}: policy: {e}"))?;
    let clock = ManualClock::new();
    let engine = Engine::builder(policy)
        .clock(Arc::new(clock.clone()))
        .seed(seed)
        .read_env(false)
        .build()
        .map_err(|e| format!("{name}: engine: {e}"))?;
    let mut run = Run {
        name,
        engine,
        clock,
        calls: BTreeMap::new(),
        mismatches: Vec::new(),
    };
    let steps = v.get("steps").and_then(Value::as_array).cloned().unwrap_or_default();
    run.steps(&steps, "");
    Ok(Ran::Mismatches(run.mismatches))
}

#[test]
fn conformance_vectors() {
    let dir = vectors_dir();
    let only = std::env::var("RETRYWISE_VECTOR").ok();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter(|p| only.as_deref().is_none_or(|o| p.file_stem().is_some_and(|s| s == o)))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no vectors in {}", dir.display());
    let mut errors = Vec::new();
    let (mut mismatches, mut failed, mut skipped) = (0, 0, 0);
    for f in &files {
        match run_vector(f) {
            Ok(Ran::Skipped(why)) => {
                skipped += 1;
                println!("{why}");
            }
            Ok(Ran::Mismatches(ms)) => {
                mismatches += ms.len();
                failed += usize::from(!ms.is_empty());
                errors.extend(ms.iter().map(|m| m.to_string()));
            }
            Err(e) => {
                failed += 1;
                errors.push(format!("vector error: {e}"));
            }
        }
    }
    for e in &errors {
        println!("{e}");
    }
    println!(
        "rust: {} vectors, {} passed, {failed} failed, {mismatches} mismatches, {skipped} skipped",
        files.len(),
        files.len() - failed - skipped
    );
    assert!(
        errors.is_empty(),
        "{} problem(s) in the conformance vectors (listed above)",
        errors.len()
    );
}
