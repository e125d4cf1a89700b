#!/usr/bin/env python3
"""Runs the conformance vectors (tests/vectors/*.json, format 1) through the
Python binding's public API with a manual clock and a fixed seed.

    python tests/vectors/run_python.py [NAME ...]     # exit 1 on any mismatch
    pytest tests/vectors/run_python.py                # one test per vector

Every runner (Rust, Python, Node, C) builds the same canonical view of each
result and compares it with the vector's expectations using the same rules:
a subset match (keys absent from `expect` are not checked), `null` matches an
absent value, integers are exact and other numbers within 1e-9, and `{i}` in a
`repeat` step's strings is the 0-based iteration. See README.md.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(os.environ.get("RETRYWISE_VECTORS_DIR", Path(__file__).resolve().parent))
FORMAT = 1

# The environment kill switch must not leak into replayed decisions.
os.environ.pop("RETRYWISE_DISABLE", None)

import retrywise  # noqa: E402


# ------------------------------------------------------------------ compare --

def compare(path: str, expected: Any, actual: Any, out: list[tuple[str, str, str]]) -> None:
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            out.append((path, dumps(expected), dumps(actual)))
            return
        for k, ev in expected.items():
            compare(f"{path}.{k}" if path else k, ev, actual.get(k), out)
    elif isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            out.append((path, dumps(expected), dumps(actual)))
            return
        for i, (e, a) in enumerate(zip(expected, actual)):
            compare(f"{path}[{i}]", e, a, out)
    elif isinstance(expected, bool) or expected is None or isinstance(expected, str):
        if expected != actual or type(expected) is not type(actual):
            out.append((path, dumps(expected), dumps(actual)))
    elif isinstance(expected, (int, float)):
        ok = isinstance(actual, (int, float)) and not isinstance(actual, bool)
        if ok and isinstance(expected, int) and isinstance(actual, int):
            ok = expected == actual
        elif ok:
            ok = abs(float(expected) - float(actual)) <= 1e-9
        if not ok:
            out.append((path, dumps(expected), dumps(actual)))
    else:
        out.append((path, dumps(expected), dumps(actual)))


def dumps(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), sort_keys=True)


def substitute(v: Any, i: int) -> Any:
    if isinstance(v, str):
        return v.replace("{i}", str(i))
    if isinstance(v, list):
        return [substitute(x, i) for x in v]
    if isinstance(v, dict):
        return {k: substitute(x, i) for k, x in v.items()}
    return v


# --------------------------------------------------------- canonical views --

def secs_to_ms(s: float | None) -> int | None:
    """Whole milliseconds of a duration given in float seconds, truncated like
    the core's `as_millis` (via nanoseconds, so 2.0 s is 2000, not 1999)."""
    if s is None:
        return None
    return round(s * 1e9) // 1_000_000


def canon_attempt(a: Any) -> dict[str, Any]:
    t = a.timeouts
    return {
        "number": a.number,
        "upstream": a.upstream,
        "fallback": a.fallback,
        "hedge": a.hedge,
        "remaining_ms": a.remaining_ms,
        "idempotency_key": a.idempotency_key,
        "timeouts_ms": {
            "connect": t.connect_ms,
            "first_byte": t.first_byte_ms,
            "first_token": t.first_token_ms,
            "idle": t.idle_ms,
            "total": t.total_ms,
        },
        "headers": {str(k): str(v) for k, v in dict(a.headers).items()},
    }


def canon_stop(s: Any) -> dict[str, Any]:
    # `wait_s` is set on a "not yet" (retrywise.NotYet): ask again after it.
    stop = {"reason": s.reason, "class": s.error_class, "on_failure": s.on_failure, "detail": s.detail}
    stop["wait_ms"] = secs_to_ms(s.wait_s)
    return {"stop": stop}


def canon_decision(d: Any) -> dict[str, Any]:
    # The Python Decision exposes the hint as float seconds only (retry_after_s).
    ra_ms = getattr(d, "retry_after_ms", None)
    if ra_ms is None:
        ra_ms = secs_to_ms(d.retry_after_s)
    return {
        "action": d.action,
        "delay_ms": d.delay_ms,
        "class": d.error_class,
        "reason": d.reason,
        "upstream": d.upstream,
        "wait_source": d.wait_source,
        "retry_after_ms": ra_ms,
        "on_failure": d.on_failure,
        "detail": d.detail,
        "attempt": d.attempt,
        "hedge": d.hedge,
        "excluded": {u: why for u, why in d.excluded},
        "continuation": d.continuation,
    }


def canon_hedge(plan: Any) -> dict[str, Any]:
    if plan.action == "start":
        return {"action": "start", "attempt": canon_attempt(plan.attempt)}
    if plan.action == "after":
        after_ms = getattr(plan, "after_ms", None)
        return {"action": "after", "after_ms": after_ms if after_ms is not None else secs_to_ms(plan.after_s)}
    return {"action": plan.action, "reason": plan.reason}


def read_of(r: dict[str, Any]) -> Any:
    """A `request` object (`url`, `headers`, `body` as text) read as a transport reads it."""
    return retrywise.read_request(r.get("url", ""), r.get("headers", {}), r.get("body", "").encode())


def canon_request(step: dict[str, Any]) -> dict[str, Any]:
    """A `read_request` step's view: family, endpoint, model and the needs,
    capabilities joined with commas in the order read."""
    f = read_of(step)
    needs = f.needs
    return {
        "family": f.family,
        "endpoint": f.endpoint,
        "model": f.model,
        "needs": {
            "capabilities": ",".join(needs.get("capabilities", [])),
            "api": needs.get("api"),
            "input_tokens": needs.get("input_tokens"),
            "max_output_tokens": needs.get("max_output_tokens"),
        },
    }


def outcome_kwargs(outcome: dict[str, Any]) -> dict[str, Any]:
    """An outcome as `report` keyword arguments (`first_token_ms` in seconds)."""
    kwargs = dict(outcome)
    ms = kwargs.pop("first_token_ms", None)
    if ms is not None:
        kwargs["first_token_s"] = ms / 1000
    return kwargs


def canon_gate(step: dict[str, Any]) -> dict[str, Any]:
    """A `stream_gate` step's view: what the consumer saw, and the phase a failure would have now."""
    g = retrywise.StreamGate(step.get("content_type"))
    released = b"".join(g.feed(c.encode()) for c in step.get("chunks", []))
    if step.get("finish", False):
        released += g.finish()
    return {"released": released.decode("utf-8", "replace"), "phase": g.phase}


# ------------------------------------------------------------------ runner --

class Run:
    def __init__(self, name: str, engine: Any) -> None:
        self.name = name
        self.engine = engine
        self.calls: dict[str, Any] = {}
        self.mismatches: list[str] = []

    def fail(self, step: str, field: str, expected: str, actual: str) -> None:
        self.mismatches.append(f"vector {self.name} step {step}: {field}: expected {expected}, got {actual}")

    def check_result(self, label: str, expected: Any, actual: dict[str, Any]) -> None:
        """`{"ok": true}` or `{"ok": false, "error": message}` against `expect`
        (default `{"ok": true}`), whose `error_contains` checks a part of the message."""
        exp = dict(expected if expected is not None else {"ok": True})
        needle = exp.pop("error_contains", None)
        if needle is not None and needle not in actual.get("error", ""):
            self.fail(label, "error_contains", dumps(needle), dumps(actual.get("error")))
        self.check(label, exp, actual)

    def check(self, step: str, expected: Any, actual: Any) -> None:
        if expected is None:
            return
        exp = dict(expected)
        diffs: list[tuple[str, str, str]] = []
        bounds = exp.pop("delay_within_ms", None)
        if bounds is not None:
            d = actual.get("delay_ms")
            if not (isinstance(d, int) and bounds[0] <= d <= bounds[1]):
                diffs.append(("delay_within_ms", dumps(bounds), dumps(d)))
        compare("", exp, actual, diffs)
        for field, e, a in diffs:
            self.fail(step, field, e, a)

    def steps(self, steps: list[dict[str, Any]], prefix: str = "") -> None:
        for idx, step in enumerate(steps):
            self.step(step, f"{prefix}.{idx}" if prefix else str(idx))

    def step(self, step: dict[str, Any], base: str) -> None:
        op = step.get("op", "")
        call = step.get("call", "")
        label = f"{base} ({op} {call})" if call else f"{base} ({op})"
        try:
            self._step(step, op, call, base, label)
        except Exception as e:  # a binding error is a mismatch, not a crash
            self.fail(label, "exception", "no exception", f"{type(e).__name__}: {e}")

    def _step(self, step: dict[str, Any], op: str, call: str, base: str, label: str) -> None:
        if op == "advance":
            self.engine.advance_clock(step.get("ms", 0))
        elif op == "begin":
            # `request`: read as a drop-in transport reads it, `needs` laid over it.
            # A route the policy does not know is a PolicyError (`expect` `ok: false`).
            spec = dict(step.get("spec", {}))
            route = spec.pop("route", "")
            if "request" in spec:
                spec["request"] = read_of(spec["request"])
            try:
                self.calls[call] = self.engine.begin(route, **spec)
                actual: dict[str, Any] = {"ok": True}
            except retrywise.PolicyError as e:
                actual = {"ok": False, "error": str(e)}
            self.check_result(label, step.get("expect"), actual)
        elif op == "read_request":
            self.check(label, step.get("expect"), canon_request(step))
        elif op == "next_attempt":
            c = self.calls[call]
            try:
                actual = canon_attempt(c.next_attempt())
            except retrywise.Stopped as s:
                actual = canon_stop(s)
            self.check_attempt(label, step.get("expect"), actual)
        elif op == "report":
            # `attempt`: report that attempt (hedging), else the latest in flight.
            kwargs = outcome_kwargs(step.get("outcome", {}))
            if "attempt" in step:
                kwargs["attempt"] = step["attempt"]
            d = self.calls[call].report(**kwargs)
            self.check(label, step.get("expect"), canon_decision(d))
        elif op == "next_hedge":
            self.check(label, step.get("expect"), canon_hedge(self.calls[call].next_hedge()))
        elif op == "cancel":
            self.check(label, step.get("expect"), canon_decision(self.calls[call].cancel()))
        elif op == "reload":
            try:
                self.engine.reload(step.get("policy", {}))
                actual = {"ok": True}
            except retrywise.PolicyError as e:
                actual = {"ok": False, "error": str(e)}
            self.check_result(label, step.get("expect"), actual)
        elif op == "set_mode":
            m = step.get("mode", {})
            self.engine.set_mode(retries=m.get("retries", True), fallback=m.get("fallback", True), hedging=m.get("hedging", True))
        elif op == "stream_gate":
            self.check(label, step.get("expect"), canon_gate(step))
        elif op == "stats":
            self.check(label, step.get("expect"), self.engine.stats())
        elif op == "repeat":
            for i in range(step.get("times", 0)):
                self.steps([substitute(s, i) for s in step.get("steps", [])], f"{base}[{i}]")
        else:
            self.fail(label, "op", "a known op", dumps(op))

    def check_attempt(self, label: str, expected: Any, actual: dict[str, Any]) -> None:
        if expected is None:
            return
        wants_stop, got_stop = "stop" in expected, "stop" in actual
        if wants_stop != got_stop:
            e = f"stop {dumps(expected['stop'])}" if wants_stop else f"attempt {dumps(expected)}"
            a = f"stop {dumps(actual['stop'])}" if got_stop else f"attempt {dumps(actual)}"
            self.fail(label, "result", e, a)
            return
        self.check(label, expected, actual)


def load(path: Path) -> dict[str, Any]:
    v = json.loads(path.read_text())
    if v.get("format") != FORMAT:
        raise ValueError(f"{path}: format must be {FORMAT}")
    if v.get("name") != path.stem:
        raise ValueError(f"{path}: name {v.get('name')!r} differs from the file name")
    return v


def skip_reason(path: Path) -> str | None:
    """The vector's `skip` (a known core bug) unless RETRYWISE_VECTORS_RUN_SKIPPED=1."""
    reason = json.loads(path.read_text()).get("skip")
    if reason is None or os.environ.get("RETRYWISE_VECTORS_RUN_SKIPPED") == "1":
        return None
    return str(reason)


def run_vector(path: Path) -> list[str]:
    v = load(path)
    try:
        engine = retrywise.Engine(v.get("policy", {}), seed=v["seed"], manual_clock=True)
    except Exception as e:
        return [f"vector {v['name']}: engine: {type(e).__name__}: {e}"]
    run = Run(v["name"], engine)
    run.steps(v.get("steps", []))
    return run.mismatches


def vector_paths(names: list[str] | None = None) -> list[Path]:
    paths = sorted(HERE.glob("*.json"))
    if names:
        paths = [p for p in paths if p.stem in names]
    return paths


def test_vectors() -> None:  # pytest entry point: one assertion listing every mismatch
    problems = [m for p in vector_paths() if skip_reason(p) is None for m in run_vector(p)]
    assert not problems, "\n".join(problems)


def main(argv: list[str]) -> int:
    paths = vector_paths(argv or None)
    if not paths:
        print(f"no vectors in {HERE}", file=sys.stderr)
        return 2
    problems: list[str] = []
    failed = skipped = 0
    for p in paths:
        why = skip_reason(p)
        if why is not None:
            skipped += 1
            print(f"vector {p.stem} skipped: {why}")
            continue
        ms = run_vector(p)
        failed += bool(ms)
        problems += ms
    for m in problems:
        print(m)
    passed = len(paths) - failed - skipped
    print(f"python: {len(paths)} vectors, {passed} passed, {failed} failed, {len(problems)} mismatches, {skipped} skipped")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
