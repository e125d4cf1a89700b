"""The summary table at the top of BENCHMARKS.md, read from the outputs of one
`bench/run-all` run (its temporary directory): each target, what this run
measured, and whether the target is met. A number the run did not produce is
"not measured", never carried over from an earlier run.

    python3 bench/summary.py DIR    # prints the Markdown table
"""

from __future__ import annotations

import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def read(d: Path, name: str) -> str:
    p = d / name
    return p.read_text() if p.exists() else ""


def criterion(text: str, row: str) -> float | None:
    m = re.search(
        rf"^test {re.escape(row)} \.\.\. bench:\s+([\d,]+) ns/iter", text, re.MULTILINE
    )
    return float(m.group(1).replace(",", "")) if m else None


def scaling(text: str) -> float | None:
    """Median ratio of the cycle's paired rounds (2 × t(one) / t(two))."""
    ratios = []
    for line in text.splitlines():
        cols = line.split()
        if len(cols) >= 4 and cols[0].isdigit():
            try:
                ratios.append(float(cols[3]))
            except ValueError:
                pass
    return statistics.median(ratios) if ratios else None


def ffi_instructions(text: str, kind: str) -> float | None:
    m = re.search(rf"^{kind}\s+\d+\s+(\d+)\s+([+-][\d.]+)%", text, re.MULTILINE)
    # No instructions counted in the ABI's cycle: its symbol was not found, nothing measured.
    return float(m.group(2)) if m and int(m.group(1)) > 0 else None


def ffi_wall(text: str, kind: str) -> float | None:
    m = re.search(rf"^{kind}\b.*?overhead: median ([+-][\d.]+) %", text, re.MULTILINE)
    return float(m.group(1)) if m else None


def python_cycle(text: str) -> tuple[float | None, float | None]:
    m = re.search(r"^retrywise\s+(\d+)\s+[\d.]+\s+(\d+)", text, re.MULTILINE)
    return (float(m.group(1)), float(m.group(2))) if m else (None, None)


def dropin(text: str) -> dict[tuple[str, str], tuple[float, float | None]]:
    """(workload, client) -> (overhead %, µs per chunk) from a dropin table."""
    out: dict[tuple[str, str], tuple[float, float | None]] = {}
    workload = ""
    for line in text.splitlines():
        if line.startswith("JSON completion"):
            workload = "json"
        elif re.match(r"^\d+-chunk stream", line):
            workload = "stream"
        m = re.match(
            # Python writes `+10.7%  +5.7`, Node `14.5%  +   4.45`.
            r"^(README wiring|catalog)\s+[\d.]+\s+\S+\s+([+-]?[\d.]+)\s*%(?:\s+([+-]?)\s*([\d.]+))?",
            line,
        )
        if m and workload:
            chunk = float((m.group(3) or "") + m.group(4)) if m.group(4) else None
            out[(workload, m.group(1))] = (float(m.group(2)), chunk)
    return out


def node_ratio(text: str, als: str, row: str) -> float | None:
    """retrywise / cockatiel for one loop, AsyncLocalStorage `als` ("off"/"on")."""
    part = text.split(f"AsyncLocalStorage {als}", 1)
    if len(part) < 2:
        return None
    section = part[1].split("AsyncLocalStorage", 1)[0]
    m = re.search(
        rf"^\s*{re.escape(row)}\s+\d+\s+\(.*?\)\s+x([\d.]+)", section, re.MULTILINE
    )
    return float(m.group(1)) if m else None


@dataclass
class RateCase:
    """One case of a rate-limit end-to-end report."""

    family: str
    limit: int
    jitter: int | None = None
    paced: int | None = None
    #: retrywise's 429s after the first window.
    later: int | None = None
    #: retrywise's answers per window.
    windows: list[int] | None = None


def ratelimit_cases(text: str) -> list[RateCase]:
    """Each complete case of a rate-limit end-to-end report."""
    cases: list[RateCase] = []
    for line in text.splitlines():
        m = re.match(r"^([a-z]+)-(fixed|bucket)\S*: L=(\d+)/", line)
        if m:
            cases.append(RateCase(m.group(1), int(m.group(3))))
            continue
        m = re.match(r"^\s+jitter-only:\s+(\d+) 429s", line)
        if m and cases:
            cases[-1].jitter = int(m.group(1))
            continue
        m = re.match(
            r"^\s+retrywise:\s+(\d+) 429s \((\d+) after.*per window \[([\d, ]+)\]", line
        )
        if m and cases:
            cases[-1].paced = int(m.group(1))
            cases[-1].later = int(m.group(2))
            cases[-1].windows = [int(x) for x in m.group(3).replace(" ", "").split(",")]
    return [
        c
        for c in cases
        if c.jitter is not None
        and c.paced is not None
        and c.later is not None
        and c.windows
    ]


def ratelimit_rows(text: str) -> tuple[float | None, float | None, float | None]:
    """The worst case of a report: retrywise's 429s as % of jitter-only's where the
    headers state the limit, after the first window as % where none does, and the
    steady windows' answers as % of L where the headers state it."""
    stated: list[float] = []
    unstated: list[float] = []
    steady: list[float] = []
    for c in ratelimit_cases(text):
        assert (
            c.jitter is not None
            and c.paced is not None
            and c.later is not None
            and c.windows
        )
        jitter = max(c.jitter, 1)
        windows = c.windows[1:]
        if c.family in ("openai", "anthropic", "ietf"):
            stated.append(100 * c.paced / jitter)
            steady.append(100 * sum(windows) / (c.limit * len(windows)))
        else:
            unstated.append(100 * c.later / jitter)
    return (
        max(stated) if stated else None,
        max(unstated) if unstated else None,
        min(steady) if steady else None,
    )


def simulated(text: str) -> tuple[float | None, float | None]:
    """`rate-limited`: the 429s retrywise sent and its completed share of the limit."""
    sent = re.search(r"retrywise sent ([\d ]+) 429s", text)
    share = re.search(r">= 95 % of the limit [\d ]+ rpm \(([\d.]+) %\)", text)
    return (
        float(sent.group(1).replace(" ", "")) if sent else None,
        float(share.group(1)) if share else None,
    )


def fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "not measured"
    if unit == "%":
        return f"{v:+.1f} %"
    if unit.startswith("% "):
        return f"{v:.1f} {unit}"
    return f"{v:g} {unit}".strip()


def at_most(limit: float) -> Callable[[float], bool]:
    return lambda x: x <= limit


def at_least(limit: float) -> Callable[[float], bool]:
    return lambda x: x >= limit


def verdict(v: float | None, ok: bool) -> str:
    return "—" if v is None else ("met" if ok else "not met")


def main() -> None:
    d = Path(sys.argv[1])
    rows: list[tuple[str, str, str, str]] = []

    def add(
        metric: str,
        target: str,
        v: float | None,
        unit: str,
        ok: Callable[[float], bool],
    ) -> None:
        """A row; `ok` judges the value when the run measured one."""
        rows.append((metric, target, fmt(v, unit), verdict(v, v is not None and ok(v))))

    crit = read(d, "criterion")
    s = criterion(crit, "cycle/success/1-thread")
    add(
        "core success cycle, one thread",
        "≤ 150 ns",
        s,
        "ns",
        at_most(150),
    )
    r = criterion(crit, "cycle/retry-decision/1-thread/report-only")
    add(
        "core retry decision, one thread",
        "≤ 300 ns",
        r,
        "ns",
        at_most(300),
    )
    sc = scaling(read(d, "scaling"))
    add(
        "two threads, distinct keys (paired rounds, median)",
        "≥ 1.6×",
        sc,
        "×",
        at_least(1.6),
    )
    cg = read(d, "ffi_cg")
    for kind in ("success", "retry"):
        v = ffi_instructions(cg, kind)
        add(
            f"C ABI over the core, {kind} cycle, instructions",
            "≤ +10 %",
            v,
            "%",
            at_most(10),
        )
    wall = read(d, "ffi")
    for kind in ("success", "retry"):
        v = ffi_wall(wall, kind)
        add(
            f"C ABI over the core, {kind} cycle, wall time (median)",
            "≤ +10 %",
            v,
            "%",
            at_most(10),
        )
    ps, p3 = python_cycle(read(d, "python"))
    add(
        "Python governed success cycle",
        "≤ 1 µs",
        ps,
        "ns",
        at_most(1000),
    )
    add(
        "Python 3-attempt cycle",
        "≤ 3 µs",
        p3,
        "ns",
        at_most(3000),
    )
    for lang, name in (("Python", "dropin_python"), ("Node", "dropin_node")):
        table = dropin(read(d, name))
        for workload in ("json", "stream"):
            for client in ("README wiring", "catalog"):
                pct, chunk = table.get((workload, client), (None, None))
                what = "JSON completion" if workload == "json" else "200-chunk stream"
                add(
                    f"{lang} drop-in, {client}, {what}, over the SDK alone",
                    "≤ +5 %",
                    pct,
                    "%",
                    at_most(5),
                )
                if workload == "stream":
                    add(
                        f"{lang} drop-in, {client}, per chunk",
                        "≤ 1 µs",
                        chunk,
                        "µs",
                        at_most(1),
                    )
    for version, name in (("20", "node"), ("22", "node22"), ("24", "node24")):
        text = read(d, name)
        for row, label in (
            ("retrywise README loop", "README loop"),
            ("retrywise engine.run", "engine.run"),
        ):
            for als, limit in (("on", 1.0 if version != "20" else 1.25),):
                v = node_ratio(text, als, row)
                add(
                    f"Node {version}, {label} / cockatiel, AsyncLocalStorage {als}",
                    f"≤ {limit:g}×",
                    v,
                    "×",
                    at_most(limit),
                )
    sent, share = simulated(read(d, "sim_rate-limited"))
    add(
        "simulate rate-limited, default policy: 429s sent",
        "0",
        sent,
        "",
        at_most(0),
    )
    add(
        "simulate rate-limited, default policy: completed, % of L",
        "≥ 97 %",
        share,
        "% of L",
        at_least(97),
    )
    for lang, name in (("Python", "ratelimit_python"), ("Node", "ratelimit_node")):
        stated, unstated, steady = ratelimit_rows(read(d, name))
        add(
            f"{lang} rate limits e2e, headers state L: 429s, % of jitter-only's (worst family)",
            "≤ 1 %",
            stated,
            "% of jitter-only",
            at_most(1),
        )
        add(
            f"{lang} rate limits e2e, no headers: 429s after the 1st window, % of jitter-only's (worst)",
            "≤ 10 %",
            unstated,
            "% of jitter-only",
            at_most(10),
        )
        add(
            f"{lang} rate limits e2e, headers state L: steady windows answered, % of L (worst)",
            "≥ 95 %",
            steady,
            "% of L",
            at_least(95),
        )
    print("| metric | target | measured | |")
    print("|---|---|---|---|")
    for cells in rows:
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
