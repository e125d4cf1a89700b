"""Type stubs for the native module ``retrywise._retrywise`` (PyO3)."""

from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from os import PathLike
from typing import Any, Literal, final

from typing_extensions import Self, disjoint_base

from .types import (
    ActionName,
    ApiName,
    BreakerStateName,
    ContinuationName,
    Effect,
    EndpointName,
    ErrorClassName,
    ErrorKind,
    FleetConfig,
    FleetStats,
    HeadersLike,
    Idempotency,
    Mode,
    Needs,
    OnFailureName,
    Phase,
    PolicyLike,
    SyncPlan,
    SyncReport,
    TimerName,
    WaitSourceName,
)

__all__ = [
    "CLAIM_SCRIPT",
    "MERGE_SCRIPT",
    "Attempt",
    "Call",
    "Decision",
    "Engine",
    "Fleet",
    "HedgePlan",
    "Reach",
    "Relay",
    "RequestFacts",
    "Splicer",
    "StreamGate",
    "Timeouts",
    "Transcript",
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

__version__: str

#: Merges one instance's record into a scope's hash (``KEYS[1]``; ``ARGV``: instance,
#: record, TTL in ms): the later record wins, the key lives as long as its latest.
MERGE_SCRIPT: str
#: Claims a scope's probe lease (``SET NX PX``, a lease past its stated end counts as
#: absent); returns nil when the claim took it, else the holder's value.
CLAIM_SCRIPT: str

#: The attempt in progress in this context (set by ``run``, ``run_async`` and the
#: httpx transports); ``begin`` nests a call begun while it is set.
current_attempt: ContextVar[Attempt | None]

@final
class Timeouts:
    """Per-attempt timeouts, each clamped to what is left of the deadline."""

    @property
    def connect(self) -> float: ...
    @property
    def first_byte(self) -> float: ...
    @property
    def first_token(self) -> float:
        """Request sent -> first visible output of a stream (pings do not count)."""
    @property
    def idle(self) -> float: ...
    @property
    def total(self) -> float: ...
    @property
    def connect_ms(self) -> int: ...
    @property
    def first_byte_ms(self) -> int: ...
    @property
    def first_token_ms(self) -> int: ...
    @property
    def idle_ms(self) -> int: ...
    @property
    def total_ms(self) -> int: ...
    def to_dict(self) -> dict[str, float]: ...

@final
class Attempt:
    """One physical attempt to make now."""

    @property
    def number(self) -> int: ...
    @property
    def upstream(self) -> str: ...
    @property
    def timeouts(self) -> Timeouts: ...
    @property
    def headers(self) -> dict[str, str]:
        """Propagation headers: ``retrywise-deadline-ms``, ``retrywise-request-id``,
        ``retrywise-attempt`` and ``idempotency-key``."""
    @property
    def hedge(self) -> bool: ...
    @property
    def fallback(self) -> bool: ...
    @property
    def request_id(self) -> str: ...
    @property
    def idempotency_key(self) -> str | None: ...
    @property
    def remaining_s(self) -> float: ...
    @property
    def remaining_ms(self) -> int: ...
    @property
    def reach(self) -> Reach | None:
        """How to reach this attempt's upstream (None for an attempt not made by an engine's call)."""
    def timer_error(self, timer: TimerName, body_started: bool) -> ErrorKind:
        """The ErrorKind to report when one of this attempt's timers expired."""

@final
class Decision:
    """What the caller must do after reporting an attempt."""

    @property
    def action(self) -> ActionName: ...
    @property
    def delay_s(self) -> float: ...
    @property
    def delay_ms(self) -> int: ...
    @property
    def error_class(self) -> ErrorClassName | None: ...
    @property
    def reason(self) -> str: ...
    @property
    def upstream(self) -> str | None: ...
    @property
    def wait_source(self) -> WaitSourceName: ...
    @property
    def retry_after_s(self) -> float | None: ...
    @property
    def retry_after_ms(self) -> int | None: ...
    @property
    def on_failure(self) -> OnFailureName | None: ...
    @property
    def detail(self) -> str | None: ...
    @property
    def attempt(self) -> int: ...
    @property
    def hedge(self) -> bool: ...
    @property
    def excluded(self) -> list[tuple[str, str]]: ...
    @property
    def continuation(self) -> ContinuationName | None:
        """How the next attempt continues a broken stream (None: it starts afresh)."""
    @property
    def is_final(self) -> bool: ...
    def to_dict(self) -> dict[str, Any]: ...

@final
class HedgePlan:
    """Whether a hedged attempt may start now."""

    @property
    def action(self) -> Literal["start", "after", "no"]: ...
    @property
    def attempt(self) -> Attempt | None: ...
    @property
    def after_s(self) -> float | None: ...
    @property
    def after_ms(self) -> int | None: ...
    @property
    def reason(self) -> str | None: ...

@final
class StreamGate:
    """Holds a streamed body's preamble (a role-only delta, ``message_start``,
    pings) until its first meaningful event, so a cut before it is
    ``stream_open`` and may be retried. Only ``text/event-stream`` bodies are
    held back; others pass through."""

    def __new__(
        cls,
        content_type: str | None = None,
        *,
        malformed_event: Literal["skip", "error"] | None = None,
        end_at_error: bool = False,
    ) -> Self: ...
    def feed(self, chunk: bytes | bytearray) -> bytes:
        """Bytes received in; what the consumer may see now out (empty while holding)."""
    def finish(self) -> bytes:
        """The body ended: everything still held."""
    @property
    def visible(self) -> bool: ...
    @property
    def may_hold(self) -> bool:
        """Whether feeding may still hold bytes back (an event stream before its first meaningful event)."""
    @property
    def watching(self) -> bool:
        """Whether the gate still reads what it is fed (keep feeding while true)."""
    @property
    def skipped(self) -> int:
        """Malformed events dropped so far."""
    @property
    def stream_error(self) -> dict[str, Any] | None:
        """The error event the stream carried: ``code``, ``message``, ``after_output``, ``status``."""
    def outcome(self, status: int) -> dict[str, Any]:
        """``call.report(**gate.outcome(status))`` for an attempt whose body ended now."""
    def end_outcome(self, status: int, transcript: Transcript) -> dict[str, Any]:
        """``call.report(**gate.end_outcome(status, transcript))`` for an attempt
        whose body ended cleanly now: output shown without its finish was cut."""
    @property
    def phase(self) -> Literal["stream_open", "stream_visible"]: ...
    @property
    def held(self) -> int: ...

@final
class Relay:
    """A streamed answer on its way to the caller, leg by leg: each chunk
    through the leg's gate, a continuation's splicer and the transcript of
    what the caller received, in one call."""

    def __new__(cls, api: ApiName, gate: StreamGate) -> Self: ...
    def continue_with(self, gate: StreamGate) -> None:
        """The next leg, a continuation: spliced into what the caller has."""
    def feed(self, chunk: bytes | bytearray) -> bytes:
        """Bytes of the leg's body in; the bytes for the caller now out (``chunk`` itself when unchanged)."""
    def finish(self) -> bytes:
        """The leg's body ended: what is still held."""
    @property
    def cut_short(self) -> bool:
        """The gate ended the leg: nothing after it goes to the caller."""
    @property
    def phase(self) -> Literal["stream_open", "stream_visible"]: ...
    def end_outcome(self, status: int) -> dict[str, Any]:
        """``call.report(**relay.end_outcome(status))`` for a leg whose body ended cleanly."""
    def outcome(self, status: int) -> dict[str, Any]:
        """``call.report(**relay.outcome(status))``: the status, or the failure an error event named."""
    @property
    def stream_error(self) -> dict[str, Any] | None: ...
    @property
    def transcript(self) -> Transcript:
        """What the caller received so far (a copy)."""
    @property
    def text(self) -> str: ...
    @property
    def resumable(self) -> bool: ...
    @property
    def api(self) -> ApiName: ...

@final
class Reach:
    """How to reach one upstream, from the policy catalog (``engine.reach(name)``)."""

    @property
    def upstream(self) -> str: ...
    @property
    def base_url(self) -> str | None: ...
    @property
    def api(self) -> ApiName | None: ...
    @property
    def model(self) -> str | None: ...
    @property
    def api_key_env(self) -> str | None: ...
    @property
    def api_version(self) -> str | None: ...
    @property
    def prefill(self) -> bool: ...
    @property
    def rewrites(self) -> bool: ...
    @property
    def api_key(self) -> str | None:
        """The key, read now from the environment variable ``api_key_env`` names."""

@final
class WireRequest:
    """A request as an SDK built it, or as ``rewrite`` made it."""

    @property
    def method(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def headers(self) -> list[tuple[str, str]]: ...
    @property
    def body(self) -> bytes: ...

@final
class Transcript:
    """What a streamed answer delivered to the caller so far."""

    def __new__(cls, api: ApiName) -> Self: ...
    def observe(self, delivered: bytes | bytearray) -> None: ...
    @property
    def api(self) -> ApiName: ...
    @property
    def text(self) -> str: ...
    @property
    def resumable(self) -> bool: ...
    @property
    def finished(self) -> bool: ...
    @property
    def usage(self) -> dict[str, int | None] | None: ...
    @property
    def model(self) -> str | None: ...

@final
class RequestFacts:
    """What a request an SDK built says about itself (``read_request``): read
    once, passed to ``Engine.begin(request=...)``."""

    @property
    def family(self) -> ApiName:
        """The wire family it was built for (from the URL and headers)."""
    @property
    def endpoint(self) -> EndpointName | None:
        """The endpoint its path names."""
    @property
    def model(self) -> str | None:
        """The body's ``model``, when it names one."""
    @property
    def needs(self) -> Needs:
        """What any upstream serving it must offer: ``capabilities`` and ``api``
        always, ``input_tokens`` (an estimate that errs low) and
        ``max_output_tokens`` when read."""

@final
class Splicer:
    """Turns a fallback's stream into the rest of the caller's stream."""

    def __new__(cls, api: ApiName, transcript: Transcript) -> Self: ...
    def feed(self, chunk: bytes | bytearray) -> bytes: ...
    def finish(self) -> bytes: ...
    @property
    def deduplicated(self) -> int: ...

@final
class Call:
    """One logical request (owned by one thread or task at a time)."""

    def next_attempt(self) -> Attempt:
        """The next attempt, or raises ``retrywise.Stopped``."""
    def report(
        self,
        status: int | None = None,
        error: ErrorKind | None = None,
        headers: HeadersLike | None = None,
        phase: Phase | None = None,
        vendor_code: str | None = None,
        effect: Effect | None = None,
        input_tokens: int | None = None,
        body: bytes | bytearray | str | None = None,
        *,
        ok: bool | None = None,
        attempt: int | None = None,
        resumable: bool | None = None,
        continuation: ContinuationName | None = None,
        first_token_s: float | None = None,
    ) -> Decision:
        """Reports the attempt in flight (``attempt=n`` for a hedge) and returns the decision.

        ``body`` (decoded): an error body gives its vendor code; a success body
        whose ``content-type`` header is JSON and does not parse is reported as
        ``malformed_response``. ``first_token_s``: a streamed answer's first
        visible output came this long after its request was sent."""
    def cancel(self) -> Decision: ...
    def next_hedge(self) -> HedgePlan: ...
    @property
    def id(self) -> str: ...
    @property
    def attempts(self) -> int: ...
    @property
    def remaining_s(self) -> float: ...
    @property
    def is_finished(self) -> bool: ...
    @property
    def is_owner(self) -> bool: ...
    @property
    def target(self) -> str: ...
    @property
    def policy_version(self) -> str: ...
    @property
    def final_decision(self) -> Decision | None: ...

@final
class Fleet:
    """An engine's attachment to a fleet (``engine.fleet(...)``): the core plans each
    sync cycle and merges its answers; ``retrywise.fleet`` runs the Redis commands."""

    def plan(self) -> SyncPlan:
        """The next cycle's commands; a plan not yet answered is abandoned."""
    def complete(
        self,
        id: int,
        reads: Iterable[Mapping[str, str] | Mapping[bytes, bytes] | None],
        claims: Iterable[str | bytes | None],
    ) -> SyncReport:
        """Takes plan ``id``'s answers (``HGETALL`` per read, the claim script's per claim)."""
    def failed(self, id: int, error: object) -> None:
        """Cycle ``id`` failed: decisions stay local; counted, evented, written again next time."""
    def healthy(self) -> bool:
        """True while the last cycle succeeded."""
    def stats(self) -> FleetStats: ...
    @property
    def config(self) -> FleetConfig: ...
    @property
    def staleness_bound_ms(self) -> int:
        """Longest a change on one instance takes to reach another while the store is up."""

@disjoint_base
class Engine:
    """The shared retry owner (subclassed by ``retrywise.Engine``)."""

    def __new__(
        cls, policy: PolicyLike = None, *, seed: int | None = None, manual_clock: bool | None = None
    ) -> Self: ...
    @classmethod
    def from_file(
        cls, path: str | PathLike[str], *, seed: int | None = None, manual_clock: bool | None = None
    ) -> Self: ...
    def begin(
        self,
        route: str,
        *,
        deadline_ms: int | None = None,
        idempotency: Idempotency | None = None,
        tenant: str | None = None,
        task: str | None = None,
        idempotency_key: str | None = None,
        priority: str | None = None,
        params: Mapping[str, Any] | None = None,
        needs: Needs | None = None,
        inbound_headers: HeadersLike | None = None,
        parent: Attempt | None = None,
        request: RequestFacts | None = None,
    ) -> Call:
        """Begins one logical request. ``request``: its ``RequestFacts``, whose needs
        the call keeps with ``needs`` laid over them. A route the policy does not
        know raises ``PolicyError`` naming the known routes."""
    def route_for_model(self, model: str) -> str:
        """The route (or upstream) serving requests for ``model``; ``PolicyError`` when none does."""
    def reach(self, upstream: str) -> Reach:
        """How to reach ``upstream`` (from the policy catalog)."""
    def stream_gate(self, content_type: str | None = None, *, end_at_error: bool = False) -> StreamGate:
        """A stream gate reading malformed events as the policy says (``streams.malformed_event``)."""
    def fleet(
        self,
        *,
        instance: str | None = None,
        namespace: str | None = None,
        quorum: int | None = None,
        quorum_window_ms: int | None = None,
        interval_ms: int | None = None,
        timeout_ms: int | None = None,
        probe_lease_ms: int | None = None,
    ) -> Fleet:
        """Attaches this engine to a fleet (at most once); see ``retrywise.fleet``."""
    def stats(self) -> dict[str, Any]: ...
    def prometheus(self) -> str: ...
    def on_event(self, callback: Callable[[dict[str, Any]], object]) -> int: ...
    def remove_sink(self, id: int) -> bool: ...
    def events(self) -> list[dict[str, Any]]: ...
    def drain_events(self) -> list[dict[str, Any]]: ...
    def reload(self, policy: PolicyLike) -> None: ...
    def set_mode(
        self, *, retries: bool | None = None, fallback: bool | None = None, hedging: bool | None = None
    ) -> None: ...
    def mode(self) -> Mode: ...
    def reconcile_list(self) -> list[dict[str, Any]]: ...
    def drain_reconcile(self) -> list[dict[str, Any]]: ...
    def breaker_state(self, upstream: str) -> BreakerStateName: ...
    def policy(self) -> dict[str, Any]: ...
    @property
    def policy_version(self) -> str: ...
    @property
    def manual_clock(self) -> bool: ...
    def advance_clock(self, ms: int) -> None: ...

def params_digest(params: Mapping[str, Any]) -> str: ...
def derive_idempotency_key(tenant: str, operation: str, digest: str) -> str: ...
def vendor_code_from_body(body: bytes | bytearray | str) -> str | None: ...
def policy_schema() -> dict[str, Any]: ...
def json_media_type(content_type: str) -> bool: ...
def rewrite(
    reach: Reach,
    method: str,
    url: str,
    headers: HeadersLike,
    body: bytes | bytearray | str,
    *,
    env: Mapping[str, str] | None = None,
) -> WireRequest: ...
def api_family(url: str, headers: HeadersLike) -> ApiName: ...
def read_request(
    url: str, headers: HeadersLike | None = None, body: bytes | bytearray | memoryview | str | None = None
) -> RequestFacts:
    """Reads a request as an SDK built it: its family, endpoint, model and needs."""

def continuation_body(
    api: ApiName, original_body: bytes | bytearray | str, transcript: Transcript, how: ContinuationName
) -> bytes: ...
