"""A streamed answer handed to the caller, relayed to its end across attempts.

The caller reads one stream. Its bytes come from the attempt that answered
first, through the core's ``Relay``: one call per chunk runs it through the
leg's gate (malformed events, error events), a continuation's splicer, and
the transcript of what the caller has seen. When that stream breaks,
stalls, ends without its finish, or carries an error event after output, the
relay reports it (with ``resumable`` from the transcript) and does what the
core decides: on a ``retry``/``fallback`` with a ``continuation`` it sends the
core's continuation request to the next attempt's upstream and splices its
stream (no second opening, no restated text) into the same stream the caller
is reading; on a stop it ends the caller's stream with an error, never a
truncated success.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from ._errors import Stopped, StreamInterrupted, WireError
from ._outcomes import error_kind, is_cancellation, note_stop
from ._retrywise import continuation_body

if TYPE_CHECKING:
    from ._retrywise import Attempt, Call, Decision
    from ._retrywise import Relay as StreamRelay
    from ._transport import _Driver
    from .types import ContinuationName

_RETRY = ("retry", "fallback")


class Leg:
    """One attempt's streamed body as the caller receives it. ``sent``: when its
    request went (monotonic); ``first_token_s``: how long after that the caller
    was given its first bytes (reported with the attempt's end); ``first``: the
    bytes already released before the relay took the body over."""

    def __init__(
        self,
        response: Any,
        rest: Any,
        sent: float,
        *,
        first: bytes | None = None,
        how: ContinuationName | None = None,
    ) -> None:
        self.body = response.stream
        self.rest = rest
        self.status: int = response.status_code
        self.headers = response.headers
        self.sent = sent
        self.first_token_s: float | None = None
        self.first = first
        self.how = how

    def shown(self) -> None:
        """Bytes of this leg reached the caller now."""
        if self.first_token_s is None:
            self.first_token_s = time.monotonic() - self.sent


#: What ``resume`` ends with: the next leg (None: stop), the last decision and failure.
Resumed = tuple["Leg | None", "Decision", "BaseException | None"]


class _RelayBase:
    """What the sync and async relays share: what to report, what to raise."""

    def __init__(
        self, d: _Driver, inner: Any, call: Call, request: Any, base: dict[str, Any], core: StreamRelay, leg: Leg
    ) -> None:
        self.d = d
        self.inner = inner
        self.call = call
        self.request = request
        self.base = base
        self.core = core
        self.leg = leg
        self.done = False

    def report_end(self) -> Decision:
        """The leg's body ended: a success, the error event it carried, or a
        cut (the core's `end_outcome`: output shown and no finish). With the
        leg's time to first token, which a success teaches the core."""
        leg = self.leg
        return self.call.report(
            **self.core.end_outcome(leg.status),
            headers=leg.headers,
            continuation=leg.how,
            first_token_s=leg.first_token_s,
        )

    def report_failure(self, exc: BaseException) -> Decision:
        leg = self.leg
        kind, _ = error_kind(exc, in_body=True)
        return self.call.report(
            status=leg.status,
            error=kind,
            phase=self.core.phase,
            headers=leg.headers,
            resumable=self.core.resumable,
            continuation=leg.how,
        )

    def closed(self) -> None:
        """The consumer closed the stream before its end (an SDK stops at its
        terminator; an app breaks out of the loop): what it read was fine."""
        if not self.done:
            self.done = True
            leg = self.leg
            self.call.report(**self.core.outcome(leg.status), headers=leg.headers, first_token_s=leg.first_token_s)

    def caught(self, exc: BaseException) -> BaseException:
        """A failure reading the leg; a cancellation is reported and raised."""
        if is_cancellation(exc):
            self.done = True
            self.call.cancel()
            raise exc
        return exc

    def settle(self, exc: BaseException | None) -> Decision | None:
        """Reports the leg that ended (``exc``: how it broke); None when the call succeeded."""
        decision = self.report_failure(exc) if exc is not None else self.report_end()
        if decision.action == "succeeded":
            self.done = True
            return None
        return decision

    def fail(self, decision: Decision, exc: BaseException | None) -> NoReturn:
        err = self.stopped(decision, exc)
        if err is exc:
            raise err
        raise err from exc

    def stopped(self, decision: Decision, exc: BaseException | None) -> BaseException:
        """The exception that ends the caller's stream."""
        self.done = True
        if decision.action == "reconcile":
            stopped = Stopped.from_decision(decision, exception=exc)
            stopped.__cause__ = exc
            return stopped
        if exc is not None:
            note_stop(exc, decision.reason)
            return exc
        return StreamInterrupted.from_decision(
            decision, delivered=self.core.text, provider_error=self.core.stream_error
        )

    def raise_refused(self, stopped: Stopped, exc: BaseException | None) -> NoReturn:
        """``next_attempt`` refused a continuation: the stream ends with the stop."""
        self.done = True
        err = StreamInterrupted(
            str(stopped),
            reason=stopped.reason,
            error_class=stopped.error_class,
            detail=stopped.detail,
            on_failure=stopped.on_failure,
            delivered=self.core.text,
            provider_error=self.core.stream_error,
        )
        raise err from exc

    def continuation_request(self, attempt: Attempt, how: ContinuationName) -> Any:
        try:
            body = continuation_body(self.core.api, self.request.content, self.core.transcript, how)
        except WireError:
            self.done = True
            self.call.cancel()
            raise
        return self.d.build(self.call, self.request, attempt, self.base, body=body)

    def new_leg(self, response: Any, rest: Any, how: ContinuationName, sent: float) -> Leg:
        """A continuation's stream: its own gate, spliced into the caller's."""
        self.core.continue_with(self.d.engine.stream_gate(response.headers.get("content-type"), end_at_error=True))
        return Leg(response, rest, sent, how=how)

    def report_answer(self, response: Any, raw: bytes, how: ContinuationName) -> Decision:
        """A continuation attempt answered without a stream (an error status, a JSON body)."""
        if response.status_code < 400:
            return self.call.report(
                status=response.status_code, error="malformed_response", phase="stream_open", continuation=how
            )
        return self.call.report(
            status=response.status_code,
            headers=response.headers,
            body=self.d.body_of(response, raw),
            resumable=self.core.resumable,
            continuation=how,
        )

    def report_send_error(self, exc: BaseException, how: ContinuationName) -> Decision:
        kind, phase = error_kind(exc)
        return self.call.report(error=kind, phase=phase, resumable=self.core.resumable, continuation=how)


class Relay(_RelayBase):
    """The sync relay (the body of the response the transport returns)."""

    def chunks(self) -> Iterator[bytes]:
        core = self.core
        feed = core.feed
        while True:
            leg = self.leg
            exc: BaseException | None = None
            try:
                if leg.first:
                    yield leg.first
                for chunk in leg.rest:
                    out = feed(chunk)
                    if out:
                        if leg.first_token_s is None:
                            leg.shown()
                        yield out
                    # Only a chunk not passed on as it came can have ended the leg.
                    if out is not chunk and core.cut_short:
                        break
                out = core.finish()
                if out:
                    leg.shown()
                    yield out
            except GeneratorExit:
                self.closed()
                raise
            except BaseException as e:
                exc = self.caught(e)
            leg.body.close()
            decision = self.settle(exc)
            if decision is None:
                return
            nxt = None
            if decision.continuation:
                nxt, decision, exc = self.resume(decision, exc)
            self.leg = nxt or self.fail(decision, exc)

    def resume(self, decision: Decision, exc: BaseException | None) -> Resumed:
        """Sends continuation requests until one streams (its leg) or the core
        stops (no leg, the last decision and failure)."""
        while decision.action in _RETRY and decision.continuation:
            how = decision.continuation
            self.d.wait(decision)
            try:
                attempt = self.d.next_attempt(self.call)
            except Stopped as stopped:
                self.raise_refused(stopped, exc)
            req = self.continuation_request(attempt, how)
            sent = time.monotonic()
            try:
                response = self.inner.handle_request(req)
            except BaseException as e:
                if is_cancellation(e):
                    self.call.cancel()
                    raise
                exc, decision = e, self.report_send_error(e, how)
                continue
            if self.d.is_streamed(response):
                self.d.idle_timeout(req, attempt, self.base)
                return self.new_leg(response, iter(response.stream), how, sent), decision, None
            raw = b"".join(response.stream)
            response.stream.close()
            exc, decision = None, self.report_answer(response, raw, how)
        return None, decision, exc

    def close(self) -> None:
        self.closed()
        self.leg.body.close()


class AsyncRelay(_RelayBase):
    """The async relay."""

    async def chunks(self) -> AsyncIterator[bytes]:
        core = self.core
        feed = core.feed
        while True:
            leg = self.leg
            exc: BaseException | None = None
            try:
                if leg.first:
                    yield leg.first
                async for chunk in leg.rest:
                    out = feed(chunk)
                    if out:
                        if leg.first_token_s is None:
                            leg.shown()
                        yield out
                    if out is not chunk and core.cut_short:
                        break
                out = core.finish()
                if out:
                    leg.shown()
                    yield out
            except GeneratorExit:
                self.closed()
                raise
            except BaseException as e:
                exc = self.caught(e)
            await leg.body.aclose()
            decision = self.settle(exc)
            if decision is None:
                return
            nxt = None
            if decision.continuation:
                nxt, decision, exc = await self.resume(decision, exc)
            self.leg = nxt or self.fail(decision, exc)

    async def resume(self, decision: Decision, exc: BaseException | None) -> Resumed:
        while decision.action in _RETRY and decision.continuation:
            how = decision.continuation
            try:
                await self.d.wait_async(decision)
            except BaseException:
                self.call.cancel()
                raise
            try:
                attempt = await self.d.next_attempt_async(self.call)
            except Stopped as stopped:
                self.raise_refused(stopped, exc)
            req = self.continuation_request(attempt, how)
            sent = time.monotonic()
            try:
                response = await self.inner.handle_async_request(req)
            except BaseException as e:
                if is_cancellation(e):
                    self.call.cancel()
                    raise
                exc, decision = e, self.report_send_error(e, how)
                continue
            if self.d.is_streamed(response):
                self.d.idle_timeout(req, attempt, self.base)
                return self.new_leg(response, response.stream.__aiter__(), how, sent), decision, None
            raw = b"".join([c async for c in response.stream])
            await response.stream.aclose()
            exc, decision = None, self.report_answer(response, raw, how)
        return None, decision, exc

    async def aclose(self) -> None:
        self.closed()
        await self.leg.body.aclose()
