"""What a request needs, read by the core and kept by every fallback.

``retrywise.read_request`` reads a request an SDK built (family, endpoint,
model, needs) on the three wire families; ``Engine.begin(request=, needs=)``
lays the caller's needs over the request's; a route the policy does not know
is a ``PolicyError`` before any I/O. End to end through the real openai SDK
(httpx) and anthropic SDK (httpx2) over the drop-in transports: a primary that
fails and two backups on the fault server, ``plain`` (streaming only, a small
context window) and ``tools`` (tools, structured output, images): a request
never reaches the backup that cannot serve it (the fault server's records say
which upstream each attempt reached), and a streamed success reports its time
to first token."""

from __future__ import annotations

import importlib
import json
import time
import types
from typing import Any, ClassVar, TypeVar

import httpx
import pytest
import retrywise
from retrywise import Engine
from retrywise.httpx import AsyncRetryTransport, RetryTransport
from retrywise.types import ApiName, Needs

from .conftest import FaultServer

openai = pytest.importorskip("openai")

KEY_ENV = "RETRYWISE_TEST_NEEDS_KEY"
CHAT = "https://api.openai.com/v1/chat/completions"
RESPONSES = "https://api.openai.com/v1/responses"
MESSAGES_URL = "https://api.anthropic.com/v1/messages"
PNG = "iVBORw0KGgo="
PRIMARY, PLAIN, TOOLS = "fb-503", "fb-ok:id=plain", "fb-ok:id=tools"
FULL = ["streaming", "tool_calling", "json_schema", "vision"]
E = TypeVar("E", bound=BaseException)


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-needs-test")


# ----------------------------------------------------------- read_request --


def test_read_request_openai_chat() -> None:
    body = {
        "model": "gpt-4o",
        "stream": True,
        "max_tokens": 300,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {}}},
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What city is this?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                ],
            }
        ],
    }
    headers = httpx.Headers({"Authorization": "Bearer sk", "Content-Type": "application/json"})
    f = retrywise.read_request(CHAT, headers, json.dumps(body).encode())
    assert isinstance(f, retrywise.RequestFacts)
    assert (f.family, f.endpoint, f.model) == ("openai", "chat_completions", "gpt-4o")
    needs = f.needs
    assert needs["capabilities"] == ["streaming", "tool_calling", "json_schema", "vision"]
    assert needs["api"] == "openai" and needs["max_output_tokens"] == 300
    assert 0 < needs["input_tokens"] < 20
    assert "gpt-4o" in repr(f) and "chat_completions" in repr(f)


def test_read_request_openai_responses_and_azure() -> None:
    body = b'{"model":"o3","max_output_tokens":1000,"text":{"format":{"type":"json_object"}},"input":"hi"}'
    f = retrywise.read_request(RESPONSES, [("content-type", "application/json")], body)
    assert (f.family, f.endpoint, f.model) == ("openai", "responses", "o3")
    assert f.needs["capabilities"] == ["json_mode"] and f.needs["max_output_tokens"] == 1000
    azure = "https://res.openai.azure.com/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21"
    f = retrywise.read_request(azure, {"api-key": "k"}, b'{"messages":[{"role":"user","content":"abcdefghijkl"}]}')
    assert (f.family, f.endpoint, f.model) == ("azure_openai", "chat_completions", None)
    assert f.needs == {"capabilities": [], "api": "azure_openai", "input_tokens": 4}


def test_read_request_anthropic_messages() -> None:
    body = {
        "model": "claude-sonnet",
        "max_tokens": 1024,
        "stream": True,
        "tools": [{"name": "lookup", "input_schema": {"type": "object"}}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}},
                ],
            }
        ],
    }
    f = retrywise.read_request(MESSAGES_URL, {"x-api-key": "k"}, json.dumps(body))
    assert (f.family, f.endpoint, f.model) == ("anthropic", "messages", "claude-sonnet")
    assert f.needs["capabilities"] == ["streaming", "tool_calling", "vision", "file_input"]
    assert f.needs["api"] == "anthropic" and f.needs["max_output_tokens"] == 1024


@pytest.mark.parametrize(
    "headers",
    [
        {"Anthropic-Version": "2023-06-01"},
        {b"anthropic-version": b"2023-06-01"},
        [("ANTHROPIC-VERSION", "2023-06-01")],
        [(b"x-api-key", b"k")],
        (("X-Api-Key", "k"),),
        types.MappingProxyType({"anthropic-version": "2023-06-01"}),
        httpx.Headers({"Anthropic-Version": "2023-06-01"}),
    ],
    ids=["dict", "dict-bytes", "pairs", "pairs-bytes", "tuple", "mapping", "httpx-headers"],
)
def test_read_request_asks_headers_of_any_shape(headers: Any) -> None:
    """A compatible URL with Anthropic's headers is an Anthropic request, whatever
    holds the headers (names in any case); without them it is OpenAI's."""
    url = "http://127.0.0.1:8080/v1/chat/completions"
    assert retrywise.read_request(url, headers, b"{}").family == "anthropic"
    assert retrywise.read_request(url, {"authorization": "Bearer k"}, b"{}").family == "openai"
    assert retrywise.read_request(url, None, None).family == "openai"


def test_read_request_httpx2_headers() -> None:
    hx2 = pytest.importorskip("httpx2")
    url = "http://127.0.0.1:8080/v1/chat/completions"
    assert retrywise.read_request(url, hx2.Headers({"X-Api-Key": "k"}), b"{}").family == "anthropic"


def test_read_request_bodies_and_arguments() -> None:
    """A body that is not a JSON object gives the family's needs only; a large
    body (read without the GIL) reads as a small one does; wrong arguments are named."""
    assert retrywise.read_request(CHAT, {}, b"not json").needs == {"capabilities": [], "api": "openai"}
    assert retrywise.read_request(CHAT, {}, b"[1, 2]").model is None
    small = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"' + b"x" * 400 + b'"}]}'
    big = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"' + b"x" * 400_000 + b'"}]}'
    for body in (small, bytearray(small), memoryview(small), small.decode()):
        assert retrywise.read_request(CHAT, {}, body).needs["input_tokens"] == 101
    f = retrywise.read_request("http://compat.local/v1/chat/completions", {"x-api-key": "k"}, big)
    assert (f.family, f.model, f.needs["capabilities"]) == ("anthropic", "m", ["streaming"])
    assert f.needs["input_tokens"] == 100_001
    with pytest.raises(TypeError, match="argument 'url'"):
        retrywise.read_request(b"http://x", {}, b"")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="argument 'headers'"):
        retrywise.read_request(CHAT, "x-api-key", b"")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="argument 'body'"):
        retrywise.read_request(CHAT, {}, 12)  # type: ignore[arg-type]


# --------------------------------------------------------- begin(request) --

UNIT_POLICY: dict[str, Any] = {
    "max_attempts": 3,
    "backoff": {"base_ms": 0, "cap_ms": 0},
    "upstreams": {
        "mini": {"api": "openai", "capabilities": ["streaming"], "context_tokens": 1000},
        "gpt": {"api": "openai", "capabilities": ["streaming", "tool_calling", "vision"], "context_tokens": 128_000},
        "claude": {"api": "anthropic", "capabilities": ["streaming", "tool_calling"]},
    },
    "routes": {
        "chat": {"candidates": ["mini", "gpt"], "attempts_per_upstream": 1},
        "claude": {"candidates": ["claude"]},
    },
}


def test_begin_keeps_the_request_needs_and_lays_the_callers_over_them() -> None:
    engine = Engine(UNIT_POLICY, seed=1)
    plain = retrywise.read_request(CHAT, {}, b'{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}')
    assert engine.begin("chat", request=plain).next_attempt().upstream == "mini"
    # The caller's needs add to the request's: vision skips mini.
    call = engine.begin("chat", request=plain, needs={"capabilities": ["vision"]})
    assert call.next_attempt().upstream == "gpt"
    # Its input_tokens win over the body's estimate.
    unset: Any = {"input_tokens": 5_000, "max_cost": None}  # None: not given
    call = engine.begin("chat", request=plain, needs=unset)
    assert call.next_attempt().upstream == "gpt"
    tools = retrywise.read_request(CHAT, {}, b'{"model":"gpt-4o","tools":[{"type":"function"}]}')
    call = engine.begin("chat", request=tools)
    assert call.next_attempt().upstream == "gpt"
    d = call.report(status=503)
    assert d.action == "stop" and d.reason == "no_eligible_upstream"
    assert d.excluded == [("mini", "missing_capability:tool_calling"), ("gpt", "already_tried")]
    # An Anthropic body has no candidate on the all-OpenAI route.
    msg = retrywise.read_request(MESSAGES_URL, {}, b'{"model":"claude","max_tokens":10,"messages":[]}')
    with pytest.raises(retrywise.Stopped) as e:
        engine.begin("chat", request=msg).next_attempt()
    assert e.value.reason == "no_eligible_upstream"
    assert e.value.detail is not None and "mini (api_family:openai!=anthropic)" in e.value.detail
    assert engine.begin("claude", request=msg).next_attempt().upstream == "claude"
    # needs={"api": ...} alone says the same.
    with pytest.raises(retrywise.Stopped):
        engine.begin("chat", needs={"api": "anthropic"}).next_attempt()


@pytest.mark.parametrize(
    ("needs", "exc", "pattern"),
    [
        ({"colour": "red"}, ValueError, r"argument 'needs': unknown field `colour`"),
        ({"api": "gemini"}, ValueError, r"argument 'needs': needs\[\"api\"\]: unknown variant `gemini`"),
        ({"input_tokens": "many"}, TypeError, r"needs\[\"input_tokens\"\]: invalid type"),
        ({"input_tokens": -1}, ValueError, r"needs\[\"input_tokens\"\]"),
        ({"capabilities": "vision"}, TypeError, r"needs\[\"capabilities\"\]"),
        (["vision"], TypeError, "argument 'needs': expected dict, got list"),
    ],
)
def test_bad_needs_name_the_key(needs: Any, exc: type[Exception], pattern: str) -> None:
    with pytest.raises(exc, match=pattern):
        Engine(UNIT_POLICY).begin("chat", needs=needs)


def test_begin_request_must_be_request_facts() -> None:
    with pytest.raises(TypeError, match="argument 'request': expected RequestFacts"):
        Engine(UNIT_POLICY).begin("chat", request={"url": CHAT})  # type: ignore[arg-type]


def test_unknown_route_is_a_policy_error_before_any_attempt() -> None:
    engine = Engine(UNIT_POLICY)
    with pytest.raises(retrywise.PolicyError) as e:
        engine.begin("caht")
    assert e.value.path == "routes.caht" and "known routes: chat, claude" in str(e.value)
    assert engine.stats()["logical_requests"] == 0
    # A catalog upstream named alone is a call to that upstream, no route.
    assert engine.begin("mini").next_attempt().upstream == "mini"
    # engine.run raises it before calling fn.
    with pytest.raises(retrywise.PolicyError, match="known routes"):
        engine.run(lambda a: pytest.fail("no attempt may start"), route="caht")
    # A policy with no routes takes any name.
    assert Engine().begin("openai/gpt-4o").next_attempt().upstream == "openai/gpt-4o"


async def test_run_async_unknown_route() -> None:
    async def fn(attempt: retrywise.Attempt) -> None:
        pytest.fail("no attempt may start")

    with pytest.raises(retrywise.PolicyError, match="known routes"):
        await Engine(UNIT_POLICY).run_async(fn, route="caht")


def test_report_first_token_s() -> None:
    engine = Engine(UNIT_POLICY)
    call = engine.begin("chat")
    call.next_attempt()
    assert call.report(status=200, first_token_s=0.25).action == "succeeded"
    for bad, exc in ((-1.0, ValueError), (float("nan"), ValueError), ("1", TypeError), (True, TypeError)):
        call = engine.begin("chat")
        call.next_attempt()
        with pytest.raises(exc, match="argument 'first_token_s'"):
            call.report(status=200, first_token_s=bad)  # type: ignore[arg-type]


def test_a_route_mixing_wire_families_is_a_policy_error() -> None:
    upstream = {"base_url": "http://127.0.0.1:1/v1", "capabilities": ["streaming"]}
    policy = {
        "upstreams": {"gpt": {**upstream, "api": "openai"}, "claude": {**upstream, "api": "anthropic"}},
        "routes": {"chat": {"candidates": ["gpt", "claude"]}},
    }
    with pytest.raises(retrywise.PolicyError) as e:
        Engine(policy)
    assert e.value.path == "routes.chat.candidates[1]"
    assert "mixes wire families" in str(e.value)


def test_an_unknown_capability_is_a_policy_error() -> None:
    with pytest.raises(retrywise.PolicyError) as e:
        Engine({"upstreams": {"a": {"capabilities": ["streaming", "visoin"]}}})
    assert e.value.path == "upstreams.a.capabilities[1]"
    Engine({"upstreams": {"a": {"capabilities": ["x-eu-only"]}}})


# ----------------------------------------------------------- end to end --


def policy(base: str, api: ApiName, plain_context: int = 100_000) -> dict[str, Any]:
    """A failing primary that can do everything, then ``plain`` (streaming
    only) and ``tools`` (tools, structured output, images), all on the fault
    server; requests for ``gpt-4o`` or ``claude`` take route ``chat``."""
    up = {"provider": "fault", "api": api, "base_url": base + "/v1", "api_key_env": KEY_ENV}
    return {
        "max_attempts": 3,
        "deadline_ms": 5_000,
        "backoff": {"base_ms": 0, "cap_ms": 0},
        "upstreams": {
            "primary": {**up, "model": PRIMARY, "capabilities": FULL, "context_tokens": 128_000},
            "plain": {**up, "model": PLAIN, "capabilities": ["streaming"], "context_tokens": plain_context},
            "tools": {**up, "model": TOOLS, "capabilities": FULL, "context_tokens": 128_000},
        },
        "models": {"gpt-4o": "chat", "claude": "chat"},
        "routes": {"chat": {"candidates": ["primary", "plain", "tools"], "attempts_per_upstream": 1}},
    }


def reached(fault: FaultServer) -> list[str]:
    """The model of every attempt the fault server received, in order."""
    return [row["model"] for row in fault.requests()]


def behind(exc: BaseException, kind: type[E]) -> E:
    """The ``kind`` exception ``exc`` is or was raised from (the anthropic SDK
    wraps what a transport raises in ``APIConnectionError``)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    raise AssertionError(f"no {kind.__name__} behind {exc!r}")


def stopped_in(exc: BaseException) -> retrywise.Stopped:
    return behind(exc, retrywise.Stopped)


def skipped_plain(engine: Engine) -> str:
    """Why the fallback from the primary skipped ``plain`` (the engine's fallback event)."""
    (event,) = [e for e in engine.events() if e["kind"] == "fallback" and e.get("action") == "fallback"]
    assert event["upstream"] == "tools"
    why = dict(event["excluded"])["plain"]
    assert isinstance(why, str)
    return why


#: Why plain cannot serve each request.
WHY = {
    "tools": "missing_capability:tool_calling",
    "json_schema": "missing_capability:json_schema",
    "image": "missing_capability:vision",
    "oversize": "context_too_small:1000<",
}


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object", "properties": {}}}}
IMAGE = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
LONG = "lorem ipsum " * 1_000  # 12 000 characters: about 3 000 tokens, more than plain's 1 000

#: request -> what it adds to the plain request (openai chat completions).
OPENAI_CASES: dict[str, dict[str, Any]] = {
    "tools": {"tools": [TOOL]},
    "json_schema": {"response_format": SCHEMA},
    "image": {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, IMAGE]}]},
    "oversize": {"messages": [{"role": "user", "content": LONG}]},
}


def openai_client(fault: FaultServer, engine: Engine, **transport: Any) -> Any:
    http = httpx.Client(transport=RetryTransport(engine, **transport))
    return openai.OpenAI(base_url=fault.base + "/v1", api_key="sk-caller", max_retries=0, http_client=http)


def openai_create(client: Any, stream: bool, **extra: Any) -> str:
    kwargs: dict[str, Any] = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], **extra}
    if not stream:
        r = client.chat.completions.create(**kwargs)
        return str(r.model)
    models = {chunk.model for chunk in client.chat.completions.create(stream=True, **kwargs)}
    assert len(models) == 1
    return str(models.pop())


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("case", list(OPENAI_CASES))
def test_openai_request_needs_skip_the_backup_that_cannot_serve_them(
    fault: FaultServer, case: str, stream: bool
) -> None:
    engine = Engine(policy(fault.base, "openai", plain_context=1_000), seed=3)
    assert openai_create(openai_client(fault, engine), stream, **OPENAI_CASES[case]) == TOOLS
    assert reached(fault) == [PRIMARY, TOOLS]  # never plain
    assert skipped_plain(engine).startswith(WHY[case])


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_openai_plain_request_takes_the_first_backup(fault: FaultServer, stream: bool) -> None:
    engine = Engine(policy(fault.base, "openai", plain_context=1_000), seed=3)
    assert openai_create(openai_client(fault, engine), stream) == PLAIN
    assert reached(fault) == [PRIMARY, PLAIN]


async def test_async_transport_keeps_the_request_needs(fault: FaultServer) -> None:
    engine = Engine(policy(fault.base, "openai"), seed=3)
    http = httpx.AsyncClient(transport=AsyncRetryTransport(engine))
    client = openai.AsyncOpenAI(base_url=fault.base + "/v1", api_key="sk-caller", max_retries=0, http_client=http)
    r = await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], tools=[TOOL])
    assert r.model == TOOLS and reached(fault) == [PRIMARY, TOOLS]


def test_openai_no_candidate_qualifies(fault: FaultServer) -> None:
    """Audio input: no upstream declares it, so the call stops before any
    request with ``no_eligible_upstream`` and names every skipped candidate."""
    engine = Engine(policy(fault.base, "openai"), seed=3)
    audio = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    with pytest.raises(Exception) as e:
        openai_create(openai_client(fault, engine), False, messages=[{"role": "user", "content": [audio]}])
    stop = stopped_in(e.value)
    assert stop.reason == "no_eligible_upstream"
    assert stop.detail == (
        "candidates skipped: primary (missing_capability:audio), plain (missing_capability:audio), "
        "tools (missing_capability:audio)"
    )
    assert reached(fault) == []


def test_transport_needs_add_to_the_request(fault: FaultServer) -> None:
    """The transport's ``needs=``: a dict for every request, or a function of
    the request (None: nothing to add)."""
    engine = Engine(policy(fault.base, "openai"), seed=3)
    assert openai_create(openai_client(fault, engine, needs={"capabilities": ["vision"]}), False) == TOOLS
    assert reached(fault) == [PRIMARY, TOOLS]

    seen: list[httpx.Request] = []

    def needs_of(request: httpx.Request) -> Needs | None:
        seen.append(request)
        return {"capabilities": ["tool_calling"]} if request.headers.get("x-needs") == "tools" else None

    client = openai_client(fault, engine, needs=needs_of)
    fault.reset()
    assert openai_create(client, False, extra_headers={"x-needs": "tools"}) == TOOLS
    assert openai_create(client, False) == PLAIN
    assert reached(fault) == [PRIMARY, TOOLS, PRIMARY, PLAIN]
    assert len(seen) == 2 and all(isinstance(r, httpx.Request) for r in seen)
    with pytest.raises(TypeError, match="argument 'needs'"):
        RetryTransport(engine, needs=["vision"])  # type: ignore[arg-type]


def test_transport_unknown_route_is_an_error_before_any_request(fault: FaultServer) -> None:
    engine = Engine(policy(fault.base, "openai"), seed=3)
    with pytest.raises(retrywise.PolicyError) as e:
        openai_create(openai_client(fault, engine, route="caht"), False)
    assert "known routes: chat" in str(e.value) and e.value.path == "routes.caht"
    assert reached(fault) == [] and engine.stats()["logical_requests"] == 0


# ---------------------------------------------------------------- anthropic --

ANTHROPIC_IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
ANTHROPIC_CASES: dict[str, dict[str, Any]] = {
    "tools": {"tools": [{"name": "lookup", "input_schema": {"type": "object", "properties": {}}}]},
    "json_schema": {"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
    "image": {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, ANTHROPIC_IMAGE]}]},
    "oversize": {"messages": [{"role": "user", "content": LONG}]},
}


def anthropic_client(fault: FaultServer, engine: Engine, **transport: Any) -> Any:
    anthropic = pytest.importorskip("anthropic")
    hx2 = pytest.importorskip("httpx2")
    rw2 = importlib.import_module("retrywise.httpx2")
    http = hx2.Client(transport=rw2.RetryTransport(engine, **transport))
    return anthropic.Anthropic(base_url=fault.base, api_key="sk-caller", max_retries=0, http_client=http)


def anthropic_create(client: Any, stream: bool, **extra: Any) -> str:
    kwargs: dict[str, Any] = {
        "model": "claude",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
        **extra,
    }
    if not stream:
        return str(client.messages.create(**kwargs).model)
    with client.messages.stream(**kwargs) as s:
        assert "".join(s.text_stream)
        return str(s.get_final_message().model)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("case", list(ANTHROPIC_CASES))
def test_anthropic_request_needs_skip_the_backup_that_cannot_serve_them(
    fault: FaultServer, case: str, stream: bool
) -> None:
    engine = Engine(policy(fault.base, "anthropic", plain_context=1_000), seed=3)
    assert anthropic_create(anthropic_client(fault, engine), stream, **ANTHROPIC_CASES[case]) == TOOLS
    assert reached(fault) == [PRIMARY, TOOLS]
    assert skipped_plain(engine).startswith(WHY[case])
    assert all(row["api_path"] == "/v1/messages" for row in fault.requests())


def test_anthropic_plain_request_and_no_candidate(fault: FaultServer) -> None:
    engine = Engine(policy(fault.base, "anthropic"), seed=3)
    client = anthropic_client(fault, engine)
    assert anthropic_create(client, True) == PLAIN
    assert reached(fault) == [PRIMARY, PLAIN]
    fault.reset()
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}}
    with pytest.raises(Exception) as e:
        anthropic_create(client, False, messages=[{"role": "user", "content": [document]}])
    stop = stopped_in(e.value)
    assert stop.reason == "no_eligible_upstream" and stop.detail is not None
    for name in ("primary", "plain", "tools"):
        assert f"{name} (missing_capability:file_input)" in stop.detail
    assert reached(fault) == []


def test_anthropic_request_on_an_openai_route_reaches_nothing(fault: FaultServer) -> None:
    """The request's wire family is a need: an Anthropic body is never sent to
    upstreams declaring the OpenAI API."""
    engine = Engine(policy(fault.base, "openai"), seed=3)
    with pytest.raises(Exception) as e:
        anthropic_create(anthropic_client(fault, engine), False)
    stop = stopped_in(e.value)
    assert stop.reason == "no_eligible_upstream"
    assert stop.detail is not None and "primary (api_family:openai!=anthropic)" in stop.detail
    assert reached(fault) == []


def test_anthropic_transport_unknown_route(fault: FaultServer) -> None:
    engine = Engine(policy(fault.base, "anthropic"), seed=3)
    with pytest.raises(Exception) as e:
        anthropic_create(anthropic_client(fault, engine, route="claude-chat"), False)
    err = behind(e.value, retrywise.PolicyError)
    assert "known routes: chat" in str(err) and err.path == "routes.claude-chat"
    assert reached(fault) == []


# ------------------------------------------------------- time to first token --


class Recording(Engine):
    """An engine whose calls record every ``report``'s keyword arguments."""

    __slots__ = ()
    reports: ClassVar[list[dict[str, Any]]] = []  # reset by each test

    def begin(self, *args: Any, **kwargs: Any) -> Any:
        return _RecordedCall(super().begin(*args, **kwargs), Recording.reports)


class _RecordedCall:
    def __init__(self, call: retrywise.Call, into: list[dict[str, Any]]) -> None:
        self._call = call
        self._into = into

    def report(self, *args: Any, **kwargs: Any) -> retrywise.Decision:
        self._into.append(kwargs)
        return self._call.report(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


@pytest.mark.parametrize("flavour", ["openai", "anthropic"])
def test_streamed_success_reports_its_time_to_first_token(fault: FaultServer, flavour: str) -> None:
    """The preamble comes at once, the first text 300 ms later: the attempt
    reports its first token after at least 300 ms (the gate held the
    preamble), and a JSON answer reports none."""
    model = "fb-slow-first-token:ms=300"
    up = {"provider": "fault", "api": flavour, "base_url": fault.base + "/v1", "api_key_env": KEY_ENV}
    p = {"upstreams": {"slow": {**up, "model": model}}, "models": {"gpt-4o": "slow", "claude": "slow"}}
    Recording.reports = []
    engine = Recording(p, seed=3)
    t0 = time.monotonic()
    if flavour == "openai":
        openai_create(openai_client(fault, engine), True)
    else:
        anthropic_create(anthropic_client(fault, engine), True)
    elapsed = time.monotonic() - t0
    (only,) = Recording.reports
    first = only["first_token_s"]
    assert isinstance(first, float) and 0.3 <= first <= elapsed
    Recording.reports = []
    if flavour == "openai":
        openai_create(openai_client(fault, engine), False)
    else:
        anthropic_create(anthropic_client(fault, engine), False)
    (only,) = Recording.reports
    assert only.get("first_token_s") is None
