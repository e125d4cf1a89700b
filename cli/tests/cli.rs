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

/// (c) runs the file's policy: one equal to (b)'s (no budget, no breaker, the
/// same timeouts) gives (b)'s exact run; YAML and TOML files load too.
#[test]
fn simulate_policy_file_replaces_the_retrywise_policy() {
    let same_as_jitter = tmp(
        "as-jitter.json",
        r#"{"version": "as-jitter", "timeouts": {"attempt_ms": 4000}, "telemetry": {"ring_size": 0},
            "budget": {"enabled": false}, "breaker": {"enabled": false}}"#,
    );
    let args = ["--scenario", "hard-outage", "--qps", "400", "--duration", "30"];
    let mut with = args.to_vec();
    with.extend(["--policy", same_as_jitter.to_str().unwrap()]);
    let r = simulate_json(&with);
    let (b, c) = (&r["strategies"][1], &r["strategies"][2]);
    assert_eq!(r["retrywise_policy"]["version"], "as-jitter");
    assert_eq!(c["label"], "(c) retrywise: policy as-jitter");
    for k in ["successes", "attempts", "p99_ms", "time_to_recover_s"] {
        assert_eq!(b[k], c[k], "{k}");
    }
    assert_eq!(b["series"], c["series"]);
    let notes = r["notes"].as_array().unwrap();
    assert!(
        notes.iter().any(|n| n.as_str().unwrap().contains("as-jitter.json")),
        "{notes:?}"
    );
    // The scenario's own policy trips its breaker here; the file's has none.
    let own = simulate_json(&args);
    assert!(own["strategies"][2]["engine"]["breaker_opens"].as_u64().unwrap() > 0);
    assert_eq!(c["engine"]["breaker_opens"], 0);

    let yaml = tmp(
        "sim-policy.yaml",
        "version: y1\ntimeouts: {attempt_ms: 4000}\nbreaker: {open_max_ms: 7000, half_open_probes: 3}\n",
    );
    let toml = tmp(
        "sim-policy.toml",
        "version = \"t1\"\n[timeouts]\nattempt_ms = 4000\n[breaker]\nopen_max_ms = 7000\nhalf_open_probes = 3\n",
    );
    for f in [&yaml, &toml] {
        let mut with = args.to_vec();
        with.extend(["--policy", f.to_str().unwrap()]);
        let r = simulate_json(&with);
        let br = &r["retrywise_policy"]["breaker"];
        assert_eq!(
            (br["open_max_ms"].as_u64(), br["half_open_probes"].as_u64()),
            (Some(7_000), Some(3))
        );
        // The recovery bound follows the file: 7 s open at most + 4 s attempt + 1 s.
        assert_eq!(r["recovery_bound_s"], 12, "{}", f.display());
    }
}

#[test]
fn simulate_bad_policy_names_the_file_and_the_field() {
    for (name, text, field) in [
        (
            "bad-rate.yaml",
            "breaker:\n  failure_rate: 1.5\n",
            "breaker.failure_rate",
        ),
        (
            "bad-field.json",
            r#"{"breaker": {"open_max": 1000}}"#,
            "breaker.open_max",
        ),
        ("bad-cap.toml", "[breaker]\nopen_ms = 30000\n", "breaker.open_max_ms"),
    ] {
        let p = tmp(name, text);
        let o = run(&[
            "simulate",
            "--qps",
            "100",
            "--duration",
            "10",
            "--policy",
            p.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{name}");
        let err = stderr(&o);
        assert!(
            err.contains(&*p.to_string_lossy()) && err.contains(field),
            "{name}: {err}"
        );
        assert!(stdout(&o).is_empty(), "{name}: nothing is simulated");
    }
    let o = run(&["simulate", "--policy", "/nonexistent/policy.yaml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("/nonexistent/policy.yaml"), "{}", stderr(&o));
}

/// Every scenario as `retrywise simulate --scenario NAME` runs it (its seed,
/// 12 000 QPS): retrywise recovers within the bound its policy gives, and
/// answers at least what jitter alone does.
fn scenario_checks(name: &str) {
    let r = simulate_json(&["--scenario", name, "--jobs", "1"]);
    assert_eq!((r["scenario"].as_str(), r["seed"].as_u64()), (Some(name), Some(42)));
    checks_hold(name, &r);
}

/// The checks of one `simulate --json` report of scenario `name`.
fn checks_hold(name: &str, r: &Value) {
    let check = |n: &str| r["checks"].as_array().unwrap().iter().find(|c| c["name"] == n).cloned();
    let (b, c) = (&r["strategies"][1], &r["strategies"][2]);
    let success = check("retrywise_success_not_worse_than_jitter_only").expect("every scenario checks success");
    assert_eq!(success["acceptance"], true);
    assert_eq!(
        success["ok"],
        c["successes"].as_u64() >= b["successes"].as_u64(),
        "{success}"
    );
    assert_eq!(success["ok"], true, "{success}");
    match check("retrywise_recovers_within_bound") {
        Some(rec) => {
            assert_eq!(rec["ok"], true, "{rec}");
            let t = c["time_to_recover_s"].as_u64().expect("recovered");
            assert!(t <= r["recovery_bound_s"].as_u64().unwrap(), "{t}");
        }
        None => assert!(
            ["steady-5pct", "rate-limited"].contains(&name),
            "only a fault that never ends has no recovery: {name}"
        ),
    }
    if name == "hard-outage" {
        // Tripped at the outage's start, the breaker probes as each open period
        // ends (1 s growing x1.5, ± 10 %, at most 20 s), so one comes within a
        // few seconds of the recovery; calls refused meanwhile wait for a probe
        // window up to 1 s away (breaker.hold_max_ms) instead of failing.
        assert!(
            c["time_to_recover_s"].as_u64().unwrap() <= 3,
            "{}",
            c["time_to_recover_s"]
        );
    }
}

#[test]
fn simulate_seed002_checks() {
    scenario_checks("seed002");
}

#[test]
fn simulate_steady_5pct_checks() {
    scenario_checks("steady-5pct");
}

#[test]
fn simulate_hard_outage_checks() {
    scenario_checks("hard-outage");
}

/// `rate-limited`: a provider limit of L requests per minute stated on every
/// answer, offered 2 L: retrywise paces before the 429 — it sends at most 1 %
/// of the 429s jitter alone sends and completes at least 95 % of L per minute
/// while the load lasts — at the default seed and at one where the window's
/// opening once sent the waiters and the newcomers together.
#[test]
fn simulate_rate_limited_checks() {
    for seed in [42, 2] {
        let r = simulate_json(&["--scenario", "rate-limited", "--jobs", "1", "--seed", &seed.to_string()]);
        assert_eq!(r["seed"].as_u64(), Some(seed));
        checks_hold("rate-limited", &r);
        rate_limited_holds(&r);
    }
}

fn rate_limited_holds(r: &Value) {
    // Answers given before the offered load ends, per minute, against L (half the offered rate).
    let secs = r["duration_s"].as_u64().unwrap();
    let done: u64 = r["strategies"][2]["series"]["goodput"].as_array().unwrap()[..secs as usize]
        .iter()
        .map(|n| n.as_u64().unwrap())
        .sum();
    let limit = r["qps"].as_f64().unwrap() / 2.0 * 60.0;
    let per_min = done as f64 * 60.0 / secs as f64;
    assert!(per_min >= 0.95 * limit, "{per_min} of {limit} per minute");
    for name in [
        "retrywise_429s_at_most_1pct_of_jitter_only",
        "retrywise_completes_95pct_of_the_limit",
    ] {
        let c = r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap();
        assert_eq!(
            (c["acceptance"].as_bool(), c["ok"].as_bool()),
            (Some(true), Some(true)),
            "{c}"
        );
    }
    let sent_429 = |i: usize| {
        r["strategies"][i]["series"]["rate_limited"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum::<u64>()
    };
    assert!(sent_429(2) * 100 <= sent_429(1), "{} vs {}", sent_429(2), sent_429(1));
}

#[test]
fn simulate_429_storm_checks() {
    scenario_checks("429-storm");
}

#[test]
fn simulate_overload_checks() {
    scenario_checks("overload");
}
