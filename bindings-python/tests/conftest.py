"""Shared fixtures: the fault-injection upstream (started once per session on
127.0.0.1) and engines with a fast backoff so retries do not slow the suite."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import retrywise

ROOT = Path(__file__).resolve().parents[2]

#: 3 attempts, jitter capped at 40 ms: the suite tests decisions, not patience.
FAST: dict[str, Any] = {"max_attempts": 3, "backoff": {"base_ms": 10, "cap_ms": 40}}

#: A breaker that opens after two failures for 5 s and holds a refused call
#: for its probe window up to 5 s (plus up to hold_jitter_ms 1000).
HOLD: dict[str, Any] = {
    "max_attempts": 1,
    "breaker": {
        "min_calls": 2,
        "window_size": 2,
        "failure_rate": 0.5,
        "open_ms": 5000,
        "open_jitter": 0,
        "hold_jitter_ms": 1000,
        "hold_max_ms": 5000,
    },
}


def openai_client_for(attempt: retrywise.Attempt) -> Any:
    """An openai client for one attempt of ``engine.run``: pointed where
    ``attempt.reach`` says, with the attempt's timeouts and its own retries off."""
    import openai

    reach = attempt.reach
    assert reach is not None
    t = attempt.timeouts
    return openai.OpenAI(
        base_url=reach.base_url,
        api_key=reach.api_key,
        max_retries=0,
        timeout=openai.Timeout(t.total, connect=t.connect, read=t.first_byte),
    )


def _server_binary() -> Path:
    explicit = os.environ.get("RETRYWISE_FAULT_SERVER")
    if explicit:
        return Path(explicit)
    targets = [os.environ.get("CARGO_TARGET_DIR"), str(ROOT / "target")]
    for t in filter(None, targets):
        for profile in ("debug", "release"):
            p = Path(t) / profile / "retrywise-fault-server"
            if p.exists():
                return p
    found = shutil.which("retrywise-fault-server")
    if found:
        return Path(found)
    raise RuntimeError(
        "retrywise-fault-server not found: run `cargo build -p retrywise-fault-server` "
        "or set RETRYWISE_FAULT_SERVER (bindings-python/ci.sh does both)"
    )


class FaultServer:
    """Handle on the running fault server: URLs, counts and recorded requests."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.base = f"http://{addr}"

    def url(self, spec: str, api: str = "/v1") -> str:
        return f"{self.base}/s/{spec}{api}"

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.base + path, timeout=5) as r:
            return json.loads(r.read())

    def reset(self) -> None:
        req = urllib.request.Request(self.base + "/control/reset", method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=5) as r:
            r.read()

    def count(self, spec: str) -> int:
        n: int = self._get("/control/counts")["by_spec"].get(spec, 0)
        return n

    def total(self) -> int:
        n: int = self._get("/control/counts")["total"]
        return n

    def closed_port(self) -> int:
        """A 127.0.0.1 port just bound and released: connecting to it is refused."""
        port: int = self._get("/control/closed-port")["port"]
        return port

    def requests(self, spec: str | None = None) -> list[dict[str, Any]]:
        q = "" if spec is None else "?spec=" + urllib.parse.quote(spec, safe="")
        rows: list[dict[str, Any]] = self._get("/control/requests" + q)
        return rows


@pytest.fixture(scope="session")
def _fault_process() -> Iterator[FaultServer]:
    proc = subprocess.Popen(
        [str(_server_binary()), "--exit-on-stdin-close"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line and line[0] == "LISTENING", f"unexpected fault-server output {line!r}"
        yield FaultServer(line[1])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def fault(_fault_process: FaultServer) -> FaultServer:
    """The fault server, with counters reset for this test."""
    _fault_process.reset()
    return _fault_process


@pytest.fixture
def engine() -> retrywise.Engine:
    return retrywise.Engine(FAST, seed=7)
