"""Serving modern (2026-07-28) callers: admission, server/discover, subscriptions/listen,
answers stamped, per-request log levels. Sans-IO.

The proxy is a dual-era server (``basic/versioning.mdx``). A request whose
``params._meta`` names a protocol version is modern and served without a session: no
initialize, its capabilities, client info and log level read from its own ``_meta``.

Rules
-----
1. The era of a connection. On Streamable HTTP a modern request is a client of its own
   (the front connects it modern). On stdio the first modern request other than
   ``server/discover`` makes the connection modern, and ``initialize`` makes it legacy;
   a connection serves one era from then on: ``initialize`` on a modern connection is
   -32022 naming the revision it serves; a legacy session's requests are legacy whatever
   their ``_meta`` says (its ``_meta`` passes through as any other). ``server/discover`` may
   come from either era, at any time, and decides nothing: a dual-era client probes with it.
2. Admission of a modern request, in order: a revision the proxy does not speak is -32022
   (``data.supported``); ``_meta`` without ``clientCapabilities`` as an object is -32602;
   a ``clientInfo`` that is not an object with a string name, a log level that is not one,
   and a ``requestState`` that is not a string (tools/call, prompts/get, resources/read)
   are -32602 (null means absent); a method the revision removed or never had
   (``modern.CLIENT_REQUESTS``) is -32601, but for the tasks extension's requests
   (``modern.TASK_REQUESTS``), which are -32021 unless ``clientCapabilities`` declare it
   (``core.requests.tasks`` routes them). A request of a modern connection without
   ``_meta`` is -32602. Then it waits for startup, as initialize does, and is handled by
   the same handlers as a legacy session's.
3. Every answer to it is stamped (``core.era.modern_results``): answers the proxy makes here,
   and upstream answers (``server_messages`` calls ``_modern_answer``).
4. Log lines reach a modern caller only for a request that carried a log level, at or
   above it, on that request's stream; legacy upstreams are told the most verbose level any
   caller wants (``logging/setLevel`` is never sent to a modern upstream).
5. A modern caller gets no unsolicited notification: list changes and resource updates
   reach it only on an open ``subscriptions/listen`` (first the acknowledgement, each
   tagged with the listen's id; a filter flag that is not a boolean, or
   ``resourceSubscriptions`` that is not a list of strings, is -32602); it ends when the
   client cancels it or leaves, and a shutdown answers it with a plain result.

``ModernCallers`` keeps no table of its own (the open listens are ``Listens``'s); it is
given the clients, links, catalogs and per-session views, the listens and subscriptions,
what requests name (``Targets``), forwarding (a per-session link's name), the proxy's own
requests upstream, the handshake, the announcements, the instance id and
``max_in_flight``. Admission (``admit``) decides; running the request's handler is the
caller's (``core.handlers.client_events``), and its answers come back to be stamped.
"""

from __future__ import annotations

import logging
from typing import Any

from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.catalogs.outages import DORMANT
from aggregator.core.catalogs.session_catalog import SessionViews
from aggregator.core.catalogs.targets import ServerDown, Targets
from aggregator.core.clients.handshake import Handshake
from aggregator.core.commands import Command, ToClient, WaitForStartup
from aggregator.core.era.modern_results import IDENTITY, cache_hints, stamp_answer
from aggregator.core.lifecycle.upstream_era import INSTANCE_KEY, LEGACY_ERA, MODERN_ERA
from aggregator.core.notices.announcements import Announcements
from aggregator.core.notices.subscriptions import Listen, Listens, Subscriptions
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import Pending, UpstreamLink
from aggregator.core.records.log_levels import LEVELS, RANK, passes
from aggregator.core.requests.forwarding import Forwarding
from aggregator.core.upstreams.upstream_control import UpstreamControl
from aggregator.jsonrpc.errors import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    RemoteProtocolError,
    error_response,
    unknown_method,
)
from aggregator.mcp.constants import CAPABILITY_OF, INITIALIZE, LIST_CHANGED, PROMPTS, RESOURCES, TOOLS
from aggregator.mcp.modern import (
    ACKNOWLEDGED,
    CACHE_SCOPE,
    CACHEABLE,
    CLIENT_CAPABILITIES,
    CLIENT_INFO,
    CLIENT_REQUESTS,
    COMPLETE,
    INPUT_REQUIRED_METHODS,
    LOG_LEVEL,
    PROTOCOL_VERSION,
    REMOVED_REQUESTS,
    REQUEST_STATE,
    RESULT_TYPE,
    SERVER_INFO,
    SUBSCRIPTION_ID,
    TASK_REQUESTS,
    TASKS_EXTENSION,
    TTL,
    UNSUPPORTED_PROTOCOL_VERSION,
    declares_tasks,
    echoed,
    tasks_required,
    unsupported_version,
)
from aggregator.mcp.versions import ALL_VERSIONS, DISCOVER, MODERN

log = logging.getLogger(__name__)

# The listen filter's flags, and the list_changed notification (and capability) of each.
_LIST_FLAGS = (("toolsListChanged", TOOLS), ("promptsListChanged", PROMPTS), ("resourcesListChanged", RESOURCES))
_RESOURCE_SUBSCRIPTIONS = "resourceSubscriptions"


class ModernCallers:
    """What the proxy does for a modern caller that it does not for a legacy session."""

    def __init__(
        self,
        clients: dict[int, ClientState],
        links: dict[str, UpstreamLink],
        catalogs: dict[str, Catalog],
        views: SessionViews,
        listens: Listens,
        subscriptions: Subscriptions,
        targets: Targets,
        forwarding: Forwarding,
        control: UpstreamControl,
        handshake: Handshake,
        announcements: Announcements,
        instance: str,
        max_in_flight: int,
    ) -> None:
        self.clients = clients
        self.links = links
        self.catalogs = catalogs  # several profiles: what a caller is answered depends on who it is
        self.views = views  # so does a session's own view
        self.listens = listens  # the open subscriptions/listen requests
        self.subscriptions = subscriptions
        self.targets = targets  # the resources a listen names
        self.forwarding = forwarding  # a per-session server's link name
        self.control = control  # the proxy's own requests upstream (log levels, subscriptions)
        self.handshake = handshake  # what the proxy serves, merged
        self.announcements = announcements  # a listen hears the notices from its opening on
        self.instance = instance
        self.max_in_flight = max_in_flight  # listens per client, and resources per listen

    # --- admission (rules 1 and 2) -------------------------------------------------------

    def admit(
        self, client: ClientState, message: dict[str, Any], meta: dict[str, Any] | None, startup_complete: bool
    ) -> tuple[list[Command], bool]:
        """Admit a modern request (rules 1 and 2): the commands so far, and whether its
        handler is to run now (then its answers go through ``stamp_answers``)."""
        id = message["id"]
        method = message["method"]
        if meta is None:  # a request of a modern connection without its _meta
            if method == INITIALIZE:
                params = message.get("params")
                requested = params.get("protocolVersion") if type(params) is dict else None
                return [ToClient(client.key, _connection_is_modern(id, requested))], False
            return [ToClient(client.key, _missing_meta(id, method, f"_meta with {PROTOCOL_VERSION}"))], False
        if meta != client.envelope:  # a new envelope is checked; the one it sent last, known good
            refused = _refused_envelope(id, method, meta)
            if refused is not None:
                return [ToClient(client.key, refused)], False
            client.envelope = dict(meta)
            client.protocol_version = meta[PROTOCOL_VERSION]
            client.capabilities = meta[CLIENT_CAPABILITIES]
            info = meta.get(CLIENT_INFO)
            client.client_info = info if info is not None else {}
        level = meta.get(LOG_LEVEL)
        if method in INPUT_REQUIRED_METHODS:
            params = message.get("params")
            state = params.get(REQUEST_STATE) if type(params) is dict else None
            if state is not None and type(state) is not str:
                text = f"Invalid params: {REQUEST_STATE} must be a string (the one an input_required result gave)"
                return [ToClient(client.key, error_response(id, INVALID_PARAMS, text))], False
        if method not in CLIENT_REQUESTS:
            if method not in TASK_REQUESTS:
                why = " (removed in protocol revision 2026-07-28)" if method in REMOVED_REQUESTS else ""
                return [ToClient(client.key, unknown_method(id, method, why))], False
            if not declares_tasks(meta[CLIENT_CAPABILITIES]):
                why = f"{method} needs the {TASKS_EXTENSION} extension in _meta {CLIENT_CAPABILITIES}.extensions"
                return [ToClient(client.key, tasks_required(id, why))], False
        if not startup_complete:
            if meta.get(INSTANCE_KEY) == self.instance:  # startup waits for this very request
                return [ToClient(client.key, _from_itself(id, self.instance))], False
            return [WaitForStartup(client.key)], False
        if method != DISCOVER:  # a probe decides no connection's era
            client.era = MODERN_ERA
        return (self._want_log_level(level) if level is not None else []), True

    def stamp_answers(self, client: ClientState, message: dict[str, Any], answers: list[Command]) -> None:
        """The answers the handler of an admitted request made to it, stamped (rule 3)."""
        id = message["id"]
        method = message["method"]
        for command in answers:
            if type(command) is ToClient and type(command.message) is dict and command.message.get("id", ...) == id:
                depends = method in CACHEABLE and self.depends_on_caller(client)
                stamp_answer(command.message, method, depends_on_caller=depends)

    def stamped(self, key: int, method: str, message: dict[str, Any]) -> dict[str, Any]:
        """An answer made outside the router (a plugin's) for client ``key``'s request, as
        the client's era wants it: stamped for a modern caller, untouched for a legacy one."""
        client = self.clients.get(key)
        if client is not None and client.era is MODERN_ERA:
            stamp_answer(message, method, depends_on_caller=self.depends_on_caller(client))
        return message

    def depends_on_caller(self, client: ClientState, link: UpstreamLink | None = None) -> bool:
        """Whether what this caller is answered depends on who it is (``cacheScope``
        private): several profiles, or its own per-session view or connection."""
        return len(self.catalogs) > 1 or client.key in self.views or (link is not None and link.session is not None)

    # --- answers (rule 3) -------------------------------------------------------------

    def answer(self, client: ClientState, pending: Pending, message: dict[str, Any], link: UpstreamLink) -> None:
        """An upstream's answer to a modern caller, stamped in place (``_answered`` stamps
        a plain call result itself, inline)."""
        method = pending.method
        depends = method in CACHEABLE and self.depends_on_caller(client, link)
        stamp_answer(message, method, depends_on_caller=depends)

    def discover(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        """server/discover, from either era: the revisions the proxy speaks, and what it
        serves (merged over its servers), as initialize would say it."""
        ttl, scope = cache_hints([], [], depends_on_caller=self.depends_on_caller(client))
        result: dict[str, Any] = {
            RESULT_TYPE: COMPLETE,
            "supportedVersions": list(ALL_VERSIONS),
            "capabilities": self.handshake.merged_capabilities(modern=True),
            TTL: ttl,
            CACHE_SCOPE: scope,
            # Its instance, as initialize says it: a proxy that probes itself knows it is itself.
            "_meta": {SERVER_INFO: IDENTITY, INSTANCE_KEY: self.instance},
        }
        instructions = self.handshake.merged_instructions()
        if instructions:
            result["instructions"] = instructions
        return [ToClient(client.key, {"jsonrpc": "2.0", "id": message["id"], "result": result})]

    # --- log levels (rule 4) ----------------------------------------------------------

    def _want_log_level(self, level: str) -> list[Command]:
        """A modern request wants log lines at ``level``: legacy upstreams that log and were
        told a less verbose level (or none) are told this one."""
        out: list[Command] = []
        for name, link in self.links.items():
            if not link.ready or link.speaks is MODERN_ERA or "logging" not in link.capabilities:
                continue
            if link.log_level is None or RANK[level] < RANK.get(link.log_level, 0):
                link.log_level = level
                out += self.control.own_request(name, "logging/setLevel", {"level": level})
        return out

    def log_wanted(self, client: ClientState, related: Any, level: object) -> bool:
        """Whether a log line of the modern caller's request ``related`` reaches it."""
        pending = client.in_flight.get(related) if related is not None else None
        wanted = pending.meta.get(LOG_LEVEL) if pending is not None and pending.meta is not None else None
        return wanted in RANK and passes(level, wanted)

    # --- subscriptions/listen (rule 5) --------------------------------------------------

    def listen(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        if client.era is LEGACY_ERA:  # a legacy session has resources/subscribe and list_changed
            raise RemoteProtocolError(METHOD_NOT_FOUND, f"Method not found: {message['method']}")
        id = message["id"]
        params: Any = message.get("params")
        wanted = params.get("notifications") if type(params) is dict else None
        if type(wanted) is not dict:
            raise RemoteProtocolError(INVALID_PARAMS, "Invalid params: notifications must be an object")
        for flag, _kind in _LIST_FLAGS:  # a flag given as null means what its absence means
            if wanted.get(flag) is not None and type(wanted[flag]) is not bool:
                raise RemoteProtocolError(INVALID_PARAMS, f"Invalid params: notifications.{flag} must be a boolean")
        uris = wanted.get(_RESOURCE_SUBSCRIPTIONS)
        if uris is None:
            uris = []
        elif type(uris) is not list or not all(type(uri) is str for uri in uris):
            raise RemoteProtocolError(
                INVALID_PARAMS, f"Invalid params: notifications.{_RESOURCE_SUBSCRIPTIONS} must be a list of strings"
            )
        if self.listens.count(client.key) >= self.max_in_flight:  # each is held until it ends
            raise RemoteProtocolError(
                INVALID_REQUEST, f"Invalid request: too many open listens (limit {self.max_in_flight})"
            )
        if len(uris) > self.max_in_flight:
            raise RemoteProtocolError(
                INVALID_PARAMS, f"Invalid params: at most {self.max_in_flight} {_RESOURCE_SUBSCRIPTIONS}"
            )
        self._wait_for_stopped_servers(client, uris)
        capabilities = self.handshake.merged_capabilities()
        honoured: dict[str, Any] = {}
        methods = set()
        for flag, kind in _LIST_FLAGS:
            if wanted.get(flag) is True and CAPABILITY_OF[kind] in capabilities:
                honoured[flag] = True
                methods.add(LIST_CHANGED[kind])
        keys, agreed, out = self._listen_resources(client, uris)
        if agreed:
            honoured[_RESOURCE_SUBSCRIPTIONS] = agreed
        self.listens.open(Listen(client.key, id, frozenset(methods), keys, self.announcements.count))
        ack = {
            "jsonrpc": "2.0",
            "method": ACKNOWLEDGED,
            "params": {"_meta": {SUBSCRIPTION_ID: id}, "notifications": honoured},
        }
        return [ToClient(client.key, ack, id), *out]

    def _wait_for_stopped_servers(self, client: ClientState, uris: list[str]) -> None:
        """Raise ``ServerDown`` (the listen is held for the server and wakes it, as a
        ``resources/subscribe`` is) when a resource it names belongs to a server stopped on
        purpose (lazy, idle-stopped) or starting on demand: once the server is listed, the
        listen is handled again and subscribes as for a running server. Resources of a
        server out for another reason are not honoured (``_listen_resources``)."""
        for uri in uris:
            try:
                self.targets.resource_route(client, {"uri": uri})
            except RemoteProtocolError:
                continue
            except ServerDown as down:
                outage = self.targets.outages.get(down.server)
                if outage is not None and (outage.state in DORMANT or outage.woken is not None):
                    raise

    def _listen_resources(
        self, client: ClientState, uris: list[str]
    ) -> tuple[set[tuple[str, str]], list[str], list[Command]]:
        """The resources a listen may hold (keys, and the URIs agreed), each subscribed upstream
        when nobody held it: ``resources/subscribe`` to a legacy server; a modern one's own
        listen is opened again, once, with every resource it now follows."""
        out: list[Command] = []
        keys: set[tuple[str, str]] = set()
        agreed: list[str] = []
        relisten: set[str] = set()
        for uri in uris:
            try:
                server, original = self.targets.resource_route(client, {"uri": uri})
            except (RemoteProtocolError, ServerDown):
                continue  # not one it may see, or its server is out: not honoured
            name = self.forwarding.link_name(server, client.key)
            link = self.links.get(name)
            if link is None or not (link.capabilities.get("resources") or {}).get("subscribe"):
                continue
            key = (name, original)
            agreed.append(uri)
            if key in keys or self.subscriptions.has(key, client.key):
                keys.add(key)
                continue  # named twice, or another listen of this client holds it
            keys.add(key)
            if self.subscriptions.add(key, client.key):
                if link.speaks is MODERN_ERA:
                    relisten.add(name)
                else:
                    out += self.control.own_request(name, "resources/subscribe", {"uri": original})
        for name in sorted(relisten):
            out += self.control.own_request(name, "resources/subscribe", {})
        return keys, agreed, out

    def close_listen(self, session: int, id: Any) -> list[Command]:
        """A listen ended (its client cancelled it): its resources no other listen holds
        are unsubscribed, upstream too when nobody else wants them."""
        listen, keys = self.listens.close(session, id)
        out: list[Command] = []
        relisten: set[str] = set()
        for key in keys:
            link = self.links.get(key[0])
            if self.subscriptions.remove(key, session) and link is not None and link.ready:
                if link.speaks is MODERN_ERA:
                    relisten.add(key[0])
                else:
                    out += self.control.own_request(key[0], "resources/unsubscribe", {"uri": key[1]})
        for name in sorted(relisten):  # its listen follows the resources still wanted
            out += self.control.own_request(name, "resources/unsubscribe", {})
        return out

    def drop_listens(self, session: int, answer: bool) -> list[Command]:
        """A modern client left: its listens end (its subscriptions go with the client);
        ``answer``: it may still read, and each listen gets its graceful end."""
        listens = self.listens.drop_session(session) if self.listens else []
        return [_listen_ended(listen) for listen in listens] if answer else []

    def end_listens(self) -> list[Command]:
        """Shutting down: every listen gets its graceful end (a plain result)."""
        out: list[Command] = []
        for listen in self.listens.all():
            out += self.close_listen(listen.session, listen.id)
            out.append(_listen_ended(listen))
        return out

    def listen_updates(self, session: int, key: tuple[str, str], params: dict[str, Any]) -> list[Command]:
        """A resource update for a modern client: on each of its listens that holds it."""
        out: list[Command] = []
        for listen in self.listens.of_session(session):
            if key in listen.keys:
                meta = dict(params.get("_meta") or {}, **{SUBSCRIPTION_ID: listen.id})
                notice = {
                    "jsonrpc": "2.0",
                    "method": "notifications/resources/updated",
                    "params": dict(params, _meta=meta),
                }
                out.append(ToClient(session, notice, listen.id))
        return out


def _listen_ended(listen: Listen) -> ToClient:
    result = {RESULT_TYPE: COMPLETE, "_meta": {SUBSCRIPTION_ID: listen.id, SERVER_INFO: IDENTITY}}
    return ToClient(listen.session, {"jsonrpc": "2.0", "id": listen.id, "result": result})


def _refused_envelope(id: Any, method: str, meta: dict[str, Any]) -> dict[str, Any] | None:
    """The error for a modern request's ``_meta`` envelope (rule 2), or None when it is
    good: its revision, client capabilities, client info and log level."""
    version = meta[PROTOCOL_VERSION]
    if version not in MODERN:  # ``is_modern``, without a call
        return unsupported_version(id, version)
    if type(meta.get(CLIENT_CAPABILITIES)) is not dict:
        return _missing_meta(id, method, f"{CLIENT_CAPABILITIES} (an object)")
    info = meta.get(CLIENT_INFO)
    if info is not None and (type(info) is not dict or type(info.get("name")) is not str):
        text = f"Invalid params: _meta {CLIENT_INFO} must be an object with a string name"
        return error_response(id, INVALID_PARAMS, text)
    level = meta.get(LOG_LEVEL)
    if level is not None and level not in LEVELS:
        text = f"Invalid params: _meta {LOG_LEVEL} must be one of {', '.join(LEVELS)}"
        return error_response(id, INVALID_PARAMS, text)
    return None


def _missing_meta(id: Any, method: str, what: str) -> dict[str, Any]:
    return error_response(
        id, INVALID_PARAMS, f"Invalid params: a {MODERN[0]} request ({method}) must carry {what} in params._meta"
    )


def _connection_is_modern(id: Any, requested: object) -> dict[str, Any]:
    shown = requested if type(requested) is str else repr(requested)
    return error_response(
        id,
        UNSUPPORTED_PROTOCOL_VERSION,
        f"This connection is serving protocol revision {MODERN[0]}; initialize ({shown[:40]}) needs a new connection",
        {"supported": list(MODERN), "requested": echoed(requested)},
    )


def _from_itself(id: Any, instance: str) -> dict[str, Any]:
    """This aggregator's own request (its config lists its own address), refused before
    startup completes, which waits for it; ``data`` names the instance, as for initialize."""
    why = "Refused: this request comes from this aggregator itself (its config lists the aggregator's own address)"
    return error_response(id, INVALID_REQUEST, why, {INSTANCE_KEY: instance})
