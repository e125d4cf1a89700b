"""httpx transports that own retries for every request sent through them.

    engine = retrywise.Engine(policy)
    client = httpx.Client(transport=RetryTransport(engine, route="openai/gpt-4o", deadline_ms=20_000))
    openai.OpenAI(max_retries=0, http_client=client)   # the SDK's own loop off: one retry owner

Each request is one logical call (``engine.begin(route, **call_kwargs)``); each attempt gets
its timeouts from the deadline, the propagation headers, and the core's decision on the
outcome (Retry-After, vendor codes from error bodies, stream phases). On a final stop the
last response is returned (or the last exception re-raised), so the SDK raises its usual
error; a result that may have been executed raises ``retrywise.ReconcileRequired``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

from ._transport import _Driver, handle_async, handle_sync

if TYPE_CHECKING:
    from ._engine import Engine

__all__ = ["AsyncRetryTransport", "RetryTransport"]


class RetryTransport(httpx.BaseTransport):
    """Sync transport: ``RetryTransport(engine, route, transport=None, **call_kwargs)``.
    ``transport`` sends each attempt (default ``httpx.HTTPTransport()``)."""

    def __init__(
        self, engine: Engine, route: str, transport: httpx.BaseTransport | None = None, **call_kwargs: Any
    ) -> None:
        self._driver = _Driver(httpx, engine, route, call_kwargs)
        self._inner = transport if transport is not None else httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response: httpx.Response = handle_sync(self._driver, self._inner, request)
        return response

    def close(self) -> None:
        self._inner.close()


class AsyncRetryTransport(httpx.AsyncBaseTransport):
    """Async transport: ``AsyncRetryTransport(engine, route, transport=None, **call_kwargs)``.
    ``transport`` sends each attempt (default ``httpx.AsyncHTTPTransport()``)."""

    def __init__(
        self, engine: Engine, route: str, transport: httpx.AsyncBaseTransport | None = None, **call_kwargs: Any
    ) -> None:
        self._driver = _Driver(httpx, engine, route, call_kwargs)
        self._inner = transport if transport is not None else httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response: httpx.Response = await handle_async(self._driver, self._inner, request)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()
