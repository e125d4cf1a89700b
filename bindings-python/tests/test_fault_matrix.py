"""The seed 000 §11 fault matrix end to end: the real openai SDK (its own retries
off) over ``retrywise.httpx.RetryTransport`` against the local fault server.

Every fault is checked on what the fault server recorded, not on what the client
believes: physical attempts (exact where the policy makes them exact), the send
time of every attempt (Retry-After waits measured between arrivals), one logical
request id and one idempotency key on every attempt, the propagated attempt
numbers, no replay after visible stream output, an unsafe call never sent twice
once it may have executed, the stop reason the engine counted, and the whole call
within its deadline + 10 %."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import retrywise
from retrywise import Engine
from retrywise.httpx import AsyncRetryTransport, RetryTransport

from .conftest import FaultServer

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "hi"}]
MAX_ATTEMPTS = 3
#: Short timeouts and jitter: the matrix tests decisions, not patience.
POLICY: dict[str, Any] = {
    "max_attempts": MAX_ATTEMPTS,
    "backoff": {"base_ms": 10, "cap_ms": 40},
    "timeouts": {"first_byte_ms": 300, "idle_ms": 300},
}


@dataclass
class Result:
    """What one logical request cost, from the fault server's point of view."""

    rows: list[dict[str, Any]]
    elapsed_s: float
    error: BaseException | None
    value: Any
    engine: Engine

    @property
    def attempts(self) -> int:
        return len(self.rows)

    def gaps_ms(self) -> list[float]:
        """Time between consecutive arrivals at the fault server (its own clock)."""
        at = [r["at_ms"] for r in self.rows]
        return [b - a for a, b in itertools.pairwise(at)]

    def stops(self) -> dict[str, int]:
        s: dict[str, int] = self.engine.stats()["stops"]
        return s


def make_client(engine: Engine, base_url: str, **call_kwargs: Any) -> Any:
    transport = RetryTransport(engine, route="openai", **call_kwargs)
    http = httpx.Client(transport=transport)
    return openai.OpenAI(base_url=base_url, api_key="test", max_retries=0, http_client=http)


def run(
    fault: FaultServer,
    spec: str,
    *,
    deadline_ms: int = 3_000,
    stream: bool = False,
    policy: dict[str, Any] | None = None,
    base_url: str | None = None,
    messages: list[dict[str, str]] = MESSAGES,
    **call_kwargs: Any,
) -> Result:
    """One chat completion (streamed and consumed when ``stream``) against ``spec``."""
    engine = Engine(policy or POLICY, seed=11)
    client = make_client(engine, base_url or fault.url(spec), deadline_ms=deadline_ms, **call_kwargs)
    t0 = time.monotonic()
    error: BaseException | None = None
    value: Any = None
    try:
        if stream:
            parts = []
            try:
                for chunk in client.chat.completions.create(model="m", messages=messages, stream=True):
                    if chunk.choices and chunk.choices[0].delta.content:
                        parts.append(chunk.choices[0].delta.content)
            finally:
                value = "".join(parts)
        else:
            value = client.chat.completions.create(model="m", messages=messages)
    except Exception as e:
        error = e
    elapsed = time.monotonic() - t0
    return Result(fault.requests(spec), elapsed, error, value, engine)


def check_invariants(r: Result, *, deadline_ms: int, key: str | None = None) -> None:
    """What holds for every fault: one logical request, attempt numbers 1..n in
    order, the key unchanged on every attempt, a shrinking propagated deadline,
    at most max_attempts, and the call over within its deadline + 10 %."""
    assert 1 <= r.attempts <= MAX_ATTEMPTS
    assert len({row["logical_id"] for row in r.rows}) == 1 and r.rows[0]["logical_id"]
    assert [row["attempt"] for row in r.rows] == list(range(1, r.attempts + 1))
    if key is not None:
        assert [row["idempotency_key"] for row in r.rows] == [key] * r.attempts
    deadlines = [row["deadline_ms"] for row in r.rows]
    assert all(0 < d < deadline_ms for d in deadlines) and deadlines == sorted(deadlines, reverse=True)
    assert all(row["x_stainless_retry_count"] in (None, "0") for row in r.rows)  # the SDK never retried
    assert r.elapsed_s <= deadline_ms / 1000 * 1.1, f"{r.elapsed_s:.3f} s for a {deadline_ms} ms deadline"
    stats = r.engine.stats()
    assert stats["logical_requests"] == 1 and stats["attempts"] == r.attempts


# ------------------------------------------------------------ before send --


@pytest.mark.parametrize("idempotency", ["safe", "unsafe"])
def test_connection_refused_is_retried_even_when_unsafe(fault: FaultServer, idempotency: str) -> None:
    """Connection refused: provably never received, so even an unsafe call may
    try again; nothing reaches any server, max_attempts bounds the attempts."""
    port = fault.closed_port()
    before = fault.total()
    r = run(fault, "refused", base_url=f"http://127.0.0.1:{port}/v1", idempotency=idempotency)
    assert isinstance(r.error, openai.APIConnectionError)
    stats = r.engine.stats()
    assert stats["attempts"] == MAX_ATTEMPTS and stats["stops"] == {"max_attempts": 1}
    assert fault.total() == before  # not a byte reached the fault server
    assert r.elapsed_s <= 3.3


# ------------------------------------------------------- sent, no answer --


def test_read_then_drop_keyed_is_retried_with_one_key(fault: FaultServer) -> None:
    """Read-then-drop: the request arrived, the result is unknown. A keyed call
    may repeat it because the key deduplicates: every attempt carries it."""
    r = run(fault, "drop", idempotency="keyed", idempotency_key="order-7")
    assert isinstance(r.error, openai.APIConnectionError)
    assert r.attempts == MAX_ATTEMPTS and r.stops() == {"max_attempts": 1}
    check_invariants(r, deadline_ms=3_000, key="order-7")
    assert all(row["status"] is None for row in r.rows)


#: Larger than the loopback socket buffers: the client is still writing when a
#: write-cut closes the connection.
BIG = [{"role": "user", "content": "x" * (8 << 20)}]


def test_request_write_cut_keyed_is_retried_with_the_same_key(fault: FaultServer) -> None:
    """The connection breaks while the request is uploaded: phase sent (the
    upstream may have started on it), so a keyed call retries with its key."""
    r = run(fault, "write-cut:64", idempotency="keyed", idempotency_key="k-up", messages=BIG)
    assert isinstance(r.error, openai.APIConnectionError)
    assert r.attempts == MAX_ATTEMPTS and r.stops() == {"max_attempts": 1}
    ends = [e for e in r.engine.events() if e["kind"] == "attempt_end"]
    assert [e["phase"] for e in ends] == ["sent"] * MAX_ATTEMPTS
    check_invariants(r, deadline_ms=3_000, key="k-up")


@pytest.mark.parametrize("spec", ["drop", "hang", "status:500", "malformed", "write-cut:64"])
def test_unsafe_call_is_never_sent_twice(fault: FaultServer, spec: str) -> None:
    """Unsafe (side effects, no key): once the upstream may have executed it, one
    attempt and a reconcile item (a malformed 200 was executed, its result unread)."""
    r = run(
        fault, spec, idempotency="unsafe", tenant="acme", messages=BIG if spec.startswith("write-cut") else MESSAGES
    )
    assert r.attempts == 1
    check_invariants(r, deadline_ms=3_000)
    assert isinstance(r.error, retrywise.ReconcileRequired) and r.error.reason == "effect_unknown"
    assert r.stops() == {"effect_unknown": 1}
    (item,) = r.engine.reconcile_list()
    assert item["tenant"] == "acme" and item["attempt"] == 1


def test_first_byte_timeout_costs_exactly_max_attempts(fault: FaultServer) -> None:
    """Accept-then-hang: each attempt ends at first_byte_ms (300 ms), never at the
    SDK's own 600 s timeout; three attempts, each started ≥ 300 ms after the last."""
    r = run(fault, "hang", idempotency="keyed", idempotency_key="k-hang")
    assert isinstance(r.error, openai.APITimeoutError)
    assert r.attempts == MAX_ATTEMPTS and r.stops() == {"max_attempts": 1}
    check_invariants(r, deadline_ms=3_000, key="k-hang")
    assert all(g >= 300 for g in r.gaps_ms()), r.gaps_ms()
    assert r.elapsed_s < 2.0


def test_hang_longer_than_the_deadline_ends_with_it(fault: FaultServer) -> None:
    """A first-byte timeout longer than the deadline: the attempt's timeout is
    clamped to the deadline, so one attempt and the call ends at the deadline."""
    policy = {**POLICY, "timeouts": {"first_byte_ms": 60_000}}
    r = run(fault, "hang", deadline_ms=1_000, policy=policy)
    assert isinstance(r.error, openai.APITimeoutError)
    assert r.attempts == 1 and r.stops() == {"deadline_exceeded": 1}
    check_invariants(r, deadline_ms=1_000)
    assert r.elapsed_s >= 0.9


# ---------------------------------------------------------------- streams --


def test_stream_cut_after_visible_output_is_not_replayed(fault: FaultServer) -> None:
    r = run(fault, "sse-cut:3", stream=True, idempotency="keyed", idempotency_key="k-cut")
    assert isinstance(r.error, openai.APIConnectionError)
    assert r.value == "c1 c2 "  # what the user saw stays what it was
    assert r.attempts == 1 and r.stops() == {"stream_visible_output": 1}
    check_invariants(r, deadline_ms=3_000, key="k-cut")


def test_stream_cut_before_any_byte_is_retried(fault: FaultServer) -> None:
    """A stream that dies right after its headers delivered nothing: phase
    stream_open, retried inside the transport, exactly max_attempts."""
    r = run(fault, "sse-cut:0", stream=True)
    assert isinstance(r.error, openai.APIConnectionError)
    assert r.value == ""
    assert r.attempts == MAX_ATTEMPTS and r.stops() == {"max_attempts": 1}
    check_invariants(r, deadline_ms=3_000)


def test_stream_cut_after_its_preamble_is_retried(fault: FaultServer) -> None:
    """Cut after the role-only first chunk: nothing meaningful reached the
    caller (the gate held it), so phase stream_open, retried, max_attempts."""
    r = run(fault, "sse-cut:1", stream=True)
    assert isinstance(r.error, openai.APIConnectionError)
    assert r.value == ""
    assert r.attempts == MAX_ATTEMPTS and r.stops() == {"max_attempts": 1}
    ends = [e for e in r.engine.events() if e["kind"] == "attempt_end"]
    assert [e["phase"] for e in ends] == ["stream_open"] * MAX_ATTEMPTS
    check_invariants(r, deadline_ms=3_000)


def test_stream_cut_after_its_preamble_then_whole(fault: FaultServer) -> None:
    """The retry's stream is the only one the caller sees: its text, once."""
    r = run(fault, "seq:sse-cut:1", stream=True)
    assert r.error is None
    assert r.value == "c1 c2 c3 "
    assert r.attempts == 2 and r.stops() == {} and r.engine.stats()["successes"] == 1
    check_invariants(r, deadline_ms=3_000)


def test_slow_stream_hits_the_idle_timeout_and_is_not_replayed(fault: FaultServer) -> None:
    """The first text delta, then 1 s pauses with idle_ms 300: the stream times
    out between chunks (not at the deadline) and, output having been
    delivered, is not replayed."""
    r = run(fault, "slow-sse:1000:2", stream=True)
    assert isinstance(r.error, openai.APITimeoutError)
    assert r.value == "c1 "
    assert r.attempts == 1 and r.stops() == {"stream_visible_output": 1}
    check_invariants(r, deadline_ms=3_000)
    assert 0.3 <= r.elapsed_s < 1.0


def test_stream_idle_before_any_output_is_retried(fault: FaultServer) -> None:
    """A 1 s pause right after the preamble: the idle timeout fires before any
    output, so every attempt is stream_open and retried, each ending at idle_ms."""
    r = run(fault, "slow-sse:1000", stream=True)
    assert isinstance(r.error, openai.APITimeoutError)
    assert r.value == ""
    assert r.attempts == MAX_ATTEMPTS and r.stops() == {"max_attempts": 1}
    check_invariants(r, deadline_ms=3_000)
    assert 0.9 <= r.elapsed_s < 2.0


# ------------------------------------------------------------ Retry-After --


@pytest.mark.parametrize(
    ("spec", "hint_ms"),
    [("ra-secs:1:then-ok", 1_000), ("ra-ms:300:then-ok", 300), ("ra-date:2:then-ok", 1_000)],
)
def test_retry_after_is_honoured(fault: FaultServer, spec: str, hint_ms: int) -> None:
    """429 with a valid hint (seconds, retry-after-ms, HTTP-date): the second
    attempt arrives no earlier than the hint after the first (server clock) and
    within the deadline. The HTTP-date has one-second resolution: a 2 s date is
    1-2 s away."""
    r = run(fault, spec, idempotency="keyed", idempotency_key="k-ra")
    assert r.error is None and r.value.object == "chat.completion"
    assert r.attempts == 2
    check_invariants(r, deadline_ms=3_000, key="k-ra")
    (gap,) = r.gaps_ms()
    assert hint_ms <= gap < 3_000, gap
    waits = [e for e in r.engine.events() if e["kind"] == "decision" and e.get("action") == "retry"]
    assert [e["wait_source"] for e in waits] == ["retry_after"]
    if not spec.startswith("ra-date"):
        # The hint plus the additive U(0, retry_after.jitter_ms = 250) default, so
        # clients told the same hint do not all come back in the same millisecond.
        assert hint_ms <= waits[0]["delay_ms"] <= hint_ms + 250
        assert waits[0]["delay_ms"] <= gap


def test_429_without_hint_backs_off_with_jitter(fault: FaultServer) -> None:
    r = run(fault, "status:429")
    assert isinstance(r.error, openai.RateLimitError)
    assert r.attempts == MAX_ATTEMPTS and r.stops() == {"max_attempts": 1}
    check_invariants(r, deadline_ms=3_000)
    waits = [e for e in r.engine.events() if e["kind"] == "decision" and e.get("action") == "retry"]
    assert [e["wait_source"] for e in waits] == ["jitter", "jitter"]
    assert all(e["delay_ms"] <= 40 for e in waits)  # full jitter capped at cap_ms


def test_503_with_hint_waits_the_hint_every_time(fault: FaultServer) -> None:
    r = run(fault, "ra-secs:1:503", idempotency="keyed", idempotency_key="k-503")
    assert isinstance(r.error, openai.InternalServerError)
    assert r.attempts == MAX_ATTEMPTS and r.stops() == {"max_attempts": 1}
    check_invariants(r, deadline_ms=3_000, key="k-503")
    assert all(1_000 <= g < 3_000 for g in r.gaps_ms()), r.gaps_ms()


def test_retry_after_beyond_the_deadline_stops_at_once(fault: FaultServer) -> None:
    r = run(fault, "ra-secs:30", deadline_ms=2_000)
    assert isinstance(r.error, openai.RateLimitError)
    assert r.attempts == 1 and r.stops() == {"retry_after_exceeds_deadline": 1}
    check_invariants(r, deadline_ms=2_000)
    assert r.elapsed_s < 0.5


# --------------------------------------------------------- server answers --


def test_persistent_500_costs_exactly_max_attempts(fault: FaultServer) -> None:
    r = run(fault, "status:500", idempotency="keyed", idempotency_key="k-500")
    assert isinstance(r.error, openai.InternalServerError)
    assert r.attempts == MAX_ATTEMPTS and r.stops() == {"max_attempts": 1}
    check_invariants(r, deadline_ms=3_000, key="k-500")


def test_malformed_json_is_retried_by_the_transport(fault: FaultServer) -> None:
    """A 200 whose JSON body does not parse is no success: malformed_response,
    retried up to max_attempts; the last response reaches the SDK, whose parse
    error reaches the caller."""
    r = run(fault, "malformed")
    assert isinstance(r.error, ValueError)
    assert r.attempts == MAX_ATTEMPTS and r.stops() == {"max_attempts": 1}
    assert r.engine.stats()["successes"] == 0
    ends = [e for e in r.engine.events() if e["kind"] == "attempt_end"]
    assert [e["error_kind"] for e in ends] == ["malformed_response"] * MAX_ATTEMPTS
    check_invariants(r, deadline_ms=3_000)


def test_malformed_json_then_whole(fault: FaultServer) -> None:
    r = run(fault, "seq:malformed")
    assert r.error is None and r.value.choices[0].message.content
    assert r.attempts == 2 and r.engine.stats()["successes"] == 1 and r.stops() == {}
    check_invariants(r, deadline_ms=3_000)


def test_malformed_json_under_an_app_level_owner(fault: FaultServer) -> None:
    """The same fault with ``engine.run`` around the SDK: the parse error is a
    malformed_response for the owner, retried up to max_attempts; the transport
    underneath is a non-owner, so 3 owner attempts are 3 requests, not 9."""
    engine = Engine(POLICY, seed=11)
    client = make_client(engine, fault.url("malformed"))
    t0 = time.monotonic()

    def ask(_: retrywise.Attempt) -> Any:
        return client.chat.completions.create(model="m", messages=MESSAGES)

    with pytest.raises(retrywise.Stopped) as e:
        engine.run(ask, route="app", deadline_ms=3_000)
    assert e.value.reason == "max_attempts" and isinstance(e.value.exception, ValueError)
    rows = fault.requests("malformed")
    assert [row["attempt"] for row in rows] == [1, 2, 3] and len({row["logical_id"] for row in rows}) == 1
    assert time.monotonic() - t0 <= 3.3


# --------------------------------------------------------- queue timeout --


def test_work_that_waited_out_its_deadline_in_a_queue_is_dropped_at_the_door(fault: FaultServer) -> None:
    """A request taken off a queue with 50 ms of its deadline left (below
    min_attempt, 300 ms): no upstream request at all, a stop at once."""
    r = run(fault, "ok", inbound_headers={"retrywise-deadline-ms": "50"})
    # The transport's Stopped reaches the caller through the SDK as it is.
    assert isinstance(r.error, retrywise.Stopped) and r.error.reason == "deadline_exceeded"
    assert r.attempts == 0 and r.elapsed_s < 0.2
    assert r.stops() == {"deadline_exceeded": 1}


# ------------------------------------------------------------------ async --


def async_client(engine: Engine, spec: str, fault: FaultServer) -> Any:
    transport = AsyncRetryTransport(engine, route="openai", deadline_ms=3_000)
    return openai.AsyncOpenAI(
        base_url=fault.url(spec), api_key="test", max_retries=0, http_client=httpx.AsyncClient(transport=transport)
    )


async def test_async_stream_cut_after_its_preamble_then_whole(fault: FaultServer) -> None:
    """The async transport holds the preamble too: the retry's stream, once."""
    engine = Engine(POLICY, seed=11)
    client = async_client(engine, "seq:sse-cut:1", fault)
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "c1 c2 c3 "
    assert [r["attempt"] for r in fault.requests("seq:sse-cut:1")] == [1, 2]
    assert engine.stats()["successes"] == 1 and engine.stats()["stops"] == {}


async def test_async_malformed_json_is_retried(fault: FaultServer) -> None:
    engine = Engine(POLICY, seed=11)
    client = async_client(engine, "seq:malformed", fault)
    r = await client.chat.completions.create(model="m", messages=MESSAGES)
    assert r.choices[0].message.content
    ends = [e for e in engine.events() if e["kind"] == "attempt_end"]
    assert [e.get("error_kind") for e in ends] == ["malformed_response", None]
    assert len(fault.requests("seq:malformed")) == 2 and engine.stats()["successes"] == 1


# ---------------------------------------------------------- cancellation --


async def test_caller_cancellation_stops_at_once(fault: FaultServer) -> None:
    """The caller cancels while the attempt waits for an answer: the attempt is
    reported cancelled, nothing is retried, CancelledError reaches the caller."""
    engine = Engine(POLICY, seed=11)
    transport = AsyncRetryTransport(engine, route="openai", deadline_ms=3_000)
    http = httpx.AsyncClient(transport=transport)
    client = openai.AsyncOpenAI(base_url=fault.url("delay:2000"), api_key="test", max_retries=0, http_client=http)
    task = asyncio.ensure_future(client.chat.completions.create(model="m", messages=MESSAGES))
    t0 = time.monotonic()
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - t0 < 0.6
    await asyncio.sleep(0.1)
    assert len(fault.requests("delay:2000")) == 1
    stats = engine.stats()
    assert stats["attempts"] == 1 and stats["stops"] == {"cancelled": 1} and stats["successes"] == 0


# --------------------------------------------------------------- combined --


def test_429_then_hang_then_stream_cut_under_one_deadline(fault: FaultServer) -> None:
    """One call meets a 429 with a 1 s hint, then a hang (first-byte timeout),
    then a stream cut after visible output: three attempts (= max_attempts), the
    hint honoured between the first two, the output not replayed, one key, and
    the whole story inside the 4 s deadline."""
    spec = "seq:ra-secs:1,hang,sse-cut:2"
    r = run(fault, spec, deadline_ms=4_000, stream=True, idempotency="keyed", idempotency_key="k-seq")
    assert isinstance(r.error, openai.APIConnectionError)
    assert r.value == "c1 "
    assert [row["status"] for row in r.rows] == [429, None, 200]
    assert r.attempts == MAX_ATTEMPTS and r.stops() == {"stream_visible_output": 1}
    check_invariants(r, deadline_ms=4_000, key="k-seq")
    first, second = r.gaps_ms()
    assert 1_000 <= first < 4_000 and second >= 300


def test_combined_faults_stop_at_max_attempts_before_the_stream(fault: FaultServer) -> None:
    """The same story with max_attempts 2: the hang is the last attempt."""
    spec = "seq:ra-ms:200,hang,sse-cut:2"
    policy = {**POLICY, "max_attempts": 2}
    r = run(fault, spec, deadline_ms=4_000, stream=True, policy=policy)
    assert isinstance(r.error, openai.APITimeoutError)
    assert [row["status"] for row in r.rows] == [429, None]
    assert r.stops() == {"max_attempts": 1}
    check_invariants(r, deadline_ms=4_000)
