//! Runs the `retrywise` binary.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_retrywise"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run retrywise")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn tmp(name: &str, text: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn audit_layers_prints_27_and_names_the_owner() {
    let o = run(&["audit", "--layers", "3,3,3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("27"), "{out}");
    assert!(out.contains("A = 3 x 3 x 3 = 27"), "{out}");
    assert!(out.contains("owner: layer 3"), "{out}");
    assert!(out.contains("A becomes 3 (was 27)"), "{out}");
}

#[test]
fn audit_yaml_call_graph_multiplies_every_factor() {
    let graph = tmp(
        "graph.yaml",
        "name: web-app\nattempts: 3\ncalls:\n  - name: sdk\n    attempts: 3\n    calls:\n      - name: llm-gateway\n        attempts: 3\n        fallbacks: 1\n        hedges: 1\n",
    );
    let o = run(&["audit", graph.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("A = 3 x 3 x 12 = 108"), "{out}");
    assert!(out.contains("owner: llm-gateway"), "{out}");
    let o = run(&["audit", "--json", graph.to_str().unwrap()]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["worst_case_amplification"], 108);
    let bad = tmp("bad-graph.yaml", "name: a\ncalls:\n  - name: b\n    attempts: 0\n");
    let o = run(&["audit", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("root.calls[0].attempts"), "{}", stderr(&o));
}

#[test]
fn audit_help_explains_the_model() {
    let out = stdout(&run(&["audit", "--help"]));
    for word in ["attempts", "fallbacks", "redelivery", "hedges", "owner"] {
        assert!(out.contains(word), "{word} missing from:\n{out}");
    }
}

#[test]
fn check_accepts_good_policies_in_every_format() {
    for (name, text) in [
        (
            "good.json",
            r#"{"version": "v7", "max_attempts": 2, "breaker": {"failure_rate": 0.4}}"#,
        ),
        (
            "good.yaml",
            "version: v7\nmax_attempts: 2\nbreaker:\n  failure_rate: 0.4\n",
        ),
        (
            "good.toml",
            "version = \"v7\"\nmax_attempts = 2\n[breaker]\nfailure_rate = 0.4\n",
        ),
    ] {
        let p = tmp(name, text);
        let o = run(&["check", p.to_str().unwrap()]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        assert_eq!(stdout(&o).trim(), "ok: policy v7 is valid");
    }
}

#[test]
fn check_names_every_bad_field() {
    let p = tmp(
        "bad.yaml",
        "version: v8\nmax_attempts: 0\nbreaker:\n  failure_rate: 1.5\n",
    );
    let o = run(&["check", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("breaker.failure_rate"), "{err}");
    assert!(err.contains("max_attempts"), "{err}");
    assert!(err.contains("2 errors"), "{err}");
    assert!(stdout(&o).is_empty());
    let missing = run(&["check", "/nonexistent/policy.yaml"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(stderr(&missing).contains("cannot read"));
}

#[test]
fn schema_is_the_policy_json_schema() {
    let o = run(&["schema"]);
    assert!(o.status.success());
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v, retrywise::Policy::json_schema());
    assert!(v["properties"]["budget"].is_object());
}

/// The production binary's schema has no test hooks (they exist only with
/// the core's `test-hooks` feature, which the binding test builds turn on).
#[test]
fn schema_has_no_test_hooks() {
    let o = run(&["schema"]);
    assert!(o.status.success());
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(!text.contains("panic_on_vendor_code"), "{text}");
    assert!(!text.contains("\"testing\""), "{text}");
}

fn simulate_json(args: &[&str]) -> Value {
    let mut all = vec!["simulate", "--json"];
    all.extend_from_slice(args);
    let o = run(&all);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("simulate --json prints JSON")
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap()
}

#[test]
fn simulate_default_scenario_headline_relations() {
    // The default scenario, shortened in traffic (not in time: the storm needs the 30 s blip).
    let r = simulate_json(&["--qps", "500", "--duration", "90"]);
    assert_eq!(r["scenario"], "seed002");
    let s = r["strategies"].as_array().unwrap();
    let keys: Vec<&str> = s.iter().map(|x| x["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["naive_layered", "jitter_only", "retrywise"]);
    let (naive, jitter, rw) = (&s[0], &s[1], &s[2]);
    // The headline numbers, recomputed from the per-second series.
    for x in s {
        let series = &x["series"];
        let amp = series["amplification"]
            .as_array()
            .unwrap()
            .iter()
            .map(f)
            .fold(0.0, f64::max);
        assert!((amp - f(&x["peak_amplification"])).abs() < 1e-12);
        let logical: f64 = series["logical"].as_array().unwrap().iter().map(f).sum();
        assert_eq!(logical, f(&x["logical_requests"]));
    }
    assert!(
        f(&naive["peak_amplification"]) >= 3.0,
        "{}",
        naive["peak_amplification"]
    );
    let floor = r["instances"].as_f64().unwrap()
        * f(&r["retrywise_policy"]["budget"]["min_per_sec"])
        * f(&r["retrywise_policy"]["budget"]["window_ms"])
        / 1000.0
        / f(&r["qps"]);
    assert!(
        f(&rw["peak_amplification"]) <= 1.1 + floor,
        "{} > 1.1 + {floor}",
        rw["peak_amplification"]
    );
    assert!(f(&rw["final_success_rate"]) >= f(&jitter["final_success_rate"]));
    // Near capacity at worst (Poisson seconds at 500 QPS wobble by a few percent), never far above it.
    assert!(
        f(&rw["peak_load_vs_capacity"]) < 1.1,
        "retrywise keeps the upstream about at or under capacity"
    );
    assert!(f(&naive["peak_load_vs_capacity"]) > 3.0);
    assert!(
        r["checks"].as_array().unwrap().iter().all(|c| c["ok"] == true),
        "{}",
        r["checks"]
    );
    // (b) and (c) ran on the real engine and say so in their counters.
    assert!(rw["engine"]["budget_refusals"].as_u64().unwrap() > 0);
    assert_eq!(jitter["engine"]["budget_refusals"], 0);
    assert!(naive["engine"].is_null());
}

#[test]
fn simulate_text_svg_fleet_and_errors() {
    let svg = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("storm.svg");
    let o = run(&[
        "simulate",
        "--scenario",
        "overload",
        "--qps",
        "300",
        "--duration",
        "30",
        "--instances",
        "3",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for needle in [
        "peak amp",
        "mean amp",
        "peak load/cap",
        "success",
        "p99",
        "recover",
        "(c) retrywise",
        "3 instances",
    ] {
        assert!(out.contains(needle), "{needle} missing from:\n{out}");
    }
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(
        chart.starts_with("<svg") && chart.trim_end().ends_with("</svg>") && chart.matches("<polyline").count() >= 7
    );
    assert!(
        stderr(&o).is_empty(),
        "no progress bar without a terminal: {}",
        stderr(&o)
    );
    let o = run(&["simulate", "--scenario", "nope"]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&["simulate", "--qps", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--qps"));
}

#[test]
fn simulate_every_scenario_runs() {
    for name in ["steady-5pct", "hard-outage", "429-storm", "overload"] {
        let r = simulate_json(&["--scenario", name, "--qps", "200", "--duration", "20"]);
        assert_eq!(r["scenario"], name);
        for s in r["strategies"].as_array().unwrap() {
            let rate = f(&s["final_success_rate"]);
            assert!((0.0..=1.0).contains(&rate));
            assert!(f(&s["mean_amplification"]) > 0.0);
        }
    }
}
