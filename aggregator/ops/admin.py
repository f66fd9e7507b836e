"""The admin paths (``/healthz``, ``/readyz``, ``/status``, ``/status.json``, ``/metrics``,
``/reload``) and the admin listener (``serve --admin``, ``http.admin_listen``).

The same paths are served on the HTTP listener (``--http``) beside MCP, except
``POST /reload``, which only the admin listener takes. Every request is checked first, as
on every front: Host against ``http.allowed_hosts`` (421), Origin against
``http.allowed_origins`` (403), then a bearer token (401): ``http.admin_token`` when it is
set (the MCP tokens do not open the admin paths then), otherwise any token the MCP
endpoint accepts (static tokens, and access tokens with ``[auth]``), when tokens are
configured; an access token must also carry every scope of ``auth.admin_scopes`` (403
``insufficient_scope`` naming them), except for the probes ``/healthz`` and ``/readyz``,
so that no user of the MCP endpoint is an operator by default. One exception: the status
page itself (``GET /status``) passes with Host and Origin alone, because a browser cannot
send a bearer token with a page load; without a valid token it is an empty page that holds
no data and fetches ``/status.json`` with the token given after ``#token=`` in its address
(a fragment never leaves the browser, so no token is read from a URL here).

``/metrics`` answers what ``hub.metrics.exposition()`` returns and ``/reload`` what
``await hub.reload()`` returns, when the hub has them; 404 otherwise.

Containment: the admin listener's connections are boundaries like the HTTP front's; one
that fails is logged and closed, nothing else. They are counted on their own
(``MAX_ADMIN_CONNECTIONS``), so a full MCP listener never locks the operator out.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any

import attrs
import trio

from aggregator.config import Config, HttpConfig, parse_listen
from aggregator.config.model import ADMIN_READ_PATHS
from aggregator.fronts.access import AccessPolicy, Denial, check_access, check_exposure
from aggregator.fronts.containment import connection_failed
from aggregator.hub.hub import Hub
from aggregator.jsonrpc.codec import dumps
from aggregator.ops.status import health, readiness, snapshot
from aggregator.ops.status_page import page
from aggregator.telemetry.recent_errors import REFUSAL
from aggregator.transports.http_server import HttpConnection, HttpLimits, Request, refuse_connection

log = logging.getLogger(__name__)

MAX_ADMIN_CONNECTIONS = 32
READ_PATHS = ADMIN_READ_PATHS
PROBES = ("/healthz", "/readyz")  # an access token opens them without auth.admin_scopes
JSON_TYPE = ("content-type", "application/json")
NO_STORE = ("cache-control", "no-store")


def admin_exposure(config: HttpConfig, listen: str, option: str, *, oauth: bool = False) -> None:
    """Refuse an admin listener beyond loopback without a token (admin or MCP, or access
    tokens: ``oauth``), unless the network is trusted (``http.allow_unauthenticated_remote``);
    raises ConfigError."""
    tokens = (config.admin_token,) if config.admin_token else config.auth_tokens
    check_exposure(
        attrs.evolve(config, auth_tokens=tokens),
        listen,
        option,
        "http.admin_token (or http.auth_tokens)",
        oauth=oauth and not config.admin_token,
    )


def admin_access(config: Config) -> str | None:
    """How the admin paths are opened, for ``aggregator check`` to say, when ``[auth]`` makes
    it a question (any user of the MCP endpoint could otherwise be taken for an operator)."""
    if not config.auth.enabled:
        return None
    if config.http.admin_token:
        return "admin paths: http.admin_token alone opens them"
    if not config.auth.admin_scopes:
        return "admin paths: any token the MCP endpoint accepts opens them (auth.admin_scopes is empty)"
    scopes = " ".join(config.auth.admin_scopes)
    return (
        f"admin paths: an access token needs the scope {scopes} (auth.admin_scopes), or a static token"
        " of http.auth_tokens or a profile's tokens (/healthz and /readyz: any token the MCP endpoint accepts);"
        " http.admin_token would alone open them"
    )


class AdminRoutes:
    """The admin paths of one listener (``reload``: whether ``POST /reload`` is served)."""

    def __init__(self, hub: Hub, config: HttpConfig, *, reload: bool) -> None:
        self.hub = hub
        self.paths = (*READ_PATHS, "/reload") if reload else READ_PATHS
        # What an access token must carry beyond what the MCP endpoint asks (not with
        # http.admin_token: it alone opens the admin paths then).
        self.admin_scopes: tuple[str, ...] = ()
        if config.admin_token:
            self.access = AccessPolicy(attrs.evolve(config, auth_tokens=(config.admin_token,)))
        else:
            self.access = AccessPolicy(config, hub.config.profiles, hub.config.auth)
            self.admin_scopes = hub.config.auth.admin_scopes
        # Host and Origin only: for the status page's empty shell.
        self.page_access = AccessPolicy(attrs.evolve(config, auth_tokens=()))

    def serves(self, path: str) -> bool:
        return path in self.paths

    async def handle(self, connection: HttpConnection, request: Request, path: str) -> None:
        """Answer one request on an admin path (``serves(path)`` is true)."""
        denial = await check_access(self.access, request.headers, request.path)
        if denial is None and self.admin_scopes and path not in PROBES:
            refused = self.access.scope_refusal(request.headers, self.admin_scopes, "the admin paths")
            denial = None if refused is None else Denial(*refused)
        if denial is not None and path == "/status" and request.method in ("GET", "HEAD"):
            if await check_access(self.page_access, request.headers) is None:
                await self._page(connection, None)  # the empty shell: no data without the token
                return
        if denial is not None:
            await self.refuse(connection, request, path, denial)
            return
        wanted = "POST" if path == "/reload" else "GET"
        if request.method != wanted and not (wanted == "GET" and request.method == "HEAD"):
            allow = "POST" if wanted == "POST" else "GET, HEAD"
            body = dumps({"error": "method not allowed", "allow": allow})
            await connection.respond(405, [("allow", allow), JSON_TYPE, NO_STORE], body)
            return
        if path == "/healthz":
            await self._json(connection, 200, health(self.hub))
        elif path == "/readyz":
            ready, detail = readiness(self.hub)
            await self._json(connection, 200 if ready else 503, detail)
        elif path == "/status.json":
            await self._json(connection, 200, snapshot(self.hub))
        elif path == "/status":
            await self._page(connection, snapshot(self.hub))
        elif path == "/metrics":
            await self._metrics(connection)
        else:
            await self._reload(connection)

    async def refuse(self, connection: HttpConnection, request: Request, path: str, denial: Denial) -> None:
        log.log(denial.level, "admin: refused %s %s: %s", request.method, path, denial.reason, extra=REFUSAL)
        await connection.respond(denial.status, [JSON_TYPE, NO_STORE, *denial.headers], dumps({"error": denial.reason}))

    async def _json(self, connection: HttpConnection, status: int, body: Any) -> None:
        await connection.respond(status, [JSON_TYPE, NO_STORE], dumps(body))

    async def _page(self, connection: HttpConnection, data: dict[str, Any] | None) -> None:
        headers = [
            ("content-type", "text/html; charset=utf-8"),
            NO_STORE,
            ("x-content-type-options", "nosniff"),
            ("referrer-policy", "no-referrer"),
            (
                "content-security-policy",
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline';"
                " connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            ),
        ]
        await connection.respond(200, headers, page(data))

    async def _metrics(self, connection: HttpConnection) -> None:
        metrics = getattr(self.hub, "metrics", None)
        if metrics is None:
            await self._json(connection, 404, {"error": "metrics are not available in this build"})
            return
        body, content_type = metrics.exposition()
        await connection.respond(200, [("content-type", content_type), NO_STORE], body)

    async def _reload(self, connection: HttpConnection) -> None:
        reload = getattr(self.hub, "reload", None)
        if reload is None:
            await self._json(connection, 404, {"error": "reloading is not available in this build"})
            return
        result = await reload()
        body = {"ok": bool(result.ok), "errors": list(result.errors), "changes": list(result.changes)}
        await self._json(connection, 200 if body["ok"] else 422, body)


class AdminEndpoint:
    """The admin listener: the admin paths and nothing else."""

    def __init__(self, hub: Hub, config: HttpConfig) -> None:
        self.routes = AdminRoutes(hub, config, reload=True)
        self.limits = HttpLimits(
            min(config.max_body_bytes, 64 * 1024),
            config.max_header_bytes,
            config.header_timeout,
            body_timeout=config.body_timeout,
            write_timeout=config.write_timeout,
            keepalive_timeout=config.keepalive_timeout,
        )
        self.connections = 0

    async def serve(self, listen: str, *, task_status: trio.TaskStatus[list[Any]] = trio.TASK_STATUS_IGNORED) -> None:
        host, port = parse_listen(listen)
        listeners = await trio.open_tcp_listeners(port, host=host)
        addresses = [listener.socket.getsockname() for listener in listeners]
        log.info(
            "serving the admin endpoint (/healthz, /readyz, /status, /metrics, /reload) at %s",
            ", ".join(f"http://{a[0] if ':' not in a[0] else '[' + a[0] + ']'}:{a[1]}" for a in addresses),
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._connection, listeners)
            task_status.started(addresses)

    async def _connection(self, stream: trio.SocketStream) -> None:
        """One connection's task, and its boundary: whatever fails in it ends only it."""
        if self.connections >= MAX_ADMIN_CONNECTIONS:
            await refuse_connection(stream)
            return
        self.connections += 1
        connection = HttpConnection(stream, self.limits)
        try:
            try:
                await connection.serve(partial(self._handle, connection))
            except Exception:  # the boundary (``aggregator.fronts.containment``)
                await connection_failed(connection, "admin", log)
        finally:
            self.connections -= 1
            await connection.aclose()

    async def _handle(self, connection: HttpConnection, request: Request) -> None:
        path = request.path.partition("?")[0]
        if self.routes.serves(path):
            await self.routes.handle(connection, request, path)
            return
        # Host, Origin and token first: a request that fails them learns nothing of the paths.
        denial = await check_access(self.routes.access, request.headers, request.path)
        if denial is not None:
            await self.routes.refuse(connection, request, path[:100], denial)
            return
        log.debug("admin: refused %s %s: no such path", request.method, path[:100])
        body = json.dumps({"error": "not found", "paths": list(self.routes.paths)}).encode()
        await connection.respond(404, [JSON_TYPE, NO_STORE], body)
