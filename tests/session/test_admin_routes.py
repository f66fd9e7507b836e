"""The admin paths in-process: /metrics and POST /reload once the hub has them, a failure
in one admin request contained to its connection, readiness while draining, and the status
snapshot's sessions. Every wait is bounded by ``trio.fail_after``."""

from __future__ import annotations

import json
import logging
from typing import Any

import attrs
import pytest
import trio

from aggregator.core.events import DrainingStarted
from aggregator.ops.admin import MAX_ADMIN_CONNECTIONS, AdminEndpoint
from aggregator.ops.status_page import page
from tests.loopback import free_port
from tests.rawhttp import read_response_async, request_bytes
from tests.session.fronts import running_fronts


@attrs.frozen
class Reloaded:
    ok: bool
    errors: list[str]
    changes: list[str]


class Exposition:
    def exposition(self) -> tuple[bytes, str]:
        return b"aggregator_up 1\n", "text/plain; version=0.0.4; charset=utf-8"


async def ask(port: int, method: str, path: str, headers: dict[str, str] | None = None):
    """One request on a new connection to 127.0.0.1:``port``; its response."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        with trio.fail_after(10):
            await stream.send_all(request_bytes(method, path, {"host": f"127.0.0.1:{port}", **(headers or {})}))
            return await read_response_async(stream)
    finally:
        await stream.aclose()


async def test_metrics_and_reload_when_the_hub_has_them(caplog):
    async with running_fronts() as fronts, trio.open_nursery() as nursery:
        admin = free_port()
        await nursery.start(AdminEndpoint(fronts.hub, fronts.hub.config.http).serve, f"127.0.0.1:{admin}")
        for port in (fronts.http_port, admin):  # the hub's own metrics, on both listeners
            response = await ask(port, "GET", "/metrics")
            assert response.status == 200 and b"aggregator_" in response.body
        fronts.hub.metrics = Exposition()  # type: ignore[assignment]
        for port in (fronts.http_port, admin):
            response = await ask(port, "GET", "/metrics")
            assert response.status == 200 and response.body == b"aggregator_up 1\n"
            assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        response = await ask(admin, "POST", "/reload")  # the hub's own: it has no file to read again
        assert response.status == 422 and json.loads(response.body)["ok"] is False
        outcomes = [Reloaded(True, [], ["servers.b: added"]), Reloaded(False, ["servers.b.command: required"], [])]

        async def reload() -> Reloaded:
            return outcomes.pop(0)

        fronts.hub.reload = reload  # type: ignore[method-assign,assignment]
        response = await ask(admin, "POST", "/reload")
        assert response.status == 200
        assert json.loads(response.body) == {"ok": True, "errors": [], "changes": ["servers.b: added"]}
        response = await ask(admin, "POST", "/reload")
        assert response.status == 422 and json.loads(response.body)["errors"] == ["servers.b.command: required"]
        assert (await ask(fronts.http_port, "POST", "/reload")).status == 404  # the admin listener only

        # A failure inside one admin request: a 500, logged, and the listener serves on.
        async def broken() -> Reloaded:
            raise RuntimeError("reload blew up")

        fronts.hub.reload = broken  # type: ignore[method-assign,assignment]
        with caplog.at_level(logging.ERROR, logger="aggregator"):
            response = await ask(admin, "POST", "/reload")
        assert response.status == 500 and json.loads(response.body)["error"]["data"]["reason"] == "internal"
        assert "admin: internal error in POST /reload" in caplog.text
        assert (await ask(admin, "GET", "/healthz")).status == 200
        nursery.cancel_scope.cancel()


async def test_readiness_while_draining_and_the_sessions_listed():
    async with running_fronts() as fronts:
        response = await ask(fronts.http_port, "GET", "/readyz")
        assert response.status == 200 and json.loads(response.body)["status"] == "ready"
        session = await fronts.initialize()
        data = json.loads((await ask(fronts.http_port, "GET", "/status.json")).body)
        assert [(s["transport"], s["profile"]) for s in data["sessions"]] == [("streamable-http", "default")]
        assert data["servers"][0]["name"] == "a" and data["servers"][0]["state"] == "ready"
        assert session
        fronts.hub.router.handle(DrainingStarted())
        response = await ask(fronts.http_port, "GET", "/readyz")
        body = json.loads(response.body)
        assert response.status == 503 and body["draining"] is True and body["status"] == "draining"
        assert (await ask(fronts.http_port, "GET", "/healthz")).status == 200  # it still serves


@pytest.mark.parametrize("hostile", ["</script><script>alert(1)</script>", "<!--", "a & b > c"])
def test_embedded_data_cannot_end_its_script_element(hostile: str):
    data: dict[str, Any] = {"servers": [{"name": "x", "stderr": [hostile]}]}
    html = page(data)
    embedded = html.split(b'id="initial">', 1)[1].split(b"</script>", 1)[0]
    assert b"<" not in embedded and b">" not in embedded and b"&" not in embedded
    assert json.loads(embedded)["servers"][0]["stderr"] == [hostile]
    assert b'id="initial"' not in page(None)


async def test_the_admin_listener_has_its_own_connection_cap():
    async with running_fronts() as fronts, trio.open_nursery() as nursery:
        admin = free_port()
        endpoint = AdminEndpoint(fronts.hub, fronts.hub.config.http)
        await nursery.start(endpoint.serve, f"127.0.0.1:{admin}")
        held = []
        try:
            for _ in range(MAX_ADMIN_CONNECTIONS):
                held.append(await trio.open_tcp_stream("127.0.0.1", admin))
            with trio.fail_after(5):
                while endpoint.connections < MAX_ADMIN_CONNECTIONS:  # noqa: ASYNC110 - bounded above
                    await trio.sleep(0.01)
            response = await ask(admin, "GET", "/healthz")
            assert response.status == 503
            # The MCP listener's connections are counted apart: it still answers.
            assert (await ask(fronts.http_port, "GET", "/healthz")).status == 200
        finally:
            for stream in held:
                await stream.aclose()
        with trio.fail_after(5):
            while endpoint.connections:  # noqa: ASYNC110 - bounded above
                await trio.sleep(0.01)
        assert (await ask(admin, "GET", "/healthz")).status == 200
        nursery.cancel_scope.cancel()


async def test_the_recent_errors_handler_leaves_with_the_hub():
    aggregator_log = logging.getLogger("aggregator")
    async with running_fronts() as fronts:
        assert fronts.hub.recent_errors in aggregator_log.handlers
        logging.getLogger("aggregator.test").warning("a warning for the page %d", 7)
        data = json.loads((await ask(fronts.http_port, "GET", "/status.json")).body)
        assert data["errors"][0]["message"] == "a warning for the page 7"
        assert data["errors"][0]["level"] == "warning"
    assert fronts.hub.recent_errors not in aggregator_log.handlers


async def test_a_flood_of_refused_requests_leaves_the_other_errors_on_the_page():
    token = "a-token-for-the-page-0123456789"
    async with running_fronts(auth_tokens=[token]) as fronts:
        logging.getLogger("aggregator.upstreams.session").error("server %s: the server exited with status %d", "a", 1)
        for _ in range(120):
            assert (await ask(fronts.http_port, "GET", "/metrics")).status == 401
        auth = {"authorization": f"Bearer {token}"}
        errors = json.loads((await ask(fronts.http_port, "GET", "/status.json", auth)).body)["errors"]
        assert [(e["message"], e["count"]) for e in errors] == [
            ("admin: refused GET /metrics: a valid bearer token is required", 120),
            ("server a: the server exited with status 1", 1),
        ]
