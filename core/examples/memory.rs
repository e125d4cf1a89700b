//! Memory bounds of the per-key state: the footprint of one breaker + budget
//! key, and the resident set under a flood of distinct tenants.
//!
//! Usage: `memory [per-key|engine-per-key|flood|all] [N]` (default `all`:
//! each measurement below in its own child process).
//!
//! - `per-key`: N keys (default 100 000) inserted into a breaker registry and
//!   a budget registry exactly as the engine stores them (default policy:
//!   count window of 100 calls, 10 budget buckets; keys `tenant-0000001`,
//!   14 bytes); bytes per key = RSS delta / N. Also at N = 10 000, the default
//!   `limits.max_keys`.
//! - `engine-per-key`: N distinct tenants (default 100 000) through one
//!   engine whose breaker scope is `[upstream, tenant]` and budget scope
//!   `[tenant]`, with `limits.max_keys` raised so nothing is evicted: each
//!   tenant makes a 503 + retry + 200 call. Bytes per tenant = RSS delta / N,
//!   which adds the per-tenant counters to the breaker and budget keys.
//! - `flood`: N distinct tenants (default 1 000 000), same call shape, same
//!   scopes, default `limits.max_keys` (10 000): RSS is sampled every
//!   100 000 calls and must stay under the cap below; every registry must
//!   track at most `max_keys` keys.
//!
//! RSS is read from `/proc/self/status` (Linux). The core forbids unsafe
//! code, so there is no counting allocator here: RSS deltas over many keys
//! agree to within ~2 % between 10 000 and 100 000 keys. Exit status 1 when a
//! bound is exceeded.

use retrywise::internals::Registry;
use retrywise::internals::{BreakerCell, BreakerParams};
use retrywise::internals::{BudgetCell, BudgetParams};
use retrywise::policy::ScopeDim;
use retrywise::{Action, CallSpec, Engine, ManualClock, Outcome, Policy};
use std::hint::black_box;
use std::sync::Arc;

/// Target footprint of one breaker + budget key.
const PER_KEY_TARGET: f64 = 512.0;
/// Documented cap on RSS growth under the 1 M-tenant flood (docs/memory.md).
const FLOOD_CAP_MIB: f64 = 32.0;

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Resident set, bytes.
fn rss() -> u64 {
    status_kib("VmRSS:") * 1024
}

/// Peak resident set, bytes.
fn peak_rss() -> u64 {
    status_kib("VmHWM:") * 1024
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn key(i: u64) -> String {
    format!("tenant-{i:07}")
}

/// Breaker + budget registries holding `n` keys: bytes per key for each and together.
fn per_key(n: u64) -> (f64, f64) {
    let policy = Policy::default();
    let bp = BreakerParams::new(&policy.breaker);
    let gp = BudgetParams::new(&policy.budget);
    let max_keys = u32::try_from(n * 2).unwrap_or(u32::MAX);
    let breakers: Registry<BreakerCell> = Registry::new();
    let budgets: Registry<BudgetCell> = Registry::new();
    let before = rss();
    for i in 0..n {
        let k = key(i);
        breakers.get_or_insert(&k, i, max_keys, u64::MAX, || BreakerCell::new(bp.clone(), i));
    }
    let mid = rss();
    for i in 0..n {
        let k = key(i);
        let cell = budgets.get_or_insert(&k, i, max_keys, u64::MAX, || BudgetCell::new(gp));
        cell.value.deposit(&gp, i);
    }
    let after = rss();
    assert_eq!((breakers.len() as u64, budgets.len() as u64), (n, n));
    black_box((&breakers, &budgets));
    let breaker = (mid - before) as f64 / n as f64;
    let budget = (after - mid) as f64 / n as f64;
    (breaker, budget)
}

fn flood_policy(max_keys: u32) -> Policy {
    let mut p = Policy::default();
    p.budget.scopes = vec![vec![ScopeDim::Tenant]];
    p.breaker.scope = vec![ScopeDim::Upstream, ScopeDim::Tenant];
    p.limits.max_keys = max_keys;
    p
}

/// One call of the flood: a 503 (a budget withdrawal in the tenant's scope), then a 200.
fn one_call(engine: &Engine, clock: &ManualClock, tenant: &str) {
    let mut call = engine.begin(CallSpec::new("openai/gpt-4o").deadline_ms(10_000).tenant(tenant));
    let Ok(_) = call.next_attempt() else { return };
    let d = call.report(&Outcome::status(503));
    if matches!(d.action, Action::Retry | Action::Fallback) {
        clock.advance(d.delay.min(std::time::Duration::from_millis(1)));
        if call.next_attempt().is_ok() {
            black_box(call.report(&Outcome::status(200)));
        }
    }
    clock.advance_ms(1);
}

fn engine(max_keys: u32) -> (Engine, ManualClock) {
    let clock = ManualClock::new();
    let e = Engine::builder(flood_policy(max_keys))
        .clock(Arc::new(clock.clone()))
        .seed(1)
        .read_env(false)
        .build()
        .expect("valid policy");
    (e, clock)
}

fn engine_per_key(n: u64) -> f64 {
    let (e, clock) = engine(u32::try_from(n * 2).unwrap_or(u32::MAX).min(100_000_000));
    one_call(&e, &clock, "warm-up");
    let before = rss();
    for i in 0..n {
        one_call(&e, &clock, &key(i));
    }
    let after = rss();
    let tracked = e.stats().tracked_keys;
    assert!(tracked.get("budgets").copied().unwrap_or(0) > n, "{tracked:?}");
    (after - before) as f64 / n as f64
}

/// Floods one engine with `n` distinct tenants; true when every bound held.
fn flood(n: u64) -> bool {
    let (e, clock) = engine(Policy::default().limits.max_keys);
    let max_keys = u64::from(e.policy().limits.max_keys);
    for i in 0..1_000 {
        one_call(&e, &clock, &format!("warm-up-{i}"));
    }
    let base = rss();
    let mut max = base;
    let mut ok = true;
    println!(
        "flood: {n} distinct tenants, budget scope [tenant], breaker scope [upstream, tenant], max_keys {max_keys}"
    );
    println!(
        "  {:>9}  {:>9}  {:>8}  {:>8}  {:>8}",
        "calls", "RSS MiB", "budgets", "breakers", "tenants"
    );
    let step = (n / 10).max(1);
    let t0 = std::time::Instant::now();
    for i in 0..n {
        one_call(&e, &clock, &key(i));
        if (i + 1) % step == 0 || i + 1 == n {
            let now = rss();
            max = max.max(now);
            let s = e.stats();
            let t = |k: &str| s.tracked_keys.get(k).copied().unwrap_or(0);
            println!(
                "  {:>9}  {:>9.1}  {:>8}  {:>8}  {:>8}",
                i + 1,
                mib(now),
                t("budgets"),
                t("breakers"),
                t("tenants")
            );
            for k in ["budgets", "breakers", "tenants", "upstreams", "gates", "throttles"] {
                if t(k) > max_keys {
                    println!("  FAIL: {k} tracks {} keys > max_keys {max_keys}", t(k));
                    ok = false;
                }
            }
        }
    }
    let s = e.stats();
    let last = rss();
    max = max.max(last);
    let growth = mib(max.saturating_sub(base));
    println!(
        "  {:.1} s; evicted: budgets {}, breakers {}, tenants {}",
        t0.elapsed().as_secs_f64(),
        s.evicted_keys.get("budgets").copied().unwrap_or(0),
        s.evicted_keys.get("breakers").copied().unwrap_or(0),
        s.evicted_keys.get("tenants").copied().unwrap_or(0)
    );
    println!(
        "  RSS: baseline {:.1} MiB, max {:.1} MiB, last {:.1} MiB, growth {growth:.1} MiB (cap {FLOOD_CAP_MIB} MiB), peak (VmHWM) {:.1} MiB",
        mib(base),
        mib(max),
        mib(last),
        mib(peak_rss())
    );
    if growth > FLOOD_CAP_MIB {
        println!("  FAIL: RSS grew {growth:.1} MiB > cap {FLOOD_CAP_MIB} MiB");
        ok = false;
    }
    ok
}

/// Runs one measurement in a child process, so that memory freed by an
/// earlier measurement cannot hide the growth of the next one.
fn child(args: &[&str]) -> bool {
    let exe = std::env::current_exe().expect("current exe");
    match std::process::Command::new(exe).args(args).status() {
        Ok(s) => s.success(),
        Err(e) => {
            eprintln!("memory: cannot run {args:?}: {e}");
            false
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "all".into());
    let n: Option<u64> = args.next().and_then(|s| s.parse().ok());
    if rss() == 0 {
        eprintln!("memory: /proc/self/status has no VmRSS (Linux only)");
        std::process::exit(2);
    }
    let ok = match what.as_str() {
        "per-key" => {
            let n = n.unwrap_or(100_000);
            let (breaker, budget) = per_key(n);
            let total = breaker + budget;
            println!(
                "per-key ({n} keys): breaker {breaker:.0} B + budget {budget:.0} B = {total:.0} B per key (target <= {PER_KEY_TARGET:.0} B){}",
                if total <= PER_KEY_TARGET { "" } else { "  ABOVE TARGET" }
            );
            true
        }
        "engine-per-key" => {
            let n = n.unwrap_or(100_000);
            let b = engine_per_key(n);
            println!(
                "engine-per-key ({n} tenants, nothing evicted): {b:.0} B per tenant \
                 (breaker + budget + tenant counters + key strings)"
            );
            true
        }
        "flood" => flood(n.unwrap_or(1_000_000)),
        "all" => {
            let mut ok = child(&["per-key", "100000"]);
            ok &= child(&["per-key", "10000"]);
            ok &= child(&["engine-per-key", "100000"]);
            ok &= child(&["flood", "1000000"]);
            ok
        }
        _ => {
            eprintln!("usage: memory [per-key|engine-per-key|flood|all] [N]");
            std::process::exit(2);
        }
    };
    if !ok {
        std::process::exit(1);
    }
}
