"""Names of the retrywise vocabulary as typing aliases, for annotating code
that builds ``report`` arguments or reads decisions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeAlias, TypedDict

Idempotency: TypeAlias = Literal["safe", "keyed", "unsafe"]
Phase: TypeAlias = Literal["before_send", "sent", "headers", "stream_open", "stream_visible"]
ErrorKind: TypeAlias = Literal[
    "dns",
    "connect",
    "tls",
    "write",
    "connect_timeout",
    "first_byte_timeout",
    "stream_idle_timeout",
    "deadline_exceeded",
    "connection_reset",
    "cancelled",
    "malformed_response",
    "other",
]
Effect: TypeAlias = Literal["none", "pending", "confirmed", "unknown"]
#: ``wait``: a hedge sibling is still in flight; its report decides (``sibling_in_flight``).
ActionName: TypeAlias = Literal["succeeded", "retry", "fallback", "stop", "reconcile", "wait"]
#: How a broken stream is continued on another upstream: its text as an assistant
#: prefill, or a user message asking to continue after it.
ContinuationName: TypeAlias = Literal["prefill", "instruction"]
#: An upstream's API family (how a request for it is shaped and authenticated).
ApiName: TypeAlias = Literal["openai", "anthropic", "azure_openai"]
#: The endpoint a request's path names (``RequestFacts.endpoint``).
EndpointName: TypeAlias = Literal["chat_completions", "responses", "completions", "embeddings", "messages"]
#: A timer of one attempt (``attempt.timer_error``).
TimerName: TypeAlias = Literal["connect", "first_byte", "first_token", "idle", "total"]
ErrorClassName: TypeAlias = Literal[
    "rate_limit",
    "transient",
    "overloaded",
    "invalid_request",
    "auth_or_policy",
    "partial_stream",
    "result_unknown",
    "deadline_exceeded",
    "cancelled",
]
WaitSourceName: TypeAlias = Literal["none", "retry_after", "jitter"]
OnFailureName: TypeAlias = Literal["fail", "manual_review"]
BreakerStateName: TypeAlias = Literal[
    "closed", "open", "half_open", "forced_open", "forced_closed", "disabled", "metrics_only"
]
#: A dict, ``httpx.Headers`` (repeated headers kept), any mapping, or (name, value) pairs.
HeadersLike: TypeAlias = "Mapping[str, str] | Mapping[bytes, bytes] | Iterable[tuple[str | bytes, str | bytes]]"
#: A dict, or a JSON / YAML / TOML document; ``None`` for the defaults.
PolicyLike: TypeAlias = "Mapping[str, Any] | str | bytes | None"


class Needs(TypedDict, total=False):
    """What any upstream serving the call must offer (``begin(needs=...)``,
    ``RequestFacts.needs``, a transport's ``needs=``). ``capabilities`` come
    from the vocabulary (``streaming``, ``tool_calling``, ``json_schema``,
    ``json_mode``, ``vision``, ``audio``, ``file_input``, ``assistant_prefill``,
    custom ones ``x-...``); ``api`` is the request's wire family: a candidate
    declaring another is skipped. Any other key is an error naming it."""

    capabilities: list[str]
    api: ApiName
    input_tokens: int
    max_output_tokens: int
    data_boundary: str
    max_cost: float


class Mode(TypedDict):
    """The kill switch (``engine.mode()``)."""

    retries: bool
    fallback: bool
    hedging: bool


class FleetConfig(TypedDict):
    """How an instance takes part in a fleet (``Fleet.config``; ``engine.fleet(**config)``
    takes any of these keys)."""

    instance: str
    namespace: str
    quorum: int
    quorum_window_ms: int
    interval_ms: int
    timeout_ms: int
    probe_lease_ms: int


class SyncPlan(TypedDict):
    """One sync cycle's commands (``Fleet.plan``): each write is ``EVALSHA`` of the
    merge script with ``(key, field, value, ttl_ms)``, each read an ``HGETALL``,
    each claim the claim script with ``(key, value, now_ms, ttl_ms)``."""

    id: int
    writes: list[tuple[str, str, str, int]]
    reads: list[str]
    claims: list[tuple[str, str, int, int]]


class SyncReport(TypedDict):
    """What one completed cycle changed locally (``Fleet.complete``)."""

    opened: int
    extended: int
    recovered: int
    leases_won: int
    leases_lost: int
    limits: int


class FleetStats(SyncReport):
    """A fleet attachment's counters (``Fleet.stats``): every completed cycle's
    report summed, and the cycles' own."""

    instance: str
    healthy: bool
    cycles: int
    failures: int
    consecutive_failures: int
    last_sync_ms: int
    writes: int


__all__ = [
    "ActionName",
    "ApiName",
    "BreakerStateName",
    "ContinuationName",
    "Effect",
    "EndpointName",
    "ErrorClassName",
    "ErrorKind",
    "FleetConfig",
    "FleetStats",
    "HeadersLike",
    "Idempotency",
    "Mode",
    "Needs",
    "OnFailureName",
    "Phase",
    "PolicyLike",
    "SyncPlan",
    "SyncReport",
    "TimerName",
    "WaitSourceName",
]
