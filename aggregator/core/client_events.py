"""What a client session says: its messages, answers and notifications, connect and disconnect. Sans-IO."""

from __future__ import annotations

import logging
from typing import Any

from aggregator.core.commands import Command, RequestEnded, StopUpstream, ToClient, ToServer
from aggregator.core.input_bridge import awaits_input, is_question
from aggregator.core.state import ClientState, Held, RouterState, ServerDown, cancelled, proxy_error, refusal_reason
from aggregator.jsonrpc.codec import decode_message
from aggregator.jsonrpc.errors import INVALID_REQUEST, METHOD_NOT_FOUND, RemoteProtocolError, error_response
from aggregator.jsonrpc.kinds import NOTIFICATION, REQUEST
from aggregator.mcp.constants import CANCELLED, INITIALIZE, INITIALIZED, PING, ROOTS_LIST_CHANGED
from aggregator.mcp.versions import DISCOVER, discover_refused

log = logging.getLogger(__name__)


class ClientEvents(RouterState):
    """A client session from connect to disconnect: each message checked, then handled."""

    def client_connected(
        self, key: int, profile: str = "default", *, modern: bool = False, principal: Any = None
    ) -> None:
        if profile not in self.catalogs:
            raise ValueError(f"no such profile: {profile!r}")
        self.clients[key] = ClientState(
            key, profile=profile, catalog=self.catalogs[profile], modern=modern, principal=principal
        )

    def client_disconnected(self, key: int, answer: bool = False) -> list[Command]:
        """A client went away: cancel its work upstream, answer what it was asked, tidy up.
        ``answer``: it stopped sending but may still read (end of input on stdio), so each
        request still in flight is also answered with an error, as at shutdown."""
        client = self.clients.pop(key, None)
        if client is None:
            return []
        self.views.pop(key)
        out: list[Command] = []
        for pending in list(client.in_flight.values()):
            self._end(pending)
            if self.links[pending.server].ready and type(pending.extra) is not Held and not awaits_input(pending):
                out.append(ToServer(pending.server, cancelled(pending.upstream_id, "client disconnected")))
            if answer:
                server = self.links[pending.server].server or pending.server
                message = f"Server {server!r} did not answer before the aggregator stopped"
                out.append(ToClient(key, proxy_error(pending.client_id, message, reason="unavailable", server=server)))
        out += self._drop_gathers(key, "client disconnected")
        for (session, proxy_id), reverse in list(self.reverse.items()):
            if session == key:
                self._end_reverse(session, proxy_id)
                if not is_question(reverse):  # a question of the proxy's own: no server waits for it
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
        if reverse is not None and is_question(reverse):
            return self._input_refused(reverse, exc.message, refusal_reason(exc))
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

    def _client_event(self, key: int, kind: int, message: dict[str, Any]) -> list[Command]:
        client = self.clients[key]
        if kind == REQUEST:
            method = message["method"]
            handler = self._requests.get(method)
            if handler is None:
                if method == DISCOVER:
                    return [ToClient(key, discover_refused(message["id"]))]
                return [ToClient(key, error_response(message["id"], METHOD_NOT_FOUND, f"Method not found: {method}"))]
            if not client.initialize_seen and method not in (INITIALIZE, PING):
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

    def _client_notification(self, client: ClientState, message: dict[str, Any]) -> list[Command]:
        method = message["method"]
        if method == INITIALIZED:
            was, client.initialized = client.initialized, client.initialize_seen
            return self._release_roots(client) if client.initialized and not was else []
        if method == CANCELLED:
            params: Any = message.get("params")
            request_id = params.get("requestId") if type(params) is dict else None
            if type(request_id) not in (int, str):
                return []
            pending = client.in_flight.get(request_id)
            if pending is None:  # a gather's, or unknown, finished or never ours: ignored, as the spec says
                out = self._drop_gathers(client.key, "cancelled by the client", request_id)
                return [*out, RequestEnded(client.key, request_id)] if out else []  # a gather's: its stream ends
            if awaits_input(pending):  # nothing in flight upstream: its questions are withdrawn
                return [*self._input_closed(pending, "the call was cancelled"), RequestEnded(client.key, request_id)]
            self._end(pending)
            ended = RequestEnded(client.key, request_id)  # it gets no answer: its stream ends
            if not self.links[pending.server].ready or type(pending.extra) is Held:
                return [ended]
            forwarded = dict(params, requestId=pending.upstream_id)
            return [ToServer(pending.server, {"jsonrpc": "2.0", "method": method, "params": forwarded}), ended]
        if method == ROOTS_LIST_CHANGED:
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
        if is_question(reverse):  # a question of the proxy's, for a modern server's call
            return self._input_answered(client, reverse, message)
        if not self.links[reverse.server].ready:
            return []
        message["id"] = reverse.upstream_id
        return [ToServer(reverse.server, message)]
