"""One engine shared by many threads: counters stay exact, event callbacks run
on the deciding threads, and a callback that blocks does not stall the others."""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import retrywise
from retrywise import Engine

OPEN = {"backoff": {"base_ms": 0, "cap_ms": 0}, "budget": {"enabled": False}, "breaker": {"enabled": False}}


def test_threads_share_one_engine() -> None:
    engine = Engine(OPEN, seed=5)
    threads, per_thread = 8, 400
    seen_threads: set[int] = set()
    lock = threading.Lock()

    def sink(event: dict[str, Any]) -> None:
        with lock:
            seen_threads.add(threading.get_ident())

    engine.on_event(sink)

    barrier = threading.Barrier(threads)
    results: list[int] = [0] * threads

    def work(t: int) -> None:
        barrier.wait()
        ok = 0
        for i in range(per_thread):
            call = engine.begin("u", tenant=f"t{t}", deadline_ms=10_000)
            call.next_attempt()
            d = call.report(status=503 if i % 2 == 0 else 200)
            if d.action == "retry":
                call.next_attempt()
                d = call.report(status=200)
            ok += d.action == "succeeded"
        results[t] = ok

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert results == [per_thread] * threads
    s = engine.stats()
    n = threads * per_thread
    assert s["logical_requests"] == n and s["successes"] == n
    assert s["attempts"] == n + n // 2 and s["retries"] == n // 2
    assert sum(v["logical_requests"] for v in s["per_tenant"].values()) == n
    assert len(seen_threads) == threads


def test_run_from_many_threads() -> None:
    engine = Engine(OPEN)

    def work(i: int) -> int:
        state = {"n": 0}

        def fn(a: retrywise.Attempt) -> dict[str, int]:
            state["n"] += 1
            if state["n"] < 3:
                raise ConnectionRefusedError
            return {"i": i}

        return engine.run(fn, route="u")["i"]

    with ThreadPoolExecutor(6) as pool:
        assert sorted(pool.map(work, range(60))) == list(range(60))
    assert engine.stats()["attempts"] == 180


def test_blocking_callback_does_not_stall_other_threads() -> None:
    """Thread A's decision runs a callback that waits for thread B, which needs the
    engine (and the GIL) to decide: this only finishes if A's core call does not
    hold the GIL or any engine lock while its callback waits."""
    engine = Engine(OPEN)
    b_done = threading.Event()
    waited: list[bool] = []

    def sink(event: dict[str, Any]) -> None:
        if event.get("tenant") == "A" and event["kind"] == "attempt_end":
            waited.append(b_done.wait(timeout=10))

    engine.on_event(sink)

    def thread_a() -> str:
        call = engine.begin("u", tenant="A")
        call.next_attempt()
        return call.report(status=200).action

    def thread_b() -> None:
        for _ in range(20):
            call = engine.begin("u", tenant="B")
            call.next_attempt()
            call.report(status=200)
        b_done.set()

    with ThreadPoolExecutor(2) as pool:
        fa = pool.submit(thread_a)
        fb = pool.submit(thread_b)
        fb.result(timeout=10)
        assert fa.result(timeout=10) == "succeeded"
    assert waited == [True]


def test_call_used_by_another_thread_while_its_callback_runs() -> None:
    """Thread A decides on a call and its event callback runs Python (sleeps, letting the
    GIL go) while holding the call; thread B then touches the same call. B must wait for
    the call without holding the GIL, or A could never finish its callback."""
    engine = Engine(OPEN)
    in_callback = threading.Event()
    call = engine.begin("u")
    call.next_attempt()

    def sink(event: dict[str, Any]) -> None:
        if event["kind"] == "attempt_end" and threading.current_thread().name == "decider":
            in_callback.set()
            time.sleep(0.05)

    engine.on_event(sink)
    seen: list[object] = []

    def toucher() -> None:
        assert in_callback.wait(timeout=10)
        seen.append(call.attempts)  # waits for A's decision, then reads it
        seen.append(call.is_finished)

    box: list[str] = []
    a = threading.Thread(target=lambda: box.append(call.report(status=200).action), name="decider")
    b = threading.Thread(target=toucher)
    b.start()
    a.start()
    a.join(timeout=10)
    b.join(timeout=10)
    assert box == ["succeeded"] and seen == [1, True]


def test_calls_handed_between_threads() -> None:
    engine = Engine(OPEN)
    call = engine.begin("u")
    attempt = call.next_attempt()
    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(call.report(status=200).action))
    t.start()
    t.join()
    assert box == ["succeeded"] and attempt.number == 1


def test_callback_reaching_into_the_call_being_decided_gets_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The call is locked while it decides; a callback touching it on the same thread
    gets a RuntimeError (through sys.unraisablehook) instead of deadlocking."""
    engine = Engine(OPEN)
    holder: dict[str, retrywise.Call] = {}
    errors: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: errors.append(u.exc_value))

    def sink(event: dict[str, Any]) -> None:
        if event["kind"] == "attempt_end" and "call" in holder:
            _ = holder["call"].attempts

    engine.on_event(sink)
    call = engine.begin("u")
    holder["call"] = call
    call.next_attempt()
    assert call.report(status=200).action == "succeeded"
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
    assert call.attempts == 1  # usable again once the decision is made
