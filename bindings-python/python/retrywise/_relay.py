"""A streamed answer handed to the caller, relayed to its end across attempts.

The caller reads one stream. Its bytes come from the attempt that answered
first, through the core's ``StreamGate`` (malformed events, error events) and
into a ``Transcript`` (what the caller has seen). When that stream breaks,
stalls, ends without its finish, or carries an error event after output, the
relay reports it (with ``resumable`` from the transcript) and does what the
core decides: on a ``retry``/``fallback`` with a ``continuation`` it sends the
core's continuation request to the next attempt's upstream and splices its
stream (the core's ``Splicer``: no second opening, no restated text) into the
same stream the caller is reading; on a stop it ends the caller's stream with
an error, never a truncated success.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from ._errors import Stopped, StreamInterrupted, WireError
from ._outcomes import error_kind, is_cancellation, note_stop
from ._retrywise import Splicer, continuation_body

if TYPE_CHECKING:
    from ._retrywise import Attempt, Call, Decision, StreamGate, Transcript
    from ._transport import _Driver
    from .types import ContinuationName, Phase

_RETRY = ("retry", "fallback")


class Leg:
    """One attempt's streamed body as the caller receives it. ``sent``: when its
    request went (monotonic); ``first_token_s``: how long after that the caller
    was given its first bytes (reported with the attempt's end)."""

    def __init__(
        self,
        response: Any,
        rest: Any,
        gate: StreamGate,
        sent: float,
        *,
        first: bytes | None = None,
        splicer: Splicer | None = None,
        how: ContinuationName | None = None,
    ) -> None:
        self.body = response.stream
        self.rest = rest
        self.status: int = response.status_code
        self.headers = response.headers
        self.gate = gate
        self.sent = sent
        self.first_token_s: float | None = None
        self.first = first
        self.splicer = splicer
        self.how = how

    @property
    def cut_short(self) -> bool:
        """The gate ended the stream (a malformed event under ``error``, an
        error event after output): nothing after it is delivered."""
        return self.gate.stream_error is not None and not self.gate.watching

    def pass_on(self, chunk: bytes) -> bytes:
        out = self.gate.feed(chunk) if self.gate.watching else chunk
        if self.splicer is not None and out:
            out = self.splicer.feed(out)
        if out and self.first_token_s is None:
            self.first_token_s = time.monotonic() - self.sent
        return out

    def tail(self) -> bytes:
        out = self.gate.finish()
        if self.splicer is not None:
            out = (self.splicer.feed(out) if out else b"") + self.splicer.finish()
        if out and self.first_token_s is None:
            self.first_token_s = time.monotonic() - self.sent
        return out

    @property
    def phase(self) -> Phase:
        return "stream_visible" if self.gate.visible else "stream_open"


#: What ``resume`` ends with: the next leg (None: stop), the last decision and failure.
Resumed = tuple["Leg | None", "Decision", "BaseException | None"]


class _RelayBase:
    """What the sync and async relays share: what to report, what to raise."""

    def __init__(
        self, d: _Driver, inner: Any, call: Call, request: Any, base: dict[str, Any], transcript: Transcript, leg: Leg
    ) -> None:
        self.d = d
        self.inner = inner
        self.call = call
        self.request = request
        self.base = base
        self.transcript = transcript
        self.leg = leg
        self.done = False

    def deliver(self, out: bytes) -> bytes:
        """``out`` goes to the caller: the transcript reads it."""
        if out:
            self.transcript.observe(out)
        return out

    def report_end(self) -> Decision:
        """The leg's body ended: a success, the error event it carried, or a
        cut (the core's `end_outcome`: output shown and no finish). With the
        leg's time to first token, which a success teaches the core."""
        leg = self.leg
        return self.call.report(
            **leg.gate.end_outcome(leg.status, self.transcript),
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
            phase=leg.phase,
            headers=leg.headers,
            resumable=self.transcript.resumable,
            continuation=leg.how,
        )

    def closed(self) -> None:
        """The consumer closed the stream before its end (an SDK stops at its
        terminator; an app breaks out of the loop): what it read was fine."""
        if not self.done:
            self.done = True
            leg = self.leg
            self.call.report(**leg.gate.outcome(leg.status), headers=leg.headers, first_token_s=leg.first_token_s)

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
            decision, delivered=self.transcript.text, provider_error=self.leg.gate.stream_error
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
            delivered=self.transcript.text,
            provider_error=self.leg.gate.stream_error,
        )
        raise err from exc

    def continuation_request(self, attempt: Attempt, how: ContinuationName) -> Any:
        try:
            body = continuation_body(self.transcript.api, self.request.content, self.transcript, how)
        except WireError:
            self.done = True
            self.call.cancel()
            raise
        return self.d.build(self.call, self.request, attempt, self.base, body=body)

    def new_leg(self, response: Any, rest: Any, how: ContinuationName, sent: float) -> Leg:
        gate = self.d.engine.stream_gate(response.headers.get("content-type"), end_at_error=True)
        return Leg(response, rest, gate, sent, splicer=Splicer(self.transcript.api, self.transcript), how=how)

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
            resumable=self.transcript.resumable,
            continuation=how,
        )

    def report_send_error(self, exc: BaseException, how: ContinuationName) -> Decision:
        kind, phase = error_kind(exc)
        return self.call.report(error=kind, phase=phase, resumable=self.transcript.resumable, continuation=how)


class Relay(_RelayBase):
    """The sync relay (the body of the response the transport returns)."""

    def chunks(self) -> Iterator[bytes]:
        while True:
            leg = self.leg
            exc: BaseException | None = None
            try:
                if leg.first:
                    yield self.deliver(leg.first)
                for chunk in leg.rest:
                    out = self.deliver(leg.pass_on(chunk))
                    if out:
                        yield out
                    if leg.cut_short:
                        break
                out = self.deliver(leg.tail())
                if out:
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
        while True:
            leg = self.leg
            exc: BaseException | None = None
            try:
                if leg.first:
                    yield self.deliver(leg.first)
                async for chunk in leg.rest:
                    out = self.deliver(leg.pass_on(chunk))
                    if out:
                        yield out
                    if leg.cut_short:
                        break
                out = self.deliver(leg.tail())
                if out:
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
