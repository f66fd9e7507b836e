"""Sending a client request upstream, or holding it for a connection that starts. Sans-IO.

``Forwarding`` owns whether the proxy still takes new requests (``draining``) and the
rules of a request's way upstream:

1. A request gets a fresh upstream id of its link's and, if it asked for progress, a
   progress token of the proxy's; it is then in the request table (invariants 1 and 2).
2. A request to a per-session server whose connection is not ready waits in that link's
   ``waiting`` list (the connection started if need be) as a placeholder in its client's
   ``in_flight``: its id is taken and a cancel ends it, though nothing was sent.
3. Nothing new goes upstream while draining, to a link that is not ready or overloaded,
   or past the client's ``max_in_flight``: the client is answered at once, counted.
4. A held request (for its per-session connection, or for a shared server between
   starts) leaves with an upstream event's commands, not with its client's: whatever it
   sends then goes through ``sent_held``, which shows it to the watcher of held requests
   (tracing: its client span and trace context), as the commands of a request sent at once
   are shown to whoever routed it. Nobody watching, nothing more is done, and a request
   sent at once never passes there.

It reads the links and the per-session servers it is given; it writes the links' ids and
``waiting`` lists, creates per-session links, and puts requests in the request table.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, TypeAlias

from aggregator import __version__
from aggregator.core.commands import Command, StartUpstream, ToClient, ToServer
from aggregator.core.lifecycle.upstream_era import LEGACY_ERA, MODERN_ERA
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import UNSENT, Pending, Phase, UpstreamLink
from aggregator.core.records.log_levels import DEFAULT as DEFAULT_LEVEL
from aggregator.core.replies import proxy_error
from aggregator.core.requests.request_table import RequestTable
from aggregator.core.requests.tasks import restore_related_task
from aggregator.mcp.constants import SERVER_REQUEST_CAPABILITIES
from aggregator.mcp.modern import (
    CLIENT_CAPABILITIES,
    CLIENT_INFO,
    ENVELOPE,
    INPUT_REQUIRED_METHODS,
    LOG_LEVEL,
    PROTOCOL_VERSION,
    TASKS_EXTENSION,
    declares_tasks,
)
from aggregator.mcp.versions import MODERN_LATEST

# The client info a request to a modern server carries when its caller gave none.
PROXY_INFO = {"name": "aggregator", "version": __version__}

# Sees what a held request sent once its server could take it: its client's key, its id,
# and the commands, which it may rewrite in place (``Tracing.forwarded`` has this shape).
HeldWatcher: TypeAlias = Callable[[int, Any, list[Command]], None]


class Forwarding:
    """A client request on its way upstream: a fresh id, a progress token of the proxy's,
    its deadline (invariants 1 and 2); or held while a per-session connection starts."""

    def __init__(
        self,
        links: dict[str, UpstreamLink],
        per_session: set[str],
        requests: RequestTable,
        server_requests: Collection[str],
        max_in_flight: int,
    ) -> None:
        self.links = links
        self.per_session = per_session  # servers with a connection per client session
        self.requests = requests
        self.tallies = requests.tallies  # what ended how
        self.server_requests = server_requests  # the server-to-client requests the proxy routes
        self.max_in_flight = max_in_flight  # per client
        self.draining = False  # shutting down: finish what is in flight, take nothing new
        self.watch_held: HeldWatcher | None = None  # rule 4 (tracing), or nobody

    def forward(
        self, client: ClientState, message: dict[str, Any], server: str, params: dict[str, Any]
    ) -> list[Command]:
        """Send a client's request upstream under a fresh id. ``params`` is ours to change."""
        if self.draining:
            self.tallies.ended(message["method"], server, "error", "unavailable", None)
            return [
                ToClient(
                    client.key,
                    proxy_error(message["id"], "The aggregator is shutting down", reason="unavailable", server=server),
                )
            ]
        if server in self.per_session:
            name = self.link_name(server, client.key)
            link = self.links.get(name)
            if link is None or not link.ready:
                return self._hold(client, message, server, params, name)
            server = name
        link = self.links[server]
        client_id = message["id"]
        method = message["method"]
        if not link.ready or len(client.in_flight) >= self.max_in_flight or link.overloaded is not None:
            return [ToClient(client.key, self._refusal(client, client_id, link, method))]
        upstream_id = link.next_id
        link.next_id = upstream_id + 1
        pending = Pending(client.key, client_id, method, server, upstream_id)
        if client.era is MODERN_ERA:
            # Its envelope (``modern.ENVELOPE``) is taken out of the params about to be sent
            # (ours to change) and stays with the request: a legacy upstream must not see it
            # (a dual-era server refuses it on a legacy connection); a modern one is given its
            # own, made from it (``_modern_meta``).
            envelope = params.get("_meta")
            if type(envelope) is dict:
                if envelope.keys() <= ENVELOPE:  # the common case, decided in C
                    del params["_meta"]
                else:
                    params["_meta"] = {key: value for key, value in envelope.items() if key not in ENVELOPE}
                pending.meta = envelope
            if "task" in params and link.speaks is LEGACY_ERA:  # a 2025-11-25 task it could not poll: run it at once
                del params["task"]
            if method in INPUT_REQUIRED_METHODS:  # what a state the proxy mints is bound to (``core.era.parked``)
                pending.params = params
        meta = params.get("_meta")
        if type(meta) is dict:
            token = meta.get("progressToken")
            if type(token) is int or type(token) is str:
                pending.client_token = token
                pending.token = self.requests.token()
                self.requests.progress[pending.token] = pending
                params["_meta"] = meta = dict(meta, progressToken=pending.token)
            restore_related_task(params, server)
        if link.speaks is MODERN_ERA:  # every request to a modern server carries its caller's _meta
            params["_meta"] = self._modern_meta(client, link, meta, pending)
            if client.era is LEGACY_ERA and method in INPUT_REQUIRED_METHODS:  # what a retry resends (``input_bridge``)
                pending.params = params
        self.requests.start(pending, link)
        client.in_flight[client_id] = pending
        return [ToServer(server, {"jsonrpc": "2.0", "id": upstream_id, "method": method, "params": params})]

    def _modern_meta(self, client: ClientState, link: UpstreamLink, meta: Any, pending: Pending) -> dict[str, Any]:
        """The ``_meta`` of a request to a modern server: its revision, the caller's client
        capabilities as far as the proxy routes server requests (a modern caller's for this
        request, a legacy one's from its session), its client info (else the proxy's) and
        its log level (per request, or the legacy session's ``logging/setLevel``)."""
        if type(meta) is not dict:
            meta = {}
        if client.era is MODERN_ERA:  # its envelope was taken out of ``meta`` into ``pending.meta``
            envelope = pending.meta or {}
            capabilities, info, level = (
                envelope.get(CLIENT_CAPABILITIES),
                envelope.get(CLIENT_INFO),
                envelope.get(LOG_LEVEL),
            )
        else:
            # A legacy session that set no level gets the default, from servers of either era.
            capabilities, info, level = client.capabilities, client.client_info, client.log_level or DEFAULT_LEVEL
        allowed = self.server_requests
        stamped = dict(meta)
        stamped[PROTOCOL_VERSION] = link.protocol_version or MODERN_LATEST
        stamped[CLIENT_CAPABILITIES] = (
            {k: v for k, v in capabilities.items() if k in allowed and k in SERVER_REQUEST_CAPABILITIES}
            if type(capabilities) is dict
            else {}
        )
        # The tasks extension, where both the caller and the server declare it (``core.requests.tasks``);
        # most callers declare no extension at all, which the C-level ``in`` tells first.
        if type(capabilities) is dict and "extensions" in capabilities and client.era is MODERN_ERA:
            if declares_tasks(capabilities) and declares_tasks(link.capabilities):
                declared = capabilities["extensions"][TASKS_EXTENSION]
                stamped[CLIENT_CAPABILITIES]["extensions"] = {TASKS_EXTENSION: declared}
        if type(info) is dict and type(info.get("name")) is str:  # an Implementation needs both
            stamped[CLIENT_INFO] = info if type(info.get("version")) is str else dict(info, version="")
        else:
            stamped[CLIENT_INFO] = PROXY_INFO
        if type(level) is str:
            stamped[LOG_LEVEL] = level
        else:
            stamped.pop(LOG_LEVEL, None)
        return stamped

    def _refusal(self, client: ClientState, client_id: Any, link: UpstreamLink, method: str) -> dict[str, Any]:
        """Why a request (for ``method``) cannot go to ``link`` now: it is not ready, the
        client has too many requests in flight, or the server takes no more input. Counted
        as an error with that reason (``core.requests.request_table``, its tallies)."""
        server = link.server or link.name
        if not link.ready:
            self.tallies.ended(method, server, "error", "unavailable", None)
            return proxy_error(
                client_id, f"Server {link.name!r} is not available right now", reason="unavailable", server=link.name
            )
        self.tallies.ended(method, server, "error", "overloaded", None)
        if len(client.in_flight) >= self.max_in_flight:
            return proxy_error(
                client_id,
                f"Too many requests in flight (limit {self.max_in_flight})",
                reason="overloaded",
                server=link.name,
            )
        return proxy_error(
            client_id,
            f"Server {link.server!r} is overloaded: {link.overloaded}; try again later",
            reason="overloaded",
            server=link.server,
        )

    def link_name(self, server: str, session: int) -> str:
        """The link a request of client ``session`` to ``server`` goes on (its own, for a
        per-session server)."""
        return f"{server}@{session}" if server in self.per_session else server

    def _hold(
        self, client: ClientState, message: dict[str, Any], server: str, params: dict[str, Any], name: str
    ) -> list[Command]:
        """Keep a request for a per-session link that is not ready; start it if need be."""
        out: list[Command] = []
        if name not in self.links:
            out += self.open_link(client, server, name)
        link = self.links[name]
        if len(link.waiting) >= self.max_in_flight:
            self.tallies.ended(message["method"], server, "error", "overloaded", None)
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
        placeholder.hold(Phase.STARTING, message)
        client.in_flight[message["id"]] = placeholder
        return out

    def sent_held(self, key: int, id: Any, commands: list[Command]) -> list[Command]:
        """What client ``key``'s held request ``id`` sent once its server could take it,
        shown to the watcher of held requests (rule 4); the one way a held request leaves."""
        if self.watch_held is not None:
            self.watch_held(key, id, commands)
        return commands

    def open_link(self, client: ClientState, server: str, name: str) -> list[Command]:
        """Make client ``client``'s own link ``name`` to per-session ``server`` and say to
        start its connection."""
        base = self.links[server]
        self.links[name] = UpstreamLink(
            name,
            base.prefix,
            base.uri_prefix,
            request_timeout=base.request_timeout,
            max_request_timeout=base.max_request_timeout,
            timeout_resets_on_progress=base.timeout_resets_on_progress,
            server=server,
            session=client.key,
            protocol=base.protocol,
            discover_timeout=base.discover_timeout,
            learnt=base.learnt,
            grants=base.grants,
        )
        capabilities = {
            k: v
            for k, v in client.capabilities.items()
            if k in SERVER_REQUEST_CAPABILITIES and k in self.server_requests
        }
        if "roots" in self.server_requests:  # its client's roots, else the proxy answers
            capabilities["roots"] = {"listChanged": True}
        return [StartUpstream(server, name, client.key, capabilities)]

    def still_waiting(self, client: ClientState | None, message: dict[str, Any]) -> bool:
        """Take a request off its wait for a per-session connection to start: False if its
        client is gone or cancelled it meanwhile."""
        if client is None:
            return False
        placeholder = client.in_flight.get(message["id"])
        if placeholder is None or placeholder.phase not in UNSENT or placeholder.held is not message:
            return False
        self.requests.end(placeholder)
        return True
