"""Exceptions raised by retrywise. Plain Python so they carry typed attributes;
the native module raises them by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._retrywise import Decision


class RetrywiseError(Exception):
    """Base class of every retrywise exception."""


class PolicyError(RetrywiseError, ValueError):
    """A policy failed to parse or validate.

    ``path`` is the dotted field path of the first problem (``breaker.failure_rate``;
    empty when the document itself is unreadable), ``message`` what is wrong with it,
    and ``errors`` every ``(path, message)`` found. ``str()`` lists them all.
    """

    def __init__(
        self,
        text: str,
        *,
        path: str = "",
        message: str = "",
        errors: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__(text)
        self.path = path
        self.message = message or text
        self.errors: list[tuple[str, str]] = list(errors or [(path, self.message)])


class InternalError(RetrywiseError, RuntimeError):
    """A bug inside retrywise (a Rust panic caught at the boundary). The engine
    that raised it stays usable; the call it happened in should be abandoned."""


class Stopped(RetrywiseError):
    """The call gave up: no further attempt will be made.

    ``reason`` is the stable reason code (``max_attempts``, ``auth_error``,
    ``retry_after_exceeds_deadline``, ...), ``error_class`` the class of the last
    failure, ``on_failure`` the route's instruction (``fail`` / ``manual_review``).
    Raised by ``run``/``run_async`` and the httpx transports, it also carries the
    final ``decision`` and the last ``response`` or ``exception`` seen.
    ``wait_s`` is None: the call is over (a ``NotYet`` carries a wait instead).
    """

    def __init__(
        self,
        text: str = "",
        *,
        reason: str,
        error_class: str | None = None,
        detail: str | None = None,
        on_failure: str | None = None,
        decision: Decision | None = None,
        response: Any = None,
        exception: BaseException | None = None,
        wait_s: float | None = None,
    ) -> None:
        super().__init__(text or f"stopped: {reason}")
        self.wait_s = wait_s
        self.reason = reason
        self.error_class = error_class
        self.detail = detail
        self.on_failure = on_failure
        self.decision = decision
        self.response = response
        self.exception = exception

    @classmethod
    def from_decision(
        cls,
        decision: Decision,
        *,
        response: Any = None,
        exception: BaseException | None = None,
        **extra: Any,
    ) -> Stopped:
        """The exception for a final ``stop`` or ``reconcile`` decision
        (``ReconcileRequired`` for the latter; a subclass's own when called on
        one, with its ``extra`` keyword arguments)."""
        kind = ReconcileRequired if decision.action == "reconcile" and cls is Stopped else cls
        text = f"{decision.action}: {decision.reason}"
        if decision.error_class:
            text += f" (class {decision.error_class})"
        if decision.detail:
            text += f": {decision.detail}"
        return kind(
            text,
            reason=decision.reason,
            error_class=decision.error_class,
            detail=decision.detail,
            on_failure=decision.on_failure,
            decision=decision,
            response=response,
            exception=exception,
            **extra,
        )


class ReconcileRequired(Stopped):
    """The upstream may have executed the request (an ``unsafe`` call that was
    sent and then failed, or visible output on one): check the effect's state
    (idempotency key, ledger) before anything else. Never replay blindly. The
    call is also in ``engine.reconcile_list()``."""


class NotYet(Stopped):
    """Not a stop but "not yet": ``call.next_attempt()`` may not start an attempt
    now, and may after ``wait_s`` seconds within the deadline (an open breaker
    that lets probes through then; provider pacing). The call is not over:
    sleep ``wait_s`` and ask again. A loop that treats it as a ``Stopped`` only
    fails fast. ``run``/``run_async`` and the transports wait for you."""

    wait_s: float

    def __init__(self, text: str = "", *, wait_s: float, **kwargs: Any) -> None:
        super().__init__(text, wait_s=wait_s, **kwargs)


class StreamInterrupted(Stopped):
    """A streamed answer the caller was reading broke after it showed output, and
    the call stopped instead of continuing it elsewhere (``stream_recovery:
    never``, output that cannot be continued, no candidate left): never a
    truncated success. ``text`` is what the caller received; ``reason`` the
    stop's reason code (``stream_visible_output``, ``max_attempts``, ...);
    ``exception`` what broke the stream (None for a stream that ended without its
    finish or with the provider's error event, named in ``provider_error``)."""

    def __init__(
        self,
        text: str = "",
        *,
        delivered: str = "",
        provider_error: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(text, **kwargs)
        self.text = delivered
        self.provider_error = provider_error


class WireError(RetrywiseError, ValueError):
    """A request could not be rewritten for an upstream or continued: ``code`` is
    ``invalid_url``, ``unknown_endpoint``, ``env_unset`` (the message names the
    variable, never a value), ``body_not_json``, ``no_deployment`` or
    ``no_conversation``."""

    def __init__(self, text: str, *, code: str) -> None:
        super().__init__(text)
        self.code = code
