"""The retry loop inside an httpx transport, shared by ``retrywise.httpx``
(httpx) and ``retrywise.httpx2`` (httpx2, used by current openai/anthropic
SDKs): both libraries have the same transport, stream and exception API, so
the flavour's module is passed in.

Per attempt: propagation headers and timeouts from the core are put on the
request (``extensions["timeout"]``, never longer than the caller's own);
error bodies are read so the core sees vendor codes; JSON bodies are read
inside the loop (a body that breaks, or a 2xx that does not parse, is still
retryable); other bodies (server-sent events) are read inside the loop up to
their first meaningful event, the preamble before it held back by the core's
``StreamGate`` (a stream that breaks before any output is still retried), then
handed to the caller wrapped, and the outcome is reported when the stream
ends, so output already delivered is never replayed.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from ._errors import NotYet, Stopped, StreamInterrupted
from ._outcomes import error_kind, is_cancellation
from ._retrywise import Attempt, Call, Decision, json_media_type

if TYPE_CHECKING:
    from ._engine import Engine
    from ._retrywise import StreamGate
    from .types import Phase

_RETRY = ("retry", "fallback")


def _min(caller: float | None, ours: float) -> float:
    return ours if caller is None else min(caller, ours)


class _Driver:
    """What the sync and async transports of one flavour share."""

    def __init__(self, hx: Any, engine: Engine, route: str, call_kwargs: dict[str, Any]) -> None:
        self.hx = hx
        self.engine = engine
        self.route = route
        self.call_kwargs = call_kwargs

    def begin(self) -> Call:
        return self.engine.begin(self.route, **self.call_kwargs)

    @staticmethod
    def prepare(request: Any, attempt: Attempt, base: dict[str, Any]) -> None:
        """Propagation headers and this attempt's timeouts on the request."""
        headers = request.headers
        for name, value in attempt.headers.items():
            headers[name] = value
        t = attempt.timeouts
        request.extensions["timeout"] = {
            "connect": _min(base.get("connect"), t.connect),
            "read": _min(base.get("read"), t.first_byte),
            "write": _min(base.get("write"), t.total),
            "pool": _min(base.get("pool"), t.total),
        }

    @staticmethod
    def idle_timeout(request: Any, attempt: Attempt, base: dict[str, Any]) -> None:
        """Between stream chunks the idle timeout applies, not the first-byte one
        (httpcore reads ``extensions["timeout"]`` again when the body is read)."""
        timeout = dict(request.extensions.get("timeout") or {})
        timeout["read"] = _min(base.get("read"), attempt.timeouts.idle)
        request.extensions["timeout"] = timeout

    @staticmethod
    def is_streamed(response: Any) -> bool:
        """Successful non-JSON bodies (server-sent events, downloads) go to the caller as a stream."""
        ctype = response.headers.get("content-type", "")
        return response.status_code < 400 and bool(ctype) and "json" not in ctype

    def rebuild(self, response: Any, raw: bytes, request: Any) -> Any:
        """A response over the bytes already read (the original stream is consumed)."""
        return self.hx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=self.hx.ByteStream(raw),
            extensions=response.extensions,
            request=request,
        )

    def body_of(self, response: Any, raw: bytes) -> bytes | None:
        """The decoded body the core reads: an error's (for its vendor code) or a
        JSON success's (a body that does not parse is ``malformed_response``).
        Bytes that do not decode are passed as they came."""
        if response.status_code < 400 and not json_media_type(response.headers.get("content-type", "")):
            return None
        try:
            body: bytes = self.hx.Response(
                response.status_code, headers=response.headers, stream=self.hx.ByteStream(raw)
            ).read()
        except Exception:
            return raw
        return body

    def wait(self, decision: Decision) -> None:
        self.engine._wait(decision)

    async def wait_async(self, decision: Decision) -> None:
        await self._sleep_async(decision.delay_s)

    async def _sleep_async(self, seconds: float) -> None:
        if self.engine.manual_clock:
            self.engine.advance_clock(round(seconds * 1000))
        elif seconds > 0:
            import anyio  # httpx's own async backend: works under asyncio and trio

            await anyio.sleep(seconds)

    def next_attempt(self, call: Call) -> Attempt:
        """The next attempt; a "not yet" (``NotYet``: an open breaker that lets a
        probe through soon) is waited out here, a stop raises ``Stopped``."""
        while True:
            try:
                return call.next_attempt()
            except NotYet as w:
                self.engine._sleep(w.wait_s)

    async def next_attempt_async(self, call: Call) -> Attempt:
        while True:
            try:
                return call.next_attempt()
            except NotYet as w:
                try:
                    await self._sleep_async(w.wait_s)
                except BaseException:
                    call.cancel()
                    raise

    @staticmethod
    def give_up(stopped: Stopped, response: Any, exc: BaseException | None) -> Any:
        """``next_attempt`` refused: surface the last failure as the caller would have seen it."""
        stopped.response, stopped.exception = response, exc
        if response is not None:
            return response
        if exc is not None:
            _note(exc, stopped.reason)
            raise exc
        raise stopped

    @staticmethod
    def final(decision: Decision, response: Any, exc: BaseException | None) -> Any:
        """Stop: the last response is returned (the SDK raises its usual error) or the
        last exception re-raised. Reconcile: ``ReconcileRequired``, never a replay."""
        if decision.action == "succeeded":
            return response
        if decision.action == "reconcile" or (response is None and exc is None):
            raise Stopped.from_decision(decision, response=response, exception=exc) from exc
        if response is not None:
            return response
        assert exc is not None
        _note(exc, decision.reason)
        raise exc


def _note(exc: BaseException, reason: str) -> None:
    add_note = getattr(exc, "add_note", None)  # Python >= 3.11
    if add_note is not None:
        add_note(f"retrywise: stopped ({reason})")


class _StreamState:
    """Reports a streamed response's outcome once: at its end, its failure, or its close."""

    def __init__(self, call: Call, response: Any, gate: StreamGate) -> None:
        self.call = call
        self.status = response.status_code
        self.headers = response.headers
        self.gate = gate
        self.delivered = False
        self.done = False

    def pass_on(self, chunk: bytes) -> bytes:
        """What the caller gets of ``chunk``: the gate reads an event stream to its
        end (an error event after output, malformed events skipped or ending it)."""
        out = self.gate.feed(chunk) if self.gate.watching else chunk
        if out:
            self.delivered = True
        return out

    @property
    def cut_short(self) -> bool:
        """A malformed event ended the stream (``streams.malformed_event: error``):
        nothing after it is delivered."""
        error = self.gate.stream_error
        return error is not None and error["code"] == "malformed_event"

    def end(self) -> BaseException | None:
        """The body ended: reports what the gate saw (a plain success, or the
        failure an error event named); returns an exception to raise when a
        malformed event ended the stream (never a truncated success)."""
        if self.done:
            return None
        self.done = True
        decision = self.call.report(**self.gate.outcome(self.status), headers=self.headers)
        if self.cut_short:
            return StreamInterrupted.from_decision(decision, provider_error=self.gate.stream_error)
        return None

    def failure(self, exc: BaseException) -> BaseException:
        """Reports a mid-body failure; returns the exception to raise."""
        if self.done:
            return exc
        self.done = True
        if is_cancellation(exc):
            self.call.cancel()
            return exc
        kind, _ = error_kind(exc, in_body=True)
        phase: Phase = "stream_visible" if self.delivered else "stream_open"
        decision = self.call.report(status=self.status, error=kind, headers=self.headers, phase=phase)
        if decision.action == "reconcile":
            stopped = Stopped.from_decision(decision, exception=exc)
            stopped.__cause__ = exc
            return stopped
        _note(exc, decision.reason)
        return exc

    def closed(self) -> None:
        """The consumer closed the stream before its end (an SDK stops at ``[DONE]``;
        an app breaks out of the loop): the upstream answered and nothing failed, so
        the attempt is a success as far as anyone saw."""
        self.end()


def _first_release(it: Iterator[bytes], gate: StreamGate, raw: list[bytes]) -> bytes | None:
    """The first bytes the caller may see: the gate holds a stream's preamble (a
    role-only delta, ``message_start``, pings) and an error event before output
    until its first meaningful event, so a cut before it is ``stream_open``.
    None when the body ended with nothing to show (``raw``: what came)."""
    for chunk in it:
        if chunk:
            raw.append(chunk)
            out = gate.feed(chunk)
            if out:
                return out
    return gate.finish() or None


async def _afirst_release(it: AsyncIterator[bytes], gate: StreamGate, raw: list[bytes]) -> bytes | None:
    async for chunk in it:
        if chunk:
            raw.append(chunk)
            out = gate.feed(chunk)
            if out:
                return out
    return gate.finish() or None


@functools.cache
def _stream_types(hx: Any) -> tuple[type, type]:
    """Stream wrappers for one httpx flavour (created once per flavour)."""

    class SyncStream(hx.SyncByteStream):  # type: ignore[misc]
        def __init__(self, first: bytes | None, rest: Iterator[bytes], inner: Any, state: _StreamState) -> None:
            self._first, self._rest, self._inner = first, rest, inner
            self._state = state

        def __iter__(self) -> Iterator[bytes]:
            state = self._state
            try:
                if self._first:
                    state.delivered = True
                    yield self._first
                for chunk in self._rest:
                    out = state.pass_on(chunk)
                    if out:
                        yield out
                    if state.cut_short:
                        break
                tail = state.gate.finish()
                if tail:
                    state.delivered = True
                    yield tail
            except GeneratorExit:
                state.closed()
                raise
            except BaseException as exc:
                err = state.failure(exc)
                if err is exc:
                    raise
                raise err from exc
            broken = state.end()
            if broken is not None:
                raise broken

        def close(self) -> None:
            self._state.closed()
            self._inner.close()

    class AsyncStream(hx.AsyncByteStream):  # type: ignore[misc]
        def __init__(self, first: bytes | None, rest: AsyncIterator[bytes], inner: Any, state: _StreamState) -> None:
            self._first, self._rest, self._inner = first, rest, inner
            self._state = state

        async def __aiter__(self) -> AsyncIterator[bytes]:
            state = self._state
            try:
                if self._first:
                    state.delivered = True
                    yield self._first
                async for chunk in self._rest:
                    out = state.pass_on(chunk)
                    if out:
                        yield out
                    if state.cut_short:
                        break
                tail = state.gate.finish()
                if tail:
                    state.delivered = True
                    yield tail
            except GeneratorExit:
                state.closed()
                raise
            except BaseException as exc:
                err = state.failure(exc)
                if err is exc:
                    raise
                raise err from exc
            broken = state.end()
            if broken is not None:
                raise broken

        async def aclose(self) -> None:
            self._state.closed()
            await self._inner.aclose()

    return SyncStream, AsyncStream


def handle_sync(d: _Driver, inner: Any, request: Any) -> Any:
    from ._engine import current_attempt

    call = d.begin()
    request.read()  # buffered once so every attempt can resend it
    base = dict(request.extensions.get("timeout") or {})
    last: Any = None
    last_exc: BaseException | None = None
    while True:
        try:
            attempt = d.next_attempt(call)
        except Stopped as stopped:
            return d.give_up(stopped, last, last_exc)
        d.prepare(request, attempt, base)
        token = current_attempt.set(attempt)
        try:
            try:
                response = inner.handle_request(request)
            except BaseException as exc:
                if is_cancellation(exc):
                    call.cancel()
                    raise
                kind, phase = error_kind(exc)
                decision = call.report(error=kind, phase=phase)
                last, last_exc = None, exc
            else:
                if d.is_streamed(response):
                    d.idle_timeout(request, attempt, base)
                    body = response.stream
                    rest = iter(body)
                    gate = d.engine.stream_gate(response.headers.get("content-type"))
                    held: list[bytes] = []
                    try:
                        first = _first_release(rest, gate, held)
                    except BaseException as exc:
                        # Broken before anything meaningful reached the caller: phase stream_open, retryable.
                        body.close()
                        if is_cancellation(exc):
                            call.cancel()
                            raise
                        kind, _ = error_kind(exc, in_body=True)
                        decision = call.report(
                            status=response.status_code, error=kind, headers=response.headers, phase="stream_open"
                        )
                        last, last_exc = None, exc
                    else:
                        if first is None and gate.stream_error is not None:
                            # An error event before any output: the attempt failed as the event says.
                            body.close()
                            decision = call.report(**gate.outcome(response.status_code), headers=response.headers)
                            last, last_exc = d.rebuild(response, b"".join(held), request), None
                        else:
                            state = _StreamState(call, response, gate)
                            response.stream = _stream_types(d.hx)[0](first, rest, body, state)
                            return response
                    if decision.action in _RETRY:
                        d.wait(decision)
                        continue
                    return d.final(decision, last, last_exc)
                try:
                    raw = b"".join(response.stream)
                except BaseException as exc:
                    response.stream.close()
                    if is_cancellation(exc):
                        call.cancel()
                        raise
                    kind, _ = error_kind(exc, in_body=True)
                    decision = call.report(status=response.status_code, error=kind, headers=response.headers)
                    last, last_exc = None, exc
                else:
                    response.stream.close()
                    last, last_exc = d.rebuild(response, raw, request), None
                    decision = call.report(
                        status=response.status_code, headers=response.headers, body=d.body_of(response, raw)
                    )
        finally:
            current_attempt.reset(token)
        if decision.action in _RETRY:
            d.wait(decision)
            continue
        return d.final(decision, last, last_exc)


async def handle_async(d: _Driver, inner: Any, request: Any) -> Any:
    from ._engine import current_attempt

    call = d.begin()
    await request.aread()
    base = dict(request.extensions.get("timeout") or {})
    last: Any = None
    last_exc: BaseException | None = None
    while True:
        try:
            attempt = await d.next_attempt_async(call)
        except Stopped as stopped:
            return d.give_up(stopped, last, last_exc)
        d.prepare(request, attempt, base)
        token = current_attempt.set(attempt)
        try:
            try:
                response = await inner.handle_async_request(request)
            except BaseException as exc:
                if is_cancellation(exc):
                    call.cancel()
                    raise
                kind, phase = error_kind(exc)
                decision = call.report(error=kind, phase=phase)
                last, last_exc = None, exc
            else:
                if d.is_streamed(response):
                    d.idle_timeout(request, attempt, base)
                    abody = response.stream
                    arest = abody.__aiter__()
                    agate = d.engine.stream_gate(response.headers.get("content-type"))
                    aheld: list[bytes] = []
                    try:
                        afirst = await _afirst_release(arest, agate, aheld)
                    except BaseException as exc:
                        # Broken before anything meaningful reached the caller: phase stream_open, retryable.
                        await abody.aclose()
                        if is_cancellation(exc):
                            call.cancel()
                            raise
                        kind, _ = error_kind(exc, in_body=True)
                        decision = call.report(
                            status=response.status_code, error=kind, headers=response.headers, phase="stream_open"
                        )
                        last, last_exc = None, exc
                    else:
                        if afirst is None and agate.stream_error is not None:
                            await abody.aclose()
                            decision = call.report(**agate.outcome(response.status_code), headers=response.headers)
                            last, last_exc = d.rebuild(response, b"".join(aheld), request), None
                        else:
                            astate = _StreamState(call, response, agate)
                            response.stream = _stream_types(d.hx)[1](afirst, arest, abody, astate)
                            return response
                    if decision.action in _RETRY:
                        try:
                            await d.wait_async(decision)
                        except BaseException:
                            call.cancel()
                            raise
                        continue
                    return d.final(decision, last, last_exc)
                try:
                    raw = b"".join([chunk async for chunk in response.stream])
                except BaseException as exc:
                    await response.stream.aclose()
                    if is_cancellation(exc):
                        call.cancel()
                        raise
                    kind, _ = error_kind(exc, in_body=True)
                    decision = call.report(status=response.status_code, error=kind, headers=response.headers)
                    last, last_exc = None, exc
                else:
                    await response.stream.aclose()
                    last, last_exc = d.rebuild(response, raw, request), None
                    decision = call.report(
                        status=response.status_code, headers=response.headers, body=d.body_of(response, raw)
                    )
        finally:
            current_attempt.reset(token)
        if decision.action in _RETRY:
            try:
                await d.wait_async(decision)
            except BaseException:
                call.cancel()
                raise
            continue
        return d.final(decision, last, last_exc)
