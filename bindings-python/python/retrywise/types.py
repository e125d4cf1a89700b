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
    """What any upstream serving the call must offer (``begin(needs=...)``)."""

    capabilities: list[str]
    input_tokens: int
    max_output_tokens: int
    data_boundary: str
    max_cost: float


class Mode(TypedDict):
    """The kill switch (``engine.mode()``)."""

    retries: bool
    fallback: bool
    hedging: bool


__all__ = [
    "ActionName",
    "ApiName",
    "BreakerStateName",
    "ContinuationName",
    "Effect",
    "ErrorClassName",
    "ErrorKind",
    "HeadersLike",
    "Idempotency",
    "Mode",
    "Needs",
    "OnFailureName",
    "Phase",
    "PolicyLike",
    "TimerName",
    "WaitSourceName",
]
