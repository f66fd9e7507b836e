"""What a client session says: its messages, answers and notifications, connect and disconnect. Sans-IO.

``ClientEvents`` owns no table: it is given the router's tables (clients, links, the
catalogs, tasks, ...) and the objects that own the rest, and checks each message before
handing it to its owner (a request to its handler in ``client_requests``, an answer to
the server-to-client request it answers). A client that leaves takes its per-session
connections with it, lost through the upstream events (``server_lost``); the requests
held for a shared server come back from the upstream events as ``Resend`` outcomes, and
are handled here again as their clients sent them (``resend``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.catalogs.discovery import CALL_TOOL, Search
from aggregator.core.catalogs.result_budget import ResultBudgets
from aggregator.core.catalogs.session_catalog import SessionViews
from aggregator.core.catalogs.targets import ServerDown
from aggregator.core.clients.handshake import Handshake
from aggregator.core.commands import Command, RequestEnded, StopUpstream, ToClient, ToServer
from aggregator.core.era.input_bridge import InputBridge, awaits_input, is_question
from aggregator.core.era.modern_callers import ModernCallers
from aggregator.core.events import ClientAdopted, ClientMessage
from aggregator.core.handlers.client_requests import ClientRequests, RequestHandler
from aggregator.core.handlers.reverse_requests import ReverseRequests
from aggregator.core.handlers.upstream_events import UpstreamEvents
from aggregator.core.lifecycle.upstream_era import MODERN_ERA, Era
from aggregator.core.notices.subscriptions import Listens, Subscriptions
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import UNSENT, Phase, UpstreamLink
from aggregator.core.replies import cancelled, proxy_error, refusal_reason
from aggregator.core.requests.request_table import RequestTable
from aggregator.core.reverse.reverse_table import ReverseTable
from aggregator.core.reverse.roots import Roots
from aggregator.core.upstreams.held_requests import HeldRequests, Resend
from aggregator.core.upstreams.upstream_control import UpstreamControl
from aggregator.jsonrpc.codec import decode_message
from aggregator.jsonrpc.errors import INVALID_REQUEST, RemoteProtocolError, error_response, unknown_method
from aggregator.jsonrpc.kinds import NOTIFICATION, REQUEST
from aggregator.mcp.constants import CANCELLED, INITIALIZE, INITIALIZED, PING, ROOTS_LIST_CHANGED
from aggregator.mcp.modern import PROTOCOL_VERSION
from aggregator.mcp.versions import DISCOVER

log = logging.getLogger(__name__)

# What a legacy client may ask before its initialize: initialize itself, ping, and
# server/discover (how a dual-era client finds out that the proxy is one too).
_BEFORE_INITIALIZE = frozenset((INITIALIZE, PING, DISCOVER))


class ClientEvents:
    """A client session from connect to disconnect: each message checked, then handled."""

    def __init__(
        self,
        *,
        clients: dict[int, ClientState],
        links: dict[str, UpstreamLink],
        per_session: set[str],
        catalogs: dict[str, Catalog],
        views: SessionViews,
        subscriptions: Subscriptions,
        listens: Listens,
        tasks: dict[str, int],
        max_json_depth: int,
        requests: RequestTable,
        client_requests: ClientRequests,
        search: Search,
        budgets: ResultBudgets,
        modern: ModernCallers,
        input_bridge: InputBridge,
        reverse: ReverseTable,
        reverse_requests: ReverseRequests,
        roots: Roots,
        control: UpstreamControl,
        held_requests: HeldRequests,
        upstreams: UpstreamEvents,
        handshake: Handshake,
    ) -> None:
        self.clients = clients
        self.links = links
        self.per_session = per_session  # servers with a connection per client
        self.catalogs = catalogs  # one per profile
        self.views = views  # of the sessions whose own per-session connections listed
        self.subscriptions = subscriptions
        self.listens = listens  # modern callers' open subscriptions/listen requests
        self.tasks = tasks  # exposed task id -> owning session
        self.max_json_depth = max_json_depth  # enforced where messages are decoded
        self.requests = requests
        self.client_requests = client_requests  # a request's handler, by method
        self.search = search
        self.budgets = budgets
        self.modern = modern
        self.input_bridge = input_bridge
        self.reverse = reverse
        self.reverse_requests = reverse_requests
        self.roots = roots
        self.control = control
        self.held_requests = held_requests
        self.upstreams = upstreams  # a leaving client's own connections are lost there
        self.handshake = handshake  # what an adopted session is taken as

    def client_connected(
        self,
        key: int,
        profile: str = "default",
        *,
        era: Era = Era.LEGACY,
        principal: Any = None,
        stateless: bool = False,
        shared_name: str | None = None,
    ) -> None:
        if profile not in self.catalogs:
            raise ValueError(f"no such profile: {profile!r}")
        self.clients[key] = ClientState(
            key,
            profile=profile,
            catalog=self.catalogs[profile],
            era=era,
            principal=principal,
            stateless=stateless,
            shared_name=shared_name,
        )

    def client_adopted(self, event: ClientAdopted) -> list[Command]:
        """A legacy session initialized elsewhere connected (``ClientAdopted``): a client
        as the handshake left it, nothing sent upstream (a per-session server of its own
        starts at its first request, as for any session). An unknown profile (the
        configurations of the replicas differ) raises ValueError, as for a new client."""
        self.client_connected(event.key, event.profile, principal=event.principal, shared_name=event.shared_name)
        self.handshake.adopt(self.clients[event.key], event.protocol_version, event.capabilities, event.client_info)
        return []

    def client_disconnected(self, key: int, answer: bool = False) -> list[Command]:
        """A client went away: cancel its work upstream, answer what it was asked, tidy up.
        ``answer``: it stopped sending but may still read (end of input on stdio), so each
        request still in flight is also answered with an error, as at shutdown."""
        client = self.clients.pop(key, None)
        if client is None:
            return []
        self.views.pop(key)
        self.budgets.forget(key)  # what its calls left for it alone (``core.catalogs.result_budget``)
        out: list[Command] = []
        for pending in list(client.in_flight.values()):
            self.requests.end(pending, "cancelled", "disconnected")
            if self.links[pending.server].ready and pending.phase is Phase.SENT:
                out.append(ToServer(pending.server, cancelled(pending.upstream_id, "client disconnected")))
            if answer:
                server = self.links[pending.server].server or pending.server
                message = f"Server {server!r} did not answer before the aggregator stopped"
                out.append(ToClient(key, proxy_error(pending.client_id, message, reason="unavailable", server=server)))
        out += self.control.drop_gathers(key, "client disconnected")
        out += self.modern.drop_listens(key, answer)  # a modern client's open listens
        if self.reverse.asked.get(key) or self.roots.held:
            out += self._withdraw_server_requests(key)
        out += self._release_session(key)
        if client.log_level is not None:
            out += self.control.apply_log_level()
        return out

    def client_idle(self, key: int) -> bool:
        """Whether the router holds nothing of a connected client but the client itself:
        no request in flight, no listen, subscription, question, task or elicitation of
        its own, no per-session view or connection. Such a client may stay connected
        between requests (a stateless HTTP client kept for its caller's next request,
        once its request was answered, so that no gather of it is left either): leaving
        would have changed nothing but its absence."""
        client = self.clients.get(key)
        return (
            client is not None
            and not client.in_flight
            and client.log_level is None
            and key not in self.listens.by_session
            and not self.reverse.asked.get(key)
            and not self.subscriptions.holds(key)
            and not self.reverse.elicitation_count.get(key)
            and key not in self.views
            and not (self.tasks and key in self.tasks.values())
            and not (self.per_session and any(link.session == key for link in self.links.values()))
        )

    def _withdraw_server_requests(self, key: int) -> list[Command]:
        """A client went away: the servers that asked it something hear it will not answer."""
        out: list[Command] = []
        for (session, proxy_id), reverse in list(self.reverse.requests.items()):
            if session == key:
                self.reverse.end(session, proxy_id)
                if not is_question(reverse):  # a question of the proxy's own: no server waits for it
                    message = f"The client that was asked for {reverse.method} disconnected"
                    error = proxy_error(reverse.upstream_id, message, reason="unavailable", server=reverse.server)
                    out.append(ToServer(reverse.server, error))
        for name, id, _deadline in self.roots.held_for(key):
            message = "The client whose roots this server sees disconnected before it could be asked"
            out.append(ToServer(name, proxy_error(id, message, reason="unavailable", server=name)))
        return out

    def _release_session(self, key: int) -> list[Command]:
        """A client went away: its subscriptions, its own connections, tasks and elicitations go."""
        out: list[Command] = []
        for name, uri in self.subscriptions.drop_session(key):
            link = self.links.get(name)
            if link is not None and link.session is None:  # its own connections just stop
                out += self.control.own_request(name, "resources/unsubscribe", {"uri": uri})
        if self.per_session:
            for name in [n for n, link in self.links.items() if link.session == key]:
                out += self.upstreams.server_lost(name, "its client disconnected")
                del self.links[name]
                out.append(StopUpstream(name))
        if self.tasks:
            for task_id in [t for t, owner in self.tasks.items() if owner == key]:
                del self.tasks[task_id]
        if self.reverse.elicitation_count.get(key):
            for eid in [e for e, owner in self.reverse.elicitations.items() if owner == key]:
                self.reverse.forget_elicitation(eid)
        return out

    def client_message(self, event: ClientMessage) -> list[Command]:
        """A client sent bytes: decoded (refused if they cannot be), then handled."""
        try:
            kind, message = decode_message(event.raw, self.max_json_depth)
        except RemoteProtocolError as exc:
            return self.client_refused(event.key, exc)
        return self.client_event(event.key, kind, message)

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
        reverse = self.reverse.end(key, answered) if type(answered) in (int, str) else None
        if reverse is not None and is_question(reverse):
            return self.input_bridge.refused(reverse, exc.message, refusal_reason(exc))
        if reverse is None or not self.links[reverse.server].ready:
            return []
        return [
            ToServer(
                reverse.server,
                proxy_error(
                    reverse.upstream_id,
                    f"The client's answer to {reverse.method} was refused ({exc.message})",
                    reason=refusal_reason(exc),
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

    def resend(self, out: Sequence[Command | Resend]) -> list[Command]:
        """What an upstream event returned, with each request it released (``Resend``: held
        for a shared server now listed) handled again in its place, as its client sent it,
        keeping its deadline (``core.upstreams.held_requests``)."""
        done: list[Command] = []
        for command in out:
            if isinstance(command, Resend):
                held = command.held
                assert held.session is not None and held.held is not None  # released: its client's request
                sent = self.client_event(held.session, REQUEST, held.held)
                done += self.held_requests.forwarding.sent_held(held.session, held.client_id, sent)
                self.held_requests.keep_deadline(held)
            else:
                done.append(command)
        return done

    def _client_event(self, key: int, kind: int, message: dict[str, Any]) -> list[Command]:
        client = self.clients[key]
        if kind == REQUEST:
            if message["method"] == "tools/call":
                params = message.get("params")
                if type(params) is dict and params.get("name") == CALL_TOOL:
                    self.search.unwrap_call_tool(key, message)  # search mode's call_tool: the call it names
            # The era of a request (``core.era.modern_callers``): a modern connection's are all
            # modern; a legacy session's, once initialized, all legacy (one attribute read
            # on the legacy hot path); before that, modern ``_meta`` decides.
            if client.era is MODERN_ERA or not client.initialize_seen:
                params = message.get("params")  # ``request_meta``, inline: every modern request
                meta = params.get("_meta") if type(params) is dict else None
                if type(meta) is not dict or PROTOCOL_VERSION not in meta:
                    meta = None
                if meta is not None or client.era is MODERN_ERA:
                    return self._modern_request(client, message, meta)
            method = message["method"]
            handler = self.client_requests.handlers.get(method)
            if handler is None:
                return [ToClient(key, unknown_method(message["id"], method))]
            if not client.initialize_seen and method not in _BEFORE_INITIALIZE:
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
            return self._handle(client, message, handler)
        if kind == NOTIFICATION:
            return self._client_notification(client, message)
        return self._client_answer(client, message)

    def _modern_request(
        self, client: ClientState, message: dict[str, Any], meta: dict[str, Any] | None
    ) -> list[Command]:
        """A modern caller's request: admitted (``core.era.modern_callers``), then handled as a
        legacy session's is (forwarding keeps its ``_meta``), its answers stamped."""
        out, admitted = self.modern.admit(client, message, meta, self.client_requests.startup_complete)
        if not admitted:
            return out
        answers = self._handle(client, message, self.client_requests.handlers[message["method"]])
        self.modern.stamp_answers(client, message, answers)
        return out + answers if out else answers

    def _handle(self, client: ClientState, message: dict[str, Any], handler: RequestHandler) -> list[Command]:
        """Run a request's handler: an id already in flight is refused; a user's mistake
        is answered with its error; a server that is out, with its state."""
        id = message["id"]
        if id in client.in_flight or (
            client.era is MODERN_ERA and client.key in self.listens.by_session and self.listens.get(client.key, id)
        ):
            return [
                ToClient(
                    client.key,
                    error_response(
                        id, INVALID_REQUEST, "Invalid request: this id is already in use by a request in flight"
                    ),
                )
            ]
        try:
            return handler(client, message)
        except RemoteProtocolError as exc:
            exc.id = id
            return [ToClient(client.key, exc.to_response())]
        except ServerDown as down:
            return self.held_requests.hold_or_answer(client, message, down.server)

    def _client_notification(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        method = message["method"]
        if client.era is MODERN_ERA and method != CANCELLED:
            return []  # the only notification of the modern revision's clients
        if method == INITIALIZED:
            was, client.initialized = client.initialized, client.initialize_seen
            return self.reverse_requests.release_roots(client) if client.initialized and not was else []
        if method == CANCELLED:
            params: Any = message.get("params")
            request_id = params.get("requestId") if type(params) is dict else None
            if type(request_id) not in (int, str):
                return []
            pending = client.in_flight.get(request_id)
            if pending is None:  # a gather's, a listen, or unknown, finished or never ours: ignored, as the spec says
                if client.era is MODERN_ERA and self.listens.get(client.key, request_id) is not None:
                    return [*self.modern.close_listen(client.key, request_id), RequestEnded(client.key, request_id)]
                out = self.control.drop_gathers(client.key, "cancelled by the client", request_id)
                return [*out, RequestEnded(client.key, request_id)] if out else []  # a gather's: its stream ends
            if awaits_input(pending):  # nothing in flight upstream: its questions are withdrawn
                return [
                    *self.input_bridge.closed(pending, "the call was cancelled"),
                    RequestEnded(client.key, request_id),
                ]
            self.requests.end(pending, "cancelled", "cancelled")
            ended = RequestEnded(client.key, request_id)  # it gets no answer: its stream ends
            if not self.links[pending.server].ready or pending.phase in UNSENT:
                return [ended]
            forwarded = dict(params, requestId=pending.upstream_id)
            return [ToServer(pending.server, {"jsonrpc": "2.0", "method": method, "params": forwarded}), ended]
        if method == ROOTS_LIST_CHANGED:
            # Only the servers that see this client's roots: a shared server sees the proxy's.
            return self.roots.changed(self.roots.followers(client))
        return []

    def _client_answer(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        """A response or error from a client: the answer to a server-to-client request."""
        id = message["id"]
        reverse = self.reverse.requests.get((client.key, id)) if type(id) in (int, str) else None
        if reverse is None:
            log.debug("client %d: dropping an answer to unknown request %r", client.key, id)
            return []
        self.reverse.end(client.key, id)
        if is_question(reverse):  # a question of the proxy's, for a modern server's call
            return self.input_bridge.answered(client, reverse, message)
        if not self.links[reverse.server].ready:
            return []
        message["id"] = reverse.upstream_id
        return [ToServer(reverse.server, message)]
