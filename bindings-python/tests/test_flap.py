"""The failover bench's flapping primary in real time, through the README's
wiring (the openai SDK, its own retries off, over ``RetryTransport``; a
primary and a fallback upstream; 3 attempts, a 30 s deadline, every other knob
at its default): the primary answers 503 for 60 s from its first request, then
is healthy; 20 requests 4 s apart, then more at that pace until the primary
answers again (at most 30 s after its recovery).

Ten runs side by side, each its own engine (differently seeded: its jitter and
breaker timings differ) and its own flapping model on the fault server, and
ten more the same way through ``engine.run`` (the SDK pointed where
``attempt.reach`` says). In each: every request is answered, nothing the primary answered came from its
outage, the breaker spares the primary part of the outage (fewer attempts
than two per request; 12 for 15 requests: five failures in a row lasting a
second trip it on the third request, then it only probes), and the primary
serves again within 30 s of its recovery (8-20 s: each failed probe opens the
breaker 1.5 times longer, up to ``open_max_ms`` 20 s; tripped that early, its
periods have grown to 11-20 s by the end of the outage, so the 20th request,
16 s after it, may still come before the probe that finds the primary back)."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
import retrywise
from retrywise import Engine
from retrywise.httpx import RetryTransport

from .conftest import FaultServer, openai_client_for

openai = pytest.importorskip("openai")

KEY_ENV = "RETRYWISE_TEST_FLAP_KEY"
MESSAGES = [{"role": "user", "content": "hi"}]
RUNS = 10
REQUESTS = 20
EVERY_S = 4.0
DOWN_MS = 60_000
#: The primary serves again within this long after its recovery.
BACK_WITHIN_MS = 30_000


def answer(model: str) -> str:
    return f"answer from {model}: w1 w2 w3 w4 w5 w6"


def policy(base_url: str, primary: str, backup: str) -> dict[str, Any]:
    upstream = {"base_url": base_url, "api_key_env": KEY_ENV}
    return {
        "max_attempts": 3,
        "deadline_ms": 30_000,
        "upstreams": {
            "primary": {**upstream, "provider": "fault", "model": primary, "capabilities": ["streaming"]},
            "backup": {**upstream, "provider": "fault-b", "model": backup, "capabilities": ["streaming"]},
        },
        "models": {primary: "chat"},
        "routes": {"chat": {"candidates": ["primary", "backup"]}},
    }


#: The two ways a user calls: the README's transport under the SDK, and
#: ``engine.run`` with the SDK pointed where ``attempt.reach`` says.
WAYS = ("transport", "run")


def down_ms(way: str, seed: int) -> int:
    """Each run's own flapping model (the fault server keys its window by the
    model name): a few ms apart, so every window is 60 s."""
    return DOWN_MS + WAYS.index(way) * 100 + seed


def ask_where_reach_says(attempt: retrywise.Attempt) -> Any:
    reach = attempt.reach
    assert reach is not None
    return openai_client_for(attempt).chat.completions.create(model=reach.model, messages=MESSAGES)


def run(fault: FaultServer, way: str, seed: int, out: dict[tuple[str, int], Any]) -> None:
    """One user's 20 requests, 4 s apart on a fixed schedule, and more until
    the primary answers one (none later than 30 s after the outage); (seconds
    since start, the model that answered) per request into ``out[way, seed]``."""
    primary, backup = f"fb-flap:down={down_ms(way, seed)}", f"fb-ok:id={way}{seed}"
    engine = Engine(policy(fault.base + "/v1", primary, backup), seed=seed)
    client = openai.OpenAI(
        base_url=fault.base + "/v1",
        api_key="sk-caller",
        max_retries=0,
        http_client=httpx.Client(transport=RetryTransport(engine)),
    )
    served: list[tuple[float, str]] = []
    try:
        t0 = time.monotonic()
        i = 0
        while i < REQUESTS or (served[-1][1] != primary and i * EVERY_S * 1000 <= DOWN_MS + BACK_WITHIN_MS):
            time.sleep(max(0.0, t0 + i * EVERY_S - time.monotonic()))
            i += 1
            if way == "transport":
                r = client.chat.completions.create(model=primary, messages=MESSAGES)
            else:
                r = engine.run(ask_where_reach_says, route=engine.route_for_model(primary))
            assert r.choices[0].message.content == answer(r.model), r
            served.append((time.monotonic() - t0, r.model))
        out[way, seed] = served
    except BaseException as e:  # reported by the test thread
        out[way, seed] = e


def test_a_60_s_outage_is_served_by_the_fallback_and_the_primary_is_back_within_30_s(
    fault: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-flap")
    out: dict[tuple[str, int], Any] = {}
    runs = [(way, seed) for way in WAYS for seed in range(1, RUNS + 1)]
    threads = [threading.Thread(target=run, args=(fault, way, seed, out)) for way, seed in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = fault.requests()
    summary = []
    for way, seed in runs:
        served = out[way, seed]
        assert not isinstance(served, BaseException), f"{way} run {seed}: {served!r}"
        primary = f"fb-flap:down={down_ms(way, seed)}"
        mine = [r for r in rows if r["model"] == primary]
        up_at = mine[0]["at_ms"] + down_ms(way, seed)  # the server's clock: the outage ends here
        assert len(served) >= REQUESTS
        answers = [r for r in mine if r["status"] == 200]
        # Nothing the primary answered came from its outage, and the outage was
        # served by the fallback without trying the primary on every request.
        assert all(r["at_ms"] >= up_at for r in answers)
        in_outage = [r for r in mine if r["at_ms"] < up_at]
        requests_in_outage = sum(1 for at_s, _ in served if at_s * 1000 < DOWN_MS)
        # Without a breaker every request of the outage costs the primary
        # attempts_per_upstream (2) attempts; the breaker (judging after its
        # min_calls, 20) spares the rest of the outage all but its probes.
        assert len(in_outage) < 2 * requests_in_outage, (way, seed, len(in_outage), requests_in_outage)
        assert answers, f"{way} run {seed}: the primary never served again: {served}"
        back_after_ms = answers[0]["at_ms"] - up_at
        assert back_after_ms < BACK_WITHIN_MS, (way, seed, back_after_ms, served)
        assert served[-1][1] == primary
        summary.append((way, seed, len(in_outage), requests_in_outage, round(back_after_ms)))
    print("way, seed, primary attempts in the outage, requests in the outage, back after ms:", summary)
