"""Three engines sharing one real Redis through ``retrywise.fleet`` (a
``redis-server`` each test starts on a free port of 127.0.0.1 and stops; the
binary is ``$RETRYWISE_REDIS_SERVER``, else ``redis-server`` on PATH).

The engines run on manual clocks that start at the same wall instant and
the tests run each sync cycle themselves (``sync_once``), so every step is
deterministic: a cycle here is one tick of the adapter's daemon thread, and
"within the staleness bound" means within the cycles that bound allows.
One test runs the daemon thread on the system clock and polls for outcomes.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import retrywise

redis = pytest.importorskip("redis", reason="retrywise.fleet needs the redis package (pip install redis)")
from retrywise.fleet import AsyncRedisFleet, RedisFleet  # noqa: E402

REDIS_SERVER = os.environ.get("RETRYWISE_REDIS_SERVER") or shutil.which("redis-server")
if REDIS_SERVER is None:
    if os.environ.get("RETRYWISE_REQUIRE_REDIS") == "1":
        raise RuntimeError("redis-server is missing (apt-get install redis-server) and RETRYWISE_REQUIRE_REDIS=1")
    pytest.skip("redis-server is not installed (apt-get install redis-server)", allow_module_level=True)

#: One upstream ``up`` whose breaker opens at 2 failures of 4 calls, for 30 s.
POLICY: dict[str, Any] = {
    "max_attempts": 1,
    # The fleet's breaker and budget records are under test; the rate-limit table
    # (shared when pacing is on) has its own test.
    "rate_limits": {"enabled": False},
    "breaker": {
        "min_calls": 4,
        "window_size": 4,
        "failure_rate": 0.5,
        "open_ms": 30000,
        "open_max_ms": 60000,
        "open_jitter": 0,
        "half_open_probes": 1,
        "close_after": 1,
        "hold": False,
    },
}
QUIET = {"opened": 0, "extended": 0, "recovered": 0, "leases_won": 0, "leases_lost": 0, "limits": 0}


def report(**changed: int) -> dict[str, int]:
    return {**QUIET, **changed}


class Redis:
    """A ``redis-server`` of this test: no persistence, so a restart is empty."""

    def __init__(self, port: int | None = None) -> None:
        if port is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        self.port = port
        assert REDIS_SERVER is not None
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        # Wait for it to listen (startup, not behaviour: nothing asserted on time).
        client = redis.Redis(port=port, socket_timeout=0.1, socket_connect_timeout=0.1)
        for _ in range(400):
            try:
                client.ping()
                client.close()
                return
            except redis.RedisError:
                time.sleep(0.025)
        self.kill()
        raise RuntimeError(f"redis-server did not start on port {port}")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def server() -> Iterator[Redis]:
    r = Redis()
    yield r
    r.kill()


def call(engine: retrywise.Engine, status: int) -> str:
    """One call of one attempt answered with ``status``: "sent", or the refusal's reason."""
    c = engine.begin("up", deadline_ms=60_000)
    try:
        c.next_attempt()
    except retrywise.Stopped as s:
        return s.reason
    c.report(status=status)
    return "sent"


class Node:
    """One instance: an engine on a manual clock, its fleet, the fleet events it saw."""

    def __init__(self, name: str, quorum: int, client: Any, **config: Any) -> None:
        self.engine = retrywise.Engine(POLICY, seed=7, manual_clock=True)
        self.events: list[str] = []
        self.engine.on_event(lambda e: self.events.append(e["detail"]) if e["kind"] == "fleet" else None)
        self.sync = RedisFleet(self.engine.fleet(instance=name, quorum=quorum, **config), client)

    def call(self, status: int) -> str:
        return call(self.engine, status)

    def state(self) -> str:
        return self.engine.breaker_state("up")

    def cycle(self) -> dict[str, int]:
        return cast("dict[str, int]", dict(self.sync.sync_once()))


def fleet(quorum: int, server: Redis) -> tuple[Node, Node, Node]:
    # One client decodes responses, one does not, one is a URL: the adapter takes each.
    return (
        Node("a", quorum, server.url),
        Node("b", quorum, redis.Redis(port=server.port)),
        Node("c", quorum, redis.Redis(port=server.port, decode_responses=True)),
    )


def advance(nodes: tuple[Node, ...], ms: int) -> None:
    for n in nodes:
        n.engine.advance_clock(ms)


def test_an_open_on_one_engine_stops_the_others_within_the_staleness_bound(server: Redis) -> None:
    a, b, c = fleet(1, server)
    for n in (a, b, c):
        assert n.call(200) == "sent"
        assert n.cycle() == QUIET
    for _ in range(3):
        assert a.call(503) == "sent"
    assert a.state() == "open"
    # The worst case: the open lands just after a's cycle began, so it goes
    # out one interval later, and b and c read it an interval after that.
    interval = a.sync.fleet.config["interval_ms"]
    advance((a, b, c), interval)
    assert (b.call(200), c.call(200)) == ("sent", "sent"), "not written yet"
    assert a.cycle() == QUIET
    advance((a, b, c), interval)
    assert b.cycle() == report(opened=1)
    assert c.cycle() == report(opened=1)
    assert 2 * interval <= a.sync.fleet.staleness_bound_ms == 900
    assert (b.call(200), c.call(200)) == ("breaker_open", "breaker_open")
    assert (b.state(), c.state()) == ("open", "open")
    assert b.sync.fleet.stats()["opened"] == 1


def test_one_engine_below_the_quorum_opens_nobody_else(server: Redis) -> None:
    a, b, c = fleet(2, server)
    for _ in range(4):
        a.call(503)
    assert a.state() == "open"
    a.cycle()
    for n in (b, c):
        assert n.cycle() == QUIET
        assert n.call(200) == "sent"
        assert n.state() == "closed"
    # A second instance's own evidence makes the quorum of two: the third opens.
    for _ in range(4):
        b.call(503)
    b.cycle()
    assert c.cycle() == report(opened=1)
    assert c.call(200) == "breaker_open"


def test_exactly_one_probe_goes_fleet_wide_and_its_success_closes_every_breaker(server: Redis) -> None:
    a, b, c = fleet(1, server)
    for n in (b, c):
        assert n.call(200) == "sent"
    for _ in range(4):
        a.call(503)
    a.cycle()
    assert b.cycle() == report(opened=1)
    assert c.cycle() == report(opened=1)
    # Shortly before the open period ends every instance claims the probe lease.
    advance((a, b, c), 29_800)
    assert b.cycle() == report(leases_won=1)
    assert a.cycle() == report(extended=1, leases_lost=1)
    assert c.cycle() == report(extended=1, leases_lost=1)
    advance((a, b, c), 300)
    probe = b.engine.begin("up", deadline_ms=60_000)
    probe.next_attempt()  # b probes
    for _ in range(3):
        for n in (a, c, b):
            assert n.call(200) == "breaker_open"
    probe.report(status=200)
    assert b.state() == "closed"
    assert b.call(200) == "sent"
    assert (a.call(200), c.call(200)) == ("breaker_open", "breaker_open"), "until they sync"
    # b's recovery reaches the others at their next cycle.
    b.cycle()
    assert a.cycle() == report(recovered=1)
    assert c.cycle() == report(recovered=1)
    assert (a.call(200), c.call(200)) == ("sent", "sent")


def test_killing_redis_loses_no_call_and_changes_no_local_decision_then_the_fleet_resyncs(server: Redis) -> None:
    a, b, _c = fleet(1, server)
    # The twin: same policy, seed and clock start, no fleet.
    twin = retrywise.Engine(POLICY, seed=7, manual_clock=True)
    assert b.call(200) == "sent", "b knows the scope"
    assert a.cycle() == QUIET
    assert b.cycle() == QUIET
    server.kill()
    # Every cycle fails; every call is answered at once, as the twin answers it.
    decisions = []
    for i in range(12):
        with pytest.raises(redis.ConnectionError):
            a.cycle()
        status = 503 if i < 6 else 200
        own, other = a.call(status), call(twin, status)
        assert own == other, f"call {i}"
        decisions.append(own)
        a.engine.advance_clock(1_000)
        twin.advance_clock(1_000)
    assert decisions == ["sent"] * 4 + ["breaker_open"] * 8
    own_stats, twin_stats = a.engine.stats(), twin.stats()
    assert own_stats["logical_requests"] == twin_stats["logical_requests"] == 12
    assert own_stats["attempts"] == twin_stats["attempts"] == 4
    assert a.state() == "open"
    s = a.sync.fleet.stats()
    assert (s["healthy"], s["failures"], s["consecutive_failures"], s["cycles"]) == (False, 12, 12, 1)
    assert not a.sync.fleet.healthy()
    with pytest.raises(redis.ConnectionError):
        b.cycle()
    # Redis comes back empty on the same port: a writes its open again, b adopts it.
    back = Redis(server.port)
    try:
        advance((b,), 12_000)
        assert b.cycle() == QUIET
        assert a.cycle() == QUIET
        s = a.sync.fleet.stats()
        assert (s["healthy"], s["failures"], s["consecutive_failures"], s["cycles"]) == (True, 12, 0, 2)
        assert len(a.events) == 2, a.events
        assert a.events[0].startswith("store_unavailable: ConnectionError")
        assert a.events[1] == "store_resynced"
        assert b.cycle() == report(opened=1)
        assert b.call(200) == "breaker_open"
    finally:
        back.kill()


def test_a_redis_that_stops_answering_fails_the_cycle_at_the_timeout_and_decisions_go_on(server: Redis) -> None:
    a, b, _c = fleet(1, server)
    assert b.call(200) == "sent"
    assert a.cycle() == QUIET
    assert b.cycle() == QUIET
    # Frozen: connections are accepted by the kernel, nothing is answered.
    server.proc.send_signal(signal.SIGSTOP)
    try:
        for _ in range(4):
            a.call(503)
        with pytest.raises(redis.TimeoutError):
            a.cycle()
        assert a.state() == "open"
        assert a.call(200) == "breaker_open"
        assert not a.sync.fleet.healthy()
    finally:
        server.proc.send_signal(signal.SIGCONT)
    # Answering again: the open a could not write goes out, and b adopts it.
    assert a.cycle() == QUIET
    assert b.cycle() == report(opened=1)
    assert a.sync.fleet.stats()["failures"] == 1


class Proc:
    """One instance in a process of its own (``tests/fleet_node.py``)."""

    def __init__(self, name: str, quorum: int, server: Redis) -> None:
        node = Path(__file__).with_name("fleet_node.py")
        self.proc = subprocess.Popen(
            [sys.executable, str(node), name, str(quorum), server.url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, cmd: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        assert reply, f"the node exited on {cmd!r}"
        return reply.rstrip("\n")

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        self.proc.wait()


def test_three_processes_share_an_open_and_keep_deciding_with_redis_gone(server: Redis) -> None:
    nodes = [Proc(name, 1, server) for name in ("a", "b", "c")]
    try:
        a, b, c = nodes
        for n in nodes:
            assert n.ask("call 200") == "sent"
            assert n.ask("sync") == ""
        for _ in range(3):
            assert a.ask("call 503") == "sent"
        assert a.ask("state") == "open"
        # Within the staleness bound: a writes at its next cycle, b and c read at theirs.
        for n in nodes:
            assert n.ask("advance 250") == "ok"
        assert a.ask("sync") == ""
        assert (b.ask("sync"), c.ask("sync")) == ("opened=1", "opened=1")
        assert (b.ask("call 200"), c.ask("call 200")) == ("breaker_open", "breaker_open")
        server.kill()
        for n in nodes:
            assert n.ask("sync") == "error ConnectionError"
            assert n.ask("call 200") == "breaker_open"
            assert n.ask("state") == "open"
    finally:
        for n in nodes:
            n.close()


def eventually(what: str, done: Callable[[], bool]) -> None:
    """Polls ``done`` for up to 10 s (an outcome, never a speed, is asserted)."""
    start = time.monotonic()
    while not done():
        assert time.monotonic() - start < 10, f"never: {what}"
        time.sleep(0.01)


def test_the_daemon_thread_shares_an_open_and_keeps_deciding_with_redis_gone(server: Redis) -> None:
    a, b = retrywise.Engine(POLICY), retrywise.Engine(POLICY)
    fa = RedisFleet(a.fleet(instance="a", quorum=1, interval_ms=20), server.url).start()
    with RedisFleet(b.fleet(instance="b", quorum=1, interval_ms=20), redis.Redis(port=server.port)) as fb:
        assert call(b, 200) == "sent", "b knows the scope"
        for _ in range(4):
            assert call(a, 503) == "sent"
        assert a.breaker_state("up") == "open"
        eventually("b adopts a's open", lambda: b.breaker_state("up") == "open")
        assert call(b, 200) == "breaker_open"
        assert fb.fleet.stats()["opened"] == 1
        server.kill()
        eventually("a notices Redis is gone", lambda: not fa.fleet.healthy())
        # Decisions go on from local state.
        assert (call(a, 200), call(b, 200)) == ("breaker_open", "breaker_open")
        assert fa.fleet.stats()["failures"] >= 1
    fa.stop()


async def test_the_asyncio_adapter_shares_an_open_and_fails_open(server: Redis) -> None:
    a = retrywise.Engine(POLICY, seed=7, manual_clock=True)
    b = retrywise.Engine(POLICY, seed=7, manual_clock=True)
    fa = AsyncRedisFleet(a.fleet(instance="a", quorum=1), server.url)
    fb = AsyncRedisFleet(b.fleet(instance="b", quorum=1), redis.asyncio.Redis(port=server.port))
    try:
        assert call(b, 200) == "sent"
        for _ in range(4):
            call(a, 503)
        assert dict(await fa.sync_once()) == QUIET
        assert dict(await fb.sync_once()) == report(opened=1)
        assert call(b, 200) == "breaker_open"
        server.kill()
        with pytest.raises(redis.ConnectionError):
            await fb.sync_once()
        assert not fb.fleet.healthy()
        assert call(b, 200) == "breaker_open"
    finally:
        await fa.stop()
        await fb.stop()


async def test_the_asyncio_task_runs_cycles_until_stopped(server: Redis) -> None:
    e = retrywise.Engine(POLICY)
    async with AsyncRedisFleet(e.fleet(instance="a", interval_ms=10), server.url) as f:
        start = time.monotonic()
        while f.fleet.stats()["cycles"] < 3:
            assert time.monotonic() - start < 10, "never: three cycles"
            await asyncio.sleep(0.01)
        assert f.fleet.healthy()
    cycles = f.fleet.stats()["cycles"]
    await asyncio.sleep(0.05)
    assert f.fleet.stats()["cycles"] == cycles, "stopped"


def test_engine_fleet_takes_the_core_config_and_attaches_once() -> None:
    e = retrywise.Engine(POLICY)
    f = e.fleet(instance="a", namespace="prod", quorum=3, interval_ms=100, timeout_ms=50)
    assert f.config == {
        "instance": "a",
        "namespace": "prod",
        "quorum": 3,
        "quorum_window_ms": 30_000,
        "interval_ms": 100,
        "timeout_ms": 50,
        "probe_lease_ms": 10_000,
    }
    assert f.staleness_bound_ms == 300
    assert not f.healthy()
    with pytest.raises(ValueError, match="already has a fleet"):
        e.fleet()
    with pytest.raises(ValueError, match="quorum must be at least 1"):
        retrywise.Engine(POLICY).fleet(quorum=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'interval'"):
        retrywise.Engine(POLICY).fleet(interval=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="argument 'quorum': expected int"):
        retrywise.Engine(POLICY).fleet(quorum="2")  # type: ignore[arg-type]
    assert retrywise.Engine(POLICY).fleet().config["instance"] != ""


def test_the_plan_is_plain_data_and_mismatched_answers_fail_the_cycle() -> None:
    e = retrywise.Engine(POLICY, manual_clock=True)
    f = e.fleet(instance="a", quorum=1)
    for _ in range(4):
        call(e, 503)
    plan = f.plan()
    assert plan["reads"] == ["retrywise:b:pmr:up"]
    assert [(k, field, ttl) for k, field, _value, ttl in plan["writes"]] == [("retrywise:b:pmr:up", "a", 30_000)]
    assert plan["claims"] == []
    assert f.complete(plan["id"], [], []) == QUIET, "one read missing"
    assert f.stats()["failures"] == 1
    assert retrywise.fleet.MERGE_SCRIPT == retrywise._retrywise.MERGE_SCRIPT
    assert "SET" in retrywise.fleet.CLAIM_SCRIPT
