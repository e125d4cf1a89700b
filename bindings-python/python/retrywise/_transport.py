"""The retry loop inside an httpx transport, shared by ``retrywise.httpx``
(httpx) and ``retrywise.httpx2`` (httpx2, used by current openai/anthropic
SDKs): both libraries have the same transport, stream and exception API, so
the flavour's module is passed in.

Per request: the request is read once by the core (``read_request``: its
family, model and what it needs: streaming, tools, structured output, media,
its size); the route comes from the transport's ``route`` (a name or a
callable), its ``routes`` map, or ``engine.route_for_model`` on the request's
``model``; an unknown model or route is an error before any I/O. The call
begins with the request's needs and the transport's ``needs`` over them, so a
fallback keeps what the request relies on. Per attempt: the
request goes to the upstream the core chose (the core's ``rewrite``: URL,
``model`` and the family's auth header from the policy catalog), with the
propagation headers and timeouts from the core (``extensions["timeout"]``,
never longer than the caller's own); error bodies are read so the core sees
vendor codes; JSON bodies are read inside the loop (a body that breaks, or a
2xx that does not parse, is still retryable); other bodies (server-sent
events) are read inside the loop up to their first meaningful event, the
preamble before it held back by the core's ``StreamGate`` (a stream that
breaks, stalls or stays silent past the first-token limit before any output
is still retried or left for the fallback), then relayed to the caller
(``_relay``: a break after output is continued elsewhere or ends the stream
with an error, never replayed).
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from ._errors import NotYet, Stopped, WireError
from ._outcomes import error_kind, is_cancellation, note_stop
from ._relay import AsyncRelay, Leg, Relay
from ._retrywise import Attempt, Call, Decision, RequestFacts, json_media_type, read_request, rewrite
from ._retrywise import Relay as StreamRelay

if TYPE_CHECKING:
    from ._engine import Engine
    from .types import ErrorKind, Needs

#: A transport's ``needs=``: a Needs dict for every request, or a function of
#: the request giving one (or None).
NeedsArg: TypeAlias = "Needs | Callable[[Any], Needs | None] | None"

_RETRY = ("retry", "fallback")


def _min(caller: float | None, ours: float) -> float:
    return ours if caller is None else min(caller, ours)


class _NoFirstToken(Exception):
    """A stream stayed without visible output past the attempt's first-token limit."""


class _Driver:
    """What the sync and async transports of one flavour share."""

    def __init__(
        self,
        hx: Any,
        engine: Engine,
        route: str | Callable[[Any], str] | None,
        routes: Mapping[str, str] | None,
        needs: NeedsArg,
        call_kwargs: dict[str, Any],
    ) -> None:
        if needs is not None and not callable(needs) and not isinstance(needs, Mapping):
            raise TypeError(
                f"argument 'needs': expected a Needs dict or a function of the request, got {type(needs).__name__}"
            )
        if "request" in call_kwargs:
            raise TypeError("argument 'request': the transport reads each request itself")
        self.hx = hx
        self.engine = engine
        self.route = route
        self.routes = dict(routes or {})
        self.needs_of: Callable[[Any], Needs | None] | None = needs if callable(needs) else None
        self.needs: Needs | None = None if callable(needs) else needs
        self.call_kwargs = call_kwargs
        #: Rewritten URLs, parsed once: a request goes to one of a few upstream URLs.
        self.urls: dict[str, Any] = {}

    def route_for(self, request: Any, facts: RequestFacts) -> str:
        """The route serving ``request``: the transport's own, the ``routes`` map's
        for the request's model, else the policy's (``engine.route_for_model``,
        which raises ``PolicyError`` for a model it does not know)."""
        if isinstance(self.route, str):
            return self.route
        if self.route is not None:
            return self.route(request)
        model = facts.model
        if model is None:
            raise ValueError(
                f"retrywise: {request.method} {request.url} names no model: give the transport route= (or routes=)"
            )
        if model in self.routes:
            return self.routes[model]
        return self.engine.route_for_model(model)

    def begin(self, request: Any) -> tuple[Call, RequestFacts]:
        """The call serving ``request`` (read once by the core: its family, model
        and needs), with the transport's ``needs`` laid over the request's. An
        unknown route raises ``PolicyError`` here, before any I/O."""
        facts = read_request(str(request.url), request.headers, request.content)
        needs = self.needs if self.needs_of is None else self.needs_of(request)
        call = self.engine.begin(self.route_for(request, facts), request=facts, needs=needs, **self.call_kwargs)
        return call, facts

    def build(
        self, call: Call, request: Any, attempt: Attempt, base: dict[str, Any], *, body: bytes | None = None
    ) -> Any:
        """The request for this attempt: as the SDK built it, or rewritten by the
        core for the upstream it chose (and with ``body`` in place of the SDK's).
        A request that cannot be rewritten (``WireError``: the key's variable is
        unset, ...) is a configuration error: the call is cancelled, the error raised."""
        try:
            return self._build(request, attempt, base, body)
        except WireError:
            call.cancel()
            raise

    def _build(self, request: Any, attempt: Attempt, base: dict[str, Any], body: bytes | None) -> Any:
        reach = attempt.reach
        if body is None and (reach is None or not reach.rewrites):
            self.prepare(request, attempt, base)
            return request
        method, url = request.method, str(request.url)
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() != "content-length"]
        content = request.content if body is None else body
        if reach is not None and reach.rewrites:
            w = rewrite(reach, method, url, headers, content)
            method, url, headers, content = w.method, w.url, w.headers, w.body
        out = self.hx.Request(
            method, self.url_of(url), headers=headers, content=content, extensions=dict(request.extensions)
        )
        self.prepare(out, attempt, base)
        return out

    def url_of(self, url: str) -> Any:
        """``url`` parsed (httpx's parse is most of a request's cost), kept for the next request."""
        parsed = self.urls.get(url)
        if parsed is None:
            if len(self.urls) >= 256:
                self.urls.clear()
            parsed = self.urls[url] = self.hx.URL(url)
        return parsed

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
    def idle_timeout(request: Any, attempt: Attempt, base: dict[str, Any], limit: float | None = None) -> None:
        """Between stream chunks the idle timeout applies, not the first-byte one
        (httpcore reads ``extensions["timeout"]`` once, when the body is read):
        ``limit`` shortens it to what is left of the first-token limit, so a
        silent stream is left in time; read once, that shorter limit also holds
        between chunks after the first output when ``first_token`` < ``idle``."""
        timeout = dict(request.extensions.get("timeout") or {})
        read = attempt.timeouts.idle if limit is None else min(attempt.timeouts.idle, limit)
        timeout["read"] = _min(base.get("read"), read)
        request.extensions["timeout"] = timeout

    @staticmethod
    def is_streamed(response: Any) -> bool:
        """Successful non-JSON bodies (server-sent events, downloads) go to the caller as a stream."""
        ctype = response.headers.get("content-type", "")
        return response.status_code < 400 and bool(ctype) and "json" not in ctype

    def rebuild(self, response: Any, raw: bytes, request: Any) -> Any:
        """The response over the bytes already read (its stream is consumed):
        the same object, its stream replaced (the client binds it to the
        caller's request when the transport returns it)."""
        response.stream = self.hx.ByteStream(raw)
        return response

    def body_of(self, response: Any, raw: bytes) -> bytes | None:
        """The decoded body the core reads: an error's (for its vendor code) or a
        JSON success's (a body that does not parse is ``malformed_response``).
        Bytes that do not decode are passed as they came."""
        headers = response.headers
        if response.status_code < 400 and not json_media_type(headers.get("content-type", "")):
            return None
        if "content-encoding" not in headers:
            return raw  # as sent: nothing to decode
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
            note_stop(exc, stopped.reason)
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
        note_stop(exc, decision.reason)
        raise exc


def _first_release(it: Iterator[bytes], core: StreamRelay, raw: list[bytes], first_token_at: float) -> bytes | None:
    """The first bytes the caller may see: the relay's gate holds a stream's
    preamble (a role-only delta, ``message_start``, pings) and an error event
    before output until its first meaningful event, so a cut before it is
    ``stream_open``. None when the body ended with nothing to show (``raw``:
    what came). Pings past ``first_token_at`` (monotonic) raise ``_NoFirstToken``."""
    for chunk in it:
        if chunk:
            raw.append(chunk)
            out = core.feed(chunk)
            if out:
                return out
            if time.monotonic() >= first_token_at:
                raise _NoFirstToken
    return core.finish() or None


async def _afirst_release(
    it: AsyncIterator[bytes], core: StreamRelay, raw: list[bytes], first_token_at: float
) -> bytes | None:
    async for chunk in it:
        if chunk:
            raw.append(chunk)
            out = core.feed(chunk)
            if out:
                return out
            if time.monotonic() >= first_token_at:
                raise _NoFirstToken
    return core.finish() or None


def _silent_kind(exc: BaseException, attempt: Attempt, first_token_at: float) -> ErrorKind:
    """What a stream that failed before output reports: past the first-token
    limit it was silent (the core's mapping of that timer), else as raised."""
    if isinstance(exc, _NoFirstToken) or (
        error_kind(exc, in_body=True)[0] == "stream_idle_timeout" and time.monotonic() >= first_token_at - 0.005
    ):
        return attempt.timer_error("first_token", True)
    return error_kind(exc, in_body=True)[0]


def _first_token_at(attempt: Attempt, sent: float) -> float:
    return sent + attempt.timeouts.first_token


def _leg(response: Any, rest: Any, first: bytes | None, sent: float, released: float) -> Leg:
    """The first leg of a relayed stream. ``sent``: when its request went;
    ``released`` when the gate released its first bytes (the attempt's time to
    first token)."""
    leg = Leg(response, rest, sent, first=first)
    if first:
        leg.first_token_s = released - sent
    return leg


def _relay_of(d: _Driver, facts: RequestFacts, response: Any) -> StreamRelay:
    """The core's relay for a streamed body: the policy's gate, a transcript of the request's family."""
    return StreamRelay(facts.family, d.engine.stream_gate(response.headers.get("content-type"), end_at_error=True))


def handle_sync(d: _Driver, inner: Any, request: Any) -> Any:
    from ._engine import current_attempt

    request.read()  # buffered once so every attempt can resend it
    call, facts = d.begin(request)
    base = dict(request.extensions.get("timeout") or {})
    last: Any = None
    last_exc: BaseException | None = None
    while True:
        try:
            attempt = d.next_attempt(call)
        except Stopped as stopped:
            return d.give_up(stopped, last, last_exc)
        req = d.build(call, request, attempt, base)
        token = current_attempt.set(attempt)
        try:
            sent = time.monotonic()
            try:
                response = inner.handle_request(req)
            except BaseException as exc:
                if is_cancellation(exc):
                    call.cancel()
                    raise
                kind, phase = error_kind(exc)
                decision = call.report(error=kind, phase=phase)
                last, last_exc = None, exc
            else:
                if d.is_streamed(response):
                    first_token_at = _first_token_at(attempt, sent)
                    d.idle_timeout(req, attempt, base, first_token_at - time.monotonic())
                    body = response.stream
                    rest = iter(body)
                    core = _relay_of(d, facts, response)
                    held: list[bytes] = []
                    try:
                        first = _first_release(rest, core, held, first_token_at)
                        released = time.monotonic()
                    except BaseException as exc:
                        # Broken or silent before anything meaningful reached the caller: stream_open.
                        body.close()
                        if is_cancellation(exc):
                            call.cancel()
                            raise
                        kind = _silent_kind(exc, attempt, first_token_at)
                        decision = call.report(
                            status=response.status_code, error=kind, headers=response.headers, phase="stream_open"
                        )
                        last, last_exc = None, exc
                    else:
                        if first is None and core.stream_error is not None:
                            # An error event before any output: the attempt failed as the event says.
                            body.close()
                            decision = call.report(**core.outcome(response.status_code), headers=response.headers)
                            last, last_exc = d.rebuild(response, b"".join(held), req), None
                        else:
                            leg = _leg(response, rest, first, sent, released)
                            relay = Relay(d, inner, call, request, base, core, leg)
                            response.stream = _stream_types(d.hx)[0](relay)
                            return response
                else:
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
                        last, last_exc = d.rebuild(response, raw, req), None
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

    await request.aread()
    call, facts = d.begin(request)
    base = dict(request.extensions.get("timeout") or {})
    last: Any = None
    last_exc: BaseException | None = None
    while True:
        try:
            attempt = await d.next_attempt_async(call)
        except Stopped as stopped:
            return d.give_up(stopped, last, last_exc)
        req = d.build(call, request, attempt, base)
        token = current_attempt.set(attempt)
        try:
            sent = time.monotonic()
            try:
                response = await inner.handle_async_request(req)
            except BaseException as exc:
                if is_cancellation(exc):
                    call.cancel()
                    raise
                kind, phase = error_kind(exc)
                decision = call.report(error=kind, phase=phase)
                last, last_exc = None, exc
            else:
                if d.is_streamed(response):
                    first_token_at = _first_token_at(attempt, sent)
                    d.idle_timeout(req, attempt, base, first_token_at - time.monotonic())
                    abody = response.stream
                    arest = abody.__aiter__()
                    acore = _relay_of(d, facts, response)
                    aheld: list[bytes] = []
                    try:
                        afirst = await _afirst_release(arest, acore, aheld, first_token_at)
                        areleased = time.monotonic()
                    except BaseException as exc:
                        await abody.aclose()
                        if is_cancellation(exc):
                            call.cancel()
                            raise
                        kind = _silent_kind(exc, attempt, first_token_at)
                        decision = call.report(
                            status=response.status_code, error=kind, headers=response.headers, phase="stream_open"
                        )
                        last, last_exc = None, exc
                    else:
                        if afirst is None and acore.stream_error is not None:
                            await abody.aclose()
                            decision = call.report(**acore.outcome(response.status_code), headers=response.headers)
                            last, last_exc = d.rebuild(response, b"".join(aheld), req), None
                        else:
                            aleg = _leg(response, arest, afirst, sent, areleased)
                            arelay = AsyncRelay(d, inner, call, request, base, acore, aleg)
                            response.stream = _stream_types(d.hx)[1](arelay)
                            return response
                else:
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
                        last, last_exc = d.rebuild(response, raw, req), None
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


@functools.cache
def _stream_types(hx: Any) -> tuple[type, type]:
    """The caller's stream for one httpx flavour (created once per flavour): a relay's chunks."""

    class SyncStream(hx.SyncByteStream):  # type: ignore[misc]
        def __init__(self, relay: Relay) -> None:
            self._relay = relay

        def __iter__(self) -> Iterator[bytes]:
            return self._relay.chunks()

        def close(self) -> None:
            self._relay.close()

    class AsyncStream(hx.AsyncByteStream):  # type: ignore[misc]
        def __init__(self, relay: AsyncRelay) -> None:
            self._relay = relay

        def __aiter__(self) -> AsyncIterator[bytes]:
            return self._relay.chunks()

        async def aclose(self) -> None:
            await self._relay.aclose()

    return SyncStream, AsyncStream
