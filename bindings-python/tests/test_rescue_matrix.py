"""The failover matrix end to end: the openai SDK (its own retries off) over
``retrywise.httpx.RetryTransport`` wired as the README shows, plus a fallback
upstream, against the fault server's sixteen fault models (chosen by the
request's ``model``). The transport is given no route: it serves the route the
policy maps the request's model to, and sends each attempt to the upstream the
core chose (URL, model and key rewritten from the catalog).

For each fault: the attempts per model the fault server recorded, an elapsed
bound, and the exact final content (the fallback's answer, or the primary's
answer completed by a continuation spliced into the same stream) or a clean
error naming the provider's reason."""

from __future__ import annotations

import importlib
import time
from typing import Any

import httpx
import pytest
import retrywise
from retrywise import Engine
from retrywise.httpx import AsyncRetryTransport, RetryTransport

from .conftest import FaultServer

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "hi"}]
KEY_ENV = "RETRYWISE_TEST_FAULT_KEY"
DEADLINE_MS = 5_000
#: The transport's silence limits, short so silent faults cost a second, not the deadline.
SILENCE_MS = 1_000


def answer(model: str) -> str:
    """The fault server's deterministic answer of ``model``."""
    return f"answer from {model}: w1 w2 w3 w4 w5 w6"


def policy(base_url: str, primary: str, backup: str = "fb-ok") -> dict[str, Any]:
    """Two upstreams on the fault server (their keys named by env var, never
    written here); the request's model maps to the route that falls back."""
    upstream = {"provider": "fault", "base_url": base_url, "api_key_env": KEY_ENV}
    return {
        "max_attempts": 3,
        "deadline_ms": DEADLINE_MS,
        "backoff": {"base_ms": 10, "cap_ms": 40},
        "timeouts": {"first_byte_ms": SILENCE_MS, "first_token_ms": SILENCE_MS, "idle_ms": SILENCE_MS},
        "upstreams": {
            "primary": {**upstream, "model": primary, "capabilities": ["streaming"], "context_tokens": 128_000},
            "backup": {
                **upstream,
                "provider": "fault-b",
                "model": backup,
                "capabilities": ["streaming", "assistant_prefill"],
                "context_tokens": 1_000_000,
            },
        },
        "models": {primary: "chat"},
        "routes": {"chat": {"candidates": ["primary", "backup"], "stream_recovery": "continue"}},
    }


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-fault-test")


def sdk(engine: Engine, fault: FaultServer) -> Any:
    http = httpx.Client(transport=RetryTransport(engine))
    return openai.OpenAI(base_url=fault.base + "/v1", api_key="sk-caller", max_retries=0, http_client=http)


def async_sdk(engine: Engine, fault: FaultServer) -> Any:
    http = httpx.AsyncClient(transport=AsyncRetryTransport(engine))
    return openai.AsyncOpenAI(base_url=fault.base + "/v1", api_key="sk-caller", max_retries=0, http_client=http)


def call(client: Any, model: str, stream: bool) -> tuple[str, str | None]:
    """(the text the caller read, the model its final usage came from)."""
    if not stream:
        r = client.chat.completions.create(model=model, messages=MESSAGES)
        assert r.usage is not None and r.usage.completion_tokens > 0
        return r.choices[0].message.content, r.model
    parts: list[str] = []
    usage_model = None
    chunks = client.chat.completions.create(
        model=model, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage_model = chunk.model
    return "".join(parts), usage_model


P, B = "primary", "backup"

#: fault model -> (upstreams the fault server saw, in order; who answered; the
#: exact text; a lower elapsed bound in seconds), for a plain (JSON) answer.
JSON_CASES: dict[str, tuple[list[str], str, str, float]] = {
    "fb-429-retry-after": ([P, P], P, "primary", 1.0),  # its 1 s hint honoured, then answered
    "fb-429": ([P, P], P, "primary", 0.0),
    "fb-500-once": ([P, P], P, "primary", 0.0),
    "fb-503": ([P, P, B], B, "backup", 0.0),  # attempts_per_upstream 2, then the fallback
    "fb-reset": ([P, P], P, "primary", 0.0),
    "fb-silent": ([P, B], B, "backup", 0.9),  # silence goes to the fallback at once
    "fb-slow-first-token:ms=3000": ([P, B], B, "backup", 0.9),
    "fb-stream-cut": ([P, P, B], B, "backup", 0.0),  # a body cut in half: not output yet
    "fb-stream-stall": ([P, B], B, "backup", 0.9),
    "fb-malformed-sse": ([P, P, B], B, "backup", 0.0),  # a 2xx that does not parse
    "fb-no-done": ([P], P, "primary", 0.0),
    "fb-context-length": ([P, B], B, "backup", 0.0),  # the larger window, never the primary again
    "fb-ok:id=primary": ([P], P, "primary", 0.0),
}

#: The same for a streamed answer; "primary" text after a cut is the primary's
#: answer completed by the fallback's continuation.
STREAM_CASES: dict[str, tuple[list[str], str, str, float]] = {
    **{k: v for k, v in JSON_CASES.items() if k not in ("fb-stream-cut", "fb-stream-stall", "fb-malformed-sse")},
    "fb-stream-cut": ([P, B], B, "primary", 0.0),  # continued by prefill, spliced
    "fb-stream-cut:end=error": ([P, B], B, "primary", 0.0),  # an error event after output
    "fb-stream-cut:end=close": ([P, B], B, "primary", 0.0),  # a clean end without the finish: a cut
    "fb-stream-cut:k=0": ([P, P, B], B, "backup", 0.0),  # cut before output: retried, then fallback
    "fb-stream-stall": ([P, B], B, "primary", 0.9),  # a stall after output continued elsewhere
    "fb-malformed-sse": ([P], P, "primary", 0.0),  # the bad event skipped: the whole answer
}


def models_of(fault: FaultServer, primary: str, backup: str = "fb-ok") -> list[str]:
    names = {primary: P, backup: B}
    return [names[row["model"]] for row in fault.requests()]


def check(fault: FaultServer, model: str, case: tuple[list[str], str, str, float], stream: bool) -> None:
    seen, answered, text_of, at_least = case
    engine = Engine(policy(fault.base + "/v1", model), seed=5)
    t0 = time.monotonic()
    text, usage_model = call(sdk(engine, fault), model, stream)
    elapsed = time.monotonic() - t0
    assert text == answer(model if text_of == "primary" else "fb-ok")
    assert models_of(fault, model) == seen
    # The caller's usage is the answering upstream's.
    assert usage_model == (model if answered == P else "fb-ok")
    assert at_least <= elapsed < DEADLINE_MS / 1000
    assert engine.stats()["successes"] == 1


@pytest.mark.parametrize("model", list(JSON_CASES))
def test_json_answer_is_rescued(fault: FaultServer, model: str) -> None:
    check(fault, model, JSON_CASES[model], stream=False)


@pytest.mark.parametrize("model", list(STREAM_CASES))
def test_streamed_answer_is_rescued(fault: FaultServer, model: str) -> None:
    check(fault, model, STREAM_CASES[model], stream=True)


@pytest.mark.parametrize("stream", [False, True])
def test_content_filter_is_a_clean_error_naming_the_reason(fault: FaultServer, stream: bool) -> None:
    """A content-filter 400 is the caller's business: one attempt, no fallback,
    the SDK's error naming the provider's reason."""
    engine = Engine(policy(fault.base + "/v1", "fb-content-filter"), seed=5)
    with pytest.raises(openai.BadRequestError) as e:
        call(sdk(engine, fault), "fb-content-filter", stream)
    assert "reason: hate" in str(e.value)
    assert models_of(fault, "fb-content-filter") == [P]


def test_run_content_filter_is_a_clean_stop(fault: FaultServer) -> None:
    engine = Engine(policy(fault.base + "/v1", "fb-content-filter"), seed=5)
    with pytest.raises(retrywise.Stopped) as e:
        engine.run(sdk_attempt, route="chat")
    assert e.value.reason == "invalid_request" and isinstance(e.value.exception, openai.BadRequestError)
    assert "reason: hate" in str(e.value.exception)
    assert models_of(fault, "fb-content-filter") == [P]


def test_a_fallback_that_rejects_prefill_is_asked_by_instruction(fault: FaultServer) -> None:
    """The fallback claims assistant_prefill and rejects it: the core retries it
    at once with a continuation instruction; the caller never sees the 400."""
    engine = Engine(policy(fault.base + "/v1", "fb-stream-cut", backup="fb-no-prefill"), seed=5)
    text, usage_model = call(sdk(engine, fault), "fb-stream-cut", stream=True)
    assert text == answer("fb-stream-cut") and usage_model == "fb-no-prefill"
    rows = fault.requests()
    assert [row["model"] for row in rows] == ["fb-stream-cut", "fb-no-prefill", "fb-no-prefill"]
    assert [(row["continuation"] or {}).get("via") for row in rows] == [None, "prefill", "instruction"]
    assert [row["status"] for row in rows] == [200, 400, 200]
    decided = [(e["action"], e["reason"]) for e in engine.events() if e["kind"] == "decision"]
    assert decided[-2:] == [("retry", "prefill_rejected"), ("succeeded", "success")]


def test_stream_recovery_never_ends_the_stream_with_an_error(fault: FaultServer) -> None:
    """``stream_recovery: never`` (the default): a cut after output is an error
    for the caller, never a truncated success, and is not replayed."""
    p = policy(fault.base + "/v1", "fb-stream-cut")
    del p["routes"]["chat"]["stream_recovery"]
    engine = Engine(p, seed=5)
    with pytest.raises(openai.APIConnectionError):
        call(sdk(engine, fault), "fb-stream-cut", stream=True)
    assert models_of(fault, "fb-stream-cut") == [P]
    assert engine.stats()["stops"] == {"stream_visible_output": 1}


def test_stream_recovery_never_ends_at_an_error_event_with_a_clean_error(fault: FaultServer) -> None:
    """An error event after output is not handed to the SDK mid-answer: the
    caller's stream ends with ``StreamInterrupted`` naming the provider's error
    and what the caller had received."""
    model = "fb-stream-cut:end=error"
    p = policy(fault.base + "/v1", model)
    del p["routes"]["chat"]["stream_recovery"]
    engine = Engine(p, seed=5)
    with pytest.raises(retrywise.StreamInterrupted) as e:
        call(sdk(engine, fault), model, stream=True)
    assert e.value.reason == "stream_visible_output" and e.value.text == f"answer from {model}: w1"
    assert e.value.provider_error is not None and "the stream failed" in e.value.provider_error["message"]
    assert models_of(fault, model) == [P]


def test_unknown_model_is_an_error_before_any_request(fault: FaultServer) -> None:
    engine = Engine(policy(fault.base + "/v1", "fb-ok"), seed=5)
    with pytest.raises(retrywise.PolicyError) as e:
        call(sdk(engine, fault), "gpt-unknown", stream=False)
    assert "gpt-unknown" in str(e.value)
    assert fault.requests() == []


def test_routes_map_and_callable_choose_the_route(fault: FaultServer) -> None:
    """``routes={model: route}`` or ``route=callable`` instead of the policy's ``models``."""
    p = policy(fault.base + "/v1", "fb-503")
    del p["models"]
    engine = Engine(p, seed=5)
    for transport in (RetryTransport(engine, routes={"fb-503": "chat"}), RetryTransport(engine, lambda r: "chat")):
        fault.reset()
        client = openai.OpenAI(
            base_url=fault.base + "/v1", api_key="x", max_retries=0, http_client=httpx.Client(transport=transport)
        )
        assert call(client, "fb-503", stream=False) == (answer("fb-ok"), "fb-ok")
        assert models_of(fault, "fb-503") == [P, P, B]


def test_flapping_primary_is_served_by_the_fallback_and_used_again(fault: FaultServer) -> None:
    """fb-flap down for 1.5 s: every request in the outage is answered (by the
    fallback), and the first request after the primary recovers is the primary's."""
    model = "fb-flap:down=1500"
    p = policy(fault.base + "/v1", model)
    # Four requests a second: a breaker that judges on 4 calls (not 20) opens within the outage.
    p["breaker"] = {"min_calls": 4, "window_size": 10}
    engine = Engine(p, seed=5)
    client = sdk(engine, fault)
    served: list[tuple[float, str]] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < 4.0:
        text, who = call(client, model, stream=False)
        assert text == answer(who or "")
        served.append((time.monotonic() - t0, who or ""))
        time.sleep(0.25)
    rows = fault.requests()
    up_at = rows[0]["at_ms"] + 1500  # the server's clock: the outage ends here
    primary_answers = [r for r in rows if r["model"] == model and r["status"] == 200]
    assert all(r["at_ms"] >= up_at for r in primary_answers)
    assert [who for _, who in served][:2] == ["fb-ok", "fb-ok"] and served[-1][1] == model
    # Back on the primary within the breaker's second open period (1 s x 1.5,
    # +10 % jitter) and one request interval of recovering.
    assert primary_answers and primary_answers[0]["at_ms"] - up_at < 2_000


async def test_async_stream_cut_is_continued(fault: FaultServer) -> None:
    engine = Engine(policy(fault.base + "/v1", "fb-stream-cut"), seed=5)
    client = async_sdk(engine, fault)
    stream = await client.chat.completions.create(model="fb-stream-cut", messages=MESSAGES, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == answer("fb-stream-cut")
    assert models_of(fault, "fb-stream-cut") == [P, B]


async def test_async_silent_primary_falls_back(fault: FaultServer) -> None:
    engine = Engine(policy(fault.base + "/v1", "fb-silent"), seed=5)
    client = async_sdk(engine, fault)
    r = await client.chat.completions.create(model="fb-silent", messages=MESSAGES)
    assert r.choices[0].message.content == answer("fb-ok") and r.model == "fb-ok"
    assert models_of(fault, "fb-silent") == [P, B]


def sdk_attempt(attempt: retrywise.Attempt) -> Any:
    """One attempt of ``engine.run``: the SDK pointed where ``attempt.reach`` says."""
    reach = attempt.reach
    assert reach is not None and reach.api_key == "sk-fault-test"
    t = attempt.timeouts
    client = openai.OpenAI(
        base_url=reach.base_url,
        api_key=reach.api_key,
        max_retries=0,
        timeout=openai.Timeout(t.total, connect=t.connect, read=t.first_byte),
    )
    return client.chat.completions.create(model=reach.model, messages=MESSAGES)


@pytest.mark.parametrize("model", list(JSON_CASES))
def test_run_calls_the_upstream_the_core_chose(fault: FaultServer, model: str) -> None:
    """``engine.run`` over the same matrix: ``attempt.reach`` says where the
    attempt goes (base URL, model, the key read from the variable the catalog
    names); the SDK's exceptions are the outcomes."""
    seen, answered_by, _, at_least = JSON_CASES[model]
    engine = Engine(policy(fault.base + "/v1", model), seed=5)

    t0 = time.monotonic()
    r = engine.run(sdk_attempt, route=engine.route_for_model(model))
    elapsed = time.monotonic() - t0
    answered = model if answered_by == P else "fb-ok"
    assert r.model == answered and r.choices[0].message.content == answer(answered)
    assert models_of(fault, model) == seen
    assert at_least <= elapsed < DEADLINE_MS / 1000


def test_httpx2_flavour_continues_a_cut_stream(fault: FaultServer) -> None:
    hx2 = pytest.importorskip("httpx2")
    rw2 = importlib.import_module("retrywise.httpx2")
    engine = Engine(policy(fault.base + "/v1", "fb-stream-cut"), seed=5)
    body = {"model": "fb-stream-cut", "messages": MESSAGES, "stream": True}
    with (
        hx2.Client(transport=rw2.RetryTransport(engine)) as c,
        c.stream("POST", fault.base + "/v1/chat/completions", json=body) as r,
    ):
        raw = r.read()
    seen = retrywise.Transcript("openai")
    seen.observe(raw)
    assert seen.text == answer("fb-stream-cut") and seen.finished and raw.endswith(b"data: [DONE]\n\n")
    assert models_of(fault, "fb-stream-cut") == [P, B]


@pytest.mark.parametrize(
    ("model", "seen", "text_of"),
    [
        ("fb-stream-cut", [P, B], "primary"),
        ("fb-stream-cut:end=error", [P, B], "primary"),
        ("fb-stream-stall", [P, B], "primary"),
        ("fb-silent", [P, B], "backup"),
        ("fb-503", [P, P, B], "backup"),
        ("fb-malformed-sse", [P], "primary"),
    ],
)
def test_anthropic_messages_stream_is_rescued(fault: FaultServer, model: str, seen: list[str], text_of: str) -> None:
    """The same wiring under the anthropic SDK (httpx2): Anthropic message
    events continued and spliced (content-block indexes continue the caller's)."""
    anthropic = pytest.importorskip("anthropic")
    hx2 = pytest.importorskip("httpx2")
    rw2 = importlib.import_module("retrywise.httpx2")
    engine = Engine(policy(fault.base + "/v1", model), seed=5)
    http = hx2.Client(transport=rw2.RetryTransport(engine))
    client = anthropic.Anthropic(base_url=fault.base, api_key="sk-caller", max_retries=0, http_client=http)
    with client.messages.stream(model=model, max_tokens=100, messages=MESSAGES) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == answer(model if text_of == "primary" else "fb-ok")
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    assert models_of(fault, model) == seen


def test_unset_key_variable_is_a_clean_error(fault: FaultServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog names a variable that is unset: ``WireError`` naming it (never
    a request with the caller's key to the other upstream), the call cancelled."""
    monkeypatch.delenv(KEY_ENV)
    engine = Engine(policy(fault.base + "/v1", "fb-ok"), seed=5)
    with pytest.raises(retrywise.WireError) as e:
        call(sdk(engine, fault), "fb-ok", stream=False)
    assert e.value.code == "env_unset" and KEY_ENV in str(e.value)
    assert fault.requests() == [] and engine.stats()["stops"] == {"cancelled": 1}
