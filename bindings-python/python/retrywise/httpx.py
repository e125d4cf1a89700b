"""httpx transports that own retries for every request sent through them.

    engine = retrywise.Engine(policy)
    client = httpx.Client(transport=RetryTransport(engine, route="openai/gpt-4o", deadline_ms=20_000))
    openai.OpenAI(max_retries=0, http_client=client)   # the SDK's own loop off: one retry owner

Each request is one logical call (``engine.begin(route, request=read_request(...),
needs=..., **call_kwargs)``). ``route``: a route name, or a function of the request naming
one; without it the route is the ``routes`` map's for the request's ``model``, else
``engine.route_for_model(model)`` (the policy's ``models`` map, a route or upstream named
like it; an unknown model or route raises ``retrywise.PolicyError`` before any I/O). The
core reads each request once (``retrywise.read_request``): what it needs from any upstream
(streaming, tools, structured output, images, audio, files, its size, its wire family), so
a fallback that cannot serve it is skipped. ``needs``: a Needs dict, or a function of the
request giving one (or None), laid over what the request says (``{"capabilities":
["x-eu-only"]}``). Each attempt goes to the upstream the core chose
(URL, ``model`` and key rewritten from the policy catalog), with its timeouts from the
deadline, the propagation headers, and the core's decision on the outcome (Retry-After,
vendor codes from error bodies, stream phases; a silent upstream left for the fallback; a
stream broken after output continued on the fallback inside the same stream when the route
says ``stream_recovery: continue``, else ended with an error, never a truncated success).
On a final stop the last response is returned (or the last exception re-raised), so the SDK
raises its usual error; a result that may have been executed raises
``retrywise.ReconcileRequired``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import httpx

from ._transport import _Driver, handle_async, handle_sync

if TYPE_CHECKING:
    from ._engine import Engine
    from .types import Needs

__all__ = ["AsyncRetryTransport", "RetryTransport"]


class RetryTransport(httpx.BaseTransport):
    """Sync transport: ``RetryTransport(engine, route=None, transport=None, *, routes=None, needs=None,
    **call_kwargs)``. ``needs``: a Needs dict, or a function of the request giving one (or None).
    ``transport`` sends each attempt (default ``httpx.HTTPTransport()``)."""

    def __init__(
        self,
        engine: Engine,
        route: str | Callable[[httpx.Request], str] | None = None,
        transport: httpx.BaseTransport | None = None,
        *,
        routes: Mapping[str, str] | None = None,
        needs: Needs | Callable[[httpx.Request], Needs | None] | None = None,
        **call_kwargs: Any,
    ) -> None:
        self._driver = _Driver(httpx, engine, route, routes, needs, call_kwargs)
        self._inner = transport if transport is not None else httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response: httpx.Response = handle_sync(self._driver, self._inner, request)
        return response

    def close(self) -> None:
        self._inner.close()


class AsyncRetryTransport(httpx.AsyncBaseTransport):
    """Async transport: ``AsyncRetryTransport(engine, route=None, transport=None, *, routes=None, needs=None,
    **call_kwargs)``. ``needs``: a Needs dict, or a function of the request giving one (or None).
    ``transport`` sends each attempt (default ``httpx.AsyncHTTPTransport()``)."""

    def __init__(
        self,
        engine: Engine,
        route: str | Callable[[httpx.Request], str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        routes: Mapping[str, str] | None = None,
        needs: Needs | Callable[[httpx.Request], Needs | None] | None = None,
        **call_kwargs: Any,
    ) -> None:
        self._driver = _Driver(httpx, engine, route, routes, needs, call_kwargs)
        self._inner = transport if transport is not None else httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response: httpx.Response = await handle_async(self._driver, self._inner, request)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()
