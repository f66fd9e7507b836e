"""Routing between downstream sessions (clients) and upstreams (servers). Sans-IO.

Theory of operation
-------------------
Events go in as method calls (a client sent these bytes; server S sent these bytes; S is
ready with this catalog; S was lost; a client went away) and commands come out as lists
(send this message to client session C; send that one to server S; re-list S's tools).
The trio layer executes the commands; nothing here awaits or blocks.

Invariants
----------
1. A client's request id is echoed back exactly, and only to that client. Upstream ids
   are minted here, per upstream, as increasing integers; the proxy's own requests to an
   upstream (initialize, listing) use string ids ``"aggregator-N"`` and never reach this
   table. So ids from different clients can never collide upstream.
2. Every forwarded request is in exactly two tables until it ends: ``link.pending``
   (upstream id -> Pending) and ``client.in_flight`` (client id -> (server, upstream id)).
   Every exit path (response, error, cancellation, client gone, upstream lost) removes it
   from both, so the tables stay bounded by what is really in flight.
3. A response from an upstream whose id is not pending (late after a cancel, foreign,
   duplicated) is dropped.
4. Names and URIs are looked up in the catalog; an unknown one is -32602 from the proxy
   and nothing reaches any upstream.
5. Errors the proxy makes itself carry ``data.source = "aggregator"``, the server and a
   reason, so nobody mistakes them for an upstream's.
"""

from __future__ import annotations

import logging
import re
from typing import Any, NamedTuple

import attrs

from aggregator import __version__
from aggregator.core.catalog import (
    CAPABILITY_OF,
    LIST_METHODS,
    PROMPTS,
    RESOURCES,
    TEMPLATES,
    TOOLS,
    Catalog,
)
from aggregator.core.uris import expose_uri, rewrite_content_uris
from aggregator.jsonrpc.codec import (
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
from aggregator.mcp.versions import negotiate

log = logging.getLogger(__name__)

CONTROL_ID_PREFIX = "aggregator-"
LIST_CHANGED = {
    TOOLS: "notifications/tools/list_changed",
    PROMPTS: "notifications/prompts/list_changed",
    RESOURCES: "notifications/resources/list_changed",
    TEMPLATES: "notifications/resources/list_changed",
}


# --- commands ---------------------------------------------------------------------------


class ToClient(NamedTuple):
    """Send ``message`` (a dict, or bytes already serialized) to client session ``session``."""

    session: int
    message: Any


class ToServer(NamedTuple):
    """Send ``message`` to upstream ``server``."""

    server: str
    message: Any


class ControlReply(NamedTuple):
    """A response to one of the proxy's own requests to ``server``."""

    server: str
    message: dict[str, Any]


class Refresh(NamedTuple):
    """Re-list ``kind`` (a catalog kind) from ``server``."""

    server: str
    kind: str


class WaitForStartup(NamedTuple):
    """Hold this client's `initialize` until startup is complete, then feed it again."""

    session: int


# --- state ------------------------------------------------------------------------------


class Pending(NamedTuple):
    session: int
    client_id: Any
    method: str


@attrs.define(eq=False)
class UpstreamLink:
    name: str
    prefix: str
    uri_prefix: str
    ready: bool = False
    next_id: int = 1
    pending: dict[int, Pending] = attrs.field(factory=dict)
    capabilities: dict[str, Any] = attrs.field(factory=dict)
    instructions: str | None = None
    server_info: dict[str, Any] = attrs.field(factory=dict)
    protocol_version: str | None = None


@attrs.define(eq=False)
class ClientState:
    key: int
    initialize_seen: bool = False
    initialized: bool = False
    protocol_version: str | None = None
    capabilities: dict[str, Any] = attrs.field(factory=dict)
    client_info: dict[str, Any] = attrs.field(factory=dict)
    advertised: dict[str, Any] = attrs.field(factory=dict)
    in_flight: dict[Any, tuple[str, int]] = attrs.field(factory=dict)


def proxy_error(
    id: Any, message: str, *, reason: str, server: str | None = None, code: int = INTERNAL_ERROR
) -> dict[str, Any]:
    data: dict[str, Any] = {"source": "aggregator", "reason": reason}
    if server is not None:
        data["server"] = server
    return error_response(id, code, message, data)


class Router:
    def __init__(self, catalog: Catalog, servers: list[Any], max_in_flight: int = 1024) -> None:
        self.catalog = catalog
        self.links: dict[str, UpstreamLink] = {
            s.name: UpstreamLink(
                s.name, catalog.naming[s.name].prefix, catalog.naming[s.name].uri_prefix
            )
            for s in servers
        }
        self.clients: dict[int, ClientState] = {}
        self.startup_complete = False
        self.max_in_flight = max_in_flight
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
            "completion/complete": self._complete,
        }

    # --- clients ------------------------------------------------------------------------

    def client_connected(self, key: int) -> None:
        self.clients[key] = ClientState(key)

    def client_disconnected(self, key: int) -> list[Any]:
        """A client went away: cancel everything it had in flight upstream."""
        client = self.clients.pop(key, None)
        if client is None:
            return []
        out: list[Any] = []
        for server, upstream_id in client.in_flight.values():
            link = self.links[server]
            if link.pending.pop(upstream_id, None) is not None and link.ready:
                out.append(ToServer(server, _cancelled(upstream_id, "client disconnected")))
        return out

    def client_message(self, key: int, raw: bytes) -> list[Any]:
        client = self.clients[key]
        try:
            kind, message = decode_message(raw)
        except RemoteProtocolError as exc:
            log.debug("client %d: refused message: %s", key, exc.message)
            return [ToClient(key, exc.to_response())] if exc.answer else []
        if kind == REQUEST:
            method = message["method"]
            handler = self._requests.get(method)
            if handler is None:
                if method == "server/discover":
                    # The 2026 stateless probe: refuse at once so the client falls back to
                    # `initialize` without waiting (and never learns an upstream's answer).
                    return [ToClient(key, error_response(
                        message["id"], METHOD_NOT_FOUND, "Method not found: server/discover"
                        " (this server speaks the initialize handshake)"))]
                return [ToClient(key, error_response(
                    message["id"], METHOD_NOT_FOUND, f"Method not found: {method}"))]
            if not client.initialize_seen and method not in ("initialize", "ping"):
                return [ToClient(key, error_response(
                    message["id"], INVALID_REQUEST,
                    f"Invalid request: {method} before initialize; send initialize first"))]
            if message["id"] in client.in_flight:
                return [ToClient(key, error_response(
                    message["id"], INVALID_REQUEST,
                    "Invalid request: this id is already in use by a request in flight"))]
            try:
                return handler(client, message)
            except RemoteProtocolError as exc:
                exc.id = message["id"]
                return [ToClient(key, exc.to_response())]
        if kind == NOTIFICATION:
            return self._client_notification(client, message)
        # A response or error from the client: an answer to a server-to-client request.
        # The proxy has sent none it expects an answer to, so there is nothing to match.
        log.debug("client %d: dropping a response to an unknown request", key)
        return []

    def _client_notification(self, client: ClientState, message: dict[str, Any]) -> list[Any]:
        method = message["method"]
        if method == "notifications/initialized":
            client.initialized = client.initialize_seen
            return []
        if method == "notifications/cancelled":
            params = message.get("params") or {}
            entry = client.in_flight.pop(params.get("requestId"), None)
            if entry is None:
                return []  # unknown, finished or never ours: ignored, as the spec says
            server, upstream_id = entry
            link = self.links[server]
            link.pending.pop(upstream_id, None)
            if not link.ready:
                return []
            forwarded = dict(params, requestId=upstream_id)
            return [ToServer(server, {"jsonrpc": "2.0", "method": method, "params": forwarded})]
        return []

    # --- client requests ----------------------------------------------------------------

    def _initialize(self, client: ClientState, message: dict[str, Any]) -> list[Any]:
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
        }
        instructions = self.merged_instructions()
        if instructions:
            result["instructions"] = instructions
        return [ToClient(client.key, {"jsonrpc": "2.0", "id": message["id"], "result": result})]

    def _ping(self, client: ClientState, message: dict[str, Any]) -> list[Any]:
        return [ToClient(client.key, {"jsonrpc": "2.0", "id": message["id"], "result": {}})]

    def _list(self, client: ClientState, message: dict[str, Any]) -> list[Any]:
        kind = LIST_METHODS[message["method"]]
        params = message.get("params") or {}
        page = self.catalog.page(kind, params.get("cursor"))
        return [ToClient(client.key, _splice_result(message["id"], page))]

    def _call_by_name(self, client: ClientState, message: dict[str, Any]) -> list[Any]:
        params = message.get("params")
        name = params.get("name") if params else None
        tools = message["method"] == "tools/call"
        routes = self.catalog.tools if tools else self.catalog.prompts
        route = routes.get(name) if type(name) is str else None
        if route is None:
            what = "tool" if tools else "prompt"
            if type(name) is not str:
                raise RemoteProtocolError(INVALID_PARAMS, f"Invalid params: {what} name must be a string")
            raise RemoteProtocolError(INVALID_PARAMS, f"Unknown {what}: {name}")
        return self._forward(client, message, route.server, dict(params, name=route.original))

    def _read_resource(self, client: ClientState, message: dict[str, Any]) -> list[Any]:
        params = message.get("params")
        uri = params.get("uri") if params else None
        if type(uri) is not str:
            raise RemoteProtocolError(INVALID_PARAMS, "Invalid params: uri must be a string")
        route = self.catalog.route_uri(uri)
        if route is None:
            raise RemoteProtocolError(INVALID_PARAMS, f"Unknown resource: {uri}")
        return self._forward(client, message, route.server, dict(params, uri=route.original))

    def _complete(self, client: ClientState, message: dict[str, Any]) -> list[Any]:
        params = message.get("params")
        ref = params.get("ref") if params else None
        if type(ref) is not dict:
            raise RemoteProtocolError(INVALID_PARAMS, "Invalid params: ref must be an object")
        if ref.get("type") == "ref/prompt":
            route = self.catalog.prompts.get(ref.get("name"))  # type: ignore[arg-type]
            if route is None:
                raise RemoteProtocolError(INVALID_PARAMS, f"Unknown prompt: {ref.get('name')}")
            new_ref = dict(ref, name=route.original)
        elif ref.get("type") == "ref/resource" and type(ref.get("uri")) is str:
            route = self.catalog.route_template(ref["uri"])
            if route is None:
                raise RemoteProtocolError(INVALID_PARAMS, f"Unknown resource: {ref['uri']}")
            new_ref = dict(ref, uri=route.original)
        else:
            raise RemoteProtocolError(
                INVALID_PARAMS, "Invalid params: ref must be ref/prompt or ref/resource")
        return self._forward(client, message, route.server, dict(params, ref=new_ref))

    def _forward(
        self, client: ClientState, message: dict[str, Any], server: str, params: dict[str, Any]
    ) -> list[Any]:
        link = self.links[server]
        client_id = message["id"]
        if not link.ready:
            return [ToClient(client.key, proxy_error(
                client_id, f"Server {server!r} is not available right now",
                reason="unavailable", server=server))]
        if len(client.in_flight) >= self.max_in_flight:
            return [ToClient(client.key, proxy_error(
                client_id, f"Too many requests in flight (limit {self.max_in_flight})",
                reason="overloaded", server=server))]
        upstream_id = link.next_id
        link.next_id = upstream_id + 1
        link.pending[upstream_id] = Pending(client.key, client_id, message["method"])
        client.in_flight[client_id] = (server, upstream_id)
        return [ToServer(server, {
            "jsonrpc": "2.0", "id": upstream_id, "method": message["method"], "params": params})]

    # --- upstreams ----------------------------------------------------------------------

    def server_message(self, server: str, raw: bytes) -> list[Any]:
        link = self.links[server]
        try:
            kind, message = decode_message(raw)
        except RemoteProtocolError as exc:
            log.warning("server %s: dropping an unreadable message: %s", server, exc.message)
            if exc.id is not None and exc.answer:
                return [ToServer(server, exc.to_response())]
            return []
        if kind == RESPONSE or kind == ERROR:
            id = message["id"]
            if type(id) is str and id.startswith(CONTROL_ID_PREFIX):
                return [ControlReply(server, message)]
            pending = link.pending.pop(id, None) if type(id) is int else None
            if pending is None:
                log.debug("server %s: dropping a response to unknown id %r", server, id)
                return []
            client = self.clients.get(pending.session)
            if client is None:
                return []
            client.in_flight.pop(pending.client_id, None)
            message["id"] = pending.client_id
            if kind == RESPONSE and link.uri_prefix:
                _expose_result_uris(pending.method, message.get("result"), link.uri_prefix)
            return [ToClient(pending.session, message)]
        if kind == NOTIFICATION:
            method = message["method"]
            if method == "notifications/tools/list_changed":
                return [Refresh(server, TOOLS)]
            if method == "notifications/prompts/list_changed":
                return [Refresh(server, PROMPTS)]
            if method == "notifications/resources/list_changed":
                return [Refresh(server, RESOURCES), Refresh(server, TEMPLATES)]
            log.debug("server %s: notification %s not routed", server, method)
            return []
        # A request from the server to its client (the proxy).
        method = message["method"]
        if method == "ping":
            return [ToServer(server, {"jsonrpc": "2.0", "id": message["id"], "result": {}})]
        return [ToServer(server, proxy_error(
            message["id"], f"The aggregator does not route {method} to clients",
            reason="unroutable", server=server, code=METHOD_NOT_FOUND))]

    def server_oversized(self, server: str, head: bytes, limit: int) -> list[Any]:
        """A message from the server was over the size limit and was dropped unread.

        If its first bytes name a pending request's id, that request fails now with
        reason ``too_large`` instead of waiting for an answer that will never come.
        """
        match = _HEAD_ID.search(head)
        if match is None:
            return []
        pending = self.links[server].pending.pop(int(match.group(1)), None)
        if pending is None or pending.session not in self.clients:
            return []
        self.clients[pending.session].in_flight.pop(pending.client_id, None)
        return [ToClient(pending.session, proxy_error(
            pending.client_id, f"Server {server!r} answered with more than {limit} bytes",
            reason="too_large", server=server))]

    def server_ready(self, server: str, init_result: dict[str, Any]) -> None:
        link = self.links[server]
        link.ready = True
        capabilities = init_result.get("capabilities")
        link.capabilities = capabilities if type(capabilities) is dict else {}
        instructions = init_result.get("instructions")
        link.instructions = instructions if type(instructions) is str and instructions.strip() else None
        info = init_result.get("serverInfo")
        link.server_info = info if type(info) is dict else {}
        link.protocol_version = init_result.get("protocolVersion")

    def server_items(self, server: str, kind: str, items: list[dict[str, Any]]) -> list[Any]:
        """A fresh listing of one kind from a server; announce a change to clients."""
        if not self.links[server].ready:
            return []
        if self.catalog.set_items(server, kind, items):
            return self._announce([kind])
        return []

    def server_lost(self, server: str, why: str) -> list[Any]:
        """The upstream is gone: fail its pending requests at once, hide its items."""
        link = self.links[server]
        link.ready = False
        out: list[Any] = []
        pending, link.pending = link.pending, {}
        for entry in pending.values():
            client = self.clients.get(entry.session)
            if client is None:
                continue
            client.in_flight.pop(entry.client_id, None)
            out.append(ToClient(entry.session, proxy_error(
                entry.client_id, f"Server {server!r} stopped before answering: {why}",
                reason="unavailable", server=server)))
        out.extend(self._announce(self.catalog.remove_server(server)))
        return out

    def _announce(self, kinds: list[str]) -> list[Any]:
        methods = []
        for kind in kinds:
            method = LIST_CHANGED[kind]
            if method not in methods:
                methods.append(method)
        out: list[Any] = []
        for client in self.clients.values():
            if not client.initialize_seen:
                continue
            for method in methods:
                capability = method.split("/")[1]
                if capability in client.advertised:
                    out.append(ToClient(client.key, {"jsonrpc": "2.0", "method": method}))
        return out

    # --- what the proxy says about itself -----------------------------------------------

    def merged_capabilities(self) -> dict[str, Any]:
        ready = [link for link in self.links.values() if link.ready]
        waiting = len(ready) < len(self.links)
        capabilities: dict[str, Any] = {}
        for kind in (TOOLS, PROMPTS, RESOURCES):
            name = CAPABILITY_OF[kind]
            # Servers still starting may bring any kind: advertise it, announce it later.
            if waiting or any(name in link.capabilities for link in ready):
                capabilities[name] = {"listChanged": True}
        if any("completions" in link.capabilities for link in ready):
            capabilities["completions"] = {}
        return capabilities

    def merged_instructions(self) -> str:
        parts = []
        for link in self.links.values():
            if link.ready and link.instructions:
                head = f"## Server {link.name}"
                if link.prefix:
                    head += f" (its tools and prompts are prefixed {link.prefix}{self.catalog.separator})"
                parts.append(f"{head}\n{link.instructions.strip()}")
        return "\n\n".join(parts)


# The id of a response, from the first bytes of a message too large to parse. Our upstream
# ids are integers; a response carries no "method", and "id" precedes "result" in what
# servers write (when it does not, the request simply waits for its timeout).
_HEAD_ID = re.compile(rb'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(\d{1,18})\s*,')


def _cancelled(upstream_id: int, reason: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": upstream_id, "reason": reason},
    }


def _splice_result(id: Any, result: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":' + dumps(id) + b',"result":' + result + b"}"


def _expose_result_uris(method: str, result: Any, prefix: str) -> None:
    """Rewrite the URIs in an upstream result to their exposed form, in place."""
    if type(result) is not dict:
        return
    if method == "tools/call":
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

