//! `retrywise`: simulate a retry storm against the real engine, audit retry
//! amplification of a call graph, validate policies, print the policy schema.

mod audit;
mod sim;

use clap::{Args, Parser, Subcommand};
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "retrywise",
    version,
    about = "One retry owner for model-API calls: simulate, audit, check",
    long_about = "One retry owner for model-API calls.\n\nRetries stacked in layers multiply (client 3 x SDK 3 x gateway 3 = 27 upstream calls for one user action) and turn a small blip into a retry storm. `simulate` shows it with numbers, `audit` computes it for your call graph, `check` validates a retrywise policy."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Simulate one upstream under naive layered retries, a jitter-only owner and retrywise (the real engine)
    #[command(long_about = SIMULATE_ABOUT)]
    Simulate(SimulateArgs),
    /// Worst-case retry amplification of a call graph, and which layer should own retries
    #[command(long_about = AUDIT_ABOUT, after_long_help = AUDIT_EXAMPLE)]
    Audit(AuditArgs),
    /// Validate a policy file (JSON, YAML or TOML); prints every error with its field path
    Check {
        /// Policy file (`.json`, `.yaml`/`.yml`, `.toml`; other names are sniffed), or `-` for stdin
        policy: PathBuf,
    },
    /// Print the JSON Schema of the policy
    Schema,
}

const SIMULATE_ABOUT: &str = "A deterministic discrete-event simulation of one model provider with finite capacity, under three retry strategies:

  (a) naive layered retries: client 3 x SDK 3 x gateway 3 attempts, fixed 1 s backoff, per-attempt timeouts, no deadline (modelled directly);
  (b) one owner with full jitter but no retry budget and no breaker (the real retrywise::Engine);
  (c) retrywise with retry budget and circuit breaker (the real retrywise::Engine).

(b) and (c) drive the real engine exactly like a gateway: begin, next_attempt, perform the I/O, report, sleep the decision's delay; the simulation only moves a manual clock to each event's time.

The upstream serves at most `capacity` requests per second; others queue, and a request that would wait more than 5 s gets a fast 529. The upstream never learns that a client timed out, so abandoned work still uses capacity. Arrivals are Poisson. Output columns: peak and mean amplification (attempts / logical requests per 1 s bucket), peak load vs capacity, final success rate, p50/p99 time to the final answer, time to recover after the fault.

Same seed, same output.";

const AUDIT_ABOUT: &str = "Worst-case retry amplification of a call graph, and which layer should own retries.

Every layer multiplies the work below it. A layer's factor is

    f = attempts x (1 + fallbacks) x redelivery x (1 + hedges)

  attempts    attempts per call, the first included (`max_retries: 2` means attempts 3)
  fallbacks   other targets tried after the first gives up, each with `attempts`
  redelivery  deliveries of one call, the first included (queue redelivery, workflow re-runs, re-submitted streams)
  hedges      parallel copies sent with each attempt

and a user action reaches the upstream under a path of layers at most A = f1 x f2 x ... x fn times. The recommendation: one owner per path (a layer marked `owner: true`, else a layer named *gateway*, else the layer nearest the upstream) keeps its attempts with a retry budget; every other layer goes to 1 and passes the deadline, request id and idempotency key down instead.";

const AUDIT_EXAMPLE: &str = "Examples:
  retrywise audit --layers 3,3,3

  retrywise audit graph.yaml, where graph.yaml is a tree (each layer's `calls` are made once per attempt):
    name: web-app
    attempts: 3
    calls:
      - name: sdk
        attempts: 3
        calls:
          - name: llm-gateway
            attempts: 3
            fallbacks: 1
            hedges: 0
  or a chain, outermost first:
    layers:
      - {name: client, attempts: 3}
      - {name: sdk, attempts: 3}
      - {name: gateway, attempts: 3}";

#[derive(Args, Debug)]
struct SimulateArgs {
    /// Scenario
    #[arg(long, default_value = "seed002", value_parser = clap::builder::PossibleValuesParser::new(sim::scenario::NAMES))]
    scenario: String,
    /// Independent gateway instances, each with its own engine, sharing the upstream (fleet view)
    #[arg(long, default_value_t = 1)]
    instances: u32,
    /// Seconds of arrivals (fault times scale with it); default per scenario (90 s for seed002)
    #[arg(long)]
    duration: Option<u64>,
    /// Offered logical requests per second
    #[arg(long, default_value_t = 12_000.0)]
    qps: f64,
    /// Seed of every random choice
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Upstream capacity as a multiple of --qps
    #[arg(long, default_value_t = 1.15)]
    capacity: f64,
    /// Print the full report (with per-second series) as JSON on stdout
    #[arg(long)]
    json: bool,
    /// Write an SVG chart of load and success over time to FILE
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Run strategy (c) with this policy (JSON, YAML or TOML) instead of the scenario's; the simulated upstream and route are named `provider`
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Threads (the three strategies are independent; the output does not depend on this)
    #[arg(long)]
    jobs: Option<usize>,
}

#[derive(Args, Debug)]
struct AuditArgs {
    /// Attempts per layer, outermost first, e.g. 3,3,3
    #[arg(long, value_name = "A,B,...", conflicts_with = "file")]
    layers: Option<String>,
    /// A call graph in YAML or JSON (see below)
    #[arg(value_name = "FILE.yaml")]
    file: Option<PathBuf>,
    /// Print the analysis as JSON
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Simulate(a) => simulate(a),
        Cmd::Audit(a) => run_audit(a),
        Cmd::Check { policy } => check(&policy),
        Cmd::Schema => {
            println!(
                "{}",
                serde_json::to_string_pretty(&retrywise::Policy::json_schema()).unwrap_or_default()
            );
            Ok(ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn simulate(a: SimulateArgs) -> Result<ExitCode, String> {
    let o = sim::scenario::Overrides {
        qps: Some(a.qps),
        duration_s: a.duration,
        seed: Some(a.seed),
        instances: Some(a.instances),
        capacity_factor: Some(a.capacity),
    };
    let mut sc = sim::scenario::Scenario::named(&a.scenario, &o)?;
    if let Some(path) = &a.policy {
        let policy = retrywise::Policy::from_file(path).map_err(|e| format!("policy {}: {e}", path.display()))?;
        sc = sc.with_retrywise_policy(policy, &path.display().to_string());
    }
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // A progress bar on stderr, only for a terminal and only once the run has taken a second.
    let bar = indicatif::ProgressBar::with_draw_target(Some(1000), indicatif::ProgressDrawTarget::hidden());
    bar.set_style(
        indicatif::ProgressStyle::with_template("simulating {bar:40} {percent:>3}% {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let started = std::time::Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut shown = false;
    let report = sim::run(&sc, jobs, |done| {
        if tty && !shown && started.elapsed().as_secs_f64() >= 1.0 {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            shown = true;
        }
        bar.set_position((done * 1000.0) as u64);
    });
    bar.finish_and_clear();
    let report = report?;
    if let Some(path) = &a.svg {
        std::fs::write(path, sim::report::svg(&report)).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
    } else {
        print!("{}", sim::report::text(&report));
        if let Some(path) = &a.svg {
            println!("\nchart written to {}", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn run_audit(a: AuditArgs) -> Result<ExitCode, String> {
    let root = match (&a.layers, &a.file) {
        (Some(l), None) => audit::from_layers(l)?,
        (None, Some(f)) => {
            let text = std::fs::read_to_string(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?;
            audit::parse(&text).map_err(|e| format!("{}: {e}", f.display()))?
        }
        _ => return Err("give --layers 3,3,3 or a call-graph file (see `retrywise audit --help`)".into()),
    };
    let reports = audit::analyse(&root)?;
    if a.json {
        let worst = reports.iter().map(|r| r.amplification).max().unwrap_or(1);
        let v = serde_json::json!({ "graph": root, "paths": reports, "worst_case_amplification": worst });
        println!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
    } else {
        print!("{}", audit::text(&root, &reports));
    }
    Ok(ExitCode::SUCCESS)
}

fn check(path: &std::path::Path) -> Result<ExitCode, String> {
    let (name, result) = if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map_err(|e| format!("cannot read stdin: {e}"))?;
        ("<stdin>".to_string(), retrywise::Policy::from_str_any(&text))
    } else {
        (path.display().to_string(), retrywise::Policy::from_file(path))
    };
    match result {
        Ok(p) => {
            println!("ok: policy {} is valid", p.version);
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            for e in &errors.0 {
                if e.path.is_empty() {
                    eprintln!("error: {}", e.message);
                } else {
                    eprintln!("error: {}: {}", e.path, e.message);
                }
            }
            let n = errors.0.len();
            eprintln!("{name}: {n} error{}", if n == 1 { "" } else { "s" });
            Ok(ExitCode::from(1))
        }
    }
}
