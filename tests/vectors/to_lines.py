#!/usr/bin/env python3
"""Converts conformance vectors (tests/vectors/*.json, format 1) into the
line format read by run_c.c, so the C runner needs no JSON parser for inputs.

    python tests/vectors/to_lines.py [NAME ...] > vectors.lines

Every line is a record of space-separated tokens. Each token is
percent-encoded: bytes outside printable ASCII, space and `%` become `%XX`;
an empty string is the single token `%`. Records:

    vector NAME                      starts a vector
    seed U64
    policy JSON                      the policy as compact JSON text
    skip REASON                      a known core bug: the vector is not run (no steps follow)
    step LABEL OP [CALL] [ARGS...]   one step; LABEL as the other runners print it
    expect PATH TYPE VALUE           a leaf of the step's `expect` (TYPE s, i, f, b, n)
    within LO HI                     the step's delay_within_ms bounds
    contains TEXT                    the step's error_contains
    end                              ends the vector

Step ARGS are key/value pairs:
    begin:   route S, deadline_ms N, idempotency S, tenant S, task S, priority S,
             idempotency_key S, params_digest HEX, cap S (repeated),
             input_tokens N, max_output_tokens N, data_boundary S, max_cost F,
             inbound NAME VALUE (repeated),
             request_url S, request_header NAME VALUE (repeated), request_body S
             (the spec's `request`: read with rw_request_read, under the needs);
             its `expect` defaults to {"ok": true}
    read_request: url S, header NAME VALUE (repeated), body S
    report:  status N, error S, phase S, effect S, vendor_code S, body S,
             input_tokens N, ok 0|1, resumable 0|1, continuation S,
             first_token_ms N, header NAME VALUE (repeated),
             attempt N (report that attempt number: hedging)
    next_hedge, cancel: no arguments
    stream_gate: content_type S (absent: none), chunk S (repeated), finish 1 (last)
    advance: ms N      reload: policy JSON      set_mode: retries B fallback B hedging B

`repeat` steps are expanded here (with `{i}` substituted), and `params` is
replaced by its digest: SHA-256 of the canonical JSON (object keys sorted,
compact), as the core's `params_digest` computes it. A vector with `skip`
becomes `vector`, `skip`, `end` unless RETRYWISE_VECTORS_RUN_SKIPPED=1. Nested `expect` objects
become dotted paths; keys must therefore not contain dots. The C ABI reads 0
as "unknown" in the needs' input_tokens and max_output_tokens and the
outcome's input_tokens and first_token_ms, so a vector giving 0 there is an
error here rather than a silent difference from the other runners.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(os.environ.get("RETRYWISE_VECTORS_DIR", Path(__file__).resolve().parent))
FORMAT = 1
SAFE = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~/:,;=+*!?@[]{}()<>'\"|^`$#&")


def enc(v: Any) -> str:
    if isinstance(v, bool):
        v = "1" if v else "0"
    s = str(v).encode("utf-8")
    if not s:
        return "%"
    return "".join(chr(b) if b in SAFE else f"%{b:02X}" for b in s)


def canonical(v: Any) -> str:
    """The core's canonical JSON: keys sorted at every level, no whitespace."""
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + canonical(v[k]) for k in sorted(v)) + "}"
    if isinstance(v, list):
        return "[" + ",".join(canonical(x) for x in v) + "]"
    return json.dumps(v, ensure_ascii=False)


def substitute(v: Any, i: int) -> Any:
    if isinstance(v, str):
        return v.replace("{i}", str(i))
    if isinstance(v, list):
        return [substitute(x, i) for x in v]
    if isinstance(v, dict):
        return {k: substitute(x, i) for k, x in v.items()}
    return v


def flatten(prefix: str, v: Any, out: list[str]) -> None:
    if isinstance(v, dict):
        for k, x in v.items():
            if "." in k:
                raise ValueError(f"expect key {k!r} contains a dot")
            flatten(f"{prefix}.{k}" if prefix else k, x, out)
        return
    if isinstance(v, list):
        raise ValueError(f"expect {prefix}: arrays are not supported by the C runner")
    if v is None:
        t, val = "n", ""
    elif isinstance(v, bool):
        t, val = "b", "1" if v else "0"
    elif isinstance(v, int):
        t, val = "i", str(v)
    elif isinstance(v, float):
        t, val = "f", repr(v)
    else:
        t, val = "s", v
    out.append(f"expect {enc(prefix)} {t} {enc(val)}")


def request_args(r: dict[str, Any], prefix: str) -> list[str]:
    """A request a transport reads (`url`, `headers`, `body` as text) as step arguments."""
    args: list[str] = []
    if "url" in r:
        args += [prefix + "url", enc(r["url"])]
    for name, value in r.get("headers", {}).items():
        args += [prefix + "header", enc(name), enc(value)]
    if "body" in r:
        args += [prefix + "body", enc(r["body"])]
    return args


ZERO_IS_UNKNOWN = ("input_tokens", "max_output_tokens", "first_token_ms")


def nonzero(label: str, where: str, fields: dict[str, Any]) -> None:
    """Refuses a 0 the C ABI would read as unknown (see the module docstring)."""
    for k in ZERO_IS_UNKNOWN:
        if k in fields and fields[k] == 0 and not isinstance(fields[k], bool):
            raise ValueError(f"step {label}: {where}.{k} is 0, which the C ABI reads as unknown")


def step_lines(step: dict[str, Any], label: str, out: list[str]) -> None:
    op = step["op"]
    if op == "repeat":
        for i in range(step.get("times", 0)):
            for j, s in enumerate(step.get("steps", [])):
                step_lines(substitute(s, i), f"{label}[{i}].{j}", out)
        return
    call = step.get("call", "")
    pretty = f"{label} ({op} {call})" if call else f"{label} ({op})"
    args: list[str] = []
    if op == "advance":
        args = ["ms", str(step.get("ms", 0))]
    elif op == "begin":
        spec = step.get("spec", {})
        for k in ("route", "deadline_ms", "idempotency", "tenant", "task", "priority", "idempotency_key"):
            if k in spec:
                args += [k, enc(spec[k])]
        if "params" in spec:
            args += ["params_digest", hashlib.sha256(canonical(spec["params"]).encode()).hexdigest()]
        needs = spec.get("needs", {})
        nonzero(label, "spec.needs", needs)
        for c in needs.get("capabilities", []):
            args += ["cap", enc(c)]
        for k in ("input_tokens", "max_output_tokens", "data_boundary", "max_cost"):
            if k in needs:
                args += [k, enc(needs[k])]
        for name, value in spec.get("inbound_headers", {}).items():
            args += ["inbound", enc(name), enc(value)]
        if "request" in spec:
            args += request_args(spec["request"], "request_")
        unknown = set(spec) - {"route", "deadline_ms", "idempotency", "tenant", "task", "priority", "idempotency_key",
                               "params", "needs", "inbound_headers", "request"}
        if unknown:
            raise ValueError(f"step {label}: unknown spec fields {sorted(unknown)}")
        unknown = set(needs) - {"capabilities", "input_tokens", "max_output_tokens", "data_boundary", "max_cost"}
        if unknown:
            raise ValueError(f"step {label}: needs fields the C runner does not pass: {sorted(unknown)}")
    elif op == "read_request":
        args = request_args(step, "")
    elif op == "report":
        o = step.get("outcome", {})
        nonzero(label, "outcome", o)
        for k in ("status", "error", "phase", "effect", "vendor_code", "input_tokens", "ok", "body", "resumable",
                  "continuation", "first_token_ms"):
            if k in o:
                args += [k, enc(o[k])]
        for name, value in o.get("headers", {}).items():
            args += ["header", enc(name), enc(value)]
        if "attempt" in step:
            args += ["attempt", enc(step["attempt"])]
    elif op == "stream_gate":
        if step.get("content_type") is not None:
            args += ["content_type", enc(step["content_type"])]
        for c in step.get("chunks", []):
            args += ["chunk", enc(c)]
        if step.get("finish", False):
            args += ["finish", "1"]
    elif op == "reload":
        args = ["policy", enc(json.dumps(step.get("policy", {}), separators=(",", ":")))]
    elif op == "set_mode":
        m = step.get("mode", {})
        args = [f"{k} {enc(m.get(k, True))}" for k in ("retries", "fallback", "hedging")]
    out.append(" ".join(["step", enc(pretty), enc(op)] + ([enc(call)] if call else ["%"]) + args))
    expect = step.get("expect")
    if op in ("reload", "begin") and expect is None:
        expect = {"ok": True}
    if expect is not None:
        expect = dict(expect)
        bounds = expect.pop("delay_within_ms", None)
        needle = expect.pop("error_contains", None)
        flatten("", expect, out)
        if bounds is not None:
            out.append(f"within {bounds[0]} {bounds[1]}")
        if needle is not None:
            out.append(f"contains {enc(needle)}")


def convert(path: Path) -> list[str]:
    v = json.loads(path.read_text())
    if v.get("format") != FORMAT:
        raise ValueError(f"{path}: format must be {FORMAT}")
    if v.get("name") != path.stem:
        raise ValueError(f"{path}: name {v.get('name')!r} differs from the file name")
    if "skip" in v and os.environ.get("RETRYWISE_VECTORS_RUN_SKIPPED") != "1":
        return [f"vector {enc(v['name'])}", f"skip {enc(v['skip'])}", "end"]
    out = [f"vector {enc(v['name'])}", f"seed {int(v['seed'])}",
           f"policy {enc(json.dumps(v.get('policy', {}), separators=(',', ':')))}"]
    for i, s in enumerate(v.get("steps", [])):
        try:
            step_lines(s, str(i), out)
        except ValueError as e:
            raise ValueError(f"{path.name}: {e}") from None
    out.append("end")
    return out


def main(argv: list[str]) -> int:
    paths = sorted(HERE.glob("*.json"))
    if argv:
        paths = [p for p in paths if p.stem in argv]
    if not paths:
        print(f"no vectors in {HERE}", file=sys.stderr)
        return 2
    for p in paths:
        sys.stdout.write("\n".join(convert(p)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
