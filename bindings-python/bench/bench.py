"""Per-call overhead of a governed call: retrywise against tenacity, stamina,
backoff and pybreaker doing the same work, in one run.

Two cycles, no I/O and no sleeping (every library is told to wait 0):
  success    one attempt that succeeds (begin -> next_attempt -> report(200))
  3-attempt  503, 503, then 200: two retry decisions and a success

    python bench/bench.py [--quick]

Prints ns per cycle (best of several rounds) and the ratio to retrywise.
Build the extension first with ``pip install ./bindings-python`` (or ``ci.sh``): that
uses the ``release-python`` profile (fat LTO); ``maturin develop --release`` builds
without LTO and measures a little slower.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import retrywise


class Resp:
    __slots__ = ("headers", "status_code")

    def __init__(self, status: int) -> None:
        self.status_code = status
        self.headers: dict[str, str] = {}


OK = Resp(200)
FAIL = Resp(503)


class Transient(Exception):
    pass


def measure(fn: Callable[[], Any], n: int, rounds: int) -> float:
    """Best ns per call over ``rounds`` rounds of ``n`` calls (best = least disturbed)."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


# ------------------------------------------------------------- retrywise --


def retrywise_cases(policy: dict[str, Any]) -> tuple[Callable[[], Any], Callable[[], Any]]:
    engine = retrywise.Engine(policy, seed=1)
    begin = engine.begin

    def success() -> None:
        call = begin("openai/gpt-4o", deadline_ms=30_000)
        call.next_attempt()
        d = call.report(status=200)
        assert d.action == "succeeded"

    def three() -> None:
        call = begin("openai/gpt-4o", deadline_ms=30_000)
        call.next_attempt()
        call.report(status=503)
        call.next_attempt()
        call.report(status=503)
        call.next_attempt()
        d = call.report(status=200)
        assert d.action == "succeeded", d

    return success, three


# -------------------------------------------------------------- tenacity --


def tenacity_cases() -> tuple[Callable[[], Any], Callable[[], Any]]:
    import tenacity

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(3),
        wait=tenacity.wait_none(),
        retry=tenacity.retry_if_result(lambda r: r.status_code >= 500),
        sleep=lambda s: None,
    )

    def success() -> None:
        retrying(lambda: OK)

    def three() -> None:
        it = iter((FAIL, FAIL, OK))
        assert retrying(lambda: next(it)) is OK

    return success, three


# --------------------------------------------------------------- stamina --


def stamina_cases() -> tuple[Callable[[], Any], Callable[[], Any]]:
    import stamina

    stamina.instrumentation.set_on_retry_hooks([])
    kw = {"on": Transient, "attempts": 3, "wait_initial": 0.0, "wait_max": 0.0, "wait_jitter": 0.0}

    @stamina.retry(**kw)  # type: ignore[arg-type]
    def once() -> Resp:
        return OK

    def success() -> None:
        once()

    state = {"n": 0}

    @stamina.retry(**kw)  # type: ignore[arg-type]
    def flaky() -> Resp:
        state["n"] += 1
        if state["n"] < 3:
            raise Transient
        return OK

    def three() -> None:
        state["n"] = 0
        assert flaky() is OK

    return success, three


# --------------------------------------------------------------- backoff --


def backoff_cases() -> tuple[Callable[[], Any], Callable[[], Any]]:
    import backoff

    deco = backoff.on_predicate(backoff.constant, lambda r: r.status_code >= 500, max_tries=3, interval=0, jitter=None)

    @deco
    def once() -> Resp:
        return OK

    state = {"it": iter(())}

    @deco
    def flaky() -> Resp:
        return next(state["it"])

    def success() -> None:
        once()

    def three() -> None:
        state["it"] = iter((FAIL, FAIL, OK))
        assert flaky() is OK

    return success, three


# ------------------------------------------------------------- pybreaker --


def pybreaker_cases() -> tuple[Callable[[], Any], Callable[[], Any]]:
    import pybreaker

    breaker = pybreaker.CircuitBreaker(fail_max=1_000_000, reset_timeout=60)

    def ok() -> Resp:
        return OK

    def fail() -> Resp:
        raise Transient

    def success() -> None:
        breaker.call(ok)

    def three() -> None:
        # pybreaker has no retry loop: the caller's loop makes 3 guarded calls.
        for fn in (fail, fail, ok):
            try:
                return breaker.call(fn)  # type: ignore[no-any-return]
            except Transient:
                continue

    return success, three


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    args = ap.parse_args()
    n, rounds = (20_000, 3) if args.quick else (200_000, 5)
    # Every library is told to wait 0, but some still call time.sleep(0), a syscall
    # that costs ~50 us of timer slack on Linux: measure decisions, not sleeps.
    time.sleep = lambda _s: None

    # Budget, breaker and telemetry stay on; the 3-attempt policy lets every retry
    # through (budget ratio 10, breaker opening only at a 100 % failure rate) so all
    # libraries do the same work.
    default_policy: dict[str, Any] = {}
    three_policy: dict[str, Any] = {"budget": {"ratio": 10.0}, "breaker": {"failure_rate": 1.0}}
    lean = {"telemetry": {"ring_size": 0}}

    rows: list[tuple[str, float, float]] = []
    rw_s, _ = retrywise_cases(default_policy)
    _, rw_3 = retrywise_cases(three_policy)
    lean_s, _ = retrywise_cases(lean)
    _, lean_3 = retrywise_cases({**three_policy, **lean})
    cases: list[tuple[str, tuple[Callable[[], Any], Callable[[], Any]]]] = [
        ("retrywise", (rw_s, rw_3)),
        ("retrywise (no event ring)", (lean_s, lean_3)),
    ]
    for name, make in [
        ("tenacity", tenacity_cases),
        ("stamina", stamina_cases),
        ("backoff", backoff_cases),
        ("pybreaker", pybreaker_cases),
    ]:
        try:
            cases.append((name, make()))
        except ImportError:
            print(f"# {name} not installed, skipped", file=sys.stderr)

    for name, (success, three) in cases:
        success()
        three()
        rows.append((name, measure(success, n, rounds), measure(three, n // 2, rounds)))

    base_s, base_3 = rows[0][1], rows[0][2]
    print(f"# python {platform.python_version()} on {platform.machine()}, retrywise {retrywise.__version__}")
    print(f"# best of {rounds} rounds; {n} success cycles, {n // 2} 3-attempt cycles per round")
    print(f"{'library':<28}{'success ns':>12}{'x':>8}{'3-attempt ns':>15}{'x':>8}")
    for name, s, t in rows:
        print(f"{name:<28}{s:>12.0f}{s / base_s:>8.2f}{t:>15.0f}{t / base_3:>8.2f}")


if __name__ == "__main__":
    main()
