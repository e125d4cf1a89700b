"""Redis for a retrywise fleet: breakers, Retry-After cooldowns and rate-limit
state shared by every process, through Redis or Valkey (``pip install redis``).

    fleet = RedisFleet(engine.fleet(), "redis://127.0.0.1:6379/0").start()

The core plans each sync cycle (``Fleet.plan``) and merges its answers
(``Fleet.complete``); this module only runs the commands, on a daemon thread
(``RedisFleet``) or an asyncio task (``AsyncRedisFleet``): one pipeline per
cycle (the merge script per write, ``HGETALL`` per read, the claim script per
probe lease) under the fleet's ``timeout_ms``. Decisions never wait on Redis:
they read the engine's own state, which the cycles update. A cycle that fails
(Redis down, slow or refusing) is handed to ``Fleet.failed``: the engine keeps
deciding on local state, the failure is counted and evented, and the next
successful cycle writes everything again.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from ._retrywise import CLAIM_SCRIPT, MERGE_SCRIPT, Fleet
from .types import SyncPlan, SyncReport

try:
    import redis
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry as AsyncRetry
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError as e:  # pragma: no cover - the adapter needs the client
    raise ImportError("retrywise.fleet needs the redis package: pip install redis") from e

__all__ = ["CLAIM_SCRIPT", "MERGE_SCRIPT", "AsyncRedisFleet", "Fleet", "RedisFleet"]

_MERGE_SHA = hashlib.sha1(MERGE_SCRIPT.encode(), usedforsecurity=False).hexdigest()
_CLAIM_SHA = hashlib.sha1(CLAIM_SCRIPT.encode(), usedforsecurity=False).hexdigest()


class _Pipeline(Protocol):
    def script_load(self, script: str) -> Any: ...
    def evalsha(self, sha: str, numkeys: int, *keys_and_args: str | int) -> Any: ...
    def hgetall(self, name: str) -> Any: ...
    def ping(self) -> Any: ...


def _queue(pipe: _Pipeline, plan: SyncPlan, load: bool) -> None:
    """The plan's commands, in the order ``Fleet.complete`` takes the answers;
    the scripts are loaded first on a new connection (``EVALSHA`` after)."""
    if load:
        pipe.script_load(MERGE_SCRIPT)
        pipe.script_load(CLAIM_SCRIPT)
    for w in plan["writes"]:
        pipe.evalsha(_MERGE_SHA, 1, *w)
    for key in plan["reads"]:
        pipe.hgetall(key)
    for c in plan["claims"]:
        pipe.evalsha(_CLAIM_SHA, 1, *c)
    if not (load or plan["writes"] or plan["reads"] or plan["claims"]):
        pipe.ping()  # nothing to say or read: a PING keeps the health honest


def _answers(plan: SyncPlan, results: Sequence[Any], load: bool) -> tuple[list[Any], list[Any]]:
    start = (2 if load else 0) + len(plan["writes"])
    mid = start + len(plan["reads"])
    return list(results[start:mid]), list(results[mid : mid + len(plan["claims"])])


def _client(target: Any, timeout: float, asynchronous: bool) -> Any:
    """A client of its own for the adapter: from a URL, or with a given client's
    connection settings (its pool's handler objects left to it), the fleet's
    timeout on connecting, reading and writing, and no retries (a failed cycle
    is reported, and the next one tries again)."""
    module, retry = (aioredis, AsyncRetry) if asynchronous else (redis, Retry)
    options = {"socket_timeout": timeout, "socket_connect_timeout": timeout, "retry": retry(NoBackoff(), 0)}
    if isinstance(target, str):
        return module.Redis.from_url(target, **options)
    pool = target.connection_pool
    kw = {
        k: v
        for k, v in pool.connection_kwargs.items()
        if k not in ("maint_notifications_pool_handler", "himport_registry") and not k.startswith("orig_")
    }
    return module.Redis(connection_pool=type(pool)(connection_class=pool.connection_class, **{**kw, **options}))


class _Cycles:
    """What both adapters share: the fleet, their client, the cycle's two ends."""

    def __init__(self, fleet: Fleet, client: Any, asynchronous: bool) -> None:
        cfg = fleet.config
        self.fleet = fleet
        self._interval = cfg["interval_ms"] / 1000
        self._timeout = cfg["timeout_ms"] / 1000
        self._client = _client(client, self._timeout, asynchronous)
        self._load = True  # the scripts, on the next cycle (a new connection may lack them)

    def _begin(self) -> tuple[SyncPlan, Any]:
        plan = self.fleet.plan()
        pipe = self._client.pipeline(transaction=False)
        _queue(pipe, plan, self._load)
        return plan, pipe

    def _failed(self, plan: SyncPlan, e: Exception) -> None:
        self._load = True
        self.fleet.failed(plan["id"], f"{type(e).__name__}: {e}")

    def _completed(self, plan: SyncPlan, results: Sequence[Any]) -> SyncReport:
        load, self._load = self._load, False
        return self.fleet.complete(plan["id"], *_answers(plan, results, load))


class RedisFleet(_Cycles):
    """A fleet synced through Redis on a daemon thread, one cycle every ``interval_ms``.

    ``client`` is a URL (``redis://host:port/db``) or a ``redis.Redis``; the
    adapter opens its own connections with the same settings, the fleet's
    ``timeout_ms`` on connecting, reading and writing, and no retries.
    Nothing connects before the first cycle. Also a context manager (starts, stops).
    """

    def __init__(self, fleet: Fleet, client: str | redis.Redis) -> None:
        super().__init__(fleet, client, asynchronous=False)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sync_once(self) -> SyncReport:
        """Runs one cycle on this thread; returns what it changed locally. A
        failure is reported to the fleet first, then raised."""
        with self._lock:
            plan, pipe = self._begin()
            try:
                results = pipe.execute()
            except Exception as e:
                self._failed(plan, e)
                raise
            return self._completed(plan, results)

    def start(self) -> RedisFleet:
        """Starts the daemon thread (once); returns ``self``."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="retrywise-fleet", daemon=True)
            self._thread.start()
            # Out of the native code before the interpreter finalizes.
            atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """Stops the thread after its cycle in progress, and closes the connections."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            atexit.unregister(self.stop)
        self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            with contextlib.suppress(Exception):  # counted and evented by the fleet; the next cycle tries again
                self.sync_once()
            self._stop.wait(max(0.0, self._interval - (time.monotonic() - started)))

    def __enter__(self) -> RedisFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class AsyncRedisFleet(_Cycles):
    """A fleet synced through ``redis.asyncio`` on a task of the running loop.

    ``client`` is a URL or a ``redis.asyncio.Redis`` (its settings are copied,
    as ``RedisFleet`` does). Each cycle is bounded by ``timeout_ms`` as a whole.
    ``async with AsyncRedisFleet(...)`` starts and stops it.
    """

    def __init__(self, fleet: Fleet, client: str | aioredis.Redis) -> None:
        super().__init__(fleet, client, asynchronous=True)
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def sync_once(self) -> SyncReport:
        """Runs one cycle now; a failure is reported to the fleet, then raised."""
        async with self._lock:
            plan, pipe = self._begin()
            try:
                results = await asyncio.wait_for(pipe.execute(), self._timeout)
            except Exception as e:
                self._failed(plan, e)
                raise
            return self._completed(plan, results)

    def start(self) -> AsyncRedisFleet:
        """Starts the task on the running loop (once); returns ``self``."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="retrywise-fleet")
        return self

    async def stop(self) -> None:
        """Cancels the task and closes the connections."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._client.aclose()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            with contextlib.suppress(Exception):  # counted and evented by the fleet; the next cycle tries again
                await self.sync_once()
            await asyncio.sleep(max(0.0, self._interval - (loop.time() - started)))

    async def __aenter__(self) -> AsyncRedisFleet:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
