"""What the drop-in transport costs a user beside the SDK alone: client CPU time
per request of the openai SDK with its own retries off, plain and through
retrywise's transport — the README wiring (one route) and a multi-provider
catalog (every request read, routed and rewritten for the upstream the core
chose) — against a local OpenAI-compatible upstream in another process (the
project's fault server, model ``fb-ok``).

Rounds interleave the clients, so a slow moment of the machine falls on all of
them alike; each round times ``--requests`` requests per client with
``time.process_time()`` (this process only: the upstream's CPU is not counted).
Reported: the median over rounds per request, the overhead against the plain
SDK in the same run, and for streams the overhead per chunk.

  python bench/dropin.py                      # JSON and a 200-chunk stream
  python bench/dropin.py --rounds 9 --requests 400
  python bench/dropin.py --quick              # a smoke run (CI)

The fault server is ``$RETRYWISE_FAULT_SERVER``, else the release or debug
build under the workspace's target directory (``cargo build --release -p
retrywise-fault-server``).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import retrywise
from retrywise.httpx import RetryTransport

ROOT = pathlib.Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "Say hello in a few words."}]
KEY_ENV = "RETRYWISE_BENCH_KEY"


def fault_server() -> tuple[subprocess.Popen[str], str]:
    """Starts the fault server on an ephemeral port; its base URL."""
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    candidates = [os.environ.get("RETRYWISE_FAULT_SERVER", "")] + [
        str(target / p / "retrywise-fault-server") for p in ("release", "debug")
    ]
    exe = next((c for c in candidates if c and os.access(c, os.X_OK)), None)
    if exe is None:
        sys.exit("no fault server: cargo build --release -p retrywise-fault-server (or set RETRYWISE_FAULT_SERVER)")
    proc = subprocess.Popen([exe, "--exit-on-stdin-close"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("LISTENING "):
        sys.exit(f"fault server said {line!r}")
    return proc, "http://" + line.split()[1]


def clients(base: str, words: int) -> dict[str, Any]:
    """The three clients measured: the SDK alone, the README wiring, a catalog
    (routes for ``fb-ok`` and for the streamed ``fb-ok:words=N`` alike)."""
    os.environ[KEY_ENV] = "sk-bench"
    readme = retrywise.Engine({"max_attempts": 3, "deadline_ms": 20_000})
    upstream = {"base_url": base + "/v1", "api": "openai", "api_key_env": KEY_ENV, "context_tokens": 128_000}
    streamed = f"fb-ok:words={words}"
    upstreams: dict[str, Any] = {}
    routes: dict[str, Any] = {}
    for route, model in (("chat", "fb-ok"), ("chat_stream", streamed)):
        upstreams[route + "_primary"] = {
            **upstream,
            "provider": "local",
            "model": model,
            "capabilities": ["streaming", "tool_calling", "json_schema", "json_mode", "vision"],
        }
        upstreams[route + "_backup"] = {
            **upstream,
            "provider": "local-b",
            "model": model + ":id=backup",
            "capabilities": ["streaming", "tool_calling", "json_mode", "assistant_prefill"],
        }
        routes[route] = {"candidates": [route + "_primary", route + "_backup"], "stream_recovery": "continue"}
    catalog = retrywise.Engine(
        {
            "deadline_ms": 30_000,
            "upstreams": upstreams,
            "models": {"fb-ok": "chat", streamed: "chat_stream"},
            "routes": routes,
        }
    )

    def sdk(transport: Any) -> Any:
        http = httpx.Client(transport=transport) if transport is not None else httpx.Client()
        return openai.OpenAI(base_url=base + "/v1", api_key="sk-caller", max_retries=0, http_client=http)

    return {
        "sdk alone": sdk(None),
        "README wiring": sdk(RetryTransport(readme, route="openai/gpt-4o")),
        "catalog": sdk(RetryTransport(catalog)),
    }


def json_request(client: Any) -> None:
    r = client.chat.completions.create(model="fb-ok", messages=MESSAGES)
    assert r.choices[0].message.content


def stream_request(words: int) -> Callable[[Any], None]:
    model = f"fb-ok:words={words}"

    def run(client: Any) -> None:
        n = 0
        for chunk in client.chat.completions.create(model=model, messages=MESSAGES, stream=True):
            n += bool(chunk.choices and chunk.choices[0].delta.content)
        assert n >= words, n

    return run


def measure(workload: Callable[[Any], None], cs: dict[str, Any], rounds: int, requests: int) -> dict[str, list[float]]:
    """CPU µs per request, per client, per round (interleaved)."""
    for c in cs.values():
        for _ in range(max(3, requests // 20)):
            workload(c)
    out: dict[str, list[float]] = {name: [] for name in cs}
    for _ in range(rounds):
        for name, c in cs.items():
            t0 = time.process_time()
            for _ in range(requests):
                workload(c)
            out[name].append((time.process_time() - t0) / requests * 1e6)
    return out


def report(title: str, per: dict[str, list[float]], chunks: int) -> None:
    base = statistics.median(per["sdk alone"])
    print(f"\n{title}")
    print(f"{'client':<16} {'median µs/req':>14} {'range':>19} {'overhead':>10}" + ("  µs/chunk" if chunks else ""))
    for name, xs in per.items():
        med = statistics.median(xs)
        extra = med - base
        line = f"{name:<16} {med:14.1f} {min(xs):9.1f}-{max(xs):<9.1f} "
        line += f"{'':>10}" if name == "sdk alone" else f"{extra / base * 100:+9.1f}%"
        if chunks and name != "sdk alone":
            line += f"  {extra / chunks:+8.2f}"
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--stream-words", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 20 requests (a smoke run)")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.requests = 2, 20
    proc, base = fault_server()
    try:
        print(
            f"python {sys.version.split()[0]}, openai {openai.__version__}, httpx {httpx.__version__}, "
            f"retrywise {retrywise.__version__}; {a.rounds} rounds x {a.requests} requests per client, interleaved"
        )
        cs = clients(base, a.stream_words)
        report("JSON completion", measure(json_request, cs, a.rounds, a.requests), 0)
        words = a.stream_words
        per = measure(stream_request(words), cs, a.rounds, max(1, a.requests // 4))
        report(f"{words}-chunk stream", per, words)
    finally:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
