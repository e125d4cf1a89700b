"""httpx2 transports that own retries for every request sent through them.

    engine = retrywise.Engine(policy)
    client = httpx2.Client(transport=RetryTransport(engine, route="openai/gpt-4o", deadline_ms=20_000))
    openai.OpenAI(max_retries=0, http_client=client)   # the SDK's own loop off: one retry owner

The same transports as ``retrywise.httpx`` (routes per request, each request's
needs read by the core and the caller's ``needs=`` over them, attempts sent to the
upstream the core chose, streams relayed and continued), for httpx2's types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import httpx2

from ._transport import _Driver, handle_async, handle_sync

if TYPE_CHECKING:
    from ._engine import Engine
    from .types import Needs

__all__ = ["AsyncRetryTransport", "RetryTransport"]


class RetryTransport(httpx2.BaseTransport):
    """Sync transport: ``RetryTransport(engine, route=None, transport=None, *, routes=None, needs=None,
    **call_kwargs)``. ``needs``: a Needs dict, or a function of the request giving one (or None).
    ``transport`` sends each attempt (default ``httpx2.HTTPTransport()``)."""

    def __init__(
        self,
        engine: Engine,
        route: str | Callable[[httpx2.Request], str] | None = None,
        transport: httpx2.BaseTransport | None = None,
        *,
        routes: Mapping[str, str] | None = None,
        needs: Needs | Callable[[httpx2.Request], Needs | None] | None = None,
        **call_kwargs: Any,
    ) -> None:
        self._driver = _Driver(httpx2, engine, route, routes, needs, call_kwargs)
        self._inner = transport if transport is not None else httpx2.HTTPTransport()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response: httpx2.Response = handle_sync(self._driver, self._inner, request)
        return response

    def close(self) -> None:
        self._inner.close()


class AsyncRetryTransport(httpx2.AsyncBaseTransport):
    """Async transport: ``AsyncRetryTransport(engine, route=None, transport=None, *, routes=None, needs=None,
    **call_kwargs)``. ``needs``: a Needs dict, or a function of the request giving one (or None).
    ``transport`` sends each attempt (default ``httpx2.AsyncHTTPTransport()``)."""

    def __init__(
        self,
        engine: Engine,
        route: str | Callable[[httpx2.Request], str] | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
        *,
        routes: Mapping[str, str] | None = None,
        needs: Needs | Callable[[httpx2.Request], Needs | None] | None = None,
        **call_kwargs: Any,
    ) -> None:
        self._driver = _Driver(httpx2, engine, route, routes, needs, call_kwargs)
        self._inner = transport if transport is not None else httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response: httpx2.Response = await handle_async(self._driver, self._inner, request)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()
