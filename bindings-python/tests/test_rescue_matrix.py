"""The failover matrix end to end: the sixteen faults of the public Failover
Bench methodology against the fault server's fault models (chosen by the
request's ``model``), through the README's wiring: a primary and a backup
upstream on the fault server, 3 attempts, a catalog declaring
``context_tokens`` and complete ``capabilities`` lists, ``stream_recovery:
continue``, each key named by an environment variable. Six paths:

- ``openai-json`` / ``openai-stream``: the openai SDK (its own retries off)
  over ``retrywise.httpx.RetryTransport``, given no route: it serves the route
  the policy maps the request's model to, and sends each attempt to the
  upstream the core chose (URL, model and key rewritten from the catalog);
- ``anthropic-json`` / ``anthropic-stream``: the anthropic SDK over
  ``retrywise.httpx2.RetryTransport`` on ``/v1/messages`` (the fault server
  answers in Anthropic's shapes there);
- ``run``: ``engine.run`` with the openai SDK called per attempt where
  ``attempt.reach`` says, with the limits ``attempt.timeouts`` gives (the
  default silence rule: half the time left);
- ``run-limits-at-deadline``: the same with a caller-set per-attempt limit as
  long as the deadline (``timeouts: {first_byte_ms, first_token_ms}`` = the
  deadline): the fallback must still get its time.

For each fault and path: the attempts per upstream the fault server
recorded, in order; an elapsed bound; the exact final text (the fallback's
answer, or the primary's completed by a continuation spliced into the same
stream) and who answered, or a clean error naming the provider's reason (the
content filter). ``test_scoreboard_counts_sixteen_rescued_faults`` counts
each path's rescued faults from those tests (running any it did not see).
"""

from __future__ import annotations

import importlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import httpx
import pytest
import retrywise
from retrywise import Engine
from retrywise.httpx import AsyncRetryTransport, RetryTransport

from .conftest import FaultServer, openai_client_for

openai = pytest.importorskip("openai")


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


# Imported here, not inside a timed call: a first import takes a second or more.
anthropic = _optional("anthropic")
hx2 = _optional("httpx2")
rw2 = None if hx2 is None else importlib.import_module("retrywise.httpx2")

MESSAGES = [{"role": "user", "content": "hi"}]
KEY_ENV = "RETRYWISE_TEST_FAULT_KEY"
DEADLINE_MS = 5_000
#: The transport's silence limits, short so silent faults cost a second, not the deadline.
SILENCE_MS = 1_000
#: ``engine.run``'s deadline: under the default rule (half the time left) a
#: silent primary costs about a second.
RUN_DEADLINE_MS = 2_000
#: The backup's answer: ``answer from fb-ok: w1 … w6`` is 9 words of usage.
BACKUP_OUTPUT_TOKENS = 9


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


def run_policy(base_url: str, primary: str, backup: str = "fb-ok") -> dict[str, Any]:
    """``policy`` for ``engine.run``: a 2 s deadline and the default silence rule."""
    p = policy(base_url, primary, backup)
    p["deadline_ms"] = RUN_DEADLINE_MS
    del p["timeouts"]
    return p


def limits_at_deadline_policy(base_url: str, primary: str, backup: str = "fb-ok") -> dict[str, Any]:
    """``run_policy`` with the caller's per-attempt silence limits as long as the deadline."""
    p = run_policy(base_url, primary, backup)
    p["timeouts"] = {"first_byte_ms": RUN_DEADLINE_MS, "first_token_ms": RUN_DEADLINE_MS}
    return p


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-fault-test")


def sdk(engine: Engine, fault: FaultServer) -> Any:
    http = httpx.Client(transport=RetryTransport(engine))
    return openai.OpenAI(base_url=fault.base + "/v1", api_key="sk-caller", max_retries=0, http_client=http)


def async_sdk(engine: Engine, fault: FaultServer) -> Any:
    http = httpx.AsyncClient(transport=AsyncRetryTransport(engine))
    return openai.AsyncOpenAI(base_url=fault.base + "/v1", api_key="sk-caller", max_retries=0, http_client=http)


class Reply(NamedTuple):
    """What the caller got: the text it read, the model the response names
    (a chat stream: its usage chunk's), and the output tokens of its usage."""

    text: str
    model: str | None
    tokens: int | None


def ask(client: Any, model: str, stream: bool) -> Reply:
    """One chat completion through the openai SDK ``client``."""
    if not stream:
        r = client.chat.completions.create(model=model, messages=MESSAGES)
        assert r.usage is not None and r.usage.completion_tokens > 0
        return Reply(r.choices[0].message.content, r.model, r.usage.completion_tokens)
    parts: list[str] = []
    usage_model, tokens = None, None
    chunks = client.chat.completions.create(
        model=model, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage_model, tokens = chunk.model, chunk.usage.completion_tokens
    return Reply("".join(parts), usage_model, tokens)


def call(client: Any, model: str, stream: bool) -> tuple[str, str | None]:
    """(the text the caller read, the model its final usage came from)."""
    reply = ask(client, model, stream)
    return reply.text, reply.model


def ask_openai(engine: Engine, fault: FaultServer, model: str, stream: bool) -> Reply:
    return ask(sdk(engine, fault), model, stream)


def ask_anthropic(engine: Engine, fault: FaultServer, model: str, stream: bool) -> Reply:
    """One message through the anthropic SDK over the httpx2 transport."""
    if anthropic is None or rw2 is None:
        pytest.skip("the anthropic SDK and httpx2 are not installed")
    http = hx2.Client(transport=rw2.RetryTransport(engine))
    client = anthropic.Anthropic(base_url=fault.base, api_key="sk-caller", max_retries=0, http_client=http)
    if not stream:
        r = client.messages.create(model=model, max_tokens=100, messages=MESSAGES)
        assert r.stop_reason == "end_turn"
        return Reply("".join(b.text for b in r.content if b.type == "text"), r.model, r.usage.output_tokens)
    with client.messages.stream(model=model, max_tokens=100, messages=MESSAGES) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert final.stop_reason == "end_turn"
    return Reply(text, final.model, final.usage.output_tokens)


def sdk_attempt(attempt: retrywise.Attempt) -> Any:
    """One attempt of ``engine.run``: the SDK pointed where ``attempt.reach`` says."""
    reach = attempt.reach
    assert reach is not None and reach.api_key == "sk-fault-test"
    return openai_client_for(attempt).chat.completions.create(model=reach.model, messages=MESSAGES)


def ask_run(engine: Engine, fault: FaultServer, model: str, stream: bool) -> Reply:
    assert not stream
    r = engine.run(sdk_attempt, route=engine.route_for_model(model))
    return Reply(r.choices[0].message.content, r.model, r.usage.completion_tokens)


def openai_refusal(exc: BaseException) -> str:
    """The provider's words in the error the caller got from the openai SDK."""
    assert isinstance(exc, openai.BadRequestError), repr(exc)
    return str(exc)


def anthropic_refusal(exc: BaseException) -> str:
    assert isinstance(exc, anthropic.BadRequestError), repr(exc)
    return str(exc)


def run_refusal(exc: BaseException) -> str:
    """``engine.run``'s clean stop, carrying the SDK's error."""
    assert isinstance(exc, retrywise.Stopped), repr(exc)
    assert exc.reason == "invalid_request" and isinstance(exc.exception, openai.BadRequestError)
    return str(exc.exception)


P, B = "primary", "backup"


class Case(NamedTuple):
    """A fault's expected rescue: the upstreams the fault server saw, in order;
    who answered; whose answer the text is (the primary's when a continuation
    completed it); a lower elapsed bound in seconds."""

    seen: list[str]
    answered: str
    text_of: str
    at_least: float


#: The sixteen faults of the Failover Bench methodology, in its order.
FAULTS = (
    "429-retry-after",  # 429 with Retry-After: its 1 s hint honoured, then answered
    "429",  # 429 without Retry-After
    "500-once",
    "503",  # 503 persistent: attempts_per_upstream 2, then the fallback
    "reset",  # reset before headers
    "silent",  # silent upstream: left for the fallback at its silence limit
    "slow-first-token",
    "stream-cut",
    "stream-stall",
    "malformed-sse",
    "no-done",  # no [DONE] / message_stop after the finish
    "context-length",  # the larger window, never the primary again
    "content-filter",  # a clean error naming the provider's reason: the caller's business
    "no-prefill",  # a fallback that rejects the prefill continuing a cut stream
    "flap",  # a primary that flaps: the fallback serves, the primary is used again
    "accounting",  # the fallback's answer, usage and the engine's counts
)

#: How long the flapping primary is down, from its first request.
FLAP_DOWN_MS = 800
#: Each fault's primary model on the fault server (the backup is ``fb-ok``, or
#: ``fb-no-prefill`` for ``no-prefill``).
PRIMARY = {
    **{f: f"fb-{f}" for f in FAULTS},
    "slow-first-token": "fb-slow-first-token:ms=3000",
    "no-prefill": "fb-stream-cut",
    "flap": f"fb-flap:down={FLAP_DOWN_MS}",
    "accounting": "fb-503",
}


def backup_of(fid: str) -> str:
    return "fb-no-prefill" if fid == "no-prefill" else "fb-ok"


#: A plain (JSON) answer: a body broken before its end is not output yet.
JSON_CASES: dict[str, Case] = {
    "429-retry-after": Case([P, P], P, P, 1.0),
    "429": Case([P, P], P, P, 0.0),
    "500-once": Case([P, P], P, P, 0.0),
    "503": Case([P, P, B], B, B, 0.0),
    "reset": Case([P, P], P, P, 0.0),
    "silent": Case([P, B], B, B, 0.9),
    "slow-first-token": Case([P, B], B, B, 0.9),
    "stream-cut": Case([P, P, B], B, B, 0.0),  # a body cut in half: retried, then the fallback
    "stream-stall": Case([P, B], B, B, 0.9),
    "malformed-sse": Case([P, P, B], B, B, 0.0),  # a 2xx that does not parse
    "no-done": Case([P], P, P, 0.0),
    "context-length": Case([P, B], B, B, 0.0),
    # No answer was partly shown, so nothing is continued: the fallback gets
    # the request itself (no prefill to reject) and answers it whole.
    "no-prefill": Case([P, P, B], B, B, 0.0),
    "accounting": Case([P, P, B], B, B, 0.0),
}

#: A streamed answer: a cut or a stall after output is continued by the
#: fallback inside the caller's stream.
STREAM_CASES: dict[str, Case] = {
    **JSON_CASES,
    "stream-cut": Case([P, B], B, P, 0.0),  # continued by prefill, spliced
    "stream-stall": Case([P, B], B, P, 0.9),  # a stall after output continued elsewhere
    "malformed-sse": Case([P], P, P, 0.0),  # the bad event skipped: the whole answer
    "no-prefill": Case([P, B, B], B, P, 0.0),  # prefill refused, asked again by instruction
}

#: ``engine.run`` with the caller's limits at the deadline: capped by the core
#: at the deadline minus ``min_attempt_ms`` (300), so a silent primary is left at 1.7 s.
LIMITS_AT_DEADLINE_CASES: dict[str, Case] = {
    **JSON_CASES,
    "silent": Case([P, B], B, B, 1.6),
    "slow-first-token": Case([P, B], B, B, 1.6),  # 3 s: past the capped limit too
    "stream-stall": Case([P, B], B, B, 1.6),
}


@dataclass(frozen=True)
class Path:
    """One way a caller reaches the upstreams."""

    ask: Callable[[Engine, FaultServer, str, bool], Reply]
    stream: bool
    policy: Callable[..., dict[str, Any]]
    cases: dict[str, Case]
    refusal: Callable[[BaseException], str]
    deadline_ms: int = DEADLINE_MS
    #: The API every attempt reached (the fault server answers in its shapes).
    api_path: str = "/v1/chat/completions"
    #: The response names the model that opened the stream, not the one whose
    #: usage ended it (the anthropic SDK's final message: ``message_start``'s model).
    names_opener: bool = False
    #: The caller's silence limits reach the deadline: the core caps them.
    limits_capped: bool = False


PATHS: dict[str, Path] = {
    "openai-json": Path(ask_openai, False, policy, JSON_CASES, openai_refusal),
    "openai-stream": Path(ask_openai, True, policy, STREAM_CASES, openai_refusal),
    "anthropic-json": Path(ask_anthropic, False, policy, JSON_CASES, anthropic_refusal, api_path="/v1/messages"),
    "anthropic-stream": Path(
        ask_anthropic, True, policy, STREAM_CASES, anthropic_refusal, api_path="/v1/messages", names_opener=True
    ),
    "run": Path(ask_run, False, run_policy, JSON_CASES, run_refusal, RUN_DEADLINE_MS),
    "run-limits-at-deadline": Path(
        ask_run,
        False,
        limits_at_deadline_policy,
        LIMITS_AT_DEADLINE_CASES,
        run_refusal,
        RUN_DEADLINE_MS,
        limits_capped=True,
    ),
}


def models_of(fault: FaultServer, primary: str, backup: str = "fb-ok") -> list[str]:
    names = {primary: P, backup: B}
    return [names[row["model"]] for row in fault.requests()]


def decisions(engine: Engine) -> list[tuple[str, str]]:
    return [(e["action"], e["reason"]) for e in engine.events() if e["kind"] == "decision"]


def rescue(path_name: str, fault: FaultServer, fid: str) -> None:
    """Runs fault ``fid`` through ``path_name`` and checks the rescue exactly."""
    path = PATHS[path_name]
    if fid == "content-filter":
        return refused_cleanly(path, fault)
    if fid == "flap":
        return flap(path, fault)
    case = path.cases[fid]
    primary, backup = PRIMARY[fid], backup_of(fid)
    engine = Engine(path.policy(fault.base + "/v1", primary, backup), seed=5)
    t0 = time.monotonic()
    reply = path.ask(engine, fault, primary, path.stream)
    elapsed = time.monotonic() - t0
    name = {P: primary, B: backup}
    assert reply.text == answer(name[case.text_of])
    assert models_of(fault, primary, backup) == case.seen
    assert {r["api_path"] for r in fault.requests()} == {path.api_path}
    # The response names the upstream that answered, with its usage.
    assert reply.model == name[case.text_of if path.names_opener else case.answered]
    assert reply.tokens is not None and reply.tokens > 0
    assert case.at_least <= elapsed < path.deadline_ms / 1000
    stats = engine.stats()
    assert stats["successes"] == 1 and stats["stops"] == {}
    if path.limits_capped and fid in SILENT_FAULTS:
        # The decision on the silent failure says why the primary had less than the caller's limit.
        (left,) = [e for e in engine.events() if e["kind"] == "fallback" and e.get("action") == "fallback"]
        said = re.fullmatch(
            r"silence limits capped at (\d+) ms \(first byte \d+ ms, first token \d+ ms\): "
            r"300 ms \(min_attempt_ms\) and 100 ms stay for backup",
            left["detail"],
        )
        assert said is not None, left["detail"]
        # The time left when it began, less 300 and the 100 ms a late timer may take.
        assert RUN_DEADLINE_MS - 500 < int(said[1]) <= RUN_DEADLINE_MS - 400
    if fid == "no-prefill":
        rows = fault.requests()
        if path.stream:
            # The fallback claims assistant_prefill and rejects it: the core
            # retries it at once with a continuation instruction; the caller
            # never sees the 400.
            assert [(r["continuation"] or {}).get("via") for r in rows] == [None, "prefill", "instruction"]
            assert [r["status"] for r in rows] == [200, 400, 200]
            assert decisions(engine)[-2:] == [("retry", "prefill_rejected"), ("succeeded", "success")]
        else:
            assert [r["continuation"] for r in rows] == [None, None, None]
    if fid == "accounting":
        # The fallback's answer names it and carries its usage; the engine
        # counts one logical request, three attempts, one fallback.
        assert reply.tokens == BACKUP_OUTPUT_TOKENS
        counted = {k: stats[k] for k in ("logical_requests", "attempts", "retries", "fallbacks", "successes")}
        assert counted == {"logical_requests": 1, "attempts": 3, "retries": 2, "fallbacks": 1, "successes": 1}
        assert stats["amplification"] == 3.0
        per = {u: (s["attempts"], s["fallbacks"], s["successes"]) for u, s in stats["per_upstream"].items()}
        assert per == {"primary": (2, 1, 0), "backup": (1, 0, 1)}
    return None


def refused_cleanly(path: Path, fault: FaultServer) -> None:
    """A content-filter 400 is the caller's business: one attempt, no
    fallback, a clean error naming the provider's reason."""
    model = PRIMARY["content-filter"]
    engine = Engine(path.policy(fault.base + "/v1", model), seed=5)
    with pytest.raises(Exception) as e:
        path.ask(engine, fault, model, path.stream)
    assert "reason: hate" in path.refusal(e.value)
    assert models_of(fault, model) == [P]
    stats = engine.stats()
    assert (stats["attempts"], stats["fallbacks"], stats["stops"]) == (1, 0, {"invalid_request": 1})


#: The flapping primary's scenario: down for 0.8 s; a request every 0.15 s
#: until the primary answers again (at most 3 s).
FLAP_EVERY_S = 0.15
FLAP_FOR_S = 3.0


def flap(path: Path, fault: FaultServer) -> None:
    """The primary answers 503 for 0.8 s from its first request: every request
    in the outage is answered (by the fallback); once it is back, a probe after
    the breaker's first open period (1 s ± 10 %) puts it back in use. A breaker
    that judges on 4 calls (not 20) opens within the outage."""
    model = PRIMARY["flap"]
    p = path.policy(fault.base + "/v1", model)
    p["breaker"] = {"min_calls": 4, "window_size": 10}
    engine = Engine(p, seed=5)
    served: list[str | None] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < FLAP_FOR_S and (len(served) < 3 or served[-1] != model):
        reply = path.ask(engine, fault, model, path.stream)
        assert reply.text == answer(reply.model or "")
        served.append(reply.model)
        time.sleep(FLAP_EVERY_S)
    rows = fault.requests()
    up_at = rows[0]["at_ms"] + FLAP_DOWN_MS  # the server's clock: the outage ends here
    primary_answers = [r for r in rows if r["model"] == model and r["status"] == 200]
    assert all(r["at_ms"] >= up_at for r in primary_answers)
    assert served[:2] == ["fb-ok", "fb-ok"] and served[-1] == model, served
    assert engine.stats()["breaker_opens"] >= 1
    # Back on the primary after the breaker's first open period (1.1 s at
    # most from its trip, on the second request) and a request interval.
    assert primary_answers and primary_answers[0]["at_ms"] - up_at < 1_500


#: path -> fault -> rescued, as the tests below found (the scoreboard runs any
#: fault its path's test did not run in this session).
SCORE: dict[str, dict[str, bool]] = {name: {} for name in PATHS}


#: The faults whose primary stays silent: their silence limits are what a cap moves.
SILENT_FAULTS = ("silent", "slow-first-token", "stream-stall")


def scored(path_name: str, fault: FaultServer, fid: str) -> None:
    try:
        rescue(path_name, fault, fid)
    except Exception:
        SCORE[path_name][fid] = False
        raise
    SCORE[path_name][fid] = True


@pytest.mark.parametrize("fid", FAULTS)
def test_json_answer_is_rescued(fault: FaultServer, fid: str) -> None:
    scored("openai-json", fault, fid)


@pytest.mark.parametrize("fid", FAULTS)
def test_streamed_answer_is_rescued(fault: FaultServer, fid: str) -> None:
    scored("openai-stream", fault, fid)


@pytest.mark.parametrize("fid", FAULTS)
def test_anthropic_messages_json_is_rescued(fault: FaultServer, fid: str) -> None:
    scored("anthropic-json", fault, fid)


@pytest.mark.parametrize("fid", FAULTS)
def test_anthropic_messages_stream_is_rescued(fault: FaultServer, fid: str) -> None:
    """Anthropic message events continued and spliced (content-block indexes
    continue the caller's)."""
    scored("anthropic-stream", fault, fid)


@pytest.mark.parametrize("fid", FAULTS)
def test_run_calls_the_upstream_the_core_chose(fault: FaultServer, fid: str) -> None:
    """``engine.run``: ``attempt.reach`` says where the attempt goes (base URL,
    model, the key read from the variable the catalog names); the SDK's
    exceptions are the outcomes; silence is left at half the time left."""
    scored("run", fault, fid)


@pytest.mark.parametrize("fid", FAULTS)
def test_run_with_limits_at_the_deadline_leaves_the_fallback_its_time(fault: FaultServer, fid: str) -> None:
    """The caller sets per-attempt silence limits as long as the deadline; the
    core ends them ``min_attempt_ms`` (and 100 ms for a late timer) before it
    while the route has a candidate left, so a silent primary still leaves the
    backup an attempt."""
    scored("run-limits-at-deadline", fault, fid)


@pytest.mark.parametrize(
    "path_name",
    PATHS,
)
def test_scoreboard_counts_sixteen_rescued_faults(fault: FaultServer, path_name: str) -> None:
    """Each path rescues all sixteen faults (the content filter as a clean
    error naming the provider's reason)."""
    board = SCORE[path_name]
    for fid in FAULTS:
        if fid not in board:
            fault.reset()
            try:
                scored(path_name, fault, fid)
            except Exception as e:
                print(f"{path_name} {fid}: {e!r}")
    rescued = [fid for fid in FAULTS if board[fid]]
    print(f"{path_name}: {len(rescued)}/{len(FAULTS)} rescued")
    assert len(FAULTS) == 16
    assert len(rescued) == 16, f"{path_name}: not rescued: {[f for f in FAULTS if not board[f]]}"


# ------------------------------------------------------------ variations --


def test_healthy_primary_answers_alone(fault: FaultServer) -> None:
    engine = Engine(policy(fault.base + "/v1", "fb-ok:id=primary"), seed=5)
    for stream in (False, True):
        fault.reset()
        assert call(sdk(engine, fault), "fb-ok:id=primary", stream) == (answer("fb-ok:id=primary"), "fb-ok:id=primary")
        assert models_of(fault, "fb-ok:id=primary") == [P]


#: Other ways a stream breaks: model -> (upstreams seen, whose answer the text is).
STREAM_VARIANTS: dict[str, tuple[list[str], str]] = {
    "fb-stream-cut:end=error": ([P, B], P),  # an error event after output
    "fb-stream-cut:end=close": ([P, B], P),  # a clean end without the finish: a cut
    "fb-stream-cut:k=0": ([P, P, B], B),  # cut before output: retried, then fallback
}


@pytest.mark.parametrize("model", list(STREAM_VARIANTS))
@pytest.mark.parametrize("how", ["openai", "anthropic"])
def test_streamed_variant_is_rescued(fault: FaultServer, model: str, how: str) -> None:
    seen, text_of = STREAM_VARIANTS[model]
    engine = Engine(policy(fault.base + "/v1", model), seed=5)
    reply = (ask_openai if how == "openai" else ask_anthropic)(engine, fault, model, True)
    assert reply.text == answer(model if text_of == P else "fb-ok")
    assert models_of(fault, model) == seen
    assert engine.stats()["successes"] == 1


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


def test_httpx2_flavour_continues_a_cut_stream(fault: FaultServer) -> None:
    if rw2 is None:
        pytest.skip("httpx2 is not installed")
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


def test_unset_key_variable_is_a_clean_error(fault: FaultServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog names a variable that is unset: ``WireError`` naming it (never
    a request with the caller's key to the other upstream), the call cancelled."""
    monkeypatch.delenv(KEY_ENV)
    engine = Engine(policy(fault.base + "/v1", "fb-ok"), seed=5)
    with pytest.raises(retrywise.WireError) as e:
        call(sdk(engine, fault), "fb-ok", stream=False)
    assert e.value.code == "env_unset" and KEY_ENV in str(e.value)
    assert fault.requests() == [] and engine.stats()["stops"] == {"cancelled": 1}


# -------------------------------------------------- a learned first-token limit --

LEARN_DEADLINE_MS = 30_000
LEARN_SAMPLES = 20  # timeouts.learn.min_samples


def test_learned_first_token_limit_leaves_a_slow_primary_after_about_the_floor(fault: FaultServer) -> None:
    """The README's wiring with no silence limits of its own (deadline 30 s,
    ``timeouts.learn`` at its defaults): a cold primary is given half the time
    left (15 s) for its first token; after 20 streamed successes that each
    reported a first token within milliseconds, the engine has learned its
    limit (the 0.99 quantile x 3, at least the 1 s floor), so a primary whose
    first token comes after 20 s is left for the backup after about 1 s."""
    model = f"fb-slow-first-token:after={LEARN_SAMPLES}:ms=20000"
    p = policy(fault.base + "/v1", model)
    p["deadline_ms"] = LEARN_DEADLINE_MS
    del p["timeouts"], p["backoff"]
    engine = Engine(p, seed=5)

    def limits() -> retrywise.Timeouts:
        """A streamed request's first attempt's limits (the call then cancelled)."""
        c = engine.begin("chat", needs={"capabilities": ["streaming"]})
        t = c.next_attempt().timeouts
        c.cancel()
        return t

    cold = limits()
    assert 14.5 < cold.first_byte <= 15.0 and 14.5 < cold.first_token <= 15.0  # half the time left
    client = sdk(engine, fault)
    for _ in range(LEARN_SAMPLES):
        assert call(client, model, stream=True) == (answer(model), model)
    learned = engine.stats()["first_token"]["primary"]
    assert learned["samples"] == LEARN_SAMPLES
    assert learned["quantile_ms"] is not None and learned["quantile_ms"] < 300
    assert learned["limit_ms"] == 1_000  # 3 x the quantile is below the 1 s floor
    warm = limits()
    assert (warm.first_byte, warm.first_token) == (1.0, 1.0)

    t0 = time.monotonic()
    assert call(client, model, stream=True) == (answer("fb-ok"), "fb-ok")
    elapsed = time.monotonic() - t0
    assert 0.95 <= elapsed < 3.0, elapsed  # the learned 1 s, not 15 s
    rows = fault.requests()[LEARN_SAMPLES:]
    assert [(r["model"], r["end"]) for r in rows] == [(model, "client_closed"), ("fb-ok", "complete")]
    assert 950 <= rows[0]["ended_at_ms"] - rows[0]["at_ms"] < 2_000
    # The slow attempt taught nothing (it failed); the backup's success is its first sample.
    first_token = engine.stats()["first_token"]
    assert first_token["primary"]["samples"] == LEARN_SAMPLES and first_token["backup"]["samples"] == 1
