"""``Engine``: the native engine plus the decision loop done for you
(``run`` / ``run_async``): sleeping, context propagation and exceptions are
Python idioms; every decision comes from the core."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from . import _retrywise
from ._errors import NotYet, Stopped
from ._outcomes import exception_report, exception_response, is_cancellation, report_result
from ._retrywise import Attempt, Call, Decision

R = TypeVar("R")

#: The attempt in progress in this context; a call begun while it is set
#: inherits its deadline and is not the retry owner.
current_attempt = _retrywise.current_attempt


class Engine(_retrywise.Engine):
    """The retry owner: one per process, shared by every thread and task.

    ``Engine(policy=None, *, seed=None, manual_clock=False)``: the policy as a dict or
    a JSON/YAML/TOML string (``Engine.from_file(path)`` reads a file). ``seed`` makes
    jitter reproducible; ``manual_clock=True`` replaces time with a clock moved by
    ``advance_clock(ms)`` (and ``run`` then advances it instead of sleeping).
    """

    __slots__ = ()

    def _wait(self, decision: Decision) -> None:
        self._sleep(decision.delay_s)

    def _sleep(self, seconds: float) -> None:
        if self.manual_clock:
            self.advance_clock(round(seconds * 1000))
        elif seconds > 0:
            time.sleep(seconds)

    async def _wait_async(self, decision: Decision) -> None:
        await self._sleep_async(decision.delay_s)

    async def _sleep_async(self, seconds: float) -> None:
        if self.manual_clock:
            self.advance_clock(round(seconds * 1000))
        elif seconds > 0:
            await asyncio.sleep(seconds)

    def run(self, fn: Callable[[Attempt], R], /, **call_kwargs: Any) -> R:
        """Calls ``fn(attempt)`` until the engine says stop; returns ``fn``'s result on success.

        ``fn`` returns a response-like object (``.status_code``, ``.headers``, optionally a
        body) or any other value (a success), or raises. On ``stop`` raises
        ``retrywise.Stopped`` (``ReconcileRequired`` on ``reconcile``) carrying the decision
        and the last response or exception. ``call_kwargs`` go to ``begin``.
        """
        call = self.begin(**call_kwargs)
        last_response: Any = None
        last_exc: BaseException | None = None
        while True:
            try:
                attempt = _next_attempt(call, last_response, last_exc)
            except NotYet as w:  # an open breaker lets a probe through soon: wait for it
                self._sleep(w.wait_s)
                continue
            token = current_attempt.set(attempt)
            try:
                result = fn(attempt)
            except BaseException as exc:
                if is_cancellation(exc):
                    call.cancel()
                    raise
                decision = call.report(**exception_report(exc))
                last_response, last_exc = exception_response(exc), exc
            else:
                decision = report_result(call, result)
                last_response, last_exc = result, None
            finally:
                current_attempt.reset(token)
            action = decision.action
            if action == "succeeded":
                return result
            if action == "retry" or action == "fallback":
                self._wait(decision)
                continue
            raise Stopped.from_decision(decision, response=last_response, exception=last_exc) from last_exc

    async def run_async(self, fn: Callable[[Attempt], Awaitable[R]], /, **call_kwargs: Any) -> R:
        """``run`` for coroutines: awaits ``fn(attempt)`` and sleeps with ``asyncio.sleep``.
        A cancelled task reports ``cancelled`` to the call and re-raises ``CancelledError``."""
        call = self.begin(**call_kwargs)
        last_response: Any = None
        last_exc: BaseException | None = None
        while True:
            try:
                attempt = _next_attempt(call, last_response, last_exc)
            except NotYet as w:
                try:
                    await self._sleep_async(w.wait_s)
                except asyncio.CancelledError:
                    call.cancel()
                    raise
                continue
            token = current_attempt.set(attempt)
            try:
                result = await fn(attempt)
            except BaseException as exc:
                if is_cancellation(exc):
                    call.cancel()
                    raise
                decision = call.report(**exception_report(exc))
                last_response, last_exc = exception_response(exc), exc
            else:
                decision = report_result(call, result)
                last_response, last_exc = result, None
            finally:
                current_attempt.reset(token)
            action = decision.action
            if action == "succeeded":
                return result
            if action == "retry" or action == "fallback":
                try:
                    await self._wait_async(decision)
                except asyncio.CancelledError:
                    call.cancel()
                    raise
                continue
            raise Stopped.from_decision(decision, response=last_response, exception=last_exc) from last_exc


def _next_attempt(call: Call, last_response: Any, last_exc: BaseException | None) -> Attempt:
    try:
        return call.next_attempt()
    except Stopped as stopped:
        stopped.response, stopped.exception = last_response, last_exc
        raise
