"""The HTTP endpoint (Streamable HTTP, MCP 2026-07-28 and 2025-03-26 to 2025-11-25, and legacy
HTTP+SSE), safe by default: its listener, each connection's boundary, and the routing table.

One URL (``/mcp``, and ``/mcp/<profile>`` for each profile): POST carries one JSON-RPC
message (``exchange``; a modern request without a session: ``modern``), GET
opens or resumes an event stream (``streams``), DELETE ends the session
(``sessions``); GET and DELETE without a session are 405. ``/sse`` and ``/messages`` serve the
legacy transport (``legacy_sse``). ``/healthz``, ``/readyz``, ``/status``, ``/status.json`` and
``/metrics`` are the admin paths (``aggregator.ops.admin``). Any other path is a 404; a method a
path does not serve, 405.

Every request is checked before anything else by the admission path shared with the
WebSocket front (``aggregator.fronts.admission``): Host against an allowlist (DNS rebinding),
Origin against an allowlist (403), then the bearer token if tokens are configured (401).
Open connections are capped together with the WebSocket front's (``hub.admission``).
Tokens, cookies and Authorization headers are never logged. A header this endpoint reads
that holds something it cannot have sent or accept (an event id that is not two ASCII
numbers, a session id outside visible ASCII) is a 400, never an exception.

Containment: each connection's task is a boundary (``aggregator.fronts.containment``). An
exception while handling a request is logged with its traceback, answered with 500 and a
JSON-RPC internal error if no response had started, its request is cancelled upstream,
and only that connection closes; the session, other connections and the process go on.

Each session is a client of the hub like a stdio client: ``HttpSession`` receives the
router's messages through ``put_message`` and hands each to the stream it belongs to.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio

from aggregator.config import HttpConfig, parse_listen
from aggregator.fronts.access import AccessPolicy
from aggregator.fronts.admission import check_access
from aggregator.fronts.containment import internal_error
from aggregator.fronts.http.exchange import PostExchange
from aggregator.fronts.http.headers import ParamHeaders
from aggregator.fronts.http.legacy_sse import LegacySession, LegacySse
from aggregator.fronts.http.queue import JSON, QUICK_ANSWER, QuickWaits
from aggregator.fronts.http.sessions import HttpSession
from aggregator.hub.hub import Hub
from aggregator.jsonrpc.codec import dumps
from aggregator.jsonrpc.errors import INVALID_REQUEST, error_response
from aggregator.ops.admin import AdminRoutes
from aggregator.ops.recent_errors import REFUSAL
from aggregator.transports.http_server import HttpConnection, HttpLimits, Request, refuse_connection

log = logging.getLogger(__name__)

__all__ = ["HttpSession", "LegacySession", "StreamableHttpEndpoint"]


class StreamableHttpEndpoint(PostExchange, LegacySse):
    def __init__(self, hub: Hub, config: HttpConfig) -> None:
        self.hub = hub
        self.config = config
        self.sessions: dict[str, HttpSession] = {}
        self.legacy: dict[str, LegacySession] = {}
        self.limits = HttpLimits(
            config.max_body_bytes,
            config.max_header_bytes,
            config.header_timeout,
            body_timeout=config.body_timeout,
            write_timeout=config.write_timeout,
            keepalive_timeout=config.keepalive_timeout,
        )
        self.admission = hub.admission
        self._nursery: trio.Nursery | None = None
        self.access = AccessPolicy(config, hub.config.profiles)
        self.stateless_by_principal = {}  # modern requests being served, per token
        self.param_headers = ParamHeaders()
        self.resting = {}  # stateless clients kept between requests, per (token, profile)
        self.quick = QuickWaits(QUICK_ANSWER)  # how long a request's answer is waited for as JSON
        self.admin = AdminRoutes(hub, config, reload=False)  # /healthz, /readyz, /status, /metrics

    # --- serving ------------------------------------------------------------------------

    async def serve(self, listen: str, *, task_status: trio.TaskStatus[list[Any]] = trio.TASK_STATUS_IGNORED) -> None:
        host, port = parse_listen(listen)
        listeners = await trio.open_tcp_listeners(port, host=host)
        addresses = [listener.socket.getsockname() for listener in listeners]
        log.info(
            "serving MCP over Streamable HTTP at %s",
            ", ".join(
                f"http://{a[0] if ':' not in a[0] else '[' + a[0] + ']'}:{a[1]}{self.config.path}" for a in addresses
            ),
        )
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._expire_idle_sessions)
            nursery.start_soon(self.quick.run)
            await nursery.start(trio.serve_listeners, self._connection, listeners)
            task_status.started(addresses)

    async def _connection(self, stream: trio.SocketStream) -> None:
        """One connection's task, and its boundary: whatever fails in it ends only it."""
        if not self.admission.admit_connection():
            await refuse_connection(stream)
            return
        connection = HttpConnection(stream, self.limits)
        try:
            await connection.serve(partial(self._handle, connection))
        except Exception:
            request = connection.current
            where = f"{request.method} {request.path[:100]}" if request is not None else "reading a request"
            log.exception("http: internal error in %s; closing this connection only", where)
            if request is not None and connection.response_pending():
                await connection.respond(500, [JSON, ("connection", "close")], dumps(internal_error(request.body)))
        finally:
            try:
                await connection.aclose()
            finally:
                self.admission.release_connection()

    async def _handle(self, connection: HttpConnection, request: Request) -> None:
        path, _, query = request.path.partition("?")
        known = (self.config.path, self.config.sse_path, self.config.messages_path)
        if path not in known and self.admin.serves(path):
            await self.admin.handle(connection, request, path)  # checks access itself, its own way
            return
        # Host, Origin and token first, as on every front: nothing, not even which paths
        # exist, is told to a request that fails them.
        denial = check_access(self.access, request.headers)
        if denial is not None:
            log.log(denial.level, "http: refused %s %s: %s", request.method, path[:100], denial.reason, extra=REFUSAL)
            body = dumps(error_response(None, INVALID_REQUEST, denial.reason))
            await connection.respond(denial.status, [JSON, *denial.headers], body)
            return
        if path not in known and self.access.named_profile(path) is None:
            log.debug("http: refused %s %s: no such endpoint", request.method, path[:100])  # as on every front
            await connection.respond_error(404, f"not found; the MCP endpoint is {self.config.path}")
            return
        handlers: dict[str, Callable[[HttpConnection, Request], Awaitable[None]]]
        if path == self.config.sse_path:
            handlers = {"GET": self._legacy_stream}
        elif path == self.config.messages_path:
            handlers = {"POST": partial(self._legacy_post, query=query)}
        else:  # the MCP endpoint, or a profile's
            handlers = {"POST": self._post, "GET": self._get, "DELETE": self._delete}
        handler = handlers.get(request.method)
        if handler is None:
            await connection.respond(
                405,
                [("allow", ", ".join(handlers)), JSON],
                dumps(error_response(None, INVALID_REQUEST, "method not allowed")),
            )
            return
        await handler(connection, request)
