"""Run by tests/artifacts/run.sh inside a fresh virtualenv holding only the
wheel from scripts/package (and httpx): the decision loop and the httpx
transport against a server this script starts on 127.0.0.1."""

from __future__ import annotations

import http.server
import pathlib
import threading
from typing import ClassVar

import httpx
import retrywise
from retrywise.httpx import RetryTransport

site = pathlib.Path(retrywise.__file__).resolve().parent
assert site.parent.name == "site-packages", f"retrywise imported from {site}, not from the venv"
(native,) = site.glob("_retrywise*.so")
print("retrywise", retrywise.__version__, "from", native.name)

# A release build has no test hooks: a policy that sets one is refused.
try:
    retrywise.Engine({"testing": {"panic_on_vendor_code": "boom"}})
except retrywise.PolicyError as e:
    assert "testing" in str(e), e
else:
    raise AssertionError("the wheel accepts test hooks: it was built with the test-hooks feature")
print("no test hooks: a policy that sets one is refused")

# The decision loop: a 503 asking for 5 ms, then a 200 (no Retry-After
# jitter, so the wait is exactly the hint).
engine = retrywise.Engine({"max_attempts": 3, "retry_after": {"jitter_ms": 0}}, seed=7, manual_clock=True)
call = engine.begin("openai/gpt-4o", deadline_ms=10_000)
a = call.next_attempt()
assert (a.number, a.upstream, a.headers["retrywise-attempt"]) == (1, "openai/gpt-4o", "1"), a.headers
d = call.report(status=503, headers={"retry-after-ms": "5"})
got = (d.action, d.reason, d.error_class, d.wait_source, d.delay_ms, d.retry_after_ms, d.attempt)
assert got == ("retry", "retryable_status", "transient", "retry_after", 5, 5, 1), got
a = call.next_attempt()
assert a.number == 2
d = call.report(status=200)
got = (d.action, d.reason, d.error_class, d.attempt, d.is_final)
assert got == ("succeeded", "success", None, 2, True), got
try:
    call.next_attempt()
    raise AssertionError("a finished call gave another attempt")
except retrywise.Stopped as stop:
    assert stop.reason == "call_finished", stop.reason
print("decision loop: retry (retryable_status, 5 ms from retry-after-ms), then succeeded")


class Upstream(http.server.BaseHTTPRequestHandler):
    """Answers 503 (retry-after-ms: 1) to the first request and 200 to the next."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        Upstream.seen.append({k.lower(): v for k, v in self.headers.items()})
        first = len(Upstream.seen) == 1
        body = b'{"error": {"type": "overloaded"}}' if first else b'{"ok": true}'
        self.send_response(503 if first else 200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        if first:
            self.send_header("retry-after-ms", "1")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
threading.Thread(target=server.serve_forever, daemon=True).start()
try:
    engine = retrywise.Engine({"max_attempts": 3, "retry_after": {"jitter_ms": 0}}, seed=7)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
    with httpx.Client(transport=RetryTransport(engine, route="local")) as client:
        r = client.post(url, json={"model": "m"}, timeout=5.0)
finally:
    server.shutdown()
    server.server_close()
assert r.status_code == 200 and r.json() == {"ok": True}, (r.status_code, r.text)
assert [h["retrywise-attempt"] for h in Upstream.seen] == ["1", "2"], Upstream.seen
stats = engine.stats()  # the overall counters are the top-level keys
counts = tuple(stats[k] for k in ("logical_requests", "attempts", "retries", "retry_successes"))
assert counts == (1, 2, 1, 1), stats
print("httpx transport on 127.0.0.1: 503 then 200, 2 requests, 1 retry")
