"""Errors: policy errors name the field, bad arguments name the argument, and a
panic inside the core surfaces as InternalError with the engine still usable."""

from __future__ import annotations

from typing import Any

import pytest
import retrywise
from retrywise import Engine


def test_policy_error_names_the_field_path() -> None:
    with pytest.raises(retrywise.PolicyError) as e:
        Engine({"max_attempts": 0})
    assert e.value.path == "max_attempts" and "max_attempts" in str(e.value)
    assert "[1, 100]" in e.value.message
    assert isinstance(e.value, ValueError)
    with pytest.raises(retrywise.PolicyError) as e:
        Engine({"breaker": {"failure_rat": 0.5}})
    assert e.value.path == "breaker.failure_rat" and "unknown field" in e.value.message
    with pytest.raises(retrywise.PolicyError) as e:
        Engine('{"budget": {"ratio": 0.1234}, "max_attempts": 500}')
    assert len(e.value.errors) == 2 and {p for p, _ in e.value.errors} == {"max_attempts", "budget.ratio"}
    with pytest.raises(retrywise.PolicyError) as e:
        Engine({"routes": {"chat": {"candidates": ["nope"]}}})
    assert e.value.path == "routes.chat.candidates[0]"
    with pytest.raises(retrywise.PolicyError):
        Engine("max_attempts: [not, a, number]")


def test_policy_argument_type() -> None:
    with pytest.raises(TypeError, match="argument 'policy'"):
        Engine(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"policy\.x"):
        Engine({"x": object()})


@pytest.mark.parametrize(
    ("kwargs", "exc", "pattern"),
    [
        ({"deadline_ms": "soon"}, TypeError, "argument 'deadline_ms': expected int, got str"),
        ({"deadline_ms": -1}, ValueError, "argument 'deadline_ms'"),
        ({"deadline_ms": True}, TypeError, "argument 'deadline_ms'"),
        (
            {"idempotency": "maybe"},
            ValueError,
            "argument 'idempotency': idempotency must be one of safe, keyed, unsafe",
        ),
        ({"idempotency": 1}, TypeError, "argument 'idempotency'"),
        ({"tenant": 5}, TypeError, "argument 'tenant'"),
        ({"params": [object()]}, TypeError, r"params\[0\]"),
        ({"needs": {"colour": "red"}}, ValueError, "argument 'needs'"),
        ({"needs": {"input_tokens": "many"}}, TypeError, "argument 'needs'"),
        ({"needs": "vision"}, TypeError, "argument 'needs'"),
        ({"parent": "not-an-attempt"}, TypeError, "argument 'parent'"),
        ({"inbound_headers": 3}, TypeError, "argument 'inbound_headers'"),
    ],
)
def test_begin_arguments_are_named(kwargs: dict[str, Any], exc: type[Exception], pattern: str) -> None:
    with pytest.raises(exc, match=pattern):
        Engine().begin("u", **kwargs)


def test_route_is_required_and_typed() -> None:
    with pytest.raises(TypeError, match="argument 'route'"):
        Engine().begin(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "exc", "pattern"),
    [
        ({"status": "503"}, TypeError, "argument 'status': expected int"),
        ({"status": 70_000}, ValueError, "argument 'status'"),
        ({"error": "exploded"}, ValueError, "argument 'error': error must be one of dns, connect"),
        ({"phase": "later"}, ValueError, "argument 'phase': phase must be one of before_send"),
        ({"effect": "maybe"}, ValueError, "argument 'effect'"),
        ({"headers": 12}, TypeError, "argument 'headers'"),
        ({"headers": {"a": object()}}, TypeError, "argument 'headers'"),
        ({"body": 12}, TypeError, "argument 'body'"),
        ({"ok": 1}, TypeError, "argument 'ok'"),
        ({"input_tokens": -5}, ValueError, "argument 'input_tokens'"),
    ],
)
def test_report_arguments_are_named(kwargs: dict[str, Any], exc: type[Exception], pattern: str) -> None:
    call = Engine().begin("u")
    call.next_attempt()
    with pytest.raises(exc, match=pattern):
        call.report(**kwargs)
    # A rejected report leaves the attempt in flight: it can still be reported.
    assert call.report(status=200).action == "succeeded"


def test_other_arguments_are_named() -> None:
    with pytest.raises(TypeError, match="argument 'seed'"):
        Engine(seed="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="argument 'seed'"):
        Engine(seed=-1)
    with pytest.raises(TypeError, match="argument 'manual_clock'"):
        Engine(manual_clock="yes")  # type: ignore[arg-type]
    e = Engine(manual_clock=True)
    with pytest.raises(TypeError, match="argument 'retries'"):
        e.set_mode(retries="off")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="argument 'ms'"):
        e.advance_clock(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="argument 'upstream'"):
        e.breaker_state(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="argument 'path'"):
        Engine.from_file(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="argument 'digest'"):
        retrywise.derive_idempotency_key("t", "op", None)  # type: ignore[arg-type]


def test_report_without_attempt_is_invalid_state() -> None:
    call = Engine().begin("u")
    d = call.report(status=200)
    assert d.action == "stop" and d.reason == "invalid_state"


def test_panic_surfaces_as_internal_error_and_engine_stays_usable() -> None:
    engine = Engine({"testing": {"panic_on_vendor_code": "boom"}, "max_attempts": 3})
    call = engine.begin("u")
    call.next_attempt()
    with pytest.raises(retrywise.InternalError, match="test hook") as e:
        call.report(status=500, vendor_code="boom")
    assert isinstance(e.value, RuntimeError) and isinstance(e.value, retrywise.RetrywiseError)
    # The same panic through the body path.
    call = engine.begin("u")
    call.next_attempt()
    with pytest.raises(retrywise.InternalError):
        call.report(status=500, body=b'{"error":{"code":"boom"}}')
    # The engine keeps deciding, on this thread and others.
    for _ in range(3):
        call = engine.begin("u")
        call.next_attempt()
        assert call.report(status=503).action == "retry"
        call.next_attempt()
        assert call.report(status=200).action == "succeeded"
    assert engine.stats()["successes"] == 3
    # The call that panicked can still be cancelled and dropped cleanly.
    assert call.is_finished


def test_panic_inside_run_is_internal_error() -> None:
    engine = Engine({"testing": {"panic_on_vendor_code": "boom"}})

    class Resp:
        status_code = 500
        headers: dict[str, str] = {}  # noqa: RUF012
        content = b'{"error":{"code":"boom"}}'

    with pytest.raises(retrywise.InternalError):
        engine.run(lambda a: Resp(), route="u")
    assert engine.run(lambda a: "fine", route="u") == "fine"
