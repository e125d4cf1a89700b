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
from pathlib import Path


def read(d: Path, name: str) -> str:
    p = d / name
    return p.read_text() if p.exists() else ""


def criterion(text: str, row: str) -> float | None:
    m = re.search(rf"^test {re.escape(row)} \.\.\. bench:\s+([\d,]+) ns/iter", text, re.M)
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
    m = re.search(rf"^{kind}\s+\d+\s+\d+\s+([+-][\d.]+)%", text, re.M)
    return float(m.group(1)) if m else None


def ffi_wall(text: str, kind: str) -> float | None:
    m = re.search(rf"^{kind}\b.*?overhead: median ([+-][\d.]+) %", text, re.M)
    return float(m.group(1)) if m else None


def python_cycle(text: str) -> tuple[float | None, float | None]:
    m = re.search(r"^retrywise\s+(\d+)\s+[\d.]+\s+(\d+)", text, re.M)
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
        m = re.match(r"^(README wiring|catalog)\s+[\d.]+\s+\S+\s+([+-][\d.]+)%(?:\s+([+-][\d.]+))?", line)
        if m and workload:
            chunk = float(m.group(3)) if m.group(3) else None
            out[(workload, m.group(1))] = (float(m.group(2)), chunk)
    return out


def node_ratio(text: str, als: str, row: str) -> float | None:
    """retrywise / cockatiel for one loop, AsyncLocalStorage `als` ("off"/"on")."""
    part = text.split(f"AsyncLocalStorage {als}", 1)
    if len(part) < 2:
        return None
    section = part[1].split("AsyncLocalStorage", 1)[0]
    m = re.search(rf"^\s*{re.escape(row)}\s+\d+\s+\(.*?\)\s+x([\d.]+)", section, re.M)
    return float(m.group(1)) if m else None


def fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "not measured"
    return f"{v:+.1f} %" if unit == "%" else f"{v:g} {unit}"


def verdict(v: float | None, ok: bool) -> str:
    return "—" if v is None else ("met" if ok else "not met")


def main() -> None:
    d = Path(sys.argv[1])
    rows: list[tuple[str, str, str, str]] = []

    def add(metric: str, target: str, v: float | None, unit: str, ok: bool | None) -> None:
        rows.append((metric, target, fmt(v, unit), verdict(v, bool(ok))))

    crit = read(d, "criterion")
    s = criterion(crit, "cycle/success/1-thread")
    add("core success cycle, one thread", "≤ 150 ns", s, "ns", s is not None and s <= 150)
    r = criterion(crit, "cycle/retry-decision/1-thread/report-only")
    add("core retry decision, one thread", "≤ 300 ns", r, "ns", r is not None and r <= 300)
    sc = scaling(read(d, "scaling"))
    add("two threads, distinct keys (paired rounds, median)", "≥ 1.6×", sc, "×", sc is not None and sc >= 1.6)
    cg = read(d, "ffi_cg")
    for kind in ("success", "retry"):
        v = ffi_instructions(cg, kind)
        add(f"C ABI over the core, {kind} cycle, instructions", "≤ +10 %", v, "%", v is not None and v <= 10)
    wall = read(d, "ffi")
    for kind in ("success", "retry"):
        v = ffi_wall(wall, kind)
        add(f"C ABI over the core, {kind} cycle, wall time (median)", "≤ +10 %", v, "%", v is not None and v <= 10)
    ps, p3 = python_cycle(read(d, "python"))
    add("Python governed success cycle", "≤ 1 µs", None if ps is None else ps, "ns", ps is not None and ps <= 1000)
    add("Python 3-attempt cycle", "≤ 3 µs", None if p3 is None else p3, "ns", p3 is not None and p3 <= 3000)
    for lang, name in (("Python", "dropin_python"), ("Node", "dropin_node")):
        table = dropin(read(d, name))
        for workload in ("json", "stream"):
            for client in ("README wiring", "catalog"):
                pct, chunk = table.get((workload, client), (None, None))  # type: ignore[assignment]
                what = "JSON completion" if workload == "json" else "200-chunk stream"
                add(f"{lang} drop-in, {client}, {what}, over the SDK alone", "≤ +5 %", pct, "%", pct is not None and pct <= 5)
                if workload == "stream":
                    add(f"{lang} drop-in, {client}, per chunk", "≤ 1 µs", chunk, "µs", chunk is not None and chunk <= 1)
    for version, name in (("20", "node"), ("22", "node22"), ("24", "node24")):
        text = read(d, name)
        for row, label in (("retrywise README loop", "README loop"), ("retrywise engine.run", "engine.run")):
            for als, limit in (("on", 1.0 if version != "20" else 1.25),):
                v = node_ratio(text, als, row)
                add(
                    f"Node {version}, {label} / cockatiel, AsyncLocalStorage {als}",
                    f"≤ {limit:g}×",
                    v,
                    "×",
                    v is not None and v <= limit,
                )
    print("| metric | target | measured | |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
