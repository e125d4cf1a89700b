"""``engine.run`` / ``engine.run_async``: the loop done for you, exceptions
mapped to error kinds, cancellation, and nesting that never multiplies."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import retrywise
from retrywise import Attempt, Engine
from retrywise._outcomes import error_kind

from .conftest import HOLD


@dataclass
class Resp:
    status_code: int
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes = b""


def scripted(*outcomes: Any) -> tuple[list[Attempt], Any]:
    """A fn returning (or raising) the given outcomes in turn, recording attempts."""
    seen: list[Attempt] = []
    it = iter(outcomes)

    def fn(attempt: Attempt) -> Any:
        seen.append(attempt)
        o = next(it)
        if isinstance(o, BaseException):
            raise o
        return o

    return seen, fn


def test_run_retries_until_success(engine: Engine) -> None:
    seen, fn = scripted(Resp(503), httpx.ConnectError("refused"), Resp(200))
    result = engine.run(fn, route="u", deadline_ms=5_000)
    assert result.status_code == 200 and [a.number for a in seen] == [1, 2, 3]
    assert len({a.request_id for a in seen}) == 1
    assert engine.stats()["attempts"] == 3


def test_run_returns_plain_values(engine: Engine) -> None:
    assert engine.run(lambda a: {"answer": 42}, route="u") == {"answer": 42}


def test_run_stop_raises_stopped_with_last_response(engine: Engine) -> None:
    seen, fn = scripted(Resp(503), Resp(503), Resp(503))
    with pytest.raises(retrywise.Stopped) as e:
        engine.run(fn, route="u")
    assert len(seen) == 3
    s = e.value
    assert s.reason == "max_attempts" and s.error_class == "transient" and s.response.status_code == 503
    assert s.decision is not None and s.decision.action == "stop" and s.exception is None
    assert not isinstance(s, retrywise.ReconcileRequired)


def test_run_auth_error_stops_at_once(engine: Engine) -> None:
    seen, fn = scripted(Resp(401))
    with pytest.raises(retrywise.Stopped) as e:
        engine.run(fn, route="u")
    assert len(seen) == 1 and e.value.reason == "auth_error"


def test_run_reads_vendor_code_from_error_body(engine: Engine) -> None:
    body = b'{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}'
    seen, fn = scripted(Resp(429, content=body))
    with pytest.raises(retrywise.Stopped) as e:
        engine.run(fn, route="u")
    assert len(seen) == 1 and e.value.reason == "quota_exhausted"


def test_run_unsafe_unknown_effect_requires_reconcile(engine: Engine) -> None:
    err = httpx.RemoteProtocolError("Server disconnected without sending a response.")
    seen, fn = scripted(err)
    with pytest.raises(retrywise.ReconcileRequired) as e:
        engine.run(fn, route="u", idempotency="unsafe")
    assert len(seen) == 1 and e.value.reason == "effect_unknown"
    assert e.value.exception is err and e.value.__cause__ is err
    assert len(engine.reconcile_list()) == 1


def test_run_exception_with_response_is_reported_as_status(engine: Engine) -> None:
    request = httpx.Request("POST", "http://upstream.invalid/v1")
    response = httpx.Response(400, request=request, content=b'{"error":{"code":"context_length_exceeded"}}')
    err = httpx.HTTPStatusError("bad", request=request, response=response)
    _, fn = scripted(err)
    with pytest.raises(retrywise.Stopped) as e:
        engine.run(fn, route="u")
    assert e.value.reason == "context_length_exceeded" and e.value.response is response


def test_run_unknown_exception_is_other_and_not_retried(engine: Engine) -> None:
    seen, fn = scripted(ValueError("bug in fn"))
    with pytest.raises(retrywise.Stopped) as e:
        engine.run(fn, route="u")
    assert len(seen) == 1 and isinstance(e.value.exception, ValueError)


def test_run_with_manual_clock_advances_instead_of_sleeping() -> None:
    engine = Engine(
        {"max_attempts": 3, "backoff": {"base_ms": 5_000, "cap_ms": 5_000, "kind": "equal"}}, manual_clock=True
    )
    seen, fn = scripted(Resp(503), Resp(503), Resp(200))
    t0 = time.monotonic()
    assert engine.run(fn, route="u", deadline_ms=60_000).status_code == 200
    assert time.monotonic() - t0 < 1.0
    assert seen[2].remaining_s < 55.0


def test_keyboard_interrupt_cancels_the_call(engine: Engine) -> None:
    _, fn = scripted(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        engine.run(fn, route="u")
    assert engine.stats()["stops"] == {"cancelled": 1}


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (httpx.ConnectError("x"), ("connect", None)),
        (httpx.ConnectTimeout("x"), ("connect_timeout", None)),
        (httpx.PoolTimeout("x"), ("connect_timeout", None)),
        (httpx.ReadTimeout("x"), ("first_byte_timeout", None)),
        (httpx.WriteTimeout("x"), ("write", None)),
        (httpx.RemoteProtocolError("x"), ("connection_reset", "sent")),
        (httpx.ReadError("x"), ("connection_reset", "sent")),
        (httpx.UnsupportedProtocol("x"), ("other", None)),
        (ConnectionRefusedError(), ("connect", None)),
        (ConnectionResetError(), ("connection_reset", "sent")),
        (socket.gaierror(), ("dns", None)),
        (TimeoutError(), ("first_byte_timeout", None)),
        (asyncio.CancelledError(), ("cancelled", None)),
        (json.JSONDecodeError("Expecting value", "{", 1), ("malformed_response", None)),
        (ValueError("x"), ("other", None)),
        (RuntimeError("x"), ("other", None)),
    ],
)
def test_exception_mapping(exc: BaseException, kind: tuple[str, str | None]) -> None:
    assert error_kind(exc) == kind


def test_exception_mapping_follows_causes() -> None:
    class APITimeoutError(Exception):
        pass

    try:
        try:
            raise httpx.ReadTimeout("slow")
        except httpx.ReadTimeout as inner:
            raise APITimeoutError("Request timed out.") from inner
    except APITimeoutError as outer:
        assert error_kind(outer) == ("first_byte_timeout", None)
    assert error_kind(httpx.ReadTimeout("x"), in_body=True) == ("stream_idle_timeout", None)


# ------------------------------------------------------------------ nesting --


def test_nested_run_never_multiplies(engine: Engine) -> None:
    """Retrywise around retrywise: the inner call inherits the deadline and makes
    one attempt per outer attempt, so 3 outer attempts cost 3 upstream calls, not 9."""
    upstream_calls = 0
    inner_calls: list[retrywise.Call] = []

    def upstream(attempt: Attempt) -> Resp:
        nonlocal upstream_calls
        upstream_calls += 1
        return Resp(503)

    def outer(attempt: Attempt) -> Resp:
        call = engine.begin("inner")
        inner_calls.append(call)
        assert not call.is_owner and call.id == attempt.request_id
        assert call.remaining_s <= attempt.remaining_s
        try:
            return engine.run(upstream, route="inner")
        except retrywise.Stopped as s:
            assert s.reason == "not_owner"
            return s.response  # type: ignore[no-any-return]

    with pytest.raises(retrywise.Stopped) as e:
        engine.run(outer, route="outer", deadline_ms=5_000)
    assert e.value.reason == "max_attempts"
    assert upstream_calls == 3
    assert retrywise.current_attempt.get() is None


def test_explicit_parent_nests_across_threads(engine: Engine) -> None:
    outer = engine.begin("outer", deadline_ms=3_000)
    a = outer.next_attempt()
    inner = engine.begin("inner", deadline_ms=60_000, parent=a)
    assert not inner.is_owner and inner.id == outer.id and inner.remaining_s <= 3.0


# ------------------------------------------------------------------ asyncio --


async def test_run_async_retries_and_sleeps_with_asyncio(engine: Engine) -> None:
    outcomes = iter([Resp(503), Resp(429, {"retry-after": "0.05"}), Resp(200)])
    delays: list[float] = []

    async def fn(attempt: Attempt) -> Resp:
        await asyncio.sleep(0)
        return next(outcomes)

    t0 = time.monotonic()
    r = await engine.run_async(fn, route="u", deadline_ms=5_000)
    delays.append(time.monotonic() - t0)
    assert r.status_code == 200 and delays[0] >= 0.05


async def test_run_async_concurrent_tasks_share_one_engine() -> None:
    # No budget or breaker here: 50 simultaneous first failures would (rightly) exhaust
    # the retry budget and open the upstream's breaker.
    engine = Engine(
        {"backoff": {"base_ms": 1, "cap_ms": 5}, "budget": {"enabled": False}, "breaker": {"enabled": False}}
    )

    async def one(i: int) -> int:
        state = {"n": 0}

        async def fn(attempt: Attempt) -> Resp:
            state["n"] += 1
            await asyncio.sleep(0.001)
            assert retrywise.current_attempt.get() is attempt
            return Resp(503 if state["n"] == 1 else 200)

        await engine.run_async(fn, route="u", tenant=f"t{i % 3}")
        return state["n"]

    counts = await asyncio.gather(*(one(i) for i in range(50)))
    assert counts == [2] * 50
    s = engine.stats()
    assert s["logical_requests"] == 50 and s["attempts"] == 100 and s["successes"] == 50


async def test_run_async_cancellation_is_reported_and_reraised(engine: Engine) -> None:
    started = asyncio.Event()

    async def fn(attempt: Attempt) -> Resp:
        started.set()
        await asyncio.sleep(10)
        return Resp(200)

    task = asyncio.ensure_future(engine.run_async(fn, route="u"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    s = engine.stats()
    assert s["stops"] == {"cancelled": 1} and s["successes"] == 0


async def test_run_async_cancelled_during_backoff(engine: Engine) -> None:
    slow = Engine({"backoff": {"base_ms": 10_000, "cap_ms": 10_000, "kind": "equal"}})
    attempts = 0

    async def fn(attempt: Attempt) -> Resp:
        nonlocal attempts
        attempts += 1
        return Resp(503)

    task = asyncio.ensure_future(slow.run_async(fn, route="u", deadline_ms=60_000))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert attempts == 1 and slow.stats()["stops"] == {"cancelled": 1}


async def test_nested_run_async_never_multiplies(engine: Engine) -> None:
    upstream_calls = 0

    async def upstream(attempt: Attempt) -> Resp:
        nonlocal upstream_calls
        upstream_calls += 1
        return Resp(502)

    async def outer(attempt: Attempt) -> Resp:
        try:
            return await engine.run_async(upstream, route="inner")
        except retrywise.Stopped as s:
            return s.response  # type: ignore[no-any-return]

    with pytest.raises(retrywise.Stopped):
        await engine.run_async(outer, route="outer")
    assert upstream_calls == 3


def _trip(engine: Engine) -> None:
    for _ in range(2):
        with pytest.raises(retrywise.Stopped):
            engine.run(lambda a: Resp(503), route="up")
    engine.advance_clock(1000)


def test_not_yet_is_a_stopped_with_a_wait() -> None:
    """An open breaker that admits probes within the hold: ``next_attempt`` says
    "not yet" (``NotYet``, a ``Stopped`` with ``wait_s``), not a final stop."""
    engine = Engine(HOLD, seed=7, manual_clock=True)
    _trip(engine)
    call = engine.begin("up", deadline_ms=30_000)
    with pytest.raises(retrywise.NotYet) as e:
        call.next_attempt()
    # The 4 s the breaker stays open, plus up to hold_jitter_ms so held calls do not probe together.
    assert e.value.reason == "breaker_open" and 4.0 <= e.value.wait_s <= 5.0
    engine.advance_clock(5000)
    assert call.next_attempt().upstream == "up"


def test_run_waits_out_not_yet() -> None:
    """``run`` sleeps a "not yet" (here: advances the manual clock) and asks again."""
    engine = Engine(HOLD, seed=7, manual_clock=True)
    _trip(engine)
    seen: list[int] = []

    def fn(attempt: retrywise.Attempt) -> Resp:
        seen.append(attempt.number)
        return Resp(200)

    assert engine.run(fn, route="up", deadline_ms=30_000).status_code == 200
    assert seen == [1] and engine.stats()["stops"] == {"max_attempts": 2}


async def test_run_async_waits_out_not_yet() -> None:
    engine = Engine(HOLD, seed=7, manual_clock=True)
    _trip(engine)

    async def fn(attempt: retrywise.Attempt) -> Resp:
        return Resp(200)

    assert (await engine.run_async(fn, route="up", deadline_ms=30_000)).status_code == 200
    assert engine.stats()["successes"] == 1
