"""The Streamable HTTP exchange: one POST, one JSON-RPC message.

A notification or response gets 202. A request gets ``application/json`` when its answer
is the first thing to send, and switches to ``text/event-stream`` when progress or a
server-to-client request for it comes first. ``initialize`` (without Mcp-Session-Id)
starts a session, once the admission path has chosen its profile and the session cap
admits it; every other message names its session. A request whose handling fails is
cancelled upstream; a client that leaves before its answer may resume the stream
(``streams``). A POST whose Accept header does not list both types an answer may
come as (``unaccepted``) is 406, whatever it carries.

``PostExchange`` owns no state of its own: it opens sessions in the ``SessionTable``,
hands a modern request to ``StatelessRequests`` and a lost stream to ``EventStreams``
(its grace period), all passed in.

Imports of the HTTP front: ``answers``, ``modern``, ``queue``, ``relay``, ``sessions``,
``shared_sessions`` and ``streams``.
"""

from __future__ import annotations

import logging
from typing import Any

from aggregator.cluster.sealing import shared_name
from aggregator.config import HttpConfig
from aggregator.fronts.access import AccessPolicy, Denial, bearer_token, choose_profile
from aggregator.fronts.http.answers import refuse_session, reject
from aggregator.fronts.http.modern import StatelessRequests, is_modern_notification, is_modern_post
from aggregator.fronts.http.queue import JSON, MessageQueue, QuickWaits, until_client_leaves
from aggregator.fronts.http.relay import Relay
from aggregator.fronts.http.sessions import HttpSession, SessionTable
from aggregator.fronts.http.shared_sessions import SharedSessions
from aggregator.fronts.http.streams import EventStreams
from aggregator.fronts.port import ClientPort
from aggregator.hub.caps import Admission
from aggregator.jsonrpc.errors import INVALID_REQUEST
from aggregator.jsonrpc.kinds import NOTIFICATION, REQUEST
from aggregator.mcp.constants import INITIALIZE
from aggregator.mcp.modern import request_meta
from aggregator.transports.http_server import HttpConnection, Request

log = logging.getLogger(__name__)

# What the answer to a POST may come as, so what its Accept header must list (every revision).
ANSWER_TYPES = ("application/json", "text/event-stream")


class PostExchange:
    """POST on the MCP endpoint: ``initialize`` opens a session, a modern request is served
    statelessly (``modern``), anything else goes to a session."""

    def __init__(
        self,
        hub: ClientPort,
        config: HttpConfig,
        *,
        access: AccessPolicy,
        admission: Admission,
        sessions: SessionTable,
        streams: EventStreams,
        stateless: StatelessRequests,
        quick: QuickWaits,
    ) -> None:
        self.hub = hub
        self.config = config
        self.access = access
        self.admission = admission
        self.sessions = sessions
        self.streams = streams
        self.stateless = stateless
        self.quick = quick
        self.shared: SharedSessions | None = None  # [cluster] store: sessions' state there
        self.relay: Relay | None = None  # [cluster]: what belongs to another replica goes there

    async def post(self, connection: HttpConnection, request: Request) -> None:
        content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if content_type != "application/json":
            await reject(connection, 415, INVALID_REQUEST, "Unsupported media type: send application/json")
            return
        missing = unaccepted(request.headers.get("accept"))
        if missing:
            await reject(
                connection,
                406,
                INVALID_REQUEST,
                "Not acceptable: the Accept header must list both application/json and text/event-stream"
                f" (missing: {' and '.join(missing)})",
            )
            return
        decoded = await self.sessions.decode(connection, request)
        if decoded is None:
            return
        kind, message = decoded
        if self.hub.tracing is not None and kind == REQUEST:
            self.hub.tracing.adopt_headers(message, request.headers)
        if kind == REQUEST and "mcp-session-id" not in request.headers:
            # Modern _meta (or a revision header no legacy session has) makes it a modern
            # request, initialize too (a method that revision removed: 404).
            meta = request_meta(message)
            if is_modern_post(request, kind, message, meta):
                if self.relay is None or not await self.relay.forwarded(connection, request, message):
                    await self.stateless.serve(connection, request, message, meta)
                return
        if kind == REQUEST and message["method"] == INITIALIZE:
            await self._initialize(connection, request, message)
            return
        session, status, reason, headers = await self.sessions.find(request)
        if session is None:
            if kind == NOTIFICATION and is_modern_notification(request):
                await connection.respond(202, [])  # accepted, and dropped: it has nothing to act on
                return
            id = message.get("id") if kind == REQUEST else None
            await reject(connection, status, INVALID_REQUEST, reason, id, headers)
            return
        # The same user's token, refreshed: what a token exchange trades from now on.
        self.hub.caller_token(session.key, self.access.access_token(request.headers))
        if kind != REQUEST:
            if self.relay is None or not await self.relay.handled_elsewhere(session, kind, message):
                await self.hub.client_decoded(session.key, kind, message)
            await connection.respond(202, [])
            return
        await self._exchange(connection, session, message)

    async def _initialize(self, connection: HttpConnection, request: Request, message: dict[str, Any]) -> None:
        if "mcp-session-id" in request.headers:
            await reject(
                connection,
                400,
                INVALID_REQUEST,
                "Bad request: initialize starts a session; send it without Mcp-Session-Id",
                message["id"],
            )
            return
        named = self.access.named_profile(request.path) or ""
        admitted = choose_profile(self.access, request.headers, named)
        if isinstance(admitted, Denial):
            path = request.path.partition("?")[0][:100]
            log.log(admitted.level, "http: refused initialize on %s: %s", path, admitted.reason)
            await reject(connection, admitted.status, INVALID_REQUEST, admitted.reason, message["id"], admitted.headers)
            return
        principal, profile = admitted
        # Movable: while draining with shared keys a new session is served (a balancer sent it
        # on a connection already open, and its id is adopted anywhere; ``hub.drain``).
        refusal = self.admission.admit_session(movable=True)
        if refusal is not None:
            await refuse_session(connection, refusal, message["id"])
            return
        # Admitted: from here the session exists, and ending it releases its place.
        session = HttpSession(self.sessions, self.sessions.new_id(principal, profile, message), principal)
        session.profile = profile
        session.named = named
        session.token_seen = bearer_token(request.headers)
        session.key = self.hub.client_connected(
            session,
            profile,
            principal=principal,
            access_token=self.access.access_token(request.headers),
            shared_name=shared_name(session.id),
        )
        self.sessions.add(session)
        log.info("http session %d: opened", session.key)
        ok = False
        try:
            ok = await self._exchange(connection, session, message, [("mcp-session-id", session.id)])
        finally:
            if not ok:
                self.sessions.end(session)

    async def _exchange(
        self,
        connection: HttpConnection,
        session: HttpSession,
        message: dict[str, Any],
        headers: list[tuple[str, str]] | None = None,
    ) -> bool:
        """Feed one request to the router and send what belongs to it; True if answered OK."""
        id = message["id"]
        if id in session.requests:
            await reject(
                connection,
                400,
                INVALID_REQUEST,
                "Invalid request: this id is already in use by a request in flight",
                id,
            )
            return False
        queue = session.new_queue()
        queue.request_id = id
        session.requests[id] = queue
        try:
            return await self._answer(connection, session, queue, message, headers or [])
        except Exception:
            # This request's handling failed: it will not be answered here, so it must
            # not go on upstream either. The connection's boundary logs and answers.
            session.streams.pop(queue.stream_id, None)
            self.streams.abandon(session, id, queue, "the aggregator failed while handling it")
            raise

    async def _answer(
        self,
        connection: HttpConnection,
        session: HttpSession,
        queue: MessageQueue,
        message: dict[str, Any],
        headers: list[tuple[str, str]],
    ) -> bool:
        id = message["id"]
        await self.hub.client_decoded(session.key, REQUEST, message)
        if session.share is not None and self.shared is not None:
            await self.shared.client_changed(session, message)  # its log level or subscriptions, in the store
        # Most answers come back within milliseconds and alone: send them as JSON without
        # starting a task to watch the connection. Only a slower or chattier request gets
        # the watcher (to notice a client that leaves) and, if need be, an event stream.
        await self.quick.wait(queue)
        if queue.final and queue.waiting == 1 and not queue.unanswered:
            answered = await queue.respond(connection, [JSON, *headers])
            return answered and self.hub.session_info(session.key) is not None
        resumes = queue.resumes
        answered, streaming = await self._send_answer(connection, session, queue, headers)
        if queue.resumes != resumes:  # a GET with Last-Event-ID took the stream over
            connection.closed = True
            return False
        if queue.overflowed:  # the session was dropped: it did not read what it was sent
            if not streaming:
                await reject(
                    connection,
                    404,
                    INVALID_REQUEST,
                    "Session ended: more was waiting for it than the aggregator holds for one client; initialize again",
                    id,
                )
            else:
                connection.closed = True
            return False
        if answered or queue.final and not queue.waiting:
            session.streams.pop(queue.stream_id, None)
        elif session.requests.get(id) is queue or queue.waiting or queue.cancelled:
            # The client went away before its answer. It may resume the stream (GET with
            # Last-Event-ID); if it does not within the grace period, cancel the request
            # (one its client cancelled is only forgotten).
            connection.closed = True
            self.streams.start_grace(session, id, queue)
        return answered and self.hub.session_info(session.key) is not None

    async def _send_answer(
        self, connection: HttpConnection, session: HttpSession, queue: MessageQueue, headers: list[tuple[str, str]]
    ) -> tuple[bool, bool]:
        """Send a request's answer as JSON if it comes alone, else as an event stream; whether
        it was answered, and whether an event stream was started."""
        answered = False
        streaming = False
        async with queue.writing(), until_client_leaves(connection):
            while True:
                await queue.wait()
                if queue.overflowed:
                    break
                if not streaming and queue.final and not queue.unanswered and queue.waiting == 1:
                    answered = await queue.respond(connection, [JSON, *headers])
                    break
                if not streaming and queue.unanswered and not queue.waiting:
                    # Cancelled by its client before anything was sent: an event stream
                    # that ends at once, with no answer (a cancelled request gets none).
                    if await connection.start_stream(headers):
                        await connection.end_stream()
                    break
                if not streaming:
                    streaming = True
                    if not await self._start_event_stream(connection, session, queue, headers):
                        break
                # Everything that waits goes in one write: a client that reads promptly
                # keeps up with any burst.
                last = queue.final
                if not await queue.send_events(connection):
                    break
                if last:
                    answered = await connection.end_stream()
                    break
        return answered, streaming

    async def _start_event_stream(
        self, connection: HttpConnection, session: HttpSession, queue: MessageQueue, headers: list[tuple[str, str]]
    ) -> bool:
        session.open_stream(queue)
        if not await connection.start_stream(headers):
            return False
        if self.streams.primes(session):
            # An id before anything else: a client that loses the stream at once can still
            # resume it (2025-11-25), and the delay to resume after: half the grace period
            # it has to, at most a second.
            retry = min(1000, int(self.config.stream_drop_grace * 500))
            return await connection.send_chunk(b"id: %s-0\nretry: %d\ndata: \n\n" % (queue.event_prefix, retry))
        return True


def unaccepted(accept: str | None) -> list[str]:
    """The types of ``ANSWER_TYPES`` an Accept header does not list, none if it lists both.
    ``*/*`` covers both, ``application/*`` and ``text/*`` one each, as in the official SDKs'
    servers; no header lists nothing. Parameters (``q``) are not read, as there."""
    if accept is None:
        return list(ANSWER_TYPES)
    listed = {part.split(";", 1)[0].strip().lower() for part in accept.split(",")}
    if "*/*" in listed:
        return []
    return [kind for kind in ANSWER_TYPES if kind not in listed and kind.split("/")[0] + "/*" not in listed]
