"""Translation of what an attempt produced (a response-like object or an
exception) into ``call.report(...)`` arguments. Python-specific: it knows
Python's and httpx's exception types; what they mean is decided by the core."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._retrywise import Call, Decision
    from .types import ErrorKind, Phase

    Kind = tuple[ErrorKind, Phase | None]

# httpx and httpx2 share one exception hierarchy; checked only when imported.
_HTTPX_MODULES = ("httpx", "httpx2")


def is_cancellation(exc: BaseException) -> bool:
    """Cancellation and interpreter exits: reported as ``cancelled``, then re-raised."""
    return not isinstance(exc, Exception) or isinstance(exc, asyncio.CancelledError)


def note_stop(exc: BaseException, reason: str) -> None:
    """Names the stop's reason on an exception re-raised to the caller (Python >= 3.11)."""
    add_note = getattr(exc, "add_note", None)
    if add_note is not None:
        add_note(f"retrywise: stopped ({reason})")


def _httpx_kind(exc: BaseException, in_body: bool) -> Kind | None:
    for name in _HTTPX_MODULES:
        hx = sys.modules.get(name)
        if hx is None:
            continue
        if not isinstance(exc, hx.HTTPError):
            continue
        if isinstance(exc, hx.ConnectTimeout | hx.PoolTimeout):
            return "connect_timeout", None
        if isinstance(exc, hx.ConnectError):
            return "connect", None
        if isinstance(exc, hx.ReadTimeout):
            return ("stream_idle_timeout" if in_body else "first_byte_timeout"), None
        if isinstance(exc, hx.WriteTimeout | hx.WriteError):
            return "write", None
        if isinstance(exc, hx.TimeoutException):
            return "first_byte_timeout", None
        if isinstance(exc, hx.RemoteProtocolError | hx.ReadError):
            # The request was written; the peer closed or broke the connection.
            return "connection_reset", None if in_body else "sent"
        if isinstance(exc, hx.DecodingError):
            return "malformed_response", None
        return "other", None
    return None


def _builtin_kind(exc: BaseException, in_body: bool) -> Kind | None:
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled", None
    if isinstance(exc, ssl.SSLError):
        return "tls", None
    if isinstance(exc, socket.gaierror):
        return "dns", None
    if isinstance(exc, ConnectionRefusedError):
        return "connect", None
    if isinstance(exc, ConnectionResetError | BrokenPipeError | ConnectionAbortedError):
        return "connection_reset", None if in_body else "sent"
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return ("stream_idle_timeout" if in_body else "first_byte_timeout"), None
    if isinstance(exc, json.JSONDecodeError):
        # A body that does not parse (an SDK decoding a truncated or garbled answer).
        return "malformed_response", None
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes (SDKs wrap transport errors: ``APITimeoutError`` from ``ReadTimeout``)."""
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(seen) < 8 and all(cur is not s for s in seen):
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def error_kind(exc: BaseException, *, in_body: bool = False) -> Kind:
    """``(ErrorKind name, phase or None)`` for an exception; ``("other", None)`` when unknown.
    ``in_body``: raised while reading a response body (a read timeout is then an idle stream)."""
    for e in _chain(exc):
        found = _httpx_kind(e, in_body) or _builtin_kind(e, in_body)
        if found is not None:
            return found
    return "other", None


def _body(resp: Any) -> bytes | None:
    """The body of an error response when it is already in memory (never does I/O)."""
    for attr in ("content", "body", "text"):
        try:
            value = getattr(resp, attr, None)
        except Exception:  # httpx.ResponseNotRead and friends
            continue
        if isinstance(value, bytes | bytearray | str):
            return bytes(value) if not isinstance(value, str) else value.encode()
    return None


def response_report(resp: Any) -> dict[str, Any]:
    """``report`` arguments for a response-like object; ``ok=True`` for a result that has no status."""
    status = getattr(resp, "status_code", None)
    if not isinstance(status, int):
        return {"ok": True}
    out: dict[str, Any] = {"status": status, "headers": getattr(resp, "headers", None)}
    if status >= 400:
        out["body"] = _body(resp)
    return out


def report_result(call: Call, resp: Any) -> Decision:
    """``call.report(**response_report(resp))`` without building the arguments (``run``'s hot path)."""
    status = getattr(resp, "status_code", None)
    if not isinstance(status, int):
        return call.report(ok=True)
    headers = getattr(resp, "headers", None)
    if status >= 400:
        return call.report(status=status, headers=headers, body=_body(resp))
    return call.report(status=status, headers=headers)


def exception_report(exc: BaseException) -> dict[str, Any]:
    """``report`` arguments for an exception raised by an attempt. An exception that
    carries an HTTP response (``httpx.HTTPStatusError``, an SDK's ``APIStatusError``)
    is reported as that response."""
    resp = exception_response(exc)
    if resp is not None:
        return response_report(resp)
    kind, phase = error_kind(exc)
    return {"error": kind, "phase": phase}


def exception_response(exc: BaseException) -> Any:
    """The HTTP response an exception carries, if any."""
    try:
        resp = getattr(exc, "response", None)
    except Exception:
        return None
    return resp if isinstance(getattr(resp, "status_code", None), int) else None
