"""The core's wire helpers through the binding: a request moved to another
upstream, and a broken stream continued there."""

from __future__ import annotations

import json

import pytest
import retrywise
from retrywise import Engine

POLICY = {
    "upstreams": {
        "primary": {"provider": "openai", "model": "gpt-4o", "capabilities": ["streaming"]},
        "backup": {
            "provider": "other",
            "model": "other-chat",
            "base_url": "https://other.example/v1",
            "api_key_env": "OTHER_KEY",
            "capabilities": ["streaming", "assistant_prefill"],
        },
    },
    "models": {"gpt-4o": "chat"},
    "routes": {"chat": {"candidates": ["primary", "backup"], "stream_recovery": "continue"}},
}
BODY = b'{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"stream":true}'
HEADERS = [("authorization", "Bearer sk-caller"), ("content-type", "application/json")]


def test_route_for_model_and_reach() -> None:
    engine = Engine(POLICY)
    assert engine.route_for_model("gpt-4o") == "chat"
    with pytest.raises(retrywise.PolicyError) as e:
        engine.route_for_model("gpt-unknown")
    assert "gpt-unknown" in str(e.value)
    reach = engine.reach("backup")
    assert (reach.base_url, reach.model, reach.api_key_env, reach.prefill) == (
        "https://other.example/v1",
        "other-chat",
        "OTHER_KEY",
        True,
    )


def test_rewrite_sends_the_fallback_its_model_and_its_key_only() -> None:
    reach = Engine(POLICY).reach("backup")
    url = "https://api.openai.com/v1/chat/completions"
    w = retrywise.rewrite(reach, "POST", url, HEADERS, BODY, env={"OTHER_KEY": "sk-other"})
    assert w.url == "https://other.example/v1/chat/completions"
    assert json.loads(w.body)["model"] == "other-chat"
    auth = [v for k, v in w.headers if k.lower() == "authorization"]
    assert auth == ["Bearer sk-other"]  # the caller's key never goes to another origin
    with pytest.raises(retrywise.WireError) as e:
        retrywise.rewrite(reach, "POST", url, HEADERS, BODY, env={})
    assert e.value.code == "env_unset" and "OTHER_KEY" in str(e.value)


def chunk(content: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": content}}]}).encode() + b"\n\n"


def test_a_continuation_is_asked_and_spliced_without_repeating() -> None:
    t = retrywise.Transcript("openai")
    t.observe(chunk("Hello") + chunk(" wor"))
    assert (t.text, t.resumable, t.finished) == ("Hello wor", True, False)
    body = json.loads(retrywise.continuation_body("openai", BODY, t, "prefill"))
    assert body["messages"][-1] == {"role": "assistant", "content": "Hello wor"}
    s = retrywise.Splicer("openai", t)
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    out = s.feed(role + chunk("Hello wor") + chunk("ld")) + s.finish()
    spliced = retrywise.Transcript("openai")
    spliced.observe(chunk("Hello") + chunk(" wor") + out)
    assert spliced.text == "Hello world" and s.deduplicated > 0
