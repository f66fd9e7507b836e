"""The HTTP endpoint (Streamable HTTP, MCP 2026-07-28 and 2025-03-26 to 2025-11-25, and legacy
HTTP+SSE), safe by default: its listener, each connection's boundary, and the routing table.

One URL (``/mcp``, and ``/mcp/<profile>`` for each profile): POST carries one JSON-RPC
message (``exchange``; a modern request without a session: ``modern``), GET
opens or resumes an event stream (``streams``), DELETE ends the session
(``sessions``); GET and DELETE without a session are 405. ``/sse`` and ``/messages`` serve the
legacy transport (``legacy_sse``). ``/healthz``, ``/readyz``, ``/status``, ``/status.json`` and
``/metrics`` are the admin paths, when the endpoint is given them (``AdminPaths``: the
admin pages are above the fronts, so ``serve`` builds them and hands them in). The OAuth
paths (the callback, ``credentials.callback_path``, and the connect page beside it) are
served when the endpoint is given them (the same shape, ``credentials.callback.OAuthCallback``):
a browser there has no bearer token; its session cookie and the single-use ``state`` are
their checks. With
``[auth]``, ``/.well-known/oauth-protected-resource`` (and its path-suffixed forms) is the
protected resource metadata, served to anyone. Any other path is a 404; a method a
path does not serve, 405.

Every request is checked before anything else by the admission path shared with the
WebSocket front (``aggregator.fronts.access``): Host against an allowlist (DNS rebinding),
Origin against an allowlist (403), then the bearer token if tokens are configured (401),
checked with its issuer when it is an OAuth access token (``[auth]``: 401 with a challenge
naming the metadata, 403 for a missing scope).
Open connections are capped together with the WebSocket front's (``hub.admission``).
While the hub drains for shutdown every response closes its connection, so that a
balancer's pooled connections move to the other replicas; with shared ``[cluster] keys``
the listener closes at once too, so that a balancer's new connection is refused and tried
on another replica (``hub.drain``), and each connection waiting between requests closes
(a balancer drops it from its pool, rather than sending it a request that would meet a
replica about to close). Requests on connections already open are still
served, the admin paths among them (a closed listener is "not ready" to a balancer too;
``admin_listen`` keeps answering /readyz with 503 until the process ends).
Tokens, cookies and Authorization headers are never logged. A header this endpoint reads
that holds something it cannot have sent or accept (an event id that is not two ASCII
numbers, a session id outside visible ASCII) is a 400, never an exception.

Containment: each connection's task is a boundary (``aggregator.fronts.containment``). An
exception while handling a request is logged with its traceback, answered with 500 and a
JSON-RPC internal error if no response had started, its request is cancelled upstream,
and only that connection closes; the session, other connections and the process go on.

Each session is a client of the hub like a stdio client: ``HttpSession`` receives the
router's messages through ``put_message`` and hands each to the stream it belongs to.

The endpoint owns its listener, the limits and access policy of its connections, and its
parts, each with its own state, built here with what each needs and nothing more:

- ``sessions``: the session table (``sessions.SessionTable``), which DELETE goes to;
- ``streams``: GET event streams and the grace periods of lost ones (``streams.EventStreams``);
- ``stateless``: modern stateless requests (``modern.StatelessRequests``);
- ``exchange``: POST (``exchange.PostExchange``), which hands a request to the three above;
- ``legacy``: the HTTP+SSE transport and its sessions (``legacy_sse.LegacySse``);
- ``quick``: the short waits for a request's answer, shared by ``exchange`` and ``stateless``.

A request goes to its part by path and method through one table built once (``routes``);
on the MCP endpoint a GET or DELETE without Mcp-Session-Id is answered here (405).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol

import trio

from aggregator.cluster.session_record import SessionRecords
from aggregator.config import HttpConfig, parse_listen
from aggregator.fronts.access import AccessPolicy, check_access
from aggregator.fronts.authorization import metadata_document, metadata_paths
from aggregator.fronts.containment import connection_failed
from aggregator.fronts.http.answers import no_session
from aggregator.fronts.http.exchange import PostExchange
from aggregator.fronts.http.legacy_sse import LegacySession, LegacySse
from aggregator.fronts.http.modern import StatelessRequests
from aggregator.fronts.http.queue import JSON, QUICK_ANSWER, QuickWaits
from aggregator.fronts.http.relay import Relay
from aggregator.fronts.http.sessions import HttpSession, SessionTable
from aggregator.fronts.http.shared_sessions import SharedSessions
from aggregator.fronts.http.streams import EventStreams
from aggregator.fronts.port import ClientPort
from aggregator.jsonrpc.codec import dumps
from aggregator.jsonrpc.errors import INVALID_REQUEST, error_response
from aggregator.transports.http_server import HttpConnection, HttpLimits, Request, refuse_connection

log = logging.getLogger(__name__)

__all__ = ["HttpSession", "LegacySession", "StreamableHttpEndpoint"]


Handler = Callable[[HttpConnection, Request], Awaitable[None]]
# Methods of the MCP endpoint that name a session: without Mcp-Session-Id, a 405.
NAME_A_SESSION = frozenset({"GET", "DELETE"})


class AdminPaths(Protocol):
    """The admin paths an endpoint also serves (``ops.admin.AdminRoutes``, given by whoever
    builds the endpoint: they read the hub from above it)."""

    def serves(self, path: str) -> bool: ...

    async def handle(self, connection: HttpConnection, request: Request, path: str) -> None:
        """Answer one request on an admin path (``serves(path)`` is true); checks access itself."""


class StreamableHttpEndpoint:
    """The HTTP endpoint: its listener, each connection's boundary, and the routing of each
    request to the part that serves it."""

    def __init__(
        self,
        hub: ClientPort,
        config: HttpConfig,
        *,
        admin: AdminPaths | None = None,
        callback: AdminPaths | None = None,
    ) -> None:
        self.hub = hub
        self.config = config
        self.limits = HttpLimits(
            config.max_body_bytes,
            config.max_header_bytes,
            config.header_timeout,
            body_timeout=config.body_timeout,
            write_timeout=config.write_timeout,
            keepalive_timeout=config.keepalive_timeout,
        )
        self.admission = hub.admission
        self._open: set[HttpConnection] = set()  # served now (closed when idle at a drain with keys)
        self.access = AccessPolicy(config, hub.config.profiles, hub.config.auth)
        self.admin = admin  # /healthz, /readyz, /status, /metrics, if given
        self.callback = callback  # the OAuth callback path, if given
        # The protected resource metadata (RFC 9728), with [auth]: public, like any metadata.
        auth = hub.config.auth
        self.metadata = dumps(metadata_document(auth)) if auth.enabled else b""
        self.metadata_paths = metadata_paths(auth, config.path) if auth.enabled else frozenset()
        self.quick = QuickWaits(QUICK_ANSWER)  # how long a request's answer is waited for as JSON
        self.sessions = SessionTable(hub, config, self.access, self.admission)
        self.streams = EventStreams(hub, config, self.sessions)
        self.stateless = StatelessRequests(hub, config, self.access, self.quick)
        self.exchange = PostExchange(
            hub,
            config,
            access=self.access,
            admission=self.admission,
            sessions=self.sessions,
            streams=self.streams,
            stateless=self.stateless,
            quick=self.quick,
        )
        # With [cluster] keys: a session's answers and cancels that belong to another replica.
        self.legacy = LegacySse(hub, config, self.access, self.admission)
        self.relay = Relay(hub, self.sessions, self.stateless, self.legacy) if hub.keys.shared else None
        self.exchange.relay = self.relay
        self.sessions.on_deleted = self.relay.deleted if self.relay is not None else None
        self.legacy.hand_over = self.relay.legacy if self.relay is not None else None
        # With keys and a configured store: sessions' state and GET streams in the store.
        self.shared: SharedSessions | None = None
        if hub.keys.shared and hub.config.cluster.store is not None:
            self.share_sessions()
        # Path, then method, to the part that serves it; a profile's path (``/mcp/<profile>``)
        # is served as the MCP endpoint. Should two paths be configured alike, the legacy
        # transport's take them, as they always did.
        self._mcp: dict[str, Handler] = {
            "POST": self.exchange.post,
            "GET": self.streams.get,
            "DELETE": self.sessions.delete,
        }
        self.routes: dict[str, dict[str, Handler]] = {
            config.path: self._mcp,
            config.messages_path: {"POST": self.legacy.post},
            config.sse_path: {"GET": self.legacy.stream},
        }

    def share_sessions(self) -> None:
        """Keep the sessions' mutable state and GET streams in the hub's store (``[cluster]``
        keys and store; a test may ask for it on the embedded store). Before ``serve``."""
        records = SessionRecords(self.hub.store, lifetime=self.hub.config.cluster.session_lifetime)
        self.shared = SharedSessions(self.hub, self.sessions, records, self.hub.keys.replica)
        self.sessions.shared = self.streams.shared = self.exchange.shared = self.shared

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
            self.streams.grace_nursery = nursery
            nursery.start_soon(self.sessions.expire_idle)
            nursery.start_soon(self.quick.run)
            if self.relay is not None:
                await nursery.start(self.relay.run)
            if self.shared is not None:
                await nursery.start(self.shared.run)
            await nursery.start(self._listen, listeners, addresses, nursery)
            task_status.started(addresses)

    async def _listen(
        self,
        listeners: list[trio.SocketListener],
        addresses: list[Any],
        connections: trio.Nursery,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept connections, each served in ``connections``, until the hub drains with
        shared keys: then the listeners close (a connection still waiting to be accepted
        is refused with them) and the connections open go on."""
        async with trio.open_nursery() as accepting:
            serving = partial(trio.serve_listeners, self._connection, listeners, handler_nursery=connections)
            await accepting.start(serving)
            task_status.started()
            await self.hub.shutdown.wait_listening_ends()
            log.info(
                "draining: stopped listening at %s; the connections open are served",
                ", ".join(f"{a[0]}:{a[1]}" for a in addresses),
            )
            accepting.cancel_scope.cancel()
            for connection in list(self._open):
                connection.close_if_idle()  # pooled by a balancer: its next request goes elsewhere

    async def _connection(self, stream: trio.SocketStream) -> None:
        """One connection's task, and its boundary: whatever fails in it ends only it."""
        if not self.admission.admit_connection():
            await refuse_connection(stream)
            return
        connection = HttpConnection(stream, self.limits)
        self._open.add(connection)
        try:
            try:
                await connection.serve(partial(self._handle, connection))
            except Exception:  # the boundary (``aggregator.fronts.containment``)
                await connection_failed(connection, "http", log)
        finally:
            self._open.discard(connection)
            try:
                await connection.aclose()
            finally:
                self.admission.release_connection()

    async def _handle(self, connection: HttpConnection, request: Request) -> None:
        path = request.path.partition("?")[0]
        if self.hub.draining:  # a balancer's pooled connections move to the other replicas
            connection.last_request()
        if path in self.metadata_paths:
            await self._metadata(connection, request)
            return
        routes = self.routes.get(path)
        if routes is None and self.admin is not None and self.admin.serves(path):
            await self.admin.handle(connection, request, path)  # checks access itself, its own way
            return
        if routes is None and self.callback is not None and self.callback.serves(path):
            await self.callback.handle(connection, request, path)  # checked by its cookie and state
            return
        # Host, Origin and token first, as on every front: nothing, not even which paths
        # exist, is told to a request that fails them.
        denial = await check_access(self.access, request.headers, request.path)
        if denial is not None:
            self.access.note_refusal(log, denial, "http: refused %s %s: %s", request.method, path[:100], denial.reason)
            body = dumps(error_response(None, INVALID_REQUEST, denial.reason))
            await connection.respond(denial.status, [JSON, *denial.headers], body)
            return
        if routes is None:
            if self.access.named_profile(path) is None:
                log.debug("http: refused %s %s: no such endpoint", request.method, path[:100])  # as on every front
                await connection.respond_error(404, f"not found; the MCP endpoint is {self.config.path}")
                return
            routes = self._mcp  # a profile's
        handler = routes.get(request.method)
        if handler is None:
            await connection.respond(
                405,
                [("allow", ", ".join(routes)), JSON],
                dumps(error_response(None, INVALID_REQUEST, "method not allowed")),
            )
            return
        if routes is self._mcp and request.method in NAME_A_SESSION and "mcp-session-id" not in request.headers:
            await no_session(connection, request)
            return
        await handler(connection, request)

    async def _metadata(self, connection: HttpConnection, request: Request) -> None:
        """The protected resource metadata: what a client reads, without a token and from
        any origin (a browser-based client too), to find the authorization server."""
        if request.method not in ("GET", "HEAD"):
            body = dumps(error_response(None, INVALID_REQUEST, "method not allowed"))
            await connection.respond(405, [("allow", "GET, HEAD"), JSON], body)
            return
        cors = ("access-control-allow-origin", "*")
        await connection.respond(200, [JSON, cors, ("cache-control", "max-age=300")], self.metadata)
