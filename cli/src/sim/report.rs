//! Text table and SVG chart of a simulation report.

use super::scenario::FaultKind;
use super::{SimReport, StrategyResult};
use std::fmt::Write as _;

fn pct(x: f64) -> String {
    format!("{:.2} %", x * 100.0)
}

pub(crate) fn thousands(n: f64) -> String {
    let n = n.round() as i64;
    let s = n.abs().to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(ch);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

fn secs(ms: u64) -> String {
    if ms % 1000 == 0 {
        format!("{}", ms / 1000)
    } else {
        format!("{:.1}", ms as f64 / 1000.0)
    }
}

/// Describes the fault schedule in one line per fault.
pub fn describe_faults(r: &SimReport) -> Vec<String> {
    r.faults
        .iter()
        .map(|f| {
            let when = format!("{}-{} s", secs(f.from_ms), secs(f.to_ms));
            match &f.kind {
                FaultKind::Degrade {
                    error_rate,
                    error_status,
                    latency_mean_ms,
                } => format!(
                    "fault {when}: errors 0.01 % -> {} ({error_status}), mean latency 800 -> {} ms",
                    pct(*error_rate).replace(".00 %", " %"),
                    thousands(*latency_mean_ms)
                ),
                FaultKind::Outage => {
                    format!("fault {when}: hard outage, every request gets a fast 503 (nothing admitted)")
                }
                FaultKind::RateLimit {
                    per_sec,
                    retry_after_s,
                    window_s: 0,
                } => {
                    format!(
                        "fault {when}: provider rate limit {} req/s, 429 with retry-after: {retry_after_s}",
                        thousands(*per_sec)
                    )
                }
                FaultKind::RateLimit { per_sec, window_s, .. } => format!(
                    "fault {when}: provider rate limit {} requests per {window_s} s window, stated on every answer (x-ratelimit-*, RateLimit-Policy); a 429's retry-after is the window's reset",
                    thousands(per_sec * f64::from(*window_s))
                ),
                FaultKind::Surge { factor } => format!(
                    "fault {when}: offered traffic x{factor} ({} QPS)",
                    thousands(r.qps * factor)
                ),
            }
        })
        .collect()
}

fn recover(s: &StrategyResult) -> String {
    match (s.recovery_measured, s.time_to_recover_s) {
        (false, _) => "n/a".into(),
        (true, Some(t)) => format!("{t} s"),
        (true, None) => "never".into(),
    }
}

/// The human-readable report.
pub fn text(r: &SimReport) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "retrywise simulate --scenario {} --seed {} ({} instance{}{})",
        r.scenario,
        r.seed,
        r.instances,
        if r.instances == 1 { "" } else { "s" },
        if r.shared { ", sharing breaker state" } else { "" }
    );
    let _ = writeln!(o, "  {}", r.summary);
    let _ = writeln!(
        o,
        "  offered {} logical QPS (Poisson) for {} s; upstream capacity {} req/s ({:.2}x offered); queue bound {} ms, then 529",
        thousands(r.qps),
        r.duration_s,
        thousands(r.capacity_per_sec),
        r.capacity_factor,
        thousands(r.upstream.max_queue_ms)
    );
    for f in describe_faults(r) {
        let _ = writeln!(o, "  {f}");
    }
    let layers: Vec<String> = r
        .naive_layers
        .iter()
        .map(|l| format!("{} {} x {} s", l.name, l.attempts, secs(l.timeout_ms)))
        .collect();
    let _ = writeln!(
        o,
        "  (a) layers (attempts x per-attempt timeout): {}; no deadline, orphaned inner calls keep retrying; worst case {} attempts",
        layers.join(", "),
        r.naive_worst_case
    );
    let _ = writeln!(
        o,
        "  (b), (c): the real retrywise::Engine on a manual clock; per-attempt timeout {} ms, deadline {} ms",
        thousands(r.attempt_timeout_ms as f64),
        thousands(r.deadline_ms as f64)
    );
    let _ = writeln!(o);
    let header = [
        "strategy",
        "peak amp",
        "mean amp",
        "peak load/cap",
        "success",
        "p50",
        "p99",
        "recover",
    ];
    let w = [34, 9, 9, 14, 9, 9, 9, 8];
    let mut line = String::new();
    for (h, w) in header.iter().zip(w) {
        if line.is_empty() {
            let _ = write!(line, "{h:<w$}");
        } else {
            let _ = write!(line, " {h:>w$}");
        }
    }
    let _ = writeln!(o, "{line}");
    let _ = writeln!(o, "{}", "-".repeat(line.len()));
    for s in &r.strategies {
        let cells = [
            format!("{:.2}x", s.peak_amplification),
            format!("{:.2}x", s.mean_amplification),
            format!("{:.2}x", s.peak_load_vs_capacity),
            pct(s.final_success_rate),
            format!("{} ms", thousands(s.p50_ms as f64)),
            format!("{} ms", thousands(s.p99_ms as f64)),
            recover(s),
        ];
        let mut line = format!("{:<34}", s.label);
        for (c, w) in cells.iter().zip(&w[1..]) {
            let _ = write!(line, " {c:>w$}", w = *w);
        }
        let _ = writeln!(o, "{line}");
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "columns: amplification = physical attempts / logical requests per 1 s bucket (mean: whole run); load = attempts");
    let _ = writeln!(
        o,
        "reaching the upstream per second / capacity; success = logical requests answered within the {} s deadline;",
        r.deadline_ms / 1000
    );
    let _ = writeln!(o, "p50/p99 = time to the final answer, success or failure; recover = seconds after the fault until success is back");
    let _ = writeln!(
        o,
        "within 1 point of pre-fault with the upstream at or below capacity for the rest of the run."
    );
    let _ = writeln!(o);
    for s in &r.strategies {
        let _ = writeln!(
            o,
            "{}: {} logical, {} attempts{}, peak {} attempts/s at {} s, peak amplification at {} s",
            s.key,
            thousands(s.logical_requests as f64),
            thousands(s.attempts as f64),
            fault_attempts(r, s),
            thousands(s.peak_attempts_per_sec as f64),
            s.peak_load_at_s,
            s.peak_amplification_at_s
        );
        if let Some(e) = &s.engine {
            let stops: Vec<String> = e
                .stops
                .iter()
                .map(|(k, v)| format!("{k} {}", thousands(*v as f64)))
                .collect();
            let _ = writeln!(
                o,
                "  engine stats(): {} attempts, {} retries granted ({} won), {} budget refusals, {} breaker opens{}, {} probes; stops: {}",
                thousands(e.attempts as f64),
                thousands(e.retries as f64),
                thousands(e.retry_successes as f64),
                thousands(e.budget_refusals as f64),
                thousands(e.breaker_opens as f64),
                if r.shared { format!(" (+{} by the fleet)", thousands(e.fleet_opened as f64)) } else { String::new() },
                thousands(e.probes as f64),
                if stops.is_empty() { "none".into() } else { stops.join(", ") }
            );
        }
    }
    if !r.notes.is_empty() {
        let _ = writeln!(o);
        let _ = writeln!(o, "policy notes:");
        for n in &r.notes {
            let _ = writeln!(o, "  - {n}");
        }
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "checks (computed from this run):");
    for c in r.checks.iter().filter(|c| c.acceptance) {
        let _ = writeln!(o, "  [{}] {}", if c.ok { "ok" } else { "FAIL" }, c.detail);
    }
    if r.checks.iter().any(|c| !c.acceptance) {
        let _ = writeln!(
            o,
            "the default scenario's amplification checks, evaluated on this one (acceptance criteria for seed002 only):"
        );
        for c in r.checks.iter().filter(|c| !c.acceptance) {
            let _ = writeln!(o, "  [{}] {}", if c.ok { "holds" } else { "does not hold" }, c.detail);
        }
    }
    o
}

const COLORS: [&str; 3] = ["#d62728", "#ff7f0e", "#2ca02c"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn si(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{}k", v / 1e3)
    } else {
        format!("{v}")
    }
}

/// Two stacked charts over the arrival window: attempts per second at the
/// upstream (log scale, with capacity and offered load) and the success rate of
/// the logical requests arriving each second; the fault window is shaded.
pub fn svg(r: &SimReport) -> String {
    let (w, left, right) = (960.0, 80.0, 24.0);
    let pw = w - left - right;
    let dur = r.duration_s as f64;
    let x = |s: f64| left + pw * (s / dur);
    let (a_top, a_h) = (84.0, 250.0);
    let (b_top, b_h) = (394.0, 180.0);
    let height = 664.0;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" viewBox="0 0 {w} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{left}" y="24" font-size="15" font-weight="bold">retrywise simulate --scenario {} (seed {}, {} QPS, capacity {} req/s, {} instance{})</text>"#,
        esc(r.scenario),
        r.seed,
        thousands(r.qps),
        thousands(r.capacity_per_sec),
        r.instances,
        if r.instances == 1 { "" } else { "s" }
    );
    let _ = writeln!(o, r##"<text x="{left}" y="42" fill="#555">{}</text>"##, esc(&r.summary));
    // Fault windows.
    for f in &r.faults {
        let (x0, x1) = (x(f.from_ms as f64 / 1000.0), x((f.to_ms as f64 / 1000.0).min(dur)));
        for (top, h) in [(a_top, a_h), (b_top, b_h)] {
            let _ = writeln!(
                o,
                r##"<rect x="{x0:.1}" y="{top}" width="{:.1}" height="{h}" fill="#f2e6c9"/>"##,
                (x1 - x0).max(0.0)
            );
        }
    }
    // Panel A: attempts per second, log scale.
    let n = r.duration_s as usize;
    let mut vmax: f64 = r.capacity_per_sec.max(r.qps);
    let mut vmin: f64 = r.qps.min(r.capacity_per_sec);
    for s in &r.strategies {
        for &v in s.series.attempts.iter().take(n) {
            vmax = vmax.max(v as f64);
            if v > 0 {
                vmin = vmin.min(v as f64);
            }
        }
    }
    let lo = 10f64.powf(vmin.max(1.0).log10().floor());
    let hi = 10f64.powf(vmax.log10().ceil()).max(lo * 10.0);
    let ya = |v: f64| a_top + a_h * (1.0 - (v.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10()));
    let _ = writeln!(
        o,
        r#"<text x="{left}" y="{}" font-weight="bold">attempts per second reaching the upstream (log scale)</text>"#,
        a_top - 6.0
    );
    let mut t = lo;
    while t <= hi * 1.0001 {
        for m in [1.0, 2.0, 5.0] {
            let v = t * m;
            if v > hi * 1.0001 {
                break;
            }
            let y = ya(v);
            let _ = writeln!(
                o,
                r##"<line x1="{left}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#e5e5e5"/>"##,
                left + pw
            );
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                left - 6.0,
                y + 4.0,
                si(v)
            );
        }
        t *= 10.0;
    }
    let yc = ya(r.capacity_per_sec);
    let _ = writeln!(
        o,
        r##"<line x1="{left}" x2="{:.1}" y1="{yc:.1}" y2="{yc:.1}" stroke="#333" stroke-dasharray="6 4"/>"##,
        left + pw
    );
    let _ = writeln!(
        o,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#333">capacity</text>"##,
        left + pw - 4.0,
        yc - 4.0
    );
    let logical = r
        .strategies
        .first()
        .map(|s| s.series.logical.clone())
        .unwrap_or_default();
    let pts: Vec<String> = logical
        .iter()
        .take(n)
        .enumerate()
        .map(|(i, &v)| format!("{:.1},{:.1}", x(i as f64 + 0.5), ya(v as f64)))
        .collect();
    let _ = writeln!(
        o,
        r##"<polyline fill="none" stroke="#000" stroke-dasharray="2 3" stroke-width="1.5" points="{}"/>"##,
        pts.join(" ")
    );
    for (k, s) in r.strategies.iter().enumerate() {
        let pts: Vec<String> = s
            .series
            .attempts
            .iter()
            .take(n)
            .enumerate()
            .map(|(i, &v)| format!("{:.1},{:.1}", x(i as f64 + 0.5), ya(v as f64)))
            .collect();
        let _ = writeln!(
            o,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            COLORS[k % 3],
            pts.join(" ")
        );
    }
    // Panel B: success rate.
    let yb = |p: f64| b_top + b_h * (1.0 - p);
    let _ = writeln!(
        o,
        r#"<text x="{left}" y="{}" font-weight="bold">success rate of the logical requests arriving each second</text>"#,
        b_top - 6.0
    );
    for p in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let y = yb(p);
        let _ = writeln!(
            o,
            r##"<line x1="{left}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#e5e5e5"/>"##,
            left + pw
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{:.0} %</text>"#,
            left - 6.0,
            y + 4.0,
            p * 100.0
        );
    }
    for (k, s) in r.strategies.iter().enumerate() {
        let pts: Vec<String> = s
            .series
            .success_rate
            .iter()
            .take(n)
            .enumerate()
            .map(|(i, &v)| format!("{:.1},{:.1}", x(i as f64 + 0.5), yb(v)))
            .collect();
        let _ = writeln!(
            o,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            COLORS[k % 3],
            pts.join(" ")
        );
    }
    // Time axis under each panel.
    let step = [5u64, 10, 15, 20, 30, 60, 120, 300, 600]
        .into_iter()
        .find(|s| r.duration_s / s <= 12)
        .unwrap_or(600);
    for (top, h) in [(a_top, a_h), (b_top, b_h)] {
        let y = top + h;
        let _ = writeln!(
            o,
            r##"<line x1="{left}" x2="{:.1}" y1="{y}" y2="{y}" stroke="#999"/>"##,
            left + pw
        );
        let _ = writeln!(
            o,
            r##"<line x1="{left}" x2="{left}" y1="{top}" y2="{y}" stroke="#999"/>"##
        );
        let mut s = 0;
        while s <= r.duration_s {
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{s} s</text>"#,
                x(s as f64),
                y + 16.0
            );
            s += step;
        }
    }
    // Legend.
    let ly = height - 40.0;
    let mut lx = left;
    for (k, s) in r.strategies.iter().enumerate() {
        let _ = writeln!(
            o,
            r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{}" stroke-width="3"/>"#,
            lx + 24.0,
            COLORS[k % 3]
        );
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{}">{}</text>"#,
            lx + 30.0,
            ly + 4.0,
            esc(&s.label)
        );
        lx += 260.0;
    }
    let ly2 = ly + 20.0;
    let _ = writeln!(
        o,
        r##"<line x1="{left}" x2="{}" y1="{ly2}" y2="{ly2}" stroke="#000" stroke-dasharray="2 3" stroke-width="1.5"/>"##,
        left + 24.0
    );
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}">offered logical requests</text>"#,
        left + 30.0,
        ly2 + 4.0
    );
    let _ = writeln!(
        o,
        r##"<rect x="{}" y="{}" width="24" height="10" fill="#f2e6c9"/>"##,
        left + 260.0,
        ly2 - 5.0
    );
    let _ = writeln!(o, r#"<text x="{}" y="{}">fault window</text>"#, left + 290.0, ly2 + 4.0);
    o.push_str("</svg>\n");
    o
}

/// ` (N while a fault lasted)`: the attempts started in the faults' seconds
/// (what a down upstream receives from the whole fleet); empty without faults.
fn fault_attempts(r: &SimReport, s: &StrategyResult) -> String {
    if r.faults.is_empty() {
        return String::new();
    }
    let at = |i: u64| s.series.attempts.get(i as usize).copied().unwrap_or(0) as u64;
    let n: u64 = r
        .faults
        .iter()
        .map(|f| (f.from_ms / 1000..f.to_ms.div_ceil(1000)).map(at).sum::<u64>())
        .sum();
    format!(" ({} while a fault lasted)", thousands(n as f64))
}
