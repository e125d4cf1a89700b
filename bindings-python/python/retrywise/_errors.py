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
    ) -> None:
        super().__init__(text or f"stopped: {reason}")
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
    ) -> Stopped:
        """The exception for a final ``stop`` or ``reconcile`` decision
        (``ReconcileRequired`` for the latter)."""
        kind = ReconcileRequired if decision.action == "reconcile" else Stopped
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
        )


class ReconcileRequired(Stopped):
    """The upstream may have executed the request (an ``unsafe`` call that was
    sent and then failed, or visible output on one): check the effect's state
    (idempotency key, ledger) before anything else. Never replay blindly. The
    call is also in ``engine.reconcile_list()``."""
