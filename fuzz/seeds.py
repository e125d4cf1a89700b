#!/usr/bin/env python3
"""Regenerates the committed seed corpora under fuzz/corpus/<target>/.

A dozen or so realistic inputs per target: Retry-After values in every form,
propagation-header blocks, policies from tests/policies and tests/vectors in
JSON, YAML and TOML, and (for the arbitrary-driven targets) fixed
pseudo-random byte strings. Deterministic: running it twice gives the same
files. Usage: python3 fuzz/seeds.py
"""

import json
import random
import shutil
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
ROOT = FUZZ.parent
CORPUS = FUZZ / "corpus"


def write(target: str, name: str, data: bytes) -> None:
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def vector_policy(name: str) -> dict:
    return json.loads((ROOT / "tests" / "vectors" / f"{name}.json").read_text())["policy"]


def yaml_of(obj, indent: int = 0) -> str:
    """A tiny block-style YAML writer for the plain policies used here."""
    pad = "  " * indent
    out = []
    for k, v in obj.items():
        if isinstance(v, dict):
            out.append(f"{pad}{k}:" + (" {}" if not v else ""))
            if v:
                out.append(yaml_of(v, indent + 1))
        elif isinstance(v, list):
            out.append(f"{pad}{k}: {json.dumps(v)}")
        elif isinstance(v, bool):
            out.append(f"{pad}{k}: {'true' if v else 'false'}")
        else:
            out.append(f"{pad}{k}: {json.dumps(v) if isinstance(v, str) else v}")
    return "\n".join(out)


def main() -> None:
    shutil.rmtree(CORPUS, ignore_errors=True)

    # retry_after: one value, or "retry-after-ms\nretry-after".
    ra = {
        "secs": b"2",
        "decimal": b"2.5",
        "zero": b"0",
        "negative": b"-1",
        "imf_fixdate": b"Sun, 06 Nov 1994 08:49:37 GMT",
        "rfc850": b"Sunday, 06-Nov-94 08:49:37 GMT",
        "asctime": b"Sun Nov  6 08:49:37 1994",
        "date_2025": b"Wed, 01 Jan 2025 00:00:30 GMT",
        "date_9999": b"Fri, 31 Dec 9999 23:59:59 GMT",
        "absurd": b"99999999999999999999",
        "padded": b"  7  ",
        "words": b"soon",
        "ms_then_secs": b"1500\n3",
        "bad_ms_then_secs": b"junk\n3",
        "ms_decimal": b"250.5\n",
    }
    for name, data in ra.items():
        write("retry_after", name, data)

    # inbound: "name: value" lines.
    inbound = {
        "full": b"retrywise-deadline-ms: 4950\nretrywise-request-id: 0123456789abcdef01234567\n"
        b"retrywise-attempt: 2\nidempotency-key: order-42",
        "deadline_only": b"retrywise-deadline-ms: 1200",
        "mixed_case": b"Retrywise-Deadline-Ms: 800\nRETRYWISE-ATTEMPT: 1",
        "id_only": b"retrywise-request-id: req-1",
        "bad_deadline": b"retrywise-deadline-ms: soon",
        "negative_deadline": b"retrywise-deadline-ms: -5",
        "huge_deadline": b"retrywise-deadline-ms: 604800001",
        "attempt_zero": b"retrywise-attempt: 0",
        "long_id": b"retrywise-request-id: " + b"x" * 129,
        "short_deadline": b"retrywise-deadline-ms: 100\nretrywise-request-id: r\nretrywise-attempt: 3",
        "no_propagation": b"content-type: application/json\nx-request-id: abc",
        "bare_value": b"30000",
    }
    for name, data in inbound.items():
        write("inbound", name, data)

    # policy: real policies in all three formats, plus invalid ones.
    seed004 = (ROOT / "tests" / "policies" / "seed004-routes.yaml").read_bytes()
    fallback = vector_policy("fallback_exclusions")
    breaker = vector_policy("breaker_lifecycle")
    budget = vector_policy("budget_tenant_scope")
    timeouts = vector_policy("deadline_timeouts")
    policies = {
        "seed004_routes.yaml": seed004,
        "fallback_exclusions.json": json.dumps(fallback).encode(),
        "breaker_lifecycle.json": json.dumps(breaker).encode(),
        "budget_tenant_scope.yaml": yaml_of(budget).encode() + b"\n",
        "deadline_timeouts.yaml": yaml_of(timeouts).encode() + b"\n",
        "ra_cap.json": json.dumps(vector_policy("ra_too_large_cap")).encode(),
        "concurrency.json": json.dumps(vector_policy("concurrency_gate")).encode(),
        "basic.toml": b'version = "v7"\nmax_attempts = 5\ndeadline_ms = 20000\n\n[backoff]\nkind = "equal"\n'
        b"base_ms = 100\ncap_ms = 2000\n\n[budget]\nratio = 0.2\nscopes = [[\"upstream\"], [\"tenant\"]]\n",
        "routes.toml": b'[upstreams.a]\nprovider = "openai"\nmodel = "gpt-4o"\ncapabilities = ["streaming"]\n'
        b'[upstreams.b]\ncontext_tokens = 200000\n[routes.chat]\ncandidates = ["a", "b"]\nhedge_after_ms = 800\n',
        "invalid_rate.json": b'{"breaker":{"failure_rate":1.5}}',
        "unknown_field.yaml": b"retries: 3\n",
        "empty": b"",
    }
    for name, data in policies.items():
        write("policy", name, data)

    # decisions: arbitrary-driven; fixed pseudo-random byte strings of several lengths.
    rng = random.Random(20250101)
    for i, n in enumerate([64, 128, 200, 300, 400, 600, 800, 1000, 1500, 2000, 3000, 4000]):
        write("decisions", f"random_{i:02}_{n}", bytes(rng.getrandbits(8) for _ in range(n)))

    # ffi: policy bytes, NUL, then arbitrary-driven operations.
    ffi_policies = [
        b"",
        b'{"max_attempts":4}',
        json.dumps(fallback).encode(),
        seed004,
        b'version = "t"\nmax_attempts = 2\n',
        b'{"testing":{"panic_on_vendor_code":"boom"}}',
        b"\xff\xfe not utf-8",
        b'{"breaker":{"failure_rate":2}}',
    ]
    for i, p in enumerate(ffi_policies):
        for j, n in enumerate([256, 1024]):
            write("ffi", f"policy{i}_ops{j}", p + b"\0" + bytes(rng.getrandbits(8) for _ in range(n)))

    # bodies: content-type byte, status byte, two chunk-seed bytes, then the body.
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    text = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    anthropic = (
        b'event: message_start\ndata: {"type":"message_start","message":{"content":[]}}\n\n'
        b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
        b'"content_block":{"type":"text","text":""}}\n\n'
        b'event: ping\ndata: {"type": "ping"}\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"Hi"}}\n\n'
    )
    bodies = {
        "openai_sse": (0, 0, role + text + b"data: [DONE]\n\n"),
        "openai_sse_crlf": (1, 0, (role + text).replace(b"\n", b"\r\n")),
        "openai_preamble_only": (0, 0, role + b": keep-alive\n\n"),
        "anthropic_sse": (0, 0, anthropic),
        "json_ok": (2, 0, b'{"id":"x","choices":[{"message":{"content":"Hi"}}]}'),
        "json_truncated": (2, 0, b'{"id":"x","choices":[{"mess'),
        "problem_json_429": (3, 3, b'{"error":{"code":"insufficient_quota"}}'),
        "text_500": (4, 4, b"upstream went away"),
    }
    for name, (ct, status, body) in bodies.items():
        write("bodies", name, bytes([ct, status, rng.getrandbits(8), rng.getrandbits(8)]) + body)


if __name__ == "__main__":
    main()
