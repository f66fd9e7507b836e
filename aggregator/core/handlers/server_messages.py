"""What an upstream says: responses, notifications (a method table), requests. Sans-IO.

``ServerMessages`` owns the table of the notifications it routes; the rest it is given:
the links and clients, and the objects an upstream's message goes to (an answer to
``answers``, an ``input_required`` to the era's bridges, a request to
``reverse_requests``). An answer to one of the proxy's own requests, and a list that
changed, go to the upstream events (``own_answer``, ``relist``): what the link's
lifecycle then says is done there, and a server listed by it releases the requests held
for it, which the client events handle again (``ClientEvents.resend``). These are the
rare paths; an answer to a client's request never takes them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, cast

from aggregator.core.catalogs.uris import expose_uri
from aggregator.core.commands import Command, ToClient, ToServer
from aggregator.core.era.input_bridge import InputBridge, is_input_required
from aggregator.core.era.modern_callers import ModernCallers
from aggregator.core.era.modern_input import ModernInput
from aggregator.core.events import ServerMessage
from aggregator.core.handlers.answers import Answers
from aggregator.core.handlers.client_events import ClientEvents
from aggregator.core.handlers.reverse_requests import ReverseRequests
from aggregator.core.handlers.upstream_events import UpstreamEvents
from aggregator.core.lifecycle.own_requests import Waiting
from aggregator.core.lifecycle.upstream_era import MODERN_ERA
from aggregator.core.lifecycle.upstream_lifecycle import CONTROL_ID_PREFIX
from aggregator.core.notices.subscriptions import Subscriptions
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import UpstreamLink
from aggregator.core.records.log_levels import passes
from aggregator.core.replies import refusal_reason
from aggregator.core.requests.request_table import RequestTable
from aggregator.core.requests.tasks import expose_task_ids
from aggregator.core.reverse import affinity
from aggregator.core.reverse.reverse_table import ReverseTable
from aggregator.core.upstreams.upstream_control import OwnWaiter, UpstreamControl
from aggregator.jsonrpc.codec import decode_message
from aggregator.jsonrpc.errors import RemoteProtocolError, error_response
from aggregator.jsonrpc.kinds import ERROR, NOTIFICATION, REQUEST, RESPONSE
from aggregator.mcp.constants import LIST_CHANGED, PROMPTS, RESOURCES, TEMPLATES, TOOLS
from aggregator.mcp.modern import (
    ACKNOWLEDGED,
)

log = logging.getLogger(__name__)

# A server notification's handler: (its link, the message, its params, the upstream id of
# the request on whose stream it came, if known) -> commands.
NotificationHandler = Callable[[UpstreamLink, dict[str, Any], dict[str, Any], int | None], list[Command]]


class ServerMessages:
    """A response goes to the client of its request (invariants 1 and 3), a notification to
    its handler by method, a request to ``reverse_requests``."""

    def __init__(
        self,
        *,
        links: dict[str, UpstreamLink],
        clients: dict[int, ClientState],
        subscriptions: Subscriptions,
        tasks: dict[str, int],
        max_json_depth: int,
        requests: RequestTable,
        answers: Answers,
        input_bridge: InputBridge,
        modern_input: ModernInput,
        modern: ModernCallers,
        reverse: ReverseTable,
        reverse_requests: ReverseRequests,
        control: UpstreamControl,
        upstreams: UpstreamEvents,
        client_events: ClientEvents,
        clock: Callable[[], float],
    ) -> None:
        self.links = links
        self.clients = clients
        self.subscriptions = subscriptions
        self.tasks = tasks  # exposed task id -> owning session
        self.max_json_depth = max_json_depth  # enforced where messages are decoded
        self.requests = requests  # in flight, by upstream id and progress token
        self.answers = answers
        self.input_bridge = input_bridge
        self.modern_input = modern_input
        self.modern = modern
        self.reverse = reverse
        self.reverse_requests = reverse_requests
        self.control = control
        self.upstreams = upstreams  # the proxy's own answers, lists changed
        self.client_events = client_events  # the requests a server listed releases
        self.clock = clock
        self._notifications = self._notification_handlers()

    def server_message(self, server: str, raw: bytes, related: int | None = None) -> list[Command]:
        """A message from an upstream, as it came (a line of a stdio server's output);
        ``related``: the upstream id of the request on whose own stream it came."""
        try:
            return self._server_message(server, raw, related)
        except Exception:  # noqa: BLE001 - the last line of defence, logged in full
            log.exception("server %s: internal error handling a message from it", server)
            return []

    def server_message_event(self, event: ServerMessage) -> list[Command]:
        """``server_message`` for its event (what ``Router.handle`` calls: one call less on
        every server's message)."""
        try:
            return self._server_message(event.server, event.raw, event.related)
        except Exception:  # noqa: BLE001 - the last line of defence, logged in full
            log.exception("server %s: internal error handling a message from it", event.server)
            return []

    def server_decoded(
        self, server: str, decoded: tuple[int, dict[str, Any]] | RemoteProtocolError, related: int | None = None
    ) -> list[Command]:
        """A message from an upstream that its transport has read already (a network
        server's, decoded once as it came off the wire, under the same limits): ``decoded``
        is what ``decode_message`` returned for it, or the RemoteProtocolError it raised.
        Handled as ``server_message`` handles a line."""
        try:
            link = self.links.get(server)
            if link is None:
                return []  # a per-session connection whose client just left
            if isinstance(decoded, RemoteProtocolError):
                return self._server_refused(link, decoded, related)
            return self._server_decoded(link, decoded[0], decoded[1], related)
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
            return self._server_refused(link, exc, related)
        return self._server_decoded(link, kind, message, related)

    def _server_decoded(
        self, link: UpstreamLink, kind: int, message: dict[str, Any], related: int | None
    ) -> list[Command]:
        if kind == RESPONSE or kind == ERROR:
            id = message["id"]
            if related is not None and id != related:  # rare: a C-level compare decides the rest
                return self._stray_answer(link, message, related) + self._server_decoded(link, kind, message, None)
            pending = link.pending.get(id) if type(id) is int else None
            if pending is None:
                if type(id) is str and id.startswith(CONTROL_ID_PREFIX):
                    return self._own_answer(link, message)
                log.debug("server %s: dropping a response to unknown id %r", link.name, id)
                return []
            if kind == RESPONSE and link.speaks is MODERN_ERA and is_input_required(message.get("result")):
                if self.input_bridge.bridges(link, pending, message["result"]):
                    return self.input_bridge.bridge(link, pending, message["result"])  # asks a legacy caller
                failed = self.modern_input.pass_input(link, pending, message["result"])  # checked for a modern one
                if failed is not None:
                    return failed
            return self.answers.answered(link, pending, kind, message)
        if kind == NOTIFICATION:
            return self._server_notification(link, message, related)
        return self.reverse_requests.server_request(link, message, related)

    def _own_answer(self, link: UpstreamLink, message: dict[str, Any]) -> list[Command]:
        """An answer to one of the proxy's own requests: the upstream events settle it."""
        return self.client_events.resend(self.upstreams.own_answer(link, message))

    def _stray_answer(self, link: UpstreamLink, message: dict[str, Any], related: int) -> list[Command]:
        """An answer to another id on a request's own stream (an HTTP POST's body or event
        stream answers that request alone): the request whose stream it is fails at once, as
        no answer of its own will come there; the stray answer goes where its id says."""
        pending = link.pending.get(related)
        if pending is None:
            return []
        said = "server %s: refused its answer to %s: it answered another request (id %r) on that request's stream"
        log.warning(said, link.name, pending.method, message["id"])
        text = (
            f"Server {link.name!r} sent an answer to {pending.method} that the aggregator cannot forward"
            f" (it answered another request, id {message['id']!r})"
        )
        return self.requests.fail(pending, text, "malformed")

    def _server_refused(self, link: UpstreamLink, exc: RemoteProtocolError, related: int | None) -> list[Command]:
        """A server's message could not be accepted (too deep, unreadable, malformed). An
        answer whose id is readable fails the request it answers, at once and with the
        reason; so does anything but an answerable request on a request's own stream
        (``related``: two JSON texts in one body). Requests get the error; all is logged."""
        server, answerable = link.name, exc.kind == REQUEST and exc.id is not None and exc.answer
        id = exc.response_to if exc.response_to is not None or answerable else related
        if id is not None:
            pending = link.pending.get(id) if type(id) is int else None
            own = link.own.peek(id)
            log.warning(
                "server %s: refused its answer to %s: %s",
                server,
                pending.method if pending is not None else _own_method(own) or f"id {id!r}",
                exc.message,
            )
            if pending is None:
                if type(id) is str and id.startswith(CONTROL_ID_PREFIX):
                    return self._own_answer(link, error_response(id, exc.code, exc.message))
                return []
            text = f"Server {server!r} sent an answer to {pending.method} that the aggregator cannot forward"
            return self.requests.fail(pending, f"{text} ({exc.message})", refusal_reason(exc))
        log.warning("server %s: dropping an unreadable message: %s", server, exc.message)
        if exc.id is not None and exc.answer:
            return [ToServer(server, exc.to_response())]
        return []

    def _notification_handlers(self) -> dict[str, NotificationHandler]:
        """The handler of each server notification the proxy routes; others are dropped."""
        return {
            "notifications/progress": self._progress,
            "notifications/message": self._log_line,
            "notifications/resources/updated": self._resource_updated,
            LIST_CHANGED[TOOLS]: self._list_changed,
            LIST_CHANGED[PROMPTS]: self._list_changed,
            LIST_CHANGED[RESOURCES]: self._list_changed,
            "notifications/cancelled": self._server_cancelled,
            "notifications/elicitation/complete": self._elicitation_complete,
            "notifications/tasks/status": self._task_status,
            ACKNOWLEDGED: self.control.listen_acknowledged,
        }

    def _server_notification(self, link: UpstreamLink, message: dict[str, Any], related: int | None) -> list[Command]:
        handler = self._notifications.get(message["method"])
        if handler is None:
            log.debug("server %s: notification %s not routed", link.name, message["method"])
            return []
        params = message.get("params")
        return handler(link, message, params if type(params) is dict else {}, related)

    def _progress(
        self, link: UpstreamLink, message: dict[str, Any], params: dict[str, Any], related: int | None
    ) -> list[Command]:
        """Progress of a forwarded request: to its client under its own token; it may extend
        the request's timeout."""
        token = params.get("progressToken")
        pending = self.requests.progress.get(token) if type(token) is str else None
        if pending is None or pending.server != link.name or pending.session not in self.clients:
            return []  # not in flight (any more), or not this server's to report on
        if link.timeout_resets_on_progress and pending.deadline < pending.hard_deadline:
            pending.deadline = min(self.clock() + link.request_timeout, pending.hard_deadline)
            self.requests.deadlines.move(pending.deadline, pending)
        forwarded = dict(params, progressToken=pending.client_token)
        notice = {"jsonrpc": "2.0", "method": message["method"], "params": forwarded}
        return [ToClient(pending.session, notice, pending.client_id)]

    def _resource_updated(
        self, link: UpstreamLink, message: dict[str, Any], params: dict[str, Any], related: int | None
    ) -> list[Command]:
        """A subscribed resource changed: to its subscribers, under its exposed URI."""
        uri = params.get("uri")
        subscribers = self.subscriptions.subscribers((link.name, uri)) if type(uri) is str else ()
        if not subscribers:
            return []
        params = dict(params, uri=expose_uri(link.uri_prefix, uri))
        notice = {"jsonrpc": "2.0", "method": message["method"], "params": params}
        out: list[Command] = []
        for session in subscribers:
            client = self.clients.get(session)
            if client is None:
                continue
            if client.era is MODERN_ERA:  # on its listens, tagged
                out += self.modern.listen_updates(session, (link.name, str(uri)), params)
            else:
                out.append(ToClient(session, notice))
        return out

    def _list_changed(
        self, link: UpstreamLink, message: dict[str, Any], params: dict[str, Any], related: int | None
    ) -> list[Command]:
        """A list changed upstream: re-list it (clients hear of it if the catalog changes)."""
        return self.client_events.resend(self.upstreams.relist(link, _KINDS_CHANGED[message["method"]]))

    def _server_cancelled(
        self, link: UpstreamLink, message: dict[str, Any], params: dict[str, Any], related: int | None
    ) -> list[Command]:
        """The server gave up on one of its own requests to a client."""
        request_id = params.get("requestId")
        entry = self.reverse.ids.get((link.name, request_id)) if type(request_id) in (int, str) else None
        if entry is None:
            return []
        self.reverse.end(*entry)
        forwarded = dict(params, requestId=entry[1])
        return [ToClient(entry[0], {"jsonrpc": "2.0", "method": message["method"], "params": forwarded})]

    def _elicitation_complete(
        self, link: UpstreamLink, message: dict[str, Any], params: dict[str, Any], related: int | None
    ) -> list[Command]:
        """A URL-mode elicitation completed: to the client it was for."""
        eid = params.get("elicitationId")
        session = self.reverse.forget_elicitation((link.name, eid)) if type(eid) is str else None
        if session is None or session not in self.clients:
            return []
        return [ToClient(session, message)]

    def _task_status(
        self, link: UpstreamLink, message: dict[str, Any], params: dict[str, Any], related: int | None
    ) -> list[Command]:
        """A task's status: to the session that owns the task, under its exposed id."""
        forwarded = dict(params)
        expose_task_ids(link.name, forwarded)
        task_id = forwarded.get("taskId")
        owner = self.tasks.get(task_id) if type(task_id) is str else None
        if owner is None or owner not in self.clients:
            return []
        return [ToClient(owner, {"jsonrpc": "2.0", "method": message["method"], "params": forwarded})]

    def _log_line(
        self, link: UpstreamLink, message: dict[str, Any], params: dict[str, Any], related: int | None
    ) -> list[Command]:
        """A server's log line: to the client of the request it belongs to, else to the
        sessions that asked for logs (``core.reverse.affinity``); each at its own level."""
        server = link.name
        owner = affinity.log_owner(**self.reverse_requests.owner_facts(link, params, related, requests=False))
        if owner.session is not None:
            recipients = [self.clients[cast(int, owner.session)]]  # a log line's owner is a session
        elif owner.signal == affinity.NO_REQUEST:
            recipients = [c for c in self.clients.values() if c.log_level is not None]
        else:
            log.debug("server %s: a log line went to no client (%s)", server, owner.signal)
            return []
        level = params.get("level")
        recipients = [
            c
            for c in recipients
            if (self.modern.log_wanted(c, owner.related, level) if c.era is MODERN_ERA else passes(level, c.log_level))
        ]
        if not recipients:
            return []
        forwarded = dict(params)
        logger = params.get("logger")
        forwarded["logger"] = f"{link.server}/{logger}" if type(logger) is str and logger else link.server
        if type(params.get("_meta")) is dict:
            forwarded["_meta"] = meta = dict(params["_meta"])
            expose_task_ids(server, {"_meta": meta})
            token = meta.get("progressToken")
            if type(token) is str and token in self.requests.progress:
                # The proxy's token names one client's request: only that client gets its
                # own token back; to anyone else it is dropped (it would tell them another's).
                pending = self.requests.progress[token]
                if pending.server == server and [c.key for c in recipients] == [pending.session]:
                    meta["progressToken"] = pending.client_token
                else:
                    del meta["progressToken"]
        notice = {"jsonrpc": "2.0", "method": message["method"], "params": forwarded}
        return [ToClient(c.key, notice, owner.related) for c in recipients]

    def server_oversized(self, server: str, head: bytes, limit: int) -> list[Command]:
        """A message from the server was over the size limit and was dropped unread.

        If its first bytes name a pending request's id, that request fails now with
        reason ``too_large`` instead of waiting for an answer that will never come.
        """
        match = _HEAD_ID.search(head)
        if match is None:
            return []
        link = self.links[server]
        if match.group(2) is not None:  # the proxy's own: a gather's fails; a lifecycle's waits
            own = link.own.peek(match.group(2).decode())
            if own is None or type(own.waiter) is not OwnWaiter:
                return []
            link.own.settle(own.waiter.id)
            return self.control.gather_step(link, own.waiter, None)
        pending = link.pending.get(int(match.group(1)))
        if pending is None:
            return []
        return self.requests.fail(pending, f"Server {server!r} answered with more than {limit} bytes", "too_large")


# ids are integers (the proxy's own: "aggregator-N"); a response carries no "method", and
# "id" precedes "result" in what servers write (when it does not, the request simply waits
# for its timeout).
_HEAD_ID = re.compile(
    rb'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(?:(\d{1,18})|"(aggregator-\d{1,18})")\s*,'
)


def _own_method(own: Waiting[Any] | None) -> str | None:
    """The method of one of the router's own requests (a lifecycle's is named by its id)."""
    return own.method if own is not None and type(own.waiter) is OwnWaiter else None


# The kinds to re-list for each list_changed notification (templates come with resources).
_KINDS_CHANGED = {
    LIST_CHANGED[TOOLS]: (TOOLS,),
    LIST_CHANGED[PROMPTS]: (PROMPTS,),
    LIST_CHANGED[RESOURCES]: (RESOURCES, TEMPLATES),
}
