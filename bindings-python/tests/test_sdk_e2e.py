"""End to end with the real openai and anthropic SDKs (their own retries off,
``max_retries=0``) over a retrywise transport, against the local fault server.
Every count below is what the server saw: physical attempts per logical request."""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import retrywise
from retrywise import Engine

from .conftest import FAST, FaultServer

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "hi"}]
MAX_ATTEMPTS = FAST["max_attempts"]


def flavours() -> Iterator[str]:
    yield "httpx"
    try:
        importlib.import_module("httpx2")
    except ImportError:
        return
    yield "httpx2"


def sync_client(engine: Engine, base_url: str, flavour: str = "httpx", **call_kwargs: Any) -> Any:
    hx = importlib.import_module(flavour)
    rw = importlib.import_module(f"retrywise.{flavour}")
    transport = rw.RetryTransport(engine, route="openai", **call_kwargs)
    return openai.OpenAI(base_url=base_url, api_key="test", max_retries=0, http_client=hx.Client(transport=transport))


def async_client(engine: Engine, base_url: str, **call_kwargs: Any) -> Any:
    import httpx
    from retrywise.httpx import AsyncRetryTransport

    transport = AsyncRetryTransport(engine, route="openai", **call_kwargs)
    return openai.AsyncOpenAI(
        base_url=base_url, api_key="test", max_retries=0, http_client=httpx.AsyncClient(transport=transport)
    )


def create(client: Any) -> Any:
    return client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)


# ------------------------------------------------------------------ sync --


@pytest.mark.parametrize("flavour", list(flavours()))
def test_persistent_503_costs_exactly_max_attempts(fault: FaultServer, engine: Engine, flavour: str) -> None:
    with pytest.raises(openai.InternalServerError):
        create(sync_client(engine, fault.url("status:503"), flavour))
    assert fault.count("status:503") == MAX_ATTEMPTS
    rows = fault.requests("status:503")
    assert [r["attempt"] for r in rows] == [1, 2, 3] and len({r["logical_id"] for r in rows}) == 1
    assert all(r["x_stainless_retry_count"] in (None, "0") for r in rows)


@pytest.mark.parametrize(("spec", "error"), [("status:400", "BadRequestError"), ("status:401", "AuthenticationError")])
def test_invalid_and_auth_cost_one(fault: FaultServer, engine: Engine, spec: str, error: str) -> None:
    with pytest.raises(getattr(openai, error)):
        create(sync_client(engine, fault.url(spec)))
    assert fault.count(spec) == 1


def test_insufficient_quota_costs_one(fault: FaultServer, engine: Engine) -> None:
    spec = "status:429:insufficient_quota"
    with pytest.raises(openai.RateLimitError) as e:
        create(sync_client(engine, fault.url(spec)))
    assert e.value.code == "insufficient_quota"
    assert fault.count(spec) == 1 and engine.stats()["stops"] == {"quota_exhausted": 1}


def test_retry_after_beyond_deadline_returns_at_once(fault: FaultServer, engine: Engine) -> None:
    spec = "ra-secs:30"
    t0 = time.monotonic()
    with pytest.raises(openai.RateLimitError):
        create(sync_client(engine, fault.url(spec), deadline_ms=2_000))
    assert time.monotonic() - t0 < 0.5
    assert fault.count(spec) == 1 and engine.stats()["stops"] == {"retry_after_exceeds_deadline": 1}


def test_retry_after_within_deadline_is_honoured(fault: FaultServer, engine: Engine) -> None:
    spec = "ra-ms:300:then-ok"
    t0 = time.monotonic()
    out = create(sync_client(engine, fault.url(spec), deadline_ms=5_000))
    assert out.choices[0].message.role == "assistant"
    assert time.monotonic() - t0 >= 0.3 and fault.count(spec) == 2


def test_dropped_unsafe_request_costs_one_and_must_reconcile(fault: FaultServer, engine: Engine) -> None:
    with pytest.raises(retrywise.ReconcileRequired) as e:
        create(sync_client(engine, fault.url("drop"), idempotency="unsafe", tenant="acme"))
    assert e.value.reason == "effect_unknown" and e.value.error_class == "result_unknown"
    assert fault.count("drop") == 1
    (item,) = engine.reconcile_list()
    assert item["tenant"] == "acme" and item["reason"] == "effect_unknown"


def test_dropped_safe_request_is_retried(fault: FaultServer, engine: Engine) -> None:
    with pytest.raises(openai.APIConnectionError):
        create(sync_client(engine, fault.url("drop")))
    assert fault.count("drop") == MAX_ATTEMPTS


def test_hanging_upstream_ends_with_the_deadline(fault: FaultServer, engine: Engine) -> None:
    """first_byte defaults to half the time left: 1 s, 0.5 s, 0.25 s attempts
    (a hang leaves time for another), all within the deadline."""
    t0 = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        create(sync_client(engine, fault.url("hang"), deadline_ms=2_000))
    elapsed = time.monotonic() - t0
    assert elapsed <= 2.2 and fault.count("hang") == MAX_ATTEMPTS
    assert engine.stats()["stops"] == {"max_attempts": 1}


def test_flaky_upstream_recovers(fault: FaultServer, engine: Engine) -> None:
    out = create(sync_client(engine, fault.url("flaky:2:503")))
    assert out.object == "chat.completion" and fault.count("flaky:2:503") == 3
    assert engine.stats()["retry_successes"] == 1


def test_stream_cut_after_output_is_not_replayed(fault: FaultServer, engine: Engine) -> None:
    client = sync_client(engine, fault.url("sse-cut:3"))
    got: list[str] = []
    with pytest.raises(openai.APIConnectionError) as e:
        for chunk in client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                got.append(chunk.choices[0].delta.content)
    assert isinstance(e.value.__cause__, httpx.RemoteProtocolError)
    assert got and fault.count("sse-cut:3") == 1
    assert engine.stats()["stops"] == {"stream_visible_output": 1}


def test_complete_stream_is_a_success(fault: FaultServer, engine: Engine) -> None:
    client = sync_client(engine, fault.url("ok"))
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        if c.choices
    )
    assert text and engine.stats()["successes"] == 1 and fault.count("ok") == 1


def test_sdk_inside_engine_run_never_multiplies(fault: FaultServer, engine: Engine) -> None:
    """An app-level ``engine.run`` around an SDK that itself uses a retrywise
    transport: the transport is a non-owner, so 3 outer attempts = 3 requests, not 9."""
    client = sync_client(engine, fault.url("status:503"))
    with pytest.raises(retrywise.Stopped) as e:
        engine.run(lambda attempt: create(client), route="app", deadline_ms=10_000)
    assert e.value.reason == "max_attempts" and isinstance(e.value.exception, openai.InternalServerError)
    assert fault.count("status:503") == MAX_ATTEMPTS
    rows = fault.requests("status:503")
    assert len({r["logical_id"] for r in rows}) == 1  # one logical request end to end
    assert [r["attempt"] for r in rows] == [1, 2, 3]  # the owner's attempt numbers reach the upstream


# ----------------------------------------------------------------- async --


@pytest.mark.parametrize(
    ("spec", "error", "count", "kwargs"),
    [
        ("status:503", "InternalServerError", MAX_ATTEMPTS, {}),
        ("status:400", "BadRequestError", 1, {}),
        ("status:401", "AuthenticationError", 1, {}),
        ("status:429:insufficient_quota", "RateLimitError", 1, {}),
        ("ra-secs:30", "RateLimitError", 1, {"deadline_ms": 2_000}),
    ],
)
async def test_async_client(
    fault: FaultServer, engine: Engine, spec: str, error: str, count: int, kwargs: dict[str, Any]
) -> None:
    client = async_client(engine, fault.url(spec), **kwargs)
    t0 = time.monotonic()
    with pytest.raises(getattr(openai, error)):
        await client.chat.completions.create(model="m", messages=MESSAGES)
    assert fault.count(spec) == count
    if spec.startswith("ra-secs"):
        assert time.monotonic() - t0 < 0.5


async def test_async_dropped_unsafe_request_must_reconcile(fault: FaultServer, engine: Engine) -> None:
    client = async_client(engine, fault.url("drop"), idempotency="unsafe")
    with pytest.raises(retrywise.ReconcileRequired):
        await client.chat.completions.create(model="m", messages=MESSAGES)
    assert fault.count("drop") == 1 and len(engine.reconcile_list()) == 1


async def test_async_hanging_upstream_ends_with_the_deadline(fault: FaultServer, engine: Engine) -> None:
    client = async_client(engine, fault.url("hang"), deadline_ms=2_000)
    t0 = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        await client.chat.completions.create(model="m", messages=MESSAGES)
    assert time.monotonic() - t0 <= 2.2 and fault.count("hang") == MAX_ATTEMPTS
    assert engine.stats()["stops"] == {"max_attempts": 1}


async def test_async_stream_ok(fault: FaultServer, engine: Engine) -> None:
    client = async_client(engine, fault.url("ok"))
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text and engine.stats()["successes"] == 1


# ------------------------------------------------------------- anthropic --


def anthropic_flavour() -> str:
    """The httpx flavour the installed anthropic SDK takes for ``http_client``."""
    base = importlib.import_module("anthropic._base_client")
    return "httpx2" if hasattr(base, "httpx2") else "httpx"


def anthropic_client(fault: FaultServer, engine: Engine, spec: str) -> Any:
    """An Anthropic client (own retries off) whose transport is retrywise's, against `spec`."""
    anthropic = importlib.import_module("anthropic")
    flavour = anthropic_flavour()
    hx = importlib.import_module(flavour)
    rw = importlib.import_module(f"retrywise.{flavour}")
    return anthropic.Anthropic(
        base_url=f"{fault.base}/s/{spec}",
        api_key="test",
        max_retries=0,
        http_client=hx.Client(transport=rw.RetryTransport(engine, route="anthropic")),
    )


def test_anthropic_persistent_overload_costs_exactly_max_attempts(fault: FaultServer, engine: Engine) -> None:
    anthropic = pytest.importorskip("anthropic")
    spec = "status:529:overloaded_error"
    client = anthropic_client(fault, engine, spec)
    with pytest.raises(anthropic.APIStatusError) as e:
        client.messages.create(model="claude-x", max_tokens=16, messages=MESSAGES)
    assert e.value.status_code == 529
    assert fault.count(spec) == MAX_ATTEMPTS
    rows = fault.requests(spec)
    assert all(r["api_path"] == "/v1/messages" for r in rows) and [r["attempt"] for r in rows] == [1, 2, 3]
    assert engine.stats()["stops"] == {"max_attempts": 1}


def test_anthropic_stream_cut_after_message_start_is_retried(fault: FaultServer, engine: Engine) -> None:
    """Anthropic opens a stream with message_start and an empty text block: a
    cut right after them delivered no output, so the transport retries and the
    SDK sees only the retry's stream."""
    pytest.importorskip("anthropic")
    spec = "seq:sse-cut:1"
    client = anthropic_client(fault, engine, spec)
    with client.messages.stream(model="claude-x", max_tokens=16, messages=MESSAGES) as stream:
        text = "".join(stream.text_stream)
    assert text == "c1 c2 c3 "
    assert [r["attempt"] for r in fault.requests(spec)] == [1, 2]
    assert engine.stats()["successes"] == 1 and engine.stats()["stops"] == {}


def test_anthropic_auth_error_costs_one(fault: FaultServer, engine: Engine) -> None:
    anthropic = pytest.importorskip("anthropic")
    client = anthropic_client(fault, engine, "status:401")
    with pytest.raises(anthropic.AuthenticationError):
        client.messages.create(model="claude-x", max_tokens=16, messages=MESSAGES)
    assert fault.count("status:401") == 1
