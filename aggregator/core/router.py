"""Routing between downstream sessions (clients) and upstreams (servers). Sans-IO.

Theory of operation
-------------------
Events go in as method calls (a client sent these bytes; server S sent these bytes; S is
ready with this catalog; S was lost; a client went away; time passed) and commands come
out as lists (send this message to client session C; send that one to server S; re-list
S's tools). The trio layer executes the commands; nothing here awaits or blocks. Time is
read from an injected clock, so tests drive timeouts without sleeping.

Invariants
----------
1. A client's request id is echoed back exactly, and only to that client. Upstream ids
   are minted here, per upstream, as increasing integers; the proxy's own requests made
   by the trio layer (initialize, listing) use string ids ``"aggregator-N"`` and never
   reach this table. So ids from different clients can never collide upstream.
2. Every forwarded request is one ``Pending``, in ``link.pending`` (by upstream id) and in
   ``client.in_flight`` (by client id), and in ``progress`` if it asked for progress.
   Every exit (response, error, cancellation, timeout, client gone, upstream lost) goes
   through ``_end``, which removes it from all of them: the tables hold exactly what is
   in flight.
3. A response whose id is not pending (late after a cancel or timeout, foreign, repeated)
   is dropped; so is progress for a token not in flight or from another server.
4. Names, URIs and task ids are looked up before anything is sent; an unknown one is
   -32602 from the proxy and reaches no upstream.
5. Server-to-client requests get proxy-minted ids per client, and the answer goes back
   under the upstream's own id. One that cannot be routed (``core.affinity``) is answered
   with an error at once; only a roots/list waits, for its client to initialize, within
   ``ROOTS_HOLD_SECONDS``.
6. Errors the proxy makes itself carry ``data.source = "aggregator"``, the server and a
   reason, so nobody mistakes them for an upstream's.
7. A name or URI that misses the catalog but belongs to a shared server between starts
   (``aggregator.core.outages``) is never "Unknown": the request waits for the server
   within its own timeout (a held ``Pending``, in ``client.in_flight`` and the deadlines,
   never in ``link.pending``: nothing was sent) or is answered ``unavailable`` with the
   server's state. Held requests are looked up again once the server is listed.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import attrs

from aggregator import __version__
from aggregator.core import affinity, defaults
from aggregator.core.catalog import CAPABILITY_OF, LIST_METHODS, PROMPTS, RESOURCES, TEMPLATES, TOOLS, Catalog, Route
from aggregator.core.commands import (
    Command,
    ControlReply,
    Refresh,
    StartUpstream,
    StopUpstream,
    ToClient,
    ToServer,
    WaitForStartup,
)
from aggregator.core.deadlines import Deadlines
from aggregator.core.log_levels import LEVELS, most_verbose, passes
from aggregator.core.outages import (
    FAILED,
    RESTARTING,
    Outage,
    name_owner,
    remember,
    should_hold,
    template_key,
    template_owner,
    unavailable,
    uri_owner,
)
from aggregator.core.session_catalog import SessionViews
from aggregator.core.subscriptions import Subscriptions
from aggregator.core.tasks import RELATED_TASK, expose_task_id, expose_task_ids, restore_related_task, split_task_id
from aggregator.core.uris import InvalidUri, expose_uri, normalize_uri, rewrite_content_uris
from aggregator.jsonrpc.codec import (
    DEFAULT_MAX_DEPTH,
    ERROR,
    NOTIFICATION,
    REQUEST,
    RESPONSE,
    decode_message,
    dumps,
)
from aggregator.jsonrpc.errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    RemoteProtocolError,
    error_response,
)
from aggregator.mcp.constants import LIST_CHANGED, SERVER_REQUEST_CAPABILITIES, SERVER_REQUESTS
from aggregator.mcp.versions import DISCOVER, discover_refused, negotiate

log = logging.getLogger(__name__)

CONTROL_ID_PREFIX = "aggregator-"
NO_SESSION = 0  # the "client" of the proxy's own requests; real sessions start at 1
# The ``_meta`` key of our initialize result that names this running proxy: an upstream
# that answers with our own instance is this proxy itself (a config that lists its own URL).
INSTANCE_KEY = "dev.mcp-aggregator/instance"
# The progress tokens the proxy sends upstream: strings no server would pick by chance, so
# one in a server's request names the proxy's request in flight and nothing else.
PROGRESS_TOKEN_PREFIX = "aggregator-progress-"
# The error a server answers when a URL-mode elicitation must be completed first (its
# data.elicitations name them; their completion notifications go to that client).
URL_ELICITATION_REQUIRED = -32042
# How long a roots/list waits for the client its roots come from to finish initializing;
# then it is answered from proxy.roots (or with no roots).
ROOTS_HOLD_SECONDS = 10.0


# --- state ------------------------------------------------------------------------------


class Pending:
    """One request in flight to an upstream."""

    __slots__ = (
        "session",
        "client_id",
        "method",
        "server",
        "upstream_id",
        "client_token",
        "token",
        "deadline",
        "hard_deadline",
        "done",
        "extra",
    )

    def __init__(self, session: int, client_id: Any, method: str, server: str, upstream_id: int) -> None:
        self.session = session
        self.client_id = client_id
        self.method = method
        self.server = server
        self.upstream_id = upstream_id
        self.client_token: Any = None
        self.token: str | None = None  # the proxy's progress token upstream
        self.deadline = 0.0
        self.hard_deadline = 0.0
        self.done = False
        self.extra: Any = None  # subscription key, or the Gather it belongs to


class Gather:
    """A client request answered from several upstreams (tasks/list)."""

    __slots__ = ("session", "client_id", "remaining", "items")

    def __init__(self, session: int, client_id: Any, remaining: int) -> None:
        self.session = session
        self.client_id = client_id
        self.remaining = remaining
        self.items: list[Any] = []


class Held(NamedTuple):
    """The ``extra`` of a ``Pending`` that waits for its server to be listed again."""

    message: dict[str, Any]


class ServerDown(Exception):
    """A lookup found that what a request names belongs to ``server``, which is out."""

    def __init__(self, server: str) -> None:
        super().__init__(server)
        self.server = server


class Reverse(NamedTuple):
    """A server-to-client request in flight: where its answer goes back to."""

    server: str
    upstream_id: Any
    method: str


@attrs.define(eq=False)
class UpstreamLink:
    name: str
    prefix: str
    uri_prefix: str
    server: str = ""  # the configured server; differs from name for per-session links
    session: int | None = None  # the one client a per-session link belongs to
    request_timeout: float = defaults.REQUEST_TIMEOUT
    max_request_timeout: float = defaults.MAX_REQUEST_TIMEOUT
    timeout_resets_on_progress: bool = defaults.TIMEOUT_RESETS_ON_PROGRESS
    ready: bool = False
    next_id: int = 1
    pending: dict[int, Pending] = attrs.field(factory=dict)
    capabilities: dict[str, Any] = attrs.field(factory=dict)
    instructions: str | None = None
    protocol_version: str | None = None
    log_level: str | None = None  # what the proxy last asked this upstream for
    # It delivers what belongs to a request on that request's own stream (Streamable HTTP),
    # and the transport says which: a message that came any other way belongs to none.
    streams: bool = False
    # Why this upstream cannot take more input now (its queue is past its budget or it
    # reads nothing), as the trio layer reports it; None when it can.
    overloaded: str | None = None
    # Requests held until a per-session link is ready: (client key, message, params).
    waiting: list[tuple[int, dict[str, Any], dict[str, Any]]] = attrs.field(factory=list)
    # It was told its roots changed and has not asked for them since: telling it again
    # says nothing new (a client's flood of changes reaches it once).
    roots_told: bool = False


@attrs.define(eq=False)
class ClientState:
    key: int
    initialize_seen: bool = False
    initialized: bool = False
    protocol_version: str | None = None
    capabilities: dict[str, Any] = attrs.field(factory=dict)
    client_info: dict[str, Any] = attrs.field(factory=dict)
    advertised: dict[str, Any] = attrs.field(factory=dict)
    in_flight: dict[Any, Pending] = attrs.field(factory=dict)
    log_level: str | None = None
    profile: str = "default"
    # What this client sees: its profile's catalog, or its own view once a per-session
    # server of its own has listed (``Router.views``).
    catalog: Any = None


def _refusal_reason(exc: RemoteProtocolError) -> str:
    """The reason a refused message gives the party waiting for it: ``too_large`` past a
    limit (depth), ``malformed`` for what could not be read."""
    data = exc.data
    return data["reason"] if type(data) is dict and "reason" in data else "malformed"


def proxy_error(
    id: Any, message: str, *, reason: str, server: str | None = None, code: int = INTERNAL_ERROR
) -> dict[str, Any]:
    data: dict[str, Any] = {"source": "aggregator", "reason": reason}
    if server is not None:
        data["server"] = server
    return error_response(id, code, message, data)


# Allow or deny a server-to-client request: (server, method, params) -> bool. The policy
# layer plugs in here; the default allows everything the client declared.
ServerRequestPolicy = Callable[[str, str, dict[str, Any]], bool]


class SessionInfo(NamedTuple):
    """What the trio layer may know of a client session: a snapshot, read-only."""

    profile: str
    protocol_version: str | None  # agreed at initialize; None before
    in_flight: int  # its requests not answered yet


class Router:
    def __init__(
        self,
        catalog: Catalog,
        servers: list[Any],
        *,
        clock: Callable[[], float] = time.monotonic,
        server_requests: tuple[str, ...] = defaults.SERVER_REQUESTS,
        roots: list[dict[str, Any]] | None = None,
        list_changed_debounce: float = defaults.LIST_CHANGED_DEBOUNCE,
        max_in_flight: int = defaults.MAX_IN_FLIGHT_PER_SESSION,
        profiles: dict[str, Catalog] | None = None,
        max_json_depth: int = DEFAULT_MAX_DEPTH,
        instance: str | None = None,
        single_client: bool = False,
        server_request_policy: ServerRequestPolicy | None = None,
    ) -> None:
        # One catalog per profile (what its clients see), all over one store of items.
        self.catalog = catalog
        self.catalogs: dict[str, Catalog] = {"default": catalog, **(profiles or {})}
        self.clock = clock
        self.instance = instance if instance is not None else secrets.token_hex(8)
        self.links: dict[str, UpstreamLink] = {
            s.name: UpstreamLink(
                s.name,
                catalog.naming[s.name].prefix,
                catalog.naming[s.name].uri_prefix,
                request_timeout=getattr(s, "request_timeout", defaults.REQUEST_TIMEOUT),
                max_request_timeout=getattr(s, "max_request_timeout", defaults.MAX_REQUEST_TIMEOUT),
                timeout_resets_on_progress=getattr(
                    s, "timeout_resets_on_progress", defaults.TIMEOUT_RESETS_ON_PROGRESS
                ),
                server=s.name,
            )
            for s in servers
        }
        self.per_session = {s.name for s in servers if getattr(s, "isolation", "shared") == "per-session"}
        # Shared servers not listed (yet, or again): their state and what was seen of them.
        self.outages: dict[str, Outage] = {s.name: Outage(s.name) for s in servers}
        self.held: dict[str, list[Pending]] = {}  # server -> requests waiting for its listing
        self.start_takes: dict[str, float] = {}  # server -> how long its last start took
        self.clients: dict[int, ClientState] = {}
        self.startup_complete = False
        self.draining = False  # shutting down: finish what is in flight, take nothing new
        self.max_in_flight = max_in_flight
        self.max_json_depth = max_json_depth  # enforced where messages are decoded
        self.server_requests = server_requests
        self.roots = roots
        # The proxy can only ever have one client (stdio, no network front): shared servers
        # see that client's roots. Otherwise they see only ``roots``.
        self.single_client = single_client
        # roots/list requests waiting for their client to initialize: (link, id, deadline).
        self.held_roots: list[tuple[str, Any, float]] = []
        self.roots_fallback: set[str] = set()  # links answered from ``roots`` in their client's place
        self.server_request_policy: ServerRequestPolicy = (
            server_request_policy if server_request_policy is not None else lambda server, method, params: True
        )
        self.list_changed_debounce = list_changed_debounce
        self.progress: dict[str, Pending] = {}
        self.deadlines = Deadlines()
        self.subscriptions = Subscriptions()  # keyed by link: (server or server@session, URI)
        self.views = SessionViews()  # of the sessions whose own per-session connections listed
        self.tasks: dict[str, int] = {}  # exposed task id -> owning session
        self.reverse: dict[tuple[int, int], Reverse] = {}  # (session, proxy id) -> where back
        self.reverse_ids: dict[tuple[str, Any], tuple[int, int]] = {}  # (server, its id) -> ^
        self.reverse_count: dict[int, int] = {}  # session -> its server-to-client requests unanswered
        self.elicitations: dict[tuple[str, Any], int] = {}  # (server, elicitationId) -> session
        self.elicitation_count: dict[int, int] = {}  # session -> its entries in ``elicitations``
        self._next_token = 1
        self._next_reverse_id = 1
        self._announce_methods: dict[str | int, list[str]] = {}  # profile, or session -> notices due
        self._announce_at: float | None = None
        self._requests = {
            "initialize": self._initialize,
            "ping": self._ping,
            "tools/list": self._list,
            "prompts/list": self._list,
            "resources/list": self._list,
            "resources/templates/list": self._list,
            "tools/call": self._call_by_name,
            "prompts/get": self._call_by_name,
            "resources/read": self._read_resource,
            "resources/subscribe": self._subscribe,
            "resources/unsubscribe": self._unsubscribe,
            "completion/complete": self._complete,
            "logging/setLevel": self._set_level,
            "tasks/get": self._task_request,
            "tasks/result": self._task_request,
            "tasks/cancel": self._task_request,
            "tasks/list": self._list_tasks,
        }

    # --- what the trio layer tells and asks (it never writes the router's fields) ------

    def startup_completed(self) -> None:
        """Startup is over (every server listed, or the wait for them timed out): requests
        no longer wait for servers that have not listed yet."""
        self.startup_complete = True

    def start_draining(self) -> None:
        """Shutting down: what is in flight finishes, nothing new is taken."""
        self.draining = True

    def link_ended(self, name: str) -> None:
        """A per-session connection ended on its own (crashed, or could not start) before it
        was ready: forget it, so that its client's next request starts a fresh one."""
        link = self.links.get(name)
        if link is not None and link.session is not None and not link.ready:
            del self.links[name]

    def server_streams(self, name: str, streams: bool) -> None:
        """Whether this upstream's transport delivers what belongs to a request on that
        request's own stream (Streamable HTTP)."""
        link = self.links.get(name)
        if link is not None:
            link.streams = streams

    def server_congested(self, name: str, reason: str | None) -> int | None:
        """This upstream cannot take more input (``reason``) or can again (None): while it
        cannot, new requests to it are refused. Returns how many of its requests are in
        flight, or None if it is not known (any more)."""
        link = self.links.get(name)
        if link is None:
            return None
        link.overloaded = reason
        return len(link.pending)

    def session_info(self, key: int) -> SessionInfo | None:
        """What is known of a client session, or None if it is not connected (any more)."""
        client = self.clients.get(key)
        if client is None:
            return None
        return SessionInfo(client.profile, client.protocol_version, len(client.in_flight))

    def request_in_flight(self, key: int, id: Any) -> bool:
        """Whether this client already has a request with this id in flight."""
        client = self.clients.get(key)
        return client is not None and id in client.in_flight

    def profile_catalog(self, profile: str) -> Catalog:
        """What the clients of ``profile`` see (read it, never change it)."""
        return self.catalogs[profile]

    # --- clients ------------------------------------------------------------------------

    def client_connected(self, key: int, profile: str = "default") -> None:
        if profile not in self.catalogs:
            raise ValueError(f"no such profile: {profile!r}")
        self.clients[key] = ClientState(key, profile=profile, catalog=self.catalogs[profile])

    def client_disconnected(self, key: int) -> list[Command]:
        """A client went away: cancel its work upstream, answer what it was asked, tidy up."""
        client = self.clients.pop(key, None)
        if client is None:
            return []
        self.views.pop(key)
        out: list[Command] = []
        for pending in list(client.in_flight.values()):
            self._end(pending)
            if self.links[pending.server].ready and type(pending.extra) is not Held:
                out.append(ToServer(pending.server, _cancelled(pending.upstream_id, "client disconnected")))
        for (session, proxy_id), reverse in list(self.reverse.items()):
            if session == key:
                self._end_reverse(session, proxy_id)
                out.append(
                    ToServer(
                        reverse.server,
                        proxy_error(
                            reverse.upstream_id,
                            f"The client that was asked for {reverse.method} disconnected",
                            reason="unavailable",
                            server=reverse.server,
                        ),
                    )
                )
        for name, id, _deadline in self._held_for(key):
            out.append(
                ToServer(
                    name,
                    proxy_error(
                        id,
                        "The client whose roots this server sees disconnected before it could be asked",
                        reason="unavailable",
                        server=name,
                    ),
                )
            )
        for name, uri in self.subscriptions.drop_session(key):
            link = self.links.get(name)
            if link is not None and link.session is None:  # its own connections just stop
                out += self._own_request(name, "resources/unsubscribe", {"uri": uri})
        for name in [n for n, link in self.links.items() if link.session == key]:
            out += self.server_lost(name, "its client disconnected")
            del self.links[name]
            out.append(StopUpstream(name))
        for task_id in [t for t, owner in self.tasks.items() if owner == key]:
            del self.tasks[task_id]
        for eid in [e for e, owner in self.elicitations.items() if owner == key]:
            self._forget_elicitation(eid)
        if client.log_level is not None:
            out += self._apply_log_level()
        return out

    def client_message(self, key: int, raw: bytes) -> list[Command]:
        try:
            kind, message = decode_message(raw, self.max_json_depth)
        except RemoteProtocolError as exc:
            return self.client_refused(key, exc)
        return self.client_event(key, kind, message)

    def client_refused(self, key: int, exc: RemoteProtocolError) -> list[Command]:
        """A client's message could not be accepted: answer it if it was a request, and if
        it was an answer to a server's request, tell that server it will not get one."""
        if exc.data is not None and exc.data.get("reason") == "too_large":
            log.warning("client %d: refused a message: %s", key, exc.message)
        else:
            log.debug("client %d: refused a message: %s", key, exc.message)
        out = [ToClient(key, exc.to_response())] if exc.answer else []
        return out + self.refused_answer(key, exc)

    def refused_answer(self, key: int, exc: RemoteProtocolError) -> list[Command]:
        """If a client's refused message was its answer to a server's request, that server
        gets an error in its place now, rather than waiting for an answer that never comes."""
        answered = exc.response_to
        reverse = self._end_reverse(key, answered) if type(answered) is int else None
        if reverse is None or not self.links[reverse.server].ready:
            return []
        return [
            ToServer(
                reverse.server,
                proxy_error(
                    reverse.upstream_id,
                    f"The client's answer to {reverse.method} was refused ({exc.message})",
                    reason=_refusal_reason(exc),
                    server=reverse.server,
                ),
            )
        ]

    def client_event(self, key: int, kind: int, message: dict[str, Any]) -> list[Command]:
        """A message from a client, already decoded and classified (``decode_message``).

        A bug must never take a session down or leak internals: anything unexpected is
        logged with its traceback and the client gets a plain -32603.
        """
        try:
            return self._client_event(key, kind, message)
        except Exception:  # noqa: BLE001 - the last line of defence, logged in full
            log.exception("client %d: internal error handling %s", key, message.get("method", "a response"))
            if kind == REQUEST:
                return [
                    ToClient(key, proxy_error(message["id"], "Internal error in the aggregator", reason="internal"))
                ]
            return []

    def _client_event(self, key: int, kind: int, message: dict[str, Any]) -> list[Command]:
        client = self.clients[key]
        if kind == REQUEST:
            method = message["method"]
            handler = self._requests.get(method)
            if handler is None:
                if method == DISCOVER:
                    return [ToClient(key, discover_refused(message["id"]))]
                return [ToClient(key, error_response(message["id"], METHOD_NOT_FOUND, f"Method not found: {method}"))]
            if not client.initialize_seen and method not in ("initialize", "ping"):
                return [
                    ToClient(
                        key,
                        error_response(
                            message["id"],
                            INVALID_REQUEST,
                            f"Invalid request: {method} before initialize; send initialize first",
                        ),
                    )
                ]
            if message["id"] in client.in_flight:
                return [
                    ToClient(
                        key,
                        error_response(
                            message["id"],
                            INVALID_REQUEST,
                            "Invalid request: this id is already in use by a request in flight",
                        ),
                    )
                ]
            try:
                return handler(client, message)
            except RemoteProtocolError as exc:
                exc.id = message["id"]
                return [ToClient(key, exc.to_response())]
            except ServerDown as down:
                return self._server_down_answer(client, message, down.server)
        if kind == NOTIFICATION:
            return self._client_notification(client, message)
        return self._client_answer(client, message)

    def describe(self, key: int, message: dict[str, Any]) -> tuple[str, str, str] | None:
        """(server, its own name or URI, the exposed one) a client's request is for, or None
        when it names nothing this client may use. Changes nothing (for plugins)."""
        client = self.clients.get(key)
        params = message.get("params")
        if client is None or type(params) is not dict:
            return None
        catalog = client.catalog
        method = message["method"]
        if method in ("tools/call", "prompts/get"):
            name = params.get("name")
            routes = catalog.tools if method == "tools/call" else catalog.prompts
            route = routes.get(name) if type(name) is str else None
            if route is None and type(name) is str:
                route = self._name_owner(client, TOOLS if routes is catalog.tools else PROMPTS, name)
            return (route[0], route[1], name) if route is not None else None
        if method in ("resources/read", "resources/subscribe"):
            uri = params.get("uri")
            try:
                route = catalog.route_uri(uri) if type(uri) is str else None
                if self.outages and type(uri) is str:
                    route = self._outage_uri(client, uri, route)[0]
            except InvalidUri:
                return None
            return (route[0], route[1], uri) if route is not None else None
        if method == "completion/complete":
            ref = params.get("ref") if type(params.get("ref")) is dict else {}
            if ref.get("type") == "ref/prompt" and type(ref.get("name")) is str:
                route = catalog.prompts.get(ref["name"])
                if route is None:
                    route = self._name_owner(client, PROMPTS, ref["name"])
                return (route[0], route[1], ref["name"]) if route is not None else None
            if ref.get("type") == "ref/resource" and type(ref.get("uri")) is str:
                try:
                    route = catalog.route_template(ref["uri"])
                    if route is None and self.outages:
                        route = template_owner(
                            self.outages, client.profile, template_key(ref["uri"], catalog.uri_prefixes)
                        )
                except InvalidUri:
                    return None
                return (route[0], route[1], ref["uri"]) if route is not None else None
        return None

    def _client_notification(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        method = message["method"]
        if method == "notifications/initialized":
            was, client.initialized = client.initialized, client.initialize_seen
            return self._release_roots(client) if client.initialized and not was else []
        if method == "notifications/cancelled":
            params = message.get("params")
            request_id = params.get("requestId") if type(params) is dict else None
            if type(request_id) not in (int, str):
                return []
            pending = client.in_flight.get(request_id)
            if pending is None:
                return []  # unknown, finished or never ours: ignored, as the spec says
            self._end(pending)
            if not self.links[pending.server].ready or type(pending.extra) is Held:
                return []
            forwarded = dict(params, requestId=pending.upstream_id)
            return [ToServer(pending.server, {"jsonrpc": "2.0", "method": method, "params": forwarded})]
        if method == "notifications/roots/list_changed":
            # Only the servers that see this client's roots: a shared server sees the proxy's.
            return self._roots_changed(self._roots_followers(client))
        return []

    def _client_answer(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        """A response or error from a client: the answer to a server-to-client request."""
        id = message["id"]
        reverse = self.reverse.get((client.key, id)) if type(id) is int else None
        if reverse is None:
            log.debug("client %d: dropping an answer to unknown request %r", client.key, id)
            return []
        self._end_reverse(client.key, id)
        if not self.links[reverse.server].ready:
            return []
        message["id"] = reverse.upstream_id
        return [ToServer(reverse.server, message)]

    # --- client requests ----------------------------------------------------------------

    def _initialize(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        if client.initialize_seen:
            raise RemoteProtocolError(INVALID_REQUEST, "Invalid request: already initialized")
        if not self.startup_complete:
            return [WaitForStartup(client.key)]
        params = message.get("params") or {}
        client.initialize_seen = True
        client.protocol_version = negotiate(params.get("protocolVersion"))
        capabilities = params.get("capabilities")
        client.capabilities = capabilities if type(capabilities) is dict else {}
        info = params.get("clientInfo")
        client.client_info = info if type(info) is dict else {}
        client.advertised = self.merged_capabilities()
        result: dict[str, Any] = {
            "protocolVersion": client.protocol_version,
            "capabilities": client.advertised,
            "serverInfo": {"name": "aggregator", "version": __version__},
            "_meta": {INSTANCE_KEY: self.instance},
        }
        instructions = self.merged_instructions()
        if instructions:
            result["instructions"] = instructions
        return [ToClient(client.key, {"jsonrpc": "2.0", "id": message["id"], "result": result})]

    def _ping(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        return [_result(client.key, message["id"], {})]

    def _list(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        kind = LIST_METHODS[message["method"]]
        params = message.get("params") or {}
        page = client.catalog.page(kind, params.get("cursor"))
        return [ToClient(client.key, _splice_result(message["id"], page), message["id"])]

    def _call_by_name(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        params = message.get("params")
        name = params.get("name") if params else None
        tools = message["method"] == "tools/call"
        catalog = client.catalog
        routes = catalog.tools if tools else catalog.prompts
        route = routes.get(name) if type(name) is str else None
        if route is None:
            what = "tool" if tools else "prompt"
            if type(name) is not str:
                raise RemoteProtocolError(INVALID_PARAMS, f"Invalid params: {what} name must be a string")
            owner = self._name_owner(client, TOOLS if tools else PROMPTS, name)
            if owner is not None:
                if owner[0] in self.per_session:  # only its listing connection is out: use the session's own
                    return self._forward(client, message, owner[0], dict(params, name=owner[1]))
                raise ServerDown(owner[0])
            raise RemoteProtocolError(INVALID_PARAMS, f"Unknown {what}: {name}")
        return self._forward(client, message, route.server, dict(params, name=route.original))

    def _resource_route(self, client: ClientState, params: Any, *, while_out: bool = False) -> tuple[str, str]:
        """(server, the URI to send it) for a client's resource URI. Compared in normal form,
        so no spelling of a hidden URI finds it; refused spellings are -32602 as well. One
        of a server that is out raises ``ServerDown``, unless ``while_out`` takes it as is."""
        uri = params.get("uri") if type(params) is dict else None
        if type(uri) is not str:
            raise RemoteProtocolError(INVALID_PARAMS, "Invalid params: uri must be a string")
        try:
            route = client.catalog.route_uri(uri)
        except InvalidUri as exc:
            raise RemoteProtocolError(INVALID_PARAMS, f"Invalid params: {exc}") from None
        if self.outages:
            route, out = self._outage_uri(client, uri, route)
            # A per-session server whose listing connection is out is still the session's own.
            if out and not while_out and route[0] not in self.per_session:  # type: ignore[index]
                raise ServerDown(route[0])  # type: ignore[index]
        if route is None:
            raise RemoteProtocolError(INVALID_PARAMS, f"Unknown resource: {uri}")
        return route

    def _name_owner(self, client: ClientState, kind: str, name: str) -> tuple[str, str] | None:
        """(server, its own name) of a tool or prompt name of a server that is out, or None.
        Read off the profile's catalog: a session's own view carries no naming rules."""
        if not self.outages:
            return None
        return name_owner(self.outages, self.catalogs[client.profile], client.profile, kind, name)

    def _outage_uri(self, client: ClientState, uri: str, route: Any) -> tuple[Any, bool]:
        """``route_uri``'s answer seen with the servers that are out: (route, whether its server
        is out). A URI one of them listed is its, unless the catalog routes it to a server
        that lists it now; a URI routed by its prefix to one of them is its, unless this
        profile was not allowed to see it there."""
        catalog = client.catalog
        normal = normalize_uri(uri)
        if normal in catalog.resources:
            return route, False
        owner = uri_owner(self.outages, client.profile, normal)
        if owner is not None:
            return Route(*owner), True
        if route is not None and self._is_out(route[0]):
            seen = self.outages[route[0]].memory.get(client.profile)
            if seen is not None and seen.hides(route[1]):
                return None, False
            return route, True
        return route, False

    def _outage_template(self, client: ClientState, exposed: str, route: Any) -> None:
        """Raise ``ServerDown`` if a completion's template or URI is of a server that is out."""
        catalog = self.catalogs[client.profile]
        owner = template_owner(self.outages, client.profile, template_key(exposed, catalog.uri_prefixes))
        if owner is None:
            try:
                uri_route, out = self._outage_uri(client, exposed, route)
            except InvalidUri:  # a template, not a URI: it names nothing of a server that is out
                return
            owner = uri_route if out else None
        if owner is not None:
            raise ServerDown(owner[0])

    def _is_out(self, server: str) -> bool:
        """Whether a request for ``server`` that the catalog routes must wait for it."""
        return server in self.outages and server not in self.per_session and not self.links[server].ready

    def _read_resource(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        params = message.get("params")
        server, original = self._resource_route(client, params)
        return self._forward(client, message, server, dict(params, uri=original))

    def _subscribe(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        params = message.get("params")
        server, original = self._resource_route(client, params)
        # One subscription per connection: a per-session server's is its session's own.
        name = self._link_name(server, client.key)
        key = (name, original)
        if self.subscriptions.has(key, client.key):
            return [_result(client.key, message["id"], {})]
        if server not in self.per_session and not self.links[server].ready:
            return self._forward(client, message, server, params)  # answers "unavailable"
        if not self.subscriptions.add(key, client.key):
            return [_result(client.key, message["id"], {})]  # already subscribed upstream
        out = self._forward(client, message, server, dict(params, uri=original))
        pending = client.in_flight.get(message["id"])
        if pending is None:  # refused (overloaded): undo
            self.subscriptions.remove(key, client.key)
        elif type(pending.extra) is not Held:  # sent (else it waits for its connection)
            pending.extra = key
        return out

    def _unsubscribe(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        params = message.get("params")
        server, original = self._resource_route(client, params, while_out=True)
        name = self._link_name(server, client.key)
        link = self.links.get(name)
        if not self.subscriptions.remove((name, original), client.key) or link is None or not link.ready:
            return [_result(client.key, message["id"], {})]
        return self._forward(client, message, server, dict(params, uri=original))

    def _complete(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        params = message.get("params")
        ref = params.get("ref") if params else None
        if type(ref) is not dict:
            raise RemoteProtocolError(INVALID_PARAMS, "Invalid params: ref must be an object")
        if ref.get("type") == "ref/prompt":
            name = ref.get("name")
            route = client.catalog.prompts.get(name) if type(name) is str else None
            if route is None:
                owner = self._name_owner(client, PROMPTS, name) if type(name) is str else None
                if owner is None:
                    raise RemoteProtocolError(INVALID_PARAMS, f"Unknown prompt: {name}")
                if owner[0] not in self.per_session:
                    raise ServerDown(owner[0])
                route = Route(*owner)  # only its listing connection is out: the session's own answers
            new_ref = dict(ref, name=route.original)
        elif ref.get("type") == "ref/resource" and type(ref.get("uri")) is str:
            try:
                route = client.catalog.route_template(ref["uri"])
                if self.outages and (route is None or self._is_out(route.server)):
                    self._outage_template(client, ref["uri"], route)
            except InvalidUri as exc:
                raise RemoteProtocolError(INVALID_PARAMS, f"Invalid params: {exc}") from None
            if route is None:
                raise RemoteProtocolError(INVALID_PARAMS, f"Unknown resource: {ref['uri']}")
            new_ref = dict(ref, uri=route.original)
        else:
            raise RemoteProtocolError(INVALID_PARAMS, "Invalid params: ref must be ref/prompt or ref/resource")
        return self._forward(client, message, route.server, dict(params, ref=new_ref))

    def _set_level(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        params = message.get("params") or {}
        level = params.get("level")
        if level not in LEVELS:
            raise RemoteProtocolError(INVALID_PARAMS, f"Invalid params: level must be one of {', '.join(LEVELS)}")
        client.log_level = level
        return [_result(client.key, message["id"], {}), *self._apply_log_level()]

    def _task_request(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        params = message.get("params")
        task_id = params.get("taskId") if type(params) is dict else None
        split = split_task_id(task_id)
        # Tasks belong to the session that created them: another session's task id is as
        # unknown as one that never existed.
        if split is None or self.tasks.get(task_id) != client.key or split[0] not in self.links:
            raise RemoteProtocolError(INVALID_PARAMS, f"Unknown task: {task_id}")
        return self._forward(client, message, split[0], dict(params, taskId=split[1]))

    def _list_tasks(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        # The connections this session's requests run on: the shared servers and its own
        # per-session ones (never another session's, nor a per-session server's shared
        # listing connection, where no client's request runs).
        servers = [
            name
            for name, link in self.links.items()
            if link.ready
            and "list" in (link.capabilities.get("tasks") or {})
            and (link.session == client.key or (link.session is None and name not in self.per_session))
        ]
        if not servers:
            return [_result(client.key, message["id"], {"tasks": []})]
        gather = Gather(client.key, message["id"], len(servers))
        out: list[Command] = []
        for server in servers:
            out += self._own_request(server, "tasks/list", {}, extra=gather)
        return out

    # --- forwarding ---------------------------------------------------------------------

    def _forward(
        self, client: ClientState, message: dict[str, Any], server: str, params: dict[str, Any]
    ) -> list[Command]:
        """Send a client's request upstream under a fresh id. ``params`` is ours to change."""
        if self.draining:
            return [
                ToClient(
                    client.key,
                    proxy_error(message["id"], "The aggregator is shutting down", reason="unavailable", server=server),
                )
            ]
        if server in self.per_session:
            name = self._link_name(server, client.key)
            link = self.links.get(name)
            if link is None or not link.ready:
                return self._hold(client, message, server, params, name)
            server = name
        link = self.links[server]
        client_id = message["id"]
        method = message["method"]
        if not link.ready:
            return [
                ToClient(
                    client.key,
                    proxy_error(
                        client_id, f"Server {server!r} is not available right now", reason="unavailable", server=server
                    ),
                )
            ]
        if len(client.in_flight) >= self.max_in_flight:
            return [
                ToClient(
                    client.key,
                    proxy_error(
                        client_id,
                        f"Too many requests in flight (limit {self.max_in_flight})",
                        reason="overloaded",
                        server=server,
                    ),
                )
            ]
        if link.overloaded is not None:
            return [
                ToClient(
                    client.key,
                    proxy_error(
                        client_id,
                        f"Server {link.server!r} is overloaded: {link.overloaded}; try again later",
                        reason="overloaded",
                        server=link.server,
                    ),
                )
            ]
        upstream_id = link.next_id
        link.next_id = upstream_id + 1
        pending = Pending(client.key, client_id, method, server, upstream_id)
        meta = params.get("_meta")
        if type(meta) is dict:
            token = meta.get("progressToken")
            if type(token) is int or type(token) is str:
                pending.client_token = token
                pending.token = f"{PROGRESS_TOKEN_PREFIX}{self._next_token}"
                self._next_token += 1
                self.progress[pending.token] = pending
                params["_meta"] = meta = dict(meta, progressToken=pending.token)
            restore_related_task(params, server)
        self._start(pending, link)
        client.in_flight[client_id] = pending
        return [ToServer(server, {"jsonrpc": "2.0", "id": upstream_id, "method": method, "params": params})]

    def _link_name(self, server: str, session: int) -> str:
        return f"{server}@{session}" if server in self.per_session else server

    def _hold(
        self, client: ClientState, message: dict[str, Any], server: str, params: dict[str, Any], name: str
    ) -> list[Command]:
        """Keep a request for a per-session link that is not ready; start it if need be."""
        out: list[Command] = []
        link = self.links.get(name)
        if link is None:
            base = self.links[server]
            link = self.links[name] = UpstreamLink(
                name,
                base.prefix,
                base.uri_prefix,
                request_timeout=base.request_timeout,
                max_request_timeout=base.max_request_timeout,
                timeout_resets_on_progress=base.timeout_resets_on_progress,
                server=server,
                session=client.key,
            )
            capabilities = {
                k: v
                for k, v in client.capabilities.items()
                if k in SERVER_REQUEST_CAPABILITIES and k in self.server_requests
            }
            if "roots" in self.server_requests:  # its client's roots, else the proxy answers
                capabilities["roots"] = {"listChanged": True}
            out.append(StartUpstream(server, name, client.key, capabilities))
        if len(link.waiting) >= self.max_in_flight:
            return [
                ToClient(
                    client.key,
                    proxy_error(
                        message["id"],
                        f"Too many requests waiting for server {server!r} to start",
                        reason="overloaded",
                        server=server,
                    ),
                )
            ]
        link.waiting.append((client.key, message, params))
        # In flight from now on (its id taken, a cancel ends it), though nothing was sent.
        placeholder = Pending(client.key, message["id"], message["method"], name, 0)
        placeholder.extra = Held(message)
        client.in_flight[message["id"]] = placeholder
        return out

    def _still_waiting(self, client: ClientState | None, message: dict[str, Any]) -> bool:
        """Take a request off its wait for a per-session connection to start: False if its
        client is gone or cancelled it meanwhile."""
        if client is None:
            return False
        placeholder = client.in_flight.get(message["id"])
        if placeholder is None or type(placeholder.extra) is not Held or placeholder.extra.message is not message:
            return False
        self._end(placeholder)
        return True

    def _own_request(self, server: str, method: str, params: dict[str, Any], extra: Any = None) -> list[Command]:
        """A request the proxy makes for its own bookkeeping; the answer is not forwarded."""
        link = self.links[server]
        if not link.ready:
            return []
        upstream_id = link.next_id
        link.next_id = upstream_id + 1
        pending = Pending(NO_SESSION, None, method, server, upstream_id)
        pending.extra = extra
        self._start(pending, link)
        return [ToServer(server, {"jsonrpc": "2.0", "id": upstream_id, "method": method, "params": params})]

    def _start(self, pending: Pending, link: UpstreamLink) -> None:
        now = self.clock()
        pending.hard_deadline = now + link.max_request_timeout
        # tasks/result blocks until the task is done, by design: only the hard maximum applies.
        # (The config guarantees request_timeout <= max_request_timeout.)
        if pending.method == "tasks/result":
            pending.deadline = pending.hard_deadline
        else:
            pending.deadline = now + link.request_timeout
        link.pending[pending.upstream_id] = pending
        self.deadlines.push(pending.deadline, pending)

    def _end(self, pending: Pending) -> None:
        """Forget a request everywhere (invariant 2). Safe to call twice."""
        if pending.done:
            return
        pending.done = True
        self.links[pending.server].pending.pop(pending.upstream_id, None)
        client = self.clients.get(pending.session)
        if client is not None:
            client.in_flight.pop(pending.client_id, None)
        if pending.token is not None:
            self.progress.pop(pending.token, None)
        self.deadlines.discard()

    def _end_reverse(self, session: int, proxy_id: int) -> Reverse | None:
        reverse = self.reverse.pop((session, proxy_id), None)
        if reverse is not None:
            self.reverse_ids.pop((reverse.server, reverse.upstream_id), None)
            left = self.reverse_count.get(session, 1) - 1
            if left > 0:
                self.reverse_count[session] = left
            else:
                self.reverse_count.pop(session, None)
        return reverse

    def abandon(self, why: str) -> list[Command]:
        """Fail every client request still in flight (shutting down): the client hears it,
        the server is told to stop."""
        out: list[Command] = []
        for link in self.links.values():
            for pending in list(link.pending.values()):
                if pending.session == NO_SESSION:
                    continue
                self._end(pending)
                if link.ready:
                    out.append(ToServer(link.name, _cancelled(pending.upstream_id, why)))
                if pending.session in self.clients:
                    out.append(
                        ToClient(
                            pending.session,
                            proxy_error(
                                pending.client_id,
                                f"Server {link.server!r} did not answer before the aggregator stopped",
                                reason="unavailable",
                                server=link.server,
                            ),
                        )
                    )
        # Requests held for a server that is restarting, or for a session's own connection
        # that is starting, were never sent: their clients hear it too.
        for client in self.clients.values():
            for pending in [p for p in client.in_flight.values() if type(p.extra) is Held]:
                self._end(pending)
                server = self.links[pending.server].server or pending.server
                out.append(
                    ToClient(
                        client.key,
                        proxy_error(
                            pending.client_id,
                            f"The aggregator stopped before server {server!r} was ready for {pending.method}",
                            reason="unavailable",
                            server=server,
                        ),
                    )
                )
        self.held.clear()
        return out

    def in_flight(self) -> int:
        """Client requests waiting for an upstream's answer (not the proxy's own)."""
        return sum(1 for link in self.links.values() for p in link.pending.values() if p.session != NO_SESSION)

    # --- time ---------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When ``expire`` has work next (a request times out, a notice is due)."""
        deadline = self.deadlines.next()
        if self._announce_at is not None and (deadline is None or self._announce_at < deadline):
            deadline = self._announce_at
        if self.held_roots:
            held = min(h[2] for h in self.held_roots)
            if deadline is None or held < deadline:
                deadline = held
        return deadline

    def expire(self) -> list[Command]:
        """Time out what is overdue, send notices that are due."""
        now = self.clock()
        out: list[Command] = []
        for pending in self.deadlines.pop_due(now):
            out += self._time_out(pending)
        if self._announce_at is not None and now >= self._announce_at:
            out += self._send_announcements()
        if self.held_roots:
            out += self._expire_roots(now)
        return out

    def _time_out(self, pending: Pending) -> list[Command]:
        if type(pending.extra) is Held:
            return self._held_timed_out(pending)
        self._end(pending)
        link = self.links[pending.server]
        out: list[Command] = []
        if link.ready:
            out.append(ToServer(pending.server, _cancelled(pending.upstream_id, "timed out")))
        log.warning("server %s: %s timed out (upstream id %d)", pending.server, pending.method, pending.upstream_id)
        if pending.session != NO_SESSION and pending.session in self.clients:
            hard = pending.deadline >= pending.hard_deadline
            limit = link.max_request_timeout if hard else link.request_timeout
            out.append(
                ToClient(
                    pending.session,
                    proxy_error(
                        pending.client_id,
                        f"Server {pending.server!r} did not answer {pending.method} within {limit:g}s",
                        reason="timeout",
                        server=pending.server,
                    ),
                )
            )
        out += self._gather_step(pending, None)
        return out

    # --- upstreams ----------------------------------------------------------------------

    def server_message(self, server: str, raw: bytes, related: int | None = None) -> list[Command]:
        """A message from an upstream; ``related``: the upstream id of the request on whose
        own stream it arrived (Streamable HTTP), when the transport knows it."""
        try:
            return self._server_message(server, raw, related)
        except Exception:  # noqa: BLE001 - the last line of defence, logged in full
            log.exception("server %s: internal error handling a message from it", server)
            return []

    def _server_message(self, server: str, raw: bytes, related: int | None = None) -> list[Command]:
        link = self.links.get(server)
        if link is None:
            return []  # a per-session connection whose client just left
        try:
            kind, message = decode_message(raw, self.max_json_depth)
        except RemoteProtocolError as exc:
            return self._server_refused(link, exc)
        if kind == RESPONSE or kind == ERROR:
            id = message["id"]
            pending = link.pending.get(id) if type(id) is int else None
            if pending is None:
                if type(id) is str and id.startswith(CONTROL_ID_PREFIX):
                    return [ControlReply(server, message)]
                log.debug("server %s: dropping a response to unknown id %r", server, id)
                return []
            self._end(pending)
            if pending.session == NO_SESSION:
                return self._own_answer(pending, message)
            if pending.session not in self.clients:
                return []
            message["id"] = pending.client_id
            if kind == RESPONSE:
                self._expose_result(pending, message.get("result"), link)
            else:
                if pending.extra is not None and type(pending.extra) is tuple:  # a failed subscribe
                    self.subscriptions.remove(pending.extra, pending.session)
                if message["error"].get("code") == URL_ELICITATION_REQUIRED:
                    self._url_elicitations_required(link, pending.session, message["error"].get("data"))
            return [ToClient(pending.session, message)]
        if kind == NOTIFICATION:
            return self._server_notification(link, message, related)
        return self._server_request(link, message, related)

    def _server_refused(self, link: UpstreamLink, exc: RemoteProtocolError) -> list[Command]:
        """A server's message could not be accepted (too deep, unreadable, malformed).

        An answer whose id is readable fails the request it answers, at once and with the
        reason, instead of leaving it to time out; the server stays up. A request is
        answered with the error; anything else is dropped. All of it is logged.
        """
        server = link.name
        id = exc.response_to
        if id is not None:
            pending = link.pending.get(id) if type(id) is int else None
            log.warning(
                "server %s: refused its answer to %s: %s",
                server,
                pending.method if pending is not None else f"id {id!r}",
                exc.message,
            )
            if pending is None:
                if type(id) is str and id.startswith(CONTROL_ID_PREFIX):
                    return [ControlReply(server, error_response(id, exc.code, exc.message))]
                return []
            self._end(pending)
            if pending.session == NO_SESSION:
                return self._gather_step(pending, None)
            if pending.session not in self.clients:
                return []
            return [
                ToClient(
                    pending.session,
                    proxy_error(
                        pending.client_id,
                        f"Server {server!r} sent an answer to {pending.method} that the aggregator"
                        f" cannot forward ({exc.message})",
                        reason=_refusal_reason(exc),
                        server=server,
                    ),
                )
            ]
        log.warning("server %s: dropping an unreadable message: %s", server, exc.message)
        if exc.id is not None and exc.answer:
            return [ToServer(server, exc.to_response())]
        return []

    def _expose_result(self, pending: Pending, result: Any, link: UpstreamLink) -> None:
        """Rewrite what the proxy owns in an upstream result, in place."""
        if type(result) is not dict:
            return
        method = pending.method
        if link.uri_prefix:
            _expose_result_uris(method, result, link.uri_prefix)
        if ("task" in result and method == "tools/call") or method.startswith("tasks/"):
            for task_id in expose_task_ids(link.name, result):
                self.tasks.setdefault(task_id, pending.session)

    def _url_elicitations_required(self, link: UpstreamLink, session: int, data: Any) -> None:
        """A -32042 answer names URL elicitations the client must complete first: their
        ``notifications/elicitation/complete`` belong to that client."""
        elicitations = data.get("elicitations") if type(data) is dict else None
        if type(elicitations) is not list:
            return
        for elicitation in elicitations[: self.max_in_flight]:
            eid = elicitation.get("elicitationId") if type(elicitation) is dict else None
            if type(eid) is str:
                self._remember_elicitation(link.name, eid, session)

    def _own_answer(self, pending: Pending, message: dict[str, Any]) -> list[Command]:
        if "error" in message:
            log.info("server %s: %s failed: %s", pending.server, pending.method, message["error"].get("message"))
            return self._gather_step(pending, None)
        return self._gather_step(pending, message.get("result"))

    def _gather_step(self, pending: Pending, result: Any) -> list[Command]:
        gather = pending.extra
        if type(gather) is not Gather:
            return []
        if type(result) is dict:
            expose_task_ids(pending.server, result)
            gather.items += [
                t
                for t in result.get("tasks") or []
                if type(t) is dict and self.tasks.get(t.get("taskId")) == gather.session
            ]
        gather.remaining -= 1
        if gather.remaining or gather.session not in self.clients:
            return []
        return [_result(gather.session, gather.client_id, {"tasks": gather.items})]

    def _server_notification(
        self, link: UpstreamLink, message: dict[str, Any], related: int | None = None
    ) -> list[Command]:
        method = message["method"]
        server = link.name
        params = message.get("params")
        if type(params) is not dict:
            params = {}
        if method == "notifications/progress":
            token = params.get("progressToken")
            pending = self.progress.get(token) if type(token) is str else None
            if pending is None or pending.server != server or pending.session not in self.clients:
                return []  # not in flight (any more), or not this server's to report on
            if link.timeout_resets_on_progress and pending.deadline < pending.hard_deadline:
                pending.deadline = min(self.clock() + link.request_timeout, pending.hard_deadline)
                self.deadlines.move(pending.deadline, pending)
            forwarded = dict(params, progressToken=pending.client_token)
            return [
                ToClient(pending.session, {"jsonrpc": "2.0", "method": method, "params": forwarded}, pending.client_id)
            ]
        if method == "notifications/message":
            return self._log_line(link, method, params, related)
        if method == "notifications/resources/updated":
            uri = params.get("uri")
            subscribers = self.subscriptions.subscribers((server, uri)) if type(uri) is str else ()
            if not subscribers:
                return []
            notice = {"jsonrpc": "2.0", "method": method, "params": dict(params, uri=expose_uri(link.uri_prefix, uri))}
            return [ToClient(session, notice) for session in subscribers if session in self.clients]
        if method == "notifications/tools/list_changed":
            return [Refresh(server, TOOLS)]
        if method == "notifications/prompts/list_changed":
            return [Refresh(server, PROMPTS)]
        if method == "notifications/resources/list_changed":
            return [Refresh(server, RESOURCES), Refresh(server, TEMPLATES)]
        if method == "notifications/cancelled":
            # The server gave up on one of its own requests to a client.
            request_id = params.get("requestId")
            entry = self.reverse_ids.get((server, request_id)) if type(request_id) in (int, str) else None
            if entry is None:
                return []
            self._end_reverse(*entry)
            return [
                ToClient(entry[0], {"jsonrpc": "2.0", "method": method, "params": dict(params, requestId=entry[1])})
            ]
        if method == "notifications/elicitation/complete":
            eid = params.get("elicitationId")
            session = self._forget_elicitation((server, eid)) if type(eid) is str else None
            if session is None or session not in self.clients:
                return []
            return [ToClient(session, message)]
        if method == "notifications/tasks/status":
            forwarded = dict(params)
            expose_task_ids(server, forwarded)
            task_id = forwarded.get("taskId")
            owner = self.tasks.get(task_id) if type(task_id) is str else None
            if owner is None or owner not in self.clients:
                return []
            return [ToClient(owner, {"jsonrpc": "2.0", "method": method, "params": forwarded})]
        log.debug("server %s: notification %s not routed", server, method)
        return []

    def _server_request(self, link: UpstreamLink, message: dict[str, Any], related: int | None = None) -> list[Command]:
        """A request from an upstream to its client: route it to the one client it is for
        (``core.affinity``), or answer it at once with why it cannot be."""
        server = link.name
        method = message["method"]
        id = message["id"]
        if method == "ping":
            return [ToServer(server, {"jsonrpc": "2.0", "id": id, "result": {}})]
        capability = SERVER_REQUESTS.get(method)
        if capability is None or capability not in self.server_requests:
            return [
                ToServer(
                    server,
                    proxy_error(
                        id,
                        f"Method not found: the aggregator does not route {method} to clients",
                        reason="unroutable",
                        server=server,
                        code=METHOD_NOT_FOUND,
                    ),
                )
            ]
        params = message.get("params")
        if type(params) is not dict:
            params = {}
        if not self.server_request_policy(link.server, method, params):
            return [
                ToServer(
                    server,
                    proxy_error(
                        id,
                        f"{method} from server {server!r} is not allowed by policy",
                        reason="denied",
                        server=server,
                        code=INVALID_REQUEST,
                    ),
                )
            ]
        if method == "roots/list":
            link.roots_told = False
            return self._roots_request(link, id, params, related)
        owner = affinity.request_owner(**self._owner_facts(link, params, related, requests=True))
        if owner.session is None:
            why = affinity.unroutable(method, link.server, owner.signal, link.session is not None)
            return [ToServer(server, proxy_error(id, why, reason=owner.signal, server=server))]
        return self._ask_client(link, owner.session, id, method, params, capability, owner.related)

    def _ask_client(
        self,
        link: UpstreamLink,
        session: int,
        id: Any,
        method: str,
        params: dict[str, Any],
        capability: str,
        related: Any,
    ) -> list[Command]:
        """Forward a server's request to client ``session`` under a proxy-minted id."""
        server = link.name
        client = self.clients[session]
        if not _declares(client.capabilities, capability, params):
            if method == "roots/list":
                return [self._roots_answer(link, id)]
            mode = " in url mode" if params.get("mode") == "url" else ""
            return [
                ToServer(
                    server,
                    proxy_error(
                        id,
                        f"Method not found: the client does not support {method}{mode}",
                        reason="unsupported",
                        server=server,
                        code=METHOD_NOT_FOUND,
                    ),
                )
            ]
        asked = self.reverse_count.get(session, 0)
        if asked >= self.max_in_flight:  # a client that answers nothing holds nothing more
            return [
                ToServer(
                    server,
                    proxy_error(
                        id,
                        f"The client already has {asked} requests to answer (the limit); {method} refused",
                        reason="overloaded",
                        server=server,
                    ),
                )
            ]
        self.reverse_count[session] = asked + 1
        proxy_id = self._next_reverse_id
        self._next_reverse_id += 1
        self.reverse[(session, proxy_id)] = Reverse(server, id, method)
        self.reverse_ids[(server, id)] = (session, proxy_id)
        if method == "elicitation/create" and type(params.get("elicitationId")) is str:
            self._remember_elicitation(server, params["elicitationId"], session)
        forwarded = dict(params)
        expose_task_ids(server, forwarded)
        return [ToClient(session, {"jsonrpc": "2.0", "id": proxy_id, "method": method, "params": forwarded}, related)]

    def _remember_elicitation(self, server: str, eid: str, session: int) -> None:
        """A URL-mode elicitation of ``server`` is ``session``'s: its completion goes there.
        A server may never complete one; past ``max_in_flight`` per session the oldest
        is forgotten (only then is the table searched)."""
        elicitations = self.elicitations
        elicitations.pop((server, eid), None)
        elicitations[(server, eid)] = session
        count = self.elicitation_count[session] = self.elicitation_count.get(session, 0) + 1
        if count > self.max_in_flight:
            oldest = next(key for key, owner in elicitations.items() if owner == session)
            self._forget_elicitation(oldest)

    def _forget_elicitation(self, key: tuple[str, Any]) -> int | None:
        session = self.elicitations.pop(key, None)
        if session is not None:
            left = self.elicitation_count.get(session, 1) - 1
            if left > 0:
                self.elicitation_count[session] = left
            else:
                self.elicitation_count.pop(session, None)
        return session

    def _owner_facts(
        self, link: UpstreamLink, params: dict[str, Any], related: int | None, requests: bool
    ) -> dict[str, Any]:
        """What ``core.affinity`` decides from, read off this link and the message."""
        facts: dict[str, Any] = {"link_session": link.session, "live": link.session in self.clients}
        if link.session is None and not requests:
            facts["streams"] = link.streams
        if related is not None:
            pending = link.pending.get(related)
            if pending is not None and pending.session in self.clients:
                facts["stream"] = (pending.session, pending.client_id)
            else:
                facts["ended"] = True
        meta = params.get("_meta")
        if type(meta) is dict:
            task = meta.get(RELATED_TASK)
            task_id = task.get("taskId") if type(task) is dict else None
            owner = self.tasks.get(expose_task_id(link.name, task_id)) if type(task_id) is str else None
            if owner in self.clients:
                facts["task"] = owner
            token = meta.get("progressToken")
            pending = self.progress.get(token) if type(token) is str else None
            if pending is not None and pending.server == link.name and pending.session in self.clients:
                facts["progress"] = (pending.session, pending.client_id)
        # The callers in flight matter only when no signal names the owner; a log line of a
        # link that streams belongs to no request then, whoever is in flight.
        if (
            link.session is None
            and related is None
            and not facts.get("streams")
            and "task" not in facts
            and "progress" not in facts
        ):
            in_flight: dict[int, list[Any]] = {}
            for pending in link.pending.values():
                if pending.session in self.clients:
                    in_flight.setdefault(pending.session, []).append(pending.client_id)
            facts["in_flight"] = in_flight
            if requests:
                facts["clients"] = [c.key for c in self.clients.values() if c.initialized]
        return facts

    def _log_line(self, link: UpstreamLink, method: str, params: dict[str, Any], related: int | None) -> list[Command]:
        """A server's log line: to the client of the request it belongs to, else to the
        sessions that asked for logs (``core.affinity``); each at its own level."""
        server = link.name
        owner = affinity.log_owner(**self._owner_facts(link, params, related, requests=False))
        if owner.session is not None:
            recipients = [self.clients[owner.session]]
        elif owner.signal == affinity.NO_REQUEST:
            recipients = [c for c in self.clients.values() if c.log_level is not None]
        else:
            log.debug("server %s: a log line went to no client (%s)", server, owner.signal)
            return []
        level = params.get("level")
        recipients = [c for c in recipients if "logging" in c.advertised and passes(level, c.log_level)]
        if not recipients:
            return []
        forwarded = dict(params)
        logger = params.get("logger")
        forwarded["logger"] = f"{link.server}/{logger}" if type(logger) is str and logger else link.server
        if type(params.get("_meta")) is dict:
            forwarded["_meta"] = meta = dict(params["_meta"])
            expose_task_ids(server, {"_meta": meta})
            token = meta.get("progressToken")
            if type(token) is str and token in self.progress:
                # The proxy's token names one client's request: only that client gets its
                # own token back; to anyone else it is dropped (it would tell them another's).
                pending = self.progress[token]
                if pending.server == server and [c.key for c in recipients] == [pending.session]:
                    meta["progressToken"] = pending.client_token
                else:
                    del meta["progressToken"]
        notice = {"jsonrpc": "2.0", "method": method, "params": forwarded}
        return [ToClient(c.key, notice, owner.related) for c in recipients]

    # --- roots --------------------------------------------------------------------------

    def _roots_request(self, link: UpstreamLink, id: Any, params: dict[str, Any], related: int | None) -> list[Command]:
        """roots/list: from the client the server's roots come from, or from the proxy;
        held while that client is still initializing (``core.affinity.roots_source``)."""
        source = affinity.roots_source(link.session, self.single_client, list(self.clients))
        client = self.clients.get(source) if type(source) is int else None
        action = affinity.roots_action(
            source, client is not None and client.initialized, client is not None and "roots" in client.capabilities
        )
        if action == affinity.ANSWER:
            return [self._roots_answer(link, id)]
        if action == affinity.HOLD:
            self.held_roots.append((link.name, id, self.clock() + ROOTS_HOLD_SECONDS))
            return []
        owner = affinity.request_owner(**self._owner_facts(link, params, related, requests=True))
        return self._ask_client(
            link, source, id, "roots/list", params, "roots", owner.related if owner.session == source else None
        )

    def _roots_answer(self, link: UpstreamLink, id: Any) -> ToServer:
        """The proxy's own answer to roots/list: proxy.roots, or no roots."""
        if affinity.roots_source(link.session, self.single_client, list(self.clients)) != affinity.FROM_PROXY:
            self.roots_fallback.add(link.name)  # its client's roots may differ: tell it when they come
        return ToServer(link.name, {"jsonrpc": "2.0", "id": id, "result": {"roots": self.roots or []}})

    def _release_roots(self, client: ClientState) -> list[Command]:
        """A client finished initializing: the roots/list requests held for it go on."""
        out: list[Command] = []
        held, self.held_roots = self.held_roots, []
        for name, id, deadline in held:
            link = self.links.get(name)
            if link is None or not link.ready:
                continue
            source = affinity.roots_source(link.session, self.single_client, list(self.clients))
            if source != client.key:
                self.held_roots.append((name, id, deadline))
                continue
            out += self._roots_request(link, id, {}, None)
        # It has roots of its own: those answered in its place ask again.
        told = [name for name in self._roots_followers(client) if name in self.roots_fallback]
        self.roots_fallback.difference_update(told)
        return out + self._roots_changed(told)

    def _roots_changed(self, names: list[str]) -> list[Command]:
        """Tell these links their roots changed; one that was told and has not asked since
        is not told again (it will read the roots as they are when it asks)."""
        out: list[Command] = []
        for name in names:
            link = self.links[name]
            if not link.roots_told:
                link.roots_told = True
                out.append(ToServer(name, {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}))
        return out

    def _roots_followers(self, client: ClientState) -> list[str]:
        """The ready links whose roots are this client's (none if it declares no roots)."""
        if "roots" not in client.capabilities or "roots" not in self.server_requests:
            return []
        return affinity.roots_followers(
            client.key, ((name, link.session) for name, link in self.links.items() if link.ready), self.single_client
        )

    def _held_for(self, key: int) -> list[tuple[str, Any, float]]:
        """Take the held roots/list requests whose roots come from client ``key``."""
        mine = [
            held
            for held in self.held_roots
            if held[0] in self.links
            and affinity.roots_source(self.links[held[0]].session, self.single_client, [key]) == key
        ]
        self.held_roots = [held for held in self.held_roots if held not in mine]
        return mine

    def _expire_roots(self, now: float) -> list[Command]:
        out: list[Command] = []
        kept = []
        for name, id, deadline in self.held_roots:
            if deadline > now:
                kept.append((name, id, deadline))
                continue
            link = self.links.get(name)
            if link is not None and link.ready:
                log.info(
                    "server %s: no client to ask for roots within %gs; answered from proxy.roots",
                    name,
                    ROOTS_HOLD_SECONDS,
                )
                out.append(self._roots_answer(link, id))
        self.held_roots = kept
        return out

    def server_oversized(self, server: str, head: bytes, limit: int) -> list[Command]:
        """A message from the server was over the size limit and was dropped unread.

        If its first bytes name a pending request's id, that request fails now with
        reason ``too_large`` instead of waiting for an answer that will never come.
        """
        match = _HEAD_ID.search(head)
        pending = self.links[server].pending.get(int(match.group(1))) if match else None
        if pending is None:
            return []
        self._end(pending)
        if pending.session not in self.clients:
            return self._gather_step(pending, None)
        return [
            ToClient(
                pending.session,
                proxy_error(
                    pending.client_id,
                    f"Server {server!r} answered with more than {limit} bytes",
                    reason="too_large",
                    server=server,
                ),
            )
        ]

    def server_ready(self, server: str, init_result: dict[str, Any]) -> list[Command]:
        """The upstream finished its handshake; renew what clients asked of it before."""
        link = self.links[server]
        link.ready = True
        capabilities = init_result.get("capabilities")
        link.capabilities = capabilities if type(capabilities) is dict else {}
        instructions = init_result.get("instructions")
        link.instructions = instructions if type(instructions) is str and instructions.strip() else None
        link.protocol_version = init_result.get("protocolVersion")
        link.log_level = None
        link.roots_told = False
        outage = self.outages.get(server)
        if outage is not None:  # out until listed; its names are known from now on
            outage.ever_ready = True
        out = self._apply_log_level()
        waiting, link.waiting = link.waiting, []
        held = {params["uri"] for _, message, params in waiting if message["method"] == "resources/subscribe"}
        for uri in self.subscriptions.of_server(server):
            if uri not in held:  # renewed; a held one goes as the client sent it
                out += self._own_request(server, "resources/subscribe", {"uri": uri})
        for key, message, params in waiting:
            client = self.clients.get(key)
            if self._still_waiting(client, message):
                assert client is not None
                out += self._forward(client, message, link.server, params)
                if message["method"] == "resources/subscribe":
                    self._held_subscribe_sent(client, message, (server, params["uri"]))
            elif client is not None and message["method"] == "resources/subscribe":
                self.subscriptions.remove((server, params["uri"]), key)  # cancelled: never made
        return out

    def _held_subscribe_sent(self, client: ClientState, message: dict[str, Any], key: tuple[str, str]) -> None:
        pending = client.in_flight.get(message["id"])
        if pending is not None:
            pending.extra = key  # a failure answered undoes it
        else:
            self.subscriptions.remove(key, client.key)  # refused (overloaded)

    def server_items(self, server: str, kind: str, items: list[dict[str, Any]]) -> list[Command]:
        """A fresh listing of one kind from a server; announce a change to clients."""
        link = self.links.get(server)
        if link is None or not link.ready:
            return []
        if link.session is not None:  # a session's own connection: its view, announced to it
            return self._announce(self.views.own_items(link.session, link.server, kind, items), link.session)
        out: list[Command] = []
        for profile, catalog in self.catalogs.items():
            changed = catalog.set_items(server, kind, items)
            if changed:
                out += self._announce([kind], profile)
            if self.views:
                out += self._views_see(catalog, server, kind, changed)
        return out

    def server_listing(self, server: str, listing: dict[str, list[dict[str, Any]]]) -> list[Command]:
        """Every kind a server lists, at once. For a session's own connection to a
        per-session server this is the moment its session switches from the shared listing
        to its own: announced to that session for what it changed."""
        link = self.links.get(server)
        if link is None or not link.ready:
            return []
        if link.session is None:
            return [command for kind, items in listing.items() for command in self.server_items(server, kind, items)]
        client = self.clients.get(link.session)
        if client is None:
            return []
        client.catalog, changed, made = self.views.listed(
            client.key, self.catalogs[client.profile], link.server, listing
        )
        inherited = self._announce_methods.get(client.profile) if made else None
        if inherited:  # what its profile has due goes to it now by its own key
            mine = self._announce_methods.setdefault(client.key, [])
            mine += [method for method in inherited if method not in mine]
        return self._announce(changed, client.key)

    def _views_see(self, catalog: Catalog, server: str, kind: str, changed: bool) -> list[Command]:
        """Announce to each session whose view over ``catalog`` changed with its listing of ``server``."""
        return [
            command
            for session, kinds in self.views.shared_changed(catalog, server, kind, changed)
            for command in self._announce(kinds, session)
        ]

    def _own_link_lost(self, link: UpstreamLink) -> list[Command]:
        """A session's own connection is gone: its held subscriptions were never made, and
        the session sees the server's shared listing again (announced if that differs)."""
        for key, message, params in link.waiting:
            if message["method"] == "resources/subscribe":
                self.subscriptions.remove((link.name, params["uri"]), key)
        assert link.session is not None
        changed, gone = self.views.lost(link.session, link.server)
        client = self.clients.get(link.session)
        if gone and client is not None:
            client.catalog = self.catalogs[client.profile]
        return self._announce(changed, link.session)

    def server_overloaded(self, server: str, why: str) -> list[Command]:
        """The upstream reads nothing of its input: fail its requests in flight at once
        (reason overloaded). It stays connected; its late answers are dropped."""
        link = self.links.get(server)
        if link is None:
            return []
        return self._fail_pending(
            link, f"Server {link.server!r} is overloaded: {why}; the request failed", "overloaded"
        )

    def _fail_pending(self, link: UpstreamLink, message: str, reason: str) -> list[Command]:
        """End every request in flight on ``link``, each client told ``message``."""
        out: list[Command] = []
        for pending in list(link.pending.values()):
            self._end(pending)
            out += self._gather_step(pending, None)
            if pending.session == NO_SESSION or pending.session not in self.clients:
                continue
            if pending.extra is not None and type(pending.extra) is tuple:
                self.subscriptions.remove(pending.extra, pending.session)
            out.append(
                ToClient(pending.session, proxy_error(pending.client_id, message, reason=reason, server=link.server))
            )
        return out

    def server_lost(self, server: str, why: str) -> list[Command]:
        """The upstream is gone: fail its requests at once, hide its items, tell clients."""
        link = self.links.get(server)
        if link is None:
            return []
        link.ready = False
        link.overloaded = None
        out: list[Command] = self._own_link_lost(link) if link.session is not None else []
        waiting, link.waiting = link.waiting, []
        for key, message, _params in waiting:
            if self._still_waiting(self.clients.get(key), message):
                out.append(
                    ToClient(
                        key,
                        proxy_error(
                            message["id"],
                            f"Server {link.server!r} could not be started: {why}",
                            reason="unavailable",
                            server=link.server,
                        ),
                    )
                )
        out += self._fail_pending(link, f"Server {link.server!r} stopped before answering: {why}", "unavailable")
        for (session, proxy_id), reverse in list(self.reverse.items()):
            if reverse.server == server:
                self._end_reverse(session, proxy_id)
                out.append(
                    ToClient(
                        session,
                        {
                            "jsonrpc": "2.0",
                            "method": "notifications/cancelled",
                            "params": {"requestId": proxy_id, "reason": f"server {server!r} stopped"},
                        },
                    )
                )
        for key in [k for k in self.elicitations if k[0] == server]:
            self._forget_elicitation(key)
        self.held_roots = [held for held in self.held_roots if held[0] != server]
        self.roots_fallback.discard(server)
        if link.session is None:
            out += self._server_out(server, why)
            kinds = self.catalog.forget(server)
            for profile, catalog in self.catalogs.items():
                for kind in kinds:
                    changed = catalog.rebuild(kind)
                    out += self._announce([kind] if changed else [], profile)
                    if self.views:
                        out += self._views_see(catalog, server, kind, changed)
        return out

    # --- servers between starts (aggregator.core.outages) ---------------------------------

    def _server_out(self, server: str, why: str) -> list[Command]:
        """A shared server is lost: remember what each profile saw of it, before it goes."""
        outage = self.outages.get(server)
        if outage is None:  # it was serving
            outage = self.outages[server] = Outage(server, state=RESTARTING, ever_ready=True)
        else:  # a start attempt failed (or the listing after it)
            outage.state = FAILED
        outage.reason = why
        outage.retry_at = None
        for profile, catalog in self.catalogs.items():
            seen = remember(catalog, server)
            if profile in outage.memory:
                outage.memory[profile].merge(seen)
            else:
                outage.memory[profile] = seen
        # Held requests are answered by ``server_down``, which follows at once with the time
        # of the next attempt; when shutting down, none follows.
        return self._fail_held(server) if self.draining else []

    def server_down(self, server: str, reason: str, retry_in: float) -> list[Command]:
        """The supervisor of a shared server that was lost (or did not start) starts it again
        in ``retry_in`` seconds. Requests that waited for the attempt that failed fail now."""
        outage = self.outages.get(server)
        if outage is None or server not in self.links:
            return []
        outage.retry_at = outage.attempt_at = self.clock() + max(0.0, retry_in)
        outage.reason = reason
        return self._fail_held(server)

    def server_listed(self, server: str) -> list[Command]:
        """A shared server is ready and listed: it is out no more. Held requests are looked
        up again (a name it no longer has is unknown now) and sent within their deadline."""
        outage = self.outages.pop(server, None)
        if outage is None:
            return []
        now = self.clock()
        if outage.attempt_at is not None:
            self.start_takes[server] = max(0.0, now - outage.attempt_at)
        out: list[Command] = []
        for held in self.held.pop(server, ()):
            if held.done:
                continue
            self._end(held)
            if held.session not in self.clients:
                continue
            out += self.client_event(held.session, REQUEST, held.extra.message)
            sent = self.clients[held.session].in_flight.get(held.client_id)
            if sent is not None and type(sent.extra) is not Held and sent.deadline > held.deadline:
                sent.deadline = held.deadline  # the request's own deadline, as if never held
                sent.hard_deadline = min(sent.hard_deadline, held.hard_deadline)
                self.deadlines.move(sent.deadline, sent)
        return out

    def _server_down_answer(self, client: ClientState, message: dict[str, Any], server: str) -> list[Command]:
        """Hold a request for a server that is out, or tell its client how the server is."""
        outage = self.outages.get(server)
        link = self.links[server]
        now = self.clock()
        if outage is None:  # not out (a lookup raced nothing here: events are sequential)
            return [
                ToClient(
                    client.key,
                    proxy_error(
                        message["id"],
                        f"Server {server!r} is not available right now",
                        reason="unavailable",
                        server=server,
                    ),
                )
            ]
        held = self.held.setdefault(server, [])
        if len(held) >= self.max_in_flight:
            held[:] = [p for p in held if not p.done]
        if (
            not self.draining
            and len(held) < self.max_in_flight
            and len(client.in_flight) < self.max_in_flight
            and should_hold(outage, now, link.request_timeout, self.start_takes.get(server, 0.0))
        ):
            pending = Pending(client.key, message["id"], message["method"], server, 0)
            pending.extra = Held(message)
            pending.hard_deadline = now + link.max_request_timeout
            pending.deadline = now + link.request_timeout
            self.deadlines.push(pending.deadline, pending)
            client.in_flight[pending.client_id] = pending
            held.append(pending)
            return []
        text, data = unavailable(outage, now)
        return [ToClient(client.key, error_response(message["id"], INTERNAL_ERROR, text, data))]

    def _fail_held(self, server: str) -> list[Command]:
        outage = self.outages.get(server)
        out: list[Command] = []
        for held in self.held.pop(server, ()):
            if held.done:
                continue
            self._end(held)
            if held.session in self.clients and outage is not None:
                text, data = unavailable(outage, self.clock())
                out.append(ToClient(held.session, error_response(held.client_id, INTERNAL_ERROR, text, data)))
        return out

    def _held_timed_out(self, held: Pending) -> list[Command]:
        self._end(held)
        if held.session not in self.clients:
            return []
        link = self.links[held.server]
        outage = self.outages.get(held.server)
        if outage is None:
            text, data = (
                f"Server {held.server!r} did not become ready within {link.request_timeout:g} s",
                {"source": "aggregator", "reason": "unavailable", "server": held.server},
            )
        else:
            text, data = unavailable(outage, self.clock(), waited=link.request_timeout)
        log.info("server %s: %s waited %gs for the server and failed", held.server, held.method, link.request_timeout)
        return [ToClient(held.session, error_response(held.client_id, INTERNAL_ERROR, text, data))]

    # --- logging ------------------------------------------------------------------------

    def _apply_log_level(self) -> list[Command]:
        """Set every upstream that logs to the most verbose level any client asked for."""
        target = most_verbose([c.log_level for c in self.clients.values() if c.log_level is not None])
        if target is None:
            return []
        out: list[Command] = []
        for name, link in self.links.items():
            if link.ready and "logging" in link.capabilities and link.log_level != target:
                link.log_level = target
                out += self._own_request(name, "logging/setLevel", {"level": target})
        return out

    # --- list changes -------------------------------------------------------------------

    def _announce(self, kinds: list[str], profile: str | int = "default") -> list[Command]:
        """Queue list_changed notices for one profile's clients (those without a view of
        their own), or for one session (by its key); they go out together once the
        debounce passes."""
        if not kinds:
            return []
        due = self._announce_methods.setdefault(profile, [])
        for kind in kinds:
            method = LIST_CHANGED[kind]
            if method not in due:
                due.append(method)
        if not due:
            return []
        if self.list_changed_debounce <= 0:
            return self._send_announcements()
        if self._announce_at is None:
            self._announce_at = self.clock() + self.list_changed_debounce
        return []

    def _send_announcements(self) -> list[Command]:
        due, self._announce_methods = self._announce_methods, {}
        self._announce_at = None
        out: list[Command] = []
        for client in self.clients.values():
            if not client.initialize_seen:
                continue
            methods = due.get(client.key, [])
            if client.key not in self.views:
                methods = [*methods, *(m for m in due.get(client.profile, ()) if m not in methods)]
            for method in methods:
                capability = method.split("/")[1]
                if capability in client.advertised:
                    out.append(ToClient(client.key, {"jsonrpc": "2.0", "method": method}))
        return out

    # --- what the proxy says about itself -----------------------------------------------

    def merged_capabilities(self) -> dict[str, Any]:
        shared = [link for link in self.links.values() if link.session is None]
        ready = [link for link in shared if link.ready]
        waiting = len(ready) < len(shared)
        capabilities: dict[str, Any] = {}
        for kind in (TOOLS, PROMPTS, RESOURCES):
            name = CAPABILITY_OF[kind]
            # Servers still starting may bring any kind: advertise it, announce it later.
            if waiting or any(name in link.capabilities for link in ready):
                capabilities[name] = {"listChanged": True}
        if "resources" in capabilities and any(
            (link.capabilities.get("resources") or {}).get("subscribe") for link in ready
        ):
            capabilities["resources"]["subscribe"] = True
        if any("completions" in link.capabilities for link in ready):
            capabilities["completions"] = {}
        if any("logging" in link.capabilities for link in ready):
            capabilities["logging"] = {}
        tasks: dict[str, Any] = {}
        for link in ready:
            upstream_tasks = link.capabilities.get("tasks")
            if type(upstream_tasks) is dict:
                _merge_into(tasks, upstream_tasks)
        if tasks:
            capabilities["tasks"] = tasks
        return capabilities

    def upstream_client_capabilities(self) -> dict[str, Any]:
        """What the proxy declares to upstreams: what it can route to a client."""
        capabilities: dict[str, Any] = {}
        if "sampling" in self.server_requests:
            capabilities["sampling"] = {}
        if "elicitation" in self.server_requests:
            capabilities["elicitation"] = {"form": {}, "url": {}}
        if "roots" in self.server_requests:
            capabilities["roots"] = {"listChanged": True}
        return capabilities

    def merged_instructions(self) -> str:
        """Each ready server's instructions, once: a per-session server's come from its shared
        listing connection, never from one session's own connection (which another session
        must not even learn of)."""
        parts = []
        for link in self.links.values():
            if link.ready and link.instructions and link.session is None:
                head = f"## Server {link.name}"
                if link.prefix:
                    head += f" (its tools and prompts are prefixed {link.prefix}{self.catalog.separator})"
                parts.append(f"{head}\n{link.instructions.strip()}")
        return "\n\n".join(parts)


def _declares(capabilities: dict[str, Any], capability: str, params: dict[str, Any]) -> bool:
    """Whether a client declared what a server-to-client request needs."""
    declared = capabilities.get(capability)
    if type(declared) is not dict:
        return False
    if capability == "elicitation":
        # 2025-11-25: {} or {"form": {}} is form mode; URL mode needs "url".
        if params.get("mode") == "url":
            return "url" in declared
        return not declared or "form" in declared
    if capability == "sampling" and ("tools" in params or "toolChoice" in params):
        return "tools" in declared
    return True


def _merge_into(target: dict[str, Any], source: dict[str, Any]) -> None:
    for key, value in source.items():
        if type(value) is dict and type(target.get(key)) is dict:
            _merge_into(target[key], value)
        elif key not in target:
            target[key] = value


def _result(session: int, id: Any, result: dict[str, Any]) -> ToClient:
    return ToClient(session, {"jsonrpc": "2.0", "id": id, "result": result})


def _cancelled(upstream_id: int, reason: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": upstream_id, "reason": reason},
    }


def _splice_result(id: Any, result: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":' + dumps(id) + b',"result":' + result + b"}"


# The id of a response, from the first bytes of a message too large to parse. Our upstream
# ids are integers; a response carries no "method", and "id" precedes "result" in what
# servers write (when it does not, the request simply waits for its timeout).
_HEAD_ID = re.compile(rb'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(\d{1,18})\s*,')


def _expose_result_uris(method: str, result: dict[str, Any], prefix: str) -> None:
    """Rewrite the URIs in an upstream result to their exposed form, in place."""
    if method == "tools/call" or method == "tasks/result":
        rewrite_content_uris(result.get("content"), prefix)
    elif method == "resources/read":
        contents = result.get("contents")
        if type(contents) is list:
            for item in contents:
                if type(item) is dict and "uri" in item:
                    item["uri"] = expose_uri(prefix, item["uri"])
    elif method == "prompts/get":
        messages = result.get("messages")
        if type(messages) is list:
            for prompt_message in messages:
                if type(prompt_message) is not dict:
                    continue
                content = prompt_message.get("content")
                rewrite_content_uris([content] if type(content) is dict else content, prefix)
