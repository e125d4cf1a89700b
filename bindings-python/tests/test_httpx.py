"""The httpx transports: headers and timeouts per attempt, error bodies, stream
phases, nesting, and the same behaviour for the async transport and httpx2."""

from __future__ import annotations

import gzip
import importlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
import retrywise
from retrywise import Engine
from retrywise.httpx import AsyncRetryTransport, RetryTransport

from .conftest import HOLD, FaultServer

Handler = Callable[[httpx.Request], httpx.Response]


class Sent:
    """What one attempt put on the wire (the request object itself is reused across attempts)."""

    def __init__(self, request: Any) -> None:
        self.headers = dict(request.headers)
        self.extensions = {"timeout": dict(request.extensions.get("timeout") or {})}
        self.content = request.content


def script(*responses: Any) -> tuple[list[Sent], Handler]:
    """A MockTransport handler answering (or raising) in turn; records each attempt."""
    seen: list[Sent] = []
    it = iter(responses)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(Sent(request))
        r = next(it)
        if isinstance(r, BaseException):
            raise r
        response: httpx.Response = r() if callable(r) else r
        return response

    return seen, handler


def client(engine: Engine, handler: Handler, **call_kwargs: Any) -> httpx.Client:
    kwargs = {"route": "openai", **call_kwargs}
    return httpx.Client(transport=RetryTransport(engine, transport=httpx.MockTransport(handler), **kwargs))


def err_json(code: str) -> dict[str, Any]:
    return {"error": {"message": "x", "type": code, "code": code}}


def test_each_attempt_gets_headers_and_timeouts(engine: Engine) -> None:
    seen, handler = script(httpx.Response(503), httpx.Response(503), httpx.Response(200, json={"ok": True}))
    with client(engine, handler, deadline_ms=4_000) as c:
        r = c.post("http://up/v1/chat/completions", json={"x": 1}, timeout=httpx.Timeout(10.0, connect=0.5))
    assert r.status_code == 200 and r.json() == {"ok": True}
    assert [req.headers["retrywise-attempt"] for req in seen] == ["1", "2", "3"]
    assert len({req.headers["retrywise-request-id"] for req in seen}) == 1
    deadlines = [int(req.headers["retrywise-deadline-ms"]) for req in seen]
    assert deadlines[0] <= 4_000 and deadlines == sorted(deadlines, reverse=True)
    t = seen[0].extensions["timeout"]
    assert t["connect"] == 0.5  # the caller's shorter timeout is kept
    # first_byte defaults to half the time left, so a silent upstream leaves time for another attempt.
    assert 1.9 < t["read"] <= 2.0 and t["write"] <= 4.0 and t["pool"] <= 4.0
    assert all(req.content == b'{"x":1}' for req in seen)


def test_persistent_failure_returns_last_response(engine: Engine) -> None:
    seen, handler = script(*[httpx.Response(503, json=err_json("server_error"))] * 3)
    with client(engine, handler) as c:
        r = c.get("http://up/v1/models")
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_error" and len(seen) == 3
    assert engine.stats()["stops"] == {"max_attempts": 1}


def test_error_body_vendor_code_stops_at_once(engine: Engine) -> None:
    seen, handler = script(httpx.Response(429, json=err_json("insufficient_quota")))
    with client(engine, handler) as c:
        r = c.post("http://up/v1/chat/completions", json={})
    assert r.status_code == 429 and len(seen) == 1
    assert engine.stats()["stops"] == {"quota_exhausted": 1}


def test_gzip_error_body_is_decoded_for_the_vendor_code(engine: Engine) -> None:
    body = gzip.compress(json.dumps(err_json("insufficient_quota")).encode())
    resp = httpx.Response(429, headers={"content-encoding": "gzip", "content-type": "application/json"}, content=body)
    seen, handler = script(resp)
    with client(engine, handler) as c:
        r = c.post("http://up/v1/chat/completions", json={})
    assert r.json()["error"]["code"] == "insufficient_quota" and len(seen) == 1
    assert engine.stats()["stops"] == {"quota_exhausted": 1}


def test_connect_errors_are_retried_then_reraised(engine: Engine) -> None:
    seen, handler = script(*[httpx.ConnectError("refused")] * 3)
    with client(engine, handler) as c, pytest.raises(httpx.ConnectError) as e:
        c.get("http://up/v1/models")
    assert len(seen) == 3
    notes = getattr(e.value, "__notes__", ["retrywise: stopped (max_attempts)"])
    assert "retrywise: stopped (max_attempts)" in notes


def test_unsafe_dropped_request_requires_reconcile(engine: Engine) -> None:
    seen, handler = script(httpx.RemoteProtocolError("Server disconnected without sending a response."))
    with client(engine, handler, idempotency="unsafe") as c, pytest.raises(retrywise.ReconcileRequired) as e:
        c.post("http://up/v1/charges", json={})
    assert len(seen) == 1 and e.value.reason == "effect_unknown"
    assert isinstance(e.value.__cause__, httpx.RemoteProtocolError)
    assert engine.reconcile_list()[0]["upstream"] == "openai"


class Chunks(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body yielding ``chunks`` then optionally failing the way a cut connection does."""

    def __init__(self, chunks: list[bytes], fail: bool) -> None:
        self.chunks, self.fail, self.closed = chunks, fail, False

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        if self.fail:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for c in self.chunks:
            yield c
        if self.fail:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True


def sse(chunks: list[bytes], fail: bool) -> Callable[[], httpx.Response]:
    return lambda: httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Chunks(chunks, fail))


def test_stream_broken_after_output_is_stream_visible_and_not_replayed(engine: Engine) -> None:
    seen, handler = script(sse([b"data: 1\n\n", b"data: 2\n\n"], fail=True), sse([], fail=False))
    got: list[bytes] = []
    with client(engine, handler) as c, c.stream("POST", "http://up/v1/chat/completions", json={}) as r:
        assert r.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            for chunk in r.iter_raw():
                got.append(chunk)
    assert got == [b"data: 1\n\n", b"data: 2\n\n"] and len(seen) == 1
    s = engine.stats()
    assert s["stops"] == {"stream_visible_output": 1} and s["successes"] == 0
    end = [e for e in engine.events() if e["kind"] == "attempt_end"][-1]
    assert end["phase"] == "stream_visible" and end["error.type"] == "partial_stream"


def test_stream_broken_before_output_is_stream_open_and_retried(engine: Engine) -> None:
    """A stream that breaks before its first byte never reached the caller: the
    transport reads the first chunk inside its loop, so it retries (phase stream_open)."""
    seen, handler = script(sse([], fail=True), sse([b'data: {"ok":1}\n\n'], fail=False))
    with client(engine, handler) as c, c.stream("POST", "http://up/v1/chat/completions", json={}) as r:
        assert r.read() == b'data: {"ok":1}\n\n'
    ends = [e for e in engine.events() if e["kind"] == "attempt_end"]
    assert [e.get("phase") for e in ends] == ["stream_open", None] and len(seen) == 2
    s = engine.stats()
    assert s["successes"] == 1 and s["retries"] == 1 and s["stops"] == {}


ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
HI = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
OVERLOADED = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'
MALFORMED = b'data: {"choices":[{"delta":{"content":\n\n'
DONE = b"data: [DONE]\n\n"


def test_stream_error_event_before_output_is_held_and_retried(engine: Engine) -> None:
    """An error event before any output never reaches the caller: the attempt is
    the failure it names (an overload, phase stream_open) and the next attempt's
    stream is delivered in its place."""
    seen, handler = script(sse([ROLE, OVERLOADED], fail=False), sse([ROLE, HI, DONE], fail=False))
    with client(engine, handler) as c, c.stream("POST", "http://up/v1/chat/completions", json={}) as r:
        assert r.read() == ROLE + HI + DONE
    ends = [e for e in engine.events() if e["kind"] == "attempt_end"]
    assert [e.get("phase") for e in ends] == ["stream_open", None] and len(seen) == 2
    assert engine.stats()["retries"] == 1 and engine.stats()["successes"] == 1


def test_stream_error_event_every_time_returns_the_provider_error(engine: Engine) -> None:
    """No attempt left: the caller gets the provider's own error event (its SDK raises it)."""
    seen, handler = script(*[sse([ROLE, OVERLOADED], fail=False)] * 3)
    with client(engine, handler) as c:
        r = c.post("http://up/v1/chat/completions", json={})
    assert r.status_code == 200 and r.content == ROLE + OVERLOADED and len(seen) == 3
    assert engine.stats()["stops"] == {"max_attempts": 1}


def test_malformed_event_is_skipped(engine: Engine) -> None:
    """``streams.malformed_event: skip`` (default): the SDK's parser never sees it."""
    _, handler = script(sse([ROLE, HI, MALFORMED, HI, DONE], fail=False))
    with client(engine, handler) as c, c.stream("POST", "http://up/v1/chat/completions", json={}) as r:
        assert r.read() == ROLE + HI + HI + DONE
    assert engine.stats()["successes"] == 1


def test_malformed_event_error_ends_the_stream_cleanly() -> None:
    """``streams.malformed_event: error``: what came before is delivered, then the
    caller's stream raises ``StreamInterrupted`` (never a truncated success)."""
    engine = Engine({"max_attempts": 3, "streams": {"malformed_event": "error"}}, seed=1)
    seen, handler = script(sse([ROLE, HI, MALFORMED, HI, DONE], fail=False))
    got: list[bytes] = []
    with (
        client(engine, handler) as c,
        c.stream("POST", "http://up/v1/chat/completions", json={}) as r,
        pytest.raises(retrywise.StreamInterrupted) as e,
    ):
        for chunk in r.iter_raw():
            got.append(chunk)
    assert b"".join(got) == ROLE + HI and len(seen) == 1
    assert e.value.provider_error is not None
    assert e.value.reason == "stream_visible_output" and e.value.provider_error["code"] == "malformed_event"
    assert engine.stats()["successes"] == 0


def test_transport_waits_out_not_yet() -> None:
    """An open breaker that admits a probe within its hold: the transport waits
    for it (a manual clock here) instead of failing the request."""
    engine = Engine(HOLD, seed=7, manual_clock=True)
    seen, handler = script(httpx.Response(503), httpx.Response(503), httpx.Response(200, json={"ok": True}))
    with client(engine, handler, route="up") as c:
        assert [c.get("http://up/v1/models").status_code for _ in range(3)] == [503, 503, 200]
    assert len(seen) == 3 and engine.stats()["stops"] == {"max_attempts": 2}


def test_stream_broken_before_output_every_time_stops_at_max_attempts(engine: Engine) -> None:
    seen, handler = script(*[sse([], fail=True)] * 3)
    with client(engine, handler) as c, pytest.raises(httpx.RemoteProtocolError):
        c.post("http://up/v1/chat/completions", json={})
    assert len(seen) == 3 and engine.stats()["stops"] == {"max_attempts": 1}


def test_empty_stream_is_a_success(engine: Engine) -> None:
    _, handler = script(sse([], fail=False))
    with client(engine, handler) as c, c.stream("GET", "http://up/v1/x") as r:
        assert r.read() == b""
    assert engine.stats()["successes"] == 1


def test_stream_completed_is_a_success_and_idle_timeout_applies(engine: Engine) -> None:
    seen, handler = script(sse([b"data: a\n\n", b"data: [DONE]\n\n"], fail=False))
    with client(engine, handler, deadline_ms=5_000) as c:
        with c.stream("POST", "http://up/v1/chat/completions", json={}) as r:
            body = r.read()
        assert body.endswith(b"[DONE]\n\n")
    assert engine.stats()["successes"] == 1
    policy_idle = engine.policy()["timeouts"]["idle_ms"] / 1000
    assert seen[0].extensions["timeout"]["read"] <= min(policy_idle, 5.0)


def test_stream_closed_early_is_a_success(engine: Engine) -> None:
    _, handler = script(sse([b"a", b"b", b"c"], fail=False))
    with client(engine, handler) as c, c.stream("GET", "http://up/v1/x") as r:
        for _ in r.iter_raw():
            break
    s = engine.stats()
    assert s["successes"] == 1 and s["stops"] == {}


def test_transport_nested_in_run_is_not_an_owner(engine: Engine) -> None:
    seen, handler = script(*[httpx.Response(503)] * 9)
    with client(engine, handler) as c:

        def fn(attempt: retrywise.Attempt) -> httpx.Response:
            return c.get("http://up/v1/models")

        with pytest.raises(retrywise.Stopped) as e:
            engine.run(fn, route="app", deadline_ms=5_000)
    assert e.value.reason == "max_attempts" and len(seen) == 3
    assert len({req.headers["retrywise-request-id"] for req in seen}) == 1
    s = engine.stats()
    assert s["stops"]["not_owner"] == 3


async def test_async_stream_broken_before_output_is_retried(engine: Engine) -> None:
    seen, handler = script(sse([], fail=True), sse([b'data: {"ok":1}\n\n'], fail=False))
    transport = AsyncRetryTransport(engine, "openai", transport=httpx.MockTransport(handler))
    async with (
        httpx.AsyncClient(transport=transport) as c,
        c.stream("POST", "http://up/v1/chat/completions", json={}) as r,
    ):
        assert await r.aread() == b'data: {"ok":1}\n\n'
    assert len(seen) == 2 and engine.stats()["successes"] == 1 and engine.stats()["retries"] == 1


async def test_async_transport_retries_and_streams(engine: Engine) -> None:
    seen, handler = script(httpx.Response(502), sse([b'data: {"x":1}\n\n'], fail=True))
    transport = AsyncRetryTransport(engine, "openai", transport=httpx.MockTransport(handler))
    async with (
        httpx.AsyncClient(transport=transport) as c,
        c.stream("POST", "http://up/v1/chat/completions", json={}) as r,
    ):
        assert r.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            async for _ in r.aiter_raw():
                pass
    assert len(seen) == 2 and engine.stats()["stops"] == {"stream_visible_output": 1}


async def test_async_transport_unsafe_reconcile(engine: Engine) -> None:
    seen, handler = script(httpx.ReadError("reset"))
    transport = AsyncRetryTransport(engine, "openai", transport=httpx.MockTransport(handler), idempotency="unsafe")
    async with httpx.AsyncClient(transport=transport) as c:
        with pytest.raises(retrywise.ReconcileRequired):
            await c.post("http://up/v1/charges", json={})
    assert len(seen) == 1


def test_httpx2_flavour_behaves_the_same(engine: Engine) -> None:
    hx2 = pytest.importorskip("httpx2")
    rw2 = importlib.import_module("retrywise.httpx2")
    seen: list[Sent] = []

    def handler(request: Any) -> Any:
        seen.append(Sent(request))
        return hx2.Response(503 if len(seen) < 3 else 200, json={"n": len(seen)})

    with hx2.Client(transport=rw2.RetryTransport(engine, "openai", transport=hx2.MockTransport(handler))) as c:
        r = c.get("http://up/v1/models")
    assert r.status_code == 200 and r.json() == {"n": 3}
    assert [req.headers["retrywise-attempt"] for req in seen] == ["1", "2", "3"]


# -------------------------------------------------------- real sockets --


def test_hanging_upstream_respects_the_deadline(fault: FaultServer, engine: Engine) -> None:
    """first_byte defaults to half the time left: a 500 ms attempt, a 250 ms one,
    then less than min_attempt_ms is left and the call stops within its deadline."""
    with httpx.Client(transport=RetryTransport(engine, "openai", deadline_ms=1_000)) as c:
        t0 = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            c.post(fault.url("hang") + "/chat/completions", json={})
        elapsed = time.monotonic() - t0
    assert 0.7 <= elapsed <= 1.1 and fault.count("hang") == 2
    assert engine.stats()["stops"] == {"deadline_exceeded": 1}


def test_connection_refused_is_retried(fault: FaultServer, engine: Engine) -> None:
    port = fault._get("/control/closed-port")["port"]
    with httpx.Client(transport=RetryTransport(engine, "openai")) as c, pytest.raises(httpx.ConnectError):
        c.get(f"http://127.0.0.1:{port}/v1/models")
    assert engine.stats()["attempts"] == 3


def test_flaky_upstream_recovers_with_propagation(fault: FaultServer, engine: Engine) -> None:
    with httpx.Client(transport=RetryTransport(engine, "openai", idempotency_key="key-9")) as c:
        r = c.post(fault.url("flaky:2:503") + "/chat/completions", json={"model": "m"})
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    rows = fault.requests("flaky:2:503")
    assert [row["attempt"] for row in rows] == [1, 2, 3]
    assert len({row["logical_id"] for row in rows}) == 1 and rows[0]["idempotency_key"] == "key-9"
    assert all(row["deadline_ms"] is not None for row in rows)
