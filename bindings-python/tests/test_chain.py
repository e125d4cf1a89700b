"""Three retrywise layers in a chain: the openai SDK (the owner) → a service →
a gateway → the fault server. The service and the gateway are small HTTP
servers on 127.0.0.1, each with its own Engine (max_attempts 3 like the
client's); they read the inbound propagation headers and govern their
outbound call with them, so they are not retry owners. Against a persistently
failing upstream the fault server sees the owner's max_attempts, not 3 x 3 x 3,
every layer sees the same logical request id, and the deadline shrinks down
the chain."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import retrywise
from retrywise import Engine
from retrywise.httpx import RetryTransport

from .conftest import FAST, FaultServer

openai = pytest.importorskip("openai")

PROPAGATION = ("retrywise-deadline-ms", "retrywise-request-id", "retrywise-attempt", "idempotency-key")


@dataclass
class Layer:
    """A retrywise-governed HTTP hop: forwards every request to ``upstream``."""

    name: str
    upstream: str
    engine: Engine = field(default_factory=lambda: Engine(FAST, seed=3))
    seen: list[dict[str, str]] = field(default_factory=list)
    url: str = ""

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        self.seen.append(headers)
        inbound = {k: v for k, v in headers.items() if k in PROPAGATION}
        forward = {k: v for k, v in headers.items() if k in ("content-type", "authorization")}

        def attempt(a: retrywise.Attempt) -> httpx.Response:
            with httpx.Client(timeout=a.timeouts.total) as client:
                return client.request(method, self.upstream + path, content=body, headers={**forward, **a.headers})

        try:
            resp = self.engine.run(attempt, route=self.name, inbound_headers=inbound)
        except retrywise.Stopped as stop:
            if stop.response is None:
                return 502, {"content-type": "application/json"}, b'{"error": {"message": "upstream unreachable"}}'
            resp = stop.response
        keep = {k: v for k, v in resp.headers.items() if k in ("content-type", "retry-after", "retry-after-ms")}
        return resp.status_code, keep, resp.content


def serve(layer: Layer) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, out, content = layer.handle("POST", self.path, headers, body)
            self.send_response(status)
            for k, v in out.items():
                self.send_header(k, v)
            self.send_header("content-length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    layer.url = f"http://127.0.0.1:{server.server_address[1]}"
    return server


@pytest.fixture
def chain(fault: FaultServer) -> Iterator[tuple[Layer, Layer]]:
    gateway = Layer("gateway", f"{fault.base}/s/status:503")
    g = serve(gateway)
    service = Layer("service", gateway.url)
    s = serve(service)
    try:
        yield service, gateway
    finally:
        for srv in (s, g):
            srv.shutdown()
            srv.server_close()


def test_three_layers_cost_the_owners_max_attempts_not_the_product(
    fault: FaultServer, chain: tuple[Layer, Layer]
) -> None:
    service, gateway = chain
    owner = Engine(FAST, seed=5)
    transport = RetryTransport(
        owner, route="service", deadline_ms=8_000, idempotency="keyed", idempotency_key="k-chain"
    )
    client = openai.OpenAI(
        base_url=f"{service.url}/v1", api_key="test", max_retries=0, http_client=httpx.Client(transport=transport)
    )
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])

    rows = fault.requests("status:503")
    max_attempts = FAST["max_attempts"]
    # Worst case at the upstream: the single owner's max_attempts (3), not 3 x 3 x 3 = 27.
    assert len(rows) == max_attempts and len(service.seen) == max_attempts and len(gateway.seen) == max_attempts
    assert owner.stats()["attempts"] == max_attempts and owner.stats()["stops"] == {"max_attempts": 1}
    for layer in (service, gateway):
        s = layer.engine.stats()
        # One attempt per inbound request, and each hop hands the decision back up.
        assert s["logical_requests"] == max_attempts and s["attempts"] == max_attempts
        assert s["stops"] == {"not_owner": max_attempts} and s["retries"] == 0

    # One logical request end to end, and the owner's attempt numbers reach every hop.
    ids = {h["retrywise-request-id"] for h in service.seen + gateway.seen} | {r["logical_id"] for r in rows}
    assert len(ids) == 1 and None not in ids
    for n in range(max_attempts):
        assert service.seen[n]["retrywise-attempt"] == gateway.seen[n]["retrywise-attempt"] == str(n + 1)
        assert rows[n]["attempt"] == n + 1
        assert service.seen[n]["idempotency-key"] == gateway.seen[n]["idempotency-key"] == "k-chain"
        assert rows[n]["idempotency_key"] == "k-chain"
        # The deadline shrinks down the chain (each hop spends time and a safety margin).
        at_service = int(service.seen[n]["retrywise-deadline-ms"])
        at_gateway = int(gateway.seen[n]["retrywise-deadline-ms"])
        at_upstream = rows[n]["deadline_ms"]
        assert 8_000 > at_service > at_gateway > at_upstream > 0, (at_service, at_gateway, at_upstream)
    # ... and from one owner attempt to the next.
    assert [int(h["retrywise-deadline-ms"]) for h in service.seen] == sorted(
        (int(h["retrywise-deadline-ms"]) for h in service.seen), reverse=True
    )
