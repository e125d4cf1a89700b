"""retrywise: one retry owner for model-API calls.

The Rust core decides every retry (classify, deadline, backoff, budget,
breaker, fallback); this package translates types and adds Python idioms:
sleeping, asyncio, exceptions, context propagation and httpx transports.

    engine = retrywise.Engine({"max_attempts": 3})
    call = engine.begin("openai/gpt-4o", deadline_ms=10_000)
    while True:
        attempt = call.next_attempt()          # or raises retrywise.Stopped
        ...                                    # send with attempt.timeouts / attempt.headers
        d = call.report(status=resp.status_code, headers=resp.headers)
        if d.action == "succeeded": break
        if d.action in ("retry", "fallback"): time.sleep(d.delay_s); continue
        # (next_attempt raises retrywise.NotYet, a Stopped with wait_s: sleep, ask again)
        raise retrywise.Stopped.from_decision(d)

or simply ``engine.run(fn, route=...)`` / ``await engine.run_async(fn, route=...)``,
or ``retrywise.httpx.RetryTransport`` under the openai / anthropic SDKs.
Breakers and cooldowns are shared across processes by ``retrywise.fleet`` (Redis).
"""

from ._engine import Engine, current_attempt
from ._errors import (
    InternalError,
    NotYet,
    PolicyError,
    ReconcileRequired,
    RetrywiseError,
    Stopped,
    StreamInterrupted,
    WireError,
)
from ._retrywise import (
    Attempt,
    Call,
    Decision,
    Fleet,
    HedgePlan,
    Reach,
    RequestFacts,
    Splicer,
    StreamGate,
    Timeouts,
    Transcript,
    WireRequest,
    __version__,
    api_family,
    continuation_body,
    derive_idempotency_key,
    json_media_type,
    params_digest,
    policy_schema,
    read_request,
    rewrite,
    vendor_code_from_body,
)

__all__ = [
    "Attempt",
    "Call",
    "Decision",
    "Engine",
    "Fleet",
    "HedgePlan",
    "InternalError",
    "NotYet",
    "PolicyError",
    "Reach",
    "ReconcileRequired",
    "RequestFacts",
    "RetrywiseError",
    "Splicer",
    "Stopped",
    "StreamGate",
    "StreamInterrupted",
    "Timeouts",
    "Transcript",
    "WireError",
    "WireRequest",
    "__version__",
    "api_family",
    "continuation_body",
    "current_attempt",
    "derive_idempotency_key",
    "json_media_type",
    "params_digest",
    "policy_schema",
    "read_request",
    "rewrite",
    "vendor_code_from_body",
]
