"""The decision loop and the engine API as Python sees them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import retrywise
from retrywise import Engine


def test_loop_retry_then_success(engine: Engine) -> None:
    call = engine.begin("openai/gpt-4o", deadline_ms=10_000)
    assert call.is_owner and not call.is_finished and call.attempts == 0
    a = call.next_attempt()
    assert a.number == 1 and a.upstream == "openai/gpt-4o" and not a.hedge and not a.fallback
    assert a.request_id == call.id
    assert 9.0 < a.remaining_s <= 10.0 and a.remaining_ms <= 10_000
    d = call.report(status=503)
    assert d.action == "retry" and d.reason == "retryable_status" and d.error_class == "transient"
    assert d.wait_source == "jitter" and 0 <= d.delay_s <= 0.04 and d.delay_ms == int(d.delay_s * 1000)
    assert d.upstream == "openai/gpt-4o" and d.attempt == 1 and not d.is_final
    a2 = call.next_attempt()
    assert a2.number == 2 and a2.headers["retrywise-attempt"] == "2"
    d2 = call.report(status=200, headers={"x-request-id": "abc"})
    assert d2.action == "succeeded" and d2.reason == "success" and d2.error_class is None and d2.is_final
    assert call.is_finished and call.attempts == 2
    assert call.final_decision is not None and call.final_decision.action == "succeeded"
    with pytest.raises(retrywise.Stopped) as e:
        call.next_attempt()
    assert e.value.reason == "call_finished"


def test_route_names_are_read_for_every_route_object(engine: Engine) -> None:
    """begin remembers recent route strings by identity: equal texts, new objects, more
    routes than it remembers and str subclasses all still name their own upstream."""

    class Name(str):
        __slots__ = ()

    routes = [f"up-{i}" for i in range(7)]
    for _ in range(3):
        for r in routes:
            fresh = "".join(list(r))  # another object with the same text
            for name in (r, fresh, Name(r)):
                call = engine.begin(name)
                attempt = call.next_attempt()
                assert attempt.upstream == r and call.target == r
    with pytest.raises(TypeError, match="argument 'route'"):
        engine.begin(b"up-1")  # type: ignore[arg-type]


def test_vocabulary_strings_are_shared_objects(engine: Engine) -> None:
    """Decision strings are interned once, not made per read; they still compare like any str."""
    call = engine.begin("u")
    call.next_attempt()
    d = call.report(status=503)
    assert d.reason is d.reason and d.error_class is d.error_class and d.wait_source is d.wait_source
    assert d.reason == "retryable_status" and type(d.reason) is str
    assert d.to_dict()["reason"] == "retryable_status" and d.to_dict()["error_class"] == "transient"
    assert type(call.id) is str and call.target == "u" and isinstance(call.policy_version, str)


def test_attempt_timeouts_and_propagation_headers(engine: Engine) -> None:
    call = engine.begin("u", deadline_ms=2_000, idempotency_key="k-1")
    a = call.next_attempt()
    t = a.timeouts
    assert t.total <= 2.0 and t.connect <= t.total and t.first_byte <= t.total and t.idle <= t.total
    assert t.connect_ms <= t.total_ms <= 2_000
    assert set(t.to_dict()) == {"connect", "first_byte", "first_token", "idle", "total"}
    h = a.headers
    assert h["retrywise-request-id"] == call.id
    assert int(h["retrywise-deadline-ms"]) <= 2_000
    assert h["idempotency-key"] == "k-1" and a.idempotency_key == "k-1"
    assert "Attempt" in repr(a) and "Timeouts" in repr(t)
    # Expired timers as the core maps them: given all the time left, total is the deadline's;
    # a stream silent past its first-token timer showed nothing, a first-byte timeout.
    kinds = {name: a.timer_error(name, True) for name in ("connect", "first_byte", "first_token", "idle", "total")}
    assert kinds == {
        "connect": "connect_timeout",
        "first_byte": "first_byte_timeout",
        "first_token": "first_byte_timeout",
        "idle": "stream_idle_timeout",
        "total": "deadline_exceeded",
    }
    with pytest.raises(ValueError, match="timer must be one of"):
        a.timer_error("first_tokens", True)  # type: ignore[arg-type]


def test_retry_after_and_stop_reasons() -> None:
    engine = Engine({"max_attempts": 3}, seed=1)
    call = engine.begin("u", deadline_ms=10_000)
    call.next_attempt()
    d = call.report(status=429, headers=[("Retry-After", "1")])
    assert d.action == "retry" and d.wait_source == "retry_after" and d.retry_after_s == 1.0 and d.delay_s >= 1.0
    # A Retry-After past the deadline stops at once instead of sleeping past it.
    call = engine.begin("u", deadline_ms=2_000)
    call.next_attempt()
    d = call.report(status=429, headers={"retry-after": "30"})
    assert d.action == "stop" and d.reason == "retry_after_exceeds_deadline"
    for status, reason, cls in [(400, "invalid_request", "invalid_request"), (401, "auth_error", "auth_or_policy")]:
        call = engine.begin("u")
        call.next_attempt()
        d = call.report(status=status)
        assert (d.action, d.reason, d.error_class) == ("stop", reason, cls)
        assert d.on_failure == "fail"


def test_vendor_code_from_body_or_argument(engine: Engine) -> None:
    body = b'{"error":{"message":"x","type":"insufficient_quota","code":"insufficient_quota"}}'
    assert retrywise.vendor_code_from_body(body) == "insufficient_quota"
    assert retrywise.vendor_code_from_body("not json") is None
    call = engine.begin("u")
    call.next_attempt()
    assert call.report(status=429, body=body).reason == "quota_exhausted"
    # Pacing (on by default) stops later calls to `u` while its quota is out: another upstream.
    call = engine.begin("v")
    call.next_attempt()
    assert call.report(status=429, vendor_code="insufficient_quota", body=b"ignored").reason == "quota_exhausted"


def test_machine_errors_and_unsafe_reconcile(engine: Engine) -> None:
    call = engine.begin("u")
    call.next_attempt()
    d = call.report(error="connect")
    assert d.action == "retry" and d.reason == "retryable_error"
    call = engine.begin("u", idempotency="unsafe", tenant="acme", idempotency_key=None)
    call.next_attempt()
    d = call.report(error="connection_reset", phase="sent")
    assert d.action == "reconcile" and d.reason == "effect_unknown" and d.error_class == "result_unknown"
    items = engine.reconcile_list()
    assert len(items) == 1 and items[0]["logical_request_id"] == call.id and items[0]["tenant"] == "acme"
    assert engine.stats()["reconcile_pending"] == 1
    assert engine.drain_reconcile()[0]["reason"] == "effect_unknown"
    assert engine.reconcile_list() == []


def test_stream_visible_is_never_replayed(engine: Engine) -> None:
    call = engine.begin("u")
    call.next_attempt()
    d = call.report(status=200, error="connection_reset", phase="stream_visible")
    assert d.action == "stop" and d.reason == "stream_visible_output" and d.error_class == "partial_stream"


def test_ok_cancel_and_effect(engine: Engine) -> None:
    call = engine.begin("u")
    call.next_attempt()
    assert call.report(ok=True).action == "succeeded"
    call = engine.begin("u")
    call.next_attempt()
    d = call.cancel()
    assert d.action == "stop" and d.reason == "cancelled"
    call = engine.begin("u", idempotency="keyed", idempotency_key="k")
    call.next_attempt()
    d = call.report(status=503, effect="unknown")
    assert d.action == "reconcile"


def test_max_attempts_stop_and_stopped_exception() -> None:
    engine = Engine({"max_attempts": 2, "backoff": {"base_ms": 0, "cap_ms": 0}})
    call = engine.begin("u")
    call.next_attempt()
    assert call.report(status=500).action == "retry"
    call.next_attempt()
    d = call.report(status=500)
    assert d.action == "stop" and d.reason == "max_attempts"
    with pytest.raises(retrywise.Stopped) as e:
        call.next_attempt()
    assert e.value.reason == "max_attempts" and e.value.error_class == "transient"
    assert isinstance(e.value, retrywise.RetrywiseError)
    stopped = retrywise.Stopped.from_decision(d)
    assert type(stopped) is retrywise.Stopped and stopped.decision is d and "max_attempts" in str(stopped)


def test_params_digest_and_idempotency_conflict(engine: Engine) -> None:
    a = retrywise.params_digest({"model": "m", "t": 0.2, "messages": [{"role": "user", "content": "hi"}]})
    b = retrywise.params_digest({"messages": [{"content": "hi", "role": "user"}], "t": 0.2, "model": "m"})
    assert a == b and len(a) == 64
    key = retrywise.derive_idempotency_key("acme", "send_email", a)
    assert key.startswith("rw1_") and len(key) == 36
    assert key == retrywise.derive_idempotency_key("acme", "send_email", b)
    engine.begin("u", idempotency="keyed", idempotency_key=key, params={"x": 1}).next_attempt()
    conflict = engine.begin("u", idempotency="keyed", idempotency_key=key, params={"x": 2})
    with pytest.raises(retrywise.Stopped) as e:
        conflict.next_attempt()
    assert e.value.reason == "idempotency_conflict" and e.value.detail


def test_stats_prometheus_and_events(engine: Engine) -> None:
    seen: list[dict[str, Any]] = []
    sink = engine.on_event(seen.append)
    for status in (503, 200):
        call = engine.begin("up-a", tenant="acme")
        call.next_attempt()
        d = call.report(status=status)
        if d.action == "retry":
            call.next_attempt()
            call.report(status=200)
    s = engine.stats()
    assert s["logical_requests"] == 2 and s["attempts"] == 3 and s["amplification"] == 1.5
    assert s["successes"] == 2 and s["per_upstream"]["up-a"]["attempts"] == 3
    assert s["per_tenant"]["acme"]["logical_requests"] == 2
    assert s["mode"] == {"retries": True, "fallback": True, "hedging": True}
    text = engine.prometheus()
    assert "retrywise_attempts_total 3" in text
    kinds = [e["kind"] for e in seen]
    assert "attempt_start" in kinds and "attempt_end" in kinds and "decision" in kinds
    assert all(isinstance(e["seq"], int) for e in seen)
    assert engine.remove_sink(sink) and not engine.remove_sink(sink)
    ring = engine.events()
    assert ring and ring[0]["seq"] < ring[-1]["seq"]
    assert engine.drain_events() and engine.events() == []


def test_event_callback_exceptions_do_not_break_decisions(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    reported: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))

    def bad(event: dict[str, Any]) -> None:
        calls.append(1)
        raise RuntimeError("sink bug")

    engine.on_event(bad)
    call = engine.begin("u")
    call.next_attempt()
    assert call.report(status=503).action == "retry"
    call.next_attempt()
    assert call.report(status=200).action == "succeeded"
    assert calls and len(reported) == len(calls)
    assert all(isinstance(e, RuntimeError) for e in reported)
    with pytest.raises(TypeError, match="callback"):
        engine.on_event(42)  # type: ignore[arg-type]


def test_reload_set_mode_and_kill_switch(engine: Engine) -> None:
    assert engine.policy_version == "default"
    engine.reload({"version": "v2", "max_attempts": 5})
    assert engine.policy_version == "v2" and engine.policy()["max_attempts"] == 5
    with pytest.raises(retrywise.PolicyError):
        engine.reload({"max_attempts": 0})
    assert engine.policy_version == "v2"
    engine.set_mode(retries=False)
    assert engine.mode() == {"retries": False, "fallback": True, "hedging": True}
    call = engine.begin("u")
    call.next_attempt()
    d = call.report(status=503)
    assert d.action == "stop" and d.reason == "retries_disabled"
    engine.set_mode(retries=True, hedging=False)
    assert engine.mode() == {"retries": True, "fallback": True, "hedging": False}


def test_policy_formats_and_from_file(tmp_path: Path) -> None:
    yaml = "version: y1\nmax_attempts: 4\n"
    toml = 'version = "t1"\nmax_attempts = 2\n'
    assert Engine(yaml).policy_version == "y1"
    assert Engine(toml).policy_version == "t1"
    assert Engine(json.dumps({"version": "j1"})).policy_version == "j1"
    assert Engine("").policy_version == "default"
    for name, text, version in [("p.yaml", yaml, "y1"), ("p.toml", toml, "t1"), ("p.json", '{"version":"j2"}', "j2")]:
        path = tmp_path / name
        path.write_text(text)
        e = Engine.from_file(path, seed=3)
        assert isinstance(e, Engine) and e.policy_version == version
        assert Engine.from_file(str(path)).policy_version == version
    with pytest.raises(retrywise.PolicyError, match="cannot read"):
        Engine.from_file(tmp_path / "missing.json")
    assert "properties" in retrywise.policy_schema()


def test_routes_fallback_and_needs() -> None:
    policy = {
        "upstreams": {
            "a": {"capabilities": ["tool_calling"], "context_tokens": 8_000},
            "b": {"capabilities": ["tool_calling", "vision"], "context_tokens": 128_000},
        },
        "routes": {"chat": {"candidates": ["a", "b"], "attempts_per_upstream": 1}},
        "backoff": {"base_ms": 0, "cap_ms": 0},
    }
    engine = Engine(policy, seed=1)
    call = engine.begin("chat")
    assert call.next_attempt().upstream == "a"
    d = call.report(status=503)
    assert d.action == "fallback" and d.upstream == "b"
    a = call.next_attempt()
    assert a.upstream == "b" and a.fallback
    # Needs exclude candidates that cannot serve the call.
    call = engine.begin("chat", needs={"capabilities": ["vision"], "input_tokens": 1_000})
    assert call.target == "b"
    call = engine.begin("chat", needs={"input_tokens": 20_000, "max_output_tokens": 1_000})
    assert call.next_attempt().upstream == "b"
    assert engine.breaker_state("a") == "closed"


def test_hedge_plan() -> None:
    engine = Engine(
        {
            "upstreams": {"a": {}, "b": {}},
            "routes": {"chat": {"candidates": ["a", "b"], "hedge_after_ms": 100}},
        },
        manual_clock=True,
        seed=1,
    )
    call = engine.begin("chat", deadline_ms=10_000)
    call.next_attempt()
    plan = call.next_hedge()
    assert plan.action == "after" and plan.after_s == pytest.approx(0.1) and plan.after_ms == 100
    assert plan.attempt is None and plan.reason is None
    engine.advance_clock(40)
    assert call.next_hedge().after_ms == 60
    engine.advance_clock(110)
    plan = call.next_hedge()
    assert plan.action == "start" and plan.attempt is not None and plan.attempt.hedge
    assert plan.attempt.upstream == "b"
    d = call.report(status=200, attempt=plan.attempt.number)
    assert d.action == "succeeded" and d.hedge
    unsafe = engine.begin("chat", idempotency="unsafe")
    unsafe.next_attempt()
    no = unsafe.next_hedge()
    assert no.action == "no" and no.reason == "hedge_not_allowed" and no.after_ms is None and no.after_s is None


def test_manual_clock_and_seed_are_reproducible() -> None:
    def delays(seed: int) -> list[int]:
        e = Engine({"max_attempts": 5}, seed=seed, manual_clock=True)
        call = e.begin("u", deadline_ms=60_000)
        out = []
        for _ in range(4):
            call.next_attempt()
            d = call.report(status=503)
            out.append(d.delay_ms)
            e.advance_clock(d.delay_ms)
        return out

    assert delays(42) == delays(42)
    assert delays(42) != delays(43)
    e = Engine(manual_clock=True)
    assert e.manual_clock
    call = e.begin("u", deadline_ms=1_000)
    assert call.remaining_s == 1.0
    e.advance_clock(400)
    assert call.remaining_s == pytest.approx(0.6)
    e.advance_clock(400)
    with pytest.raises(retrywise.Stopped) as s:
        call.next_attempt()
    assert s.value.reason == "deadline_exceeded" and s.value.error_class == "deadline_exceeded"
    with pytest.raises(RuntimeError, match="manual_clock"):
        Engine().advance_clock(1)


def test_inbound_headers_make_a_non_owner(engine: Engine) -> None:
    call = engine.begin(
        "u",
        deadline_ms=30_000,
        inbound_headers={"retrywise-deadline-ms": "1500", "retrywise-request-id": "parent-1", "retrywise-attempt": "2"},
    )
    assert not call.is_owner and call.id == "parent-1" and call.remaining_s <= 1.5
    call.next_attempt()
    d = call.report(status=503)
    assert d.action == "stop" and d.reason == "not_owner"
    with pytest.raises(ValueError, match=r"inbound_headers.*retrywise-deadline-ms"):
        engine.begin("u", inbound_headers={"retrywise-deadline-ms": "soon"})


def test_repr_and_version(engine: Engine) -> None:
    assert retrywise.__version__
    call = engine.begin("u")
    assert call.id in repr(call) and "Engine" in repr(engine)
    call.next_attempt()
    assert "retry" in repr(call.report(status=503))


def test_stream_gate_holds_a_preamble_until_the_first_meaningful_event() -> None:
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    text = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    g = retrywise.StreamGate("text/event-stream; charset=utf-8")
    assert not g.visible and g.phase == "stream_open"
    assert g.feed(role) == b"" and g.held == len(role)
    # Split mid-event: nothing until the event's blank line arrives.
    assert g.feed(text[:10]) == b""
    assert g.feed(bytearray(text[10:])) == role + text
    assert g.visible and g.phase == "stream_visible"
    assert g.feed(b"data: [DONE]\n\n") == b"data: [DONE]\n\n"
    assert g.finish() == b""
    assert "stream_visible" in repr(g)

    start = b'event: message_start\ndata: {"type":"message_start","message":{"content":[]}}\n\n'
    pre = retrywise.StreamGate("text/event-stream")
    assert pre.feed(start) == b""
    assert pre.finish() == start  # a body that ends holding delivers what it held

    # A body that ends after text without its finish was cut (the core decides, in every binding).
    cut = retrywise.StreamGate("text/event-stream")
    seen = retrywise.Transcript("openai")
    seen.observe(cut.feed(role + text))
    assert cut.end_outcome(200, seen) == {
        "status": 200,
        "error": "connection_reset",
        "phase": "stream_visible",
        "vendor_code": None,
        "resumable": True,
    }
    seen.observe(cut.feed(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'))
    assert cut.end_outcome(200, seen) == cut.outcome(200) | {"resumable": False}
    assert cut.outcome(200) == {"status": 200, "error": None, "phase": None, "vendor_code": None}

    for ct in (None, "application/json"):
        p = retrywise.StreamGate(ct)
        assert not p.may_hold and p.phase == "stream_open"  # nothing delivered yet
        assert p.feed(role) == role and p.phase == "stream_visible"
    assert retrywise.StreamGate("text/event-stream").may_hold
    with pytest.raises(TypeError, match="argument 'chunk': expected bytes, got int"):
        retrywise.StreamGate("text/event-stream").feed(3)
    with pytest.raises(TypeError, match="content_type"):
        retrywise.StreamGate(3)


def test_report_body_malformed_json_success_and_vendor_code() -> None:
    engine = Engine({"max_attempts": 3}, seed=1)
    json_ct = {"content-type": "application/json; charset=utf-8"}
    call = engine.begin("u")
    call.next_attempt()
    d = call.report(status=200, headers=json_ct, body=b'{"id":"x","choices":[')
    assert (d.action, d.reason) == ("retry", "retryable_error")
    call.next_attempt()
    assert call.report(status=200, headers=json_ct, body=b'{"id":"x"}').action == "succeeded"
    # Not JSON by its content-type (or none given): not judged.
    for headers in ({"content-type": "text/plain"}, None):
        c = engine.begin("u")
        c.next_attempt()
        assert c.report(status=200, headers=headers, body=b"{garbled").action == "succeeded"
    c = engine.begin("u")
    c.next_attempt()
    assert c.report(status=429, body=b'{"error":{"code":"insufficient_quota"}}').reason == "quota_exhausted"
    assert retrywise.json_media_type("application/problem+json")
    assert not retrywise.json_media_type("text/event-stream")
