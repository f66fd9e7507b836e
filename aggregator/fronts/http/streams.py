"""The event streams of the Streamable HTTP front: the GET stream, event ids, resumption.

GET opens a session's stream for everything not tied to a request (list changes,
subscription updates, log messages); what came while none was open waits in the
session's backlog. Every event stream has an id in its session, and its events are
``<stream>-<message number>``: a client that lost a stream (its GET stream or a request's
answer) resumes it with GET and Last-Event-ID, which replays what followed that event; a
GET resuming the session's GET stream while its old connection still looks open (the
client lost it first) takes the stream over and that connection ends; so does a GET
resuming a request's stream that its POST or an earlier resumption still writes (one
writer per stream, the newest). A
request's stream not resumed within ``http.stream_drop_grace`` is cancelled upstream. A
Last-Event-ID that is not two ASCII numbers is a 400, never an exception.

``EventStreams`` owns the handling of GET (the sessions it finds in the ``SessionTable``
passed in) and the grace periods of lost request streams, which run in the endpoint's nursery
(``grace_nursery``); the POST exchange starts them and abandons requests through it.

Under ``[cluster]`` keys event ids name the replica and the request too: a resumption of
another replica's request stream gets that request's retryable error (-32603,
``data.retryable``), never silence; one of another replica's GET stream opens it here.

With a shared store (``shared_sessions``) the GET stream is written from the session's
events there, with event ids ``@<ms>-<seq>`` that any replica resumes.

Imports of the HTTP front: ``answers``, ``queue``, ``relay``, ``sessions`` and ``shared_sessions``.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import trio

from aggregator.config import HttpConfig
from aggregator.errors import StoreError
from aggregator.fronts.access import TokenHold
from aggregator.fronts.containment import contained
from aggregator.fronts.http.answers import reject
from aggregator.fronts.http.queue import MessageQueue, pump, until_client_leaves
from aggregator.fronts.http.relay import replica_channel
from aggregator.fronts.http.sessions import BACKLOG_BYTES, HttpSession, SessionTable, request_of
from aggregator.fronts.http.shared_sessions import STORE_EVENT, SharedSessions, sent_by_now
from aggregator.fronts.port import ClientPort
from aggregator.jsonrpc.codec import dumps
from aggregator.jsonrpc.errors import INTERNAL_ERROR, INVALID_REQUEST
from aggregator.transports.http_server import HttpConnection, Request, sse_event

log = logging.getLogger(__name__)

PRIMING_SINCE = "2025-11-25"  # event streams open with an id-only event from this revision
# An SSE event id as this endpoint writes them: "<stream>-<seq>", ASCII digits only (a
# Unicode digit such as "\xb2" passes str.isdigit() and fails int()); under [cluster] keys
# "<replica>.<stream>.<request id token>-<seq>" (``sessions.event_prefix``).
EVENT_ID = re.compile(r"(?:([A-Za-z0-9_-]{1,64})\.)?([0-9]{1,15})(?:\.([A-Za-z0-9_-]{0,200}))?-([0-9]{1,15})")


class EventStreams:
    """GET: a session's stream, or a request's stream resumed; the grace period of a lost one."""

    def __init__(self, hub: ClientPort, config: HttpConfig, sessions: SessionTable) -> None:
        self.hub = hub
        self.config = config
        self.sessions = sessions
        # Where grace periods run: the endpoint's nursery, set when it serves, so that they
        # outlive every connection that starts one.
        self.grace_nursery: trio.Nursery | None = None
        # [cluster] store: GET streams written from the session's events there.
        self.shared: SharedSessions | None = None

    async def get(self, connection: HttpConnection, request: Request) -> None:
        """GET with Mcp-Session-Id: open the session's stream, or resume one it lost."""
        accept = request.headers.get("accept", "").lower()
        if "text/event-stream" not in accept and "*/*" not in accept:
            await reject(connection, 406, INVALID_REQUEST, "Not acceptable: GET opens a text/event-stream")
            return
        session, status, reason, headers = await self.sessions.find(request)
        if session is None:
            await reject(connection, status, INVALID_REQUEST, reason, headers=headers)
            return
        last_event_id = request.headers.get("last-event-id")
        resume = None
        stored = STORE_EVENT.fullmatch(last_event_id.strip()) if last_event_id is not None else None
        if stored is not None and session.share is not None:  # an event of the store's (``shared_sessions``)
            if not sent_by_now(stored[1]):
                await reject(
                    connection,
                    400,
                    INVALID_REQUEST,
                    "Bad request: Last-Event-ID names an event not sent yet; give the id of one this server sent, "
                    "like @1764900000000-0, or none",
                )
                return
            if session.get_stream is not None:
                await self._take_over(session)  # the client lost it before this end noticed
            if session.closed:
                await reject(connection, 404, INVALID_REQUEST, "Session not found: it ended; initialize again")
                return
            hold = TokenHold(self.sessions.access, request.headers, f"http session {session.key}")
            queue = session.new_queue()
            session.open_stream(queue)
            await self._serve_get_stream(connection, session, queue, None, hold, stored[1])
            return
        if last_event_id is not None:
            position = EVENT_ID.fullmatch(last_event_id.strip())
            if position is None:
                await reject(
                    connection,
                    400,
                    INVALID_REQUEST,
                    "Bad request: Last-Event-ID must be the id of an event this server sent, like "
                    + ("@1764900000000-0" if session.share is not None else "3-17"),
                )
                return
            owner = position[1]
            if owner is not None and owner != self.sessions.replica:
                await self._resume_elsewhere(connection, request, session, owner, position[3] or "")
                return
            resume = self._resumable(session, int(position[2]), int(position[4]))
        if resume is not None and resume[0].request_id is not None:
            await self._resume_request_stream(connection, session, *resume)
            return
        if session.get_stream is not None and resume is not None and resume[0] is session.get_stream:
            await self._take_over(session)  # the client lost it before this end noticed
        if session.get_stream is not None:
            await reject(connection, 409, INVALID_REQUEST, "Conflict: this session already has a GET stream")
            return
        if session.closed:
            await reject(connection, 404, INVALID_REQUEST, "Session not found: it ended; initialize again")
            return
        hold = TokenHold(self.sessions.access, request.headers, f"http session {session.key}")
        if resume is not None:  # the session's own GET stream, back after a drop
            await self._serve_get_stream(connection, session, *resume, hold)
            return
        queue = session.new_queue()
        session.open_stream(queue)
        await self._serve_get_stream(connection, session, queue, None, hold)

    async def _serve_get_stream(
        self,
        connection: HttpConnection,
        session: HttpSession,
        queue: MessageQueue,
        after: int | None,
        hold: TokenHold,
        stored: str | None = None,
    ) -> None:
        """Write the session's GET stream on this connection (first the replay of what
        followed event ``after``, when resumed) until either side ends it, another GET
        takes it over, or the access token it was opened with ends (``hold``: its ``exp``
        passes, or it is revoked): then the stream ends, the session stays, and the client
        opens it again with its new token (resuming after the last event it had)."""
        for data in session.backlog.take_all():
            queue.push(data)
        session.get_stream = queue
        session.get_handler = handler = trio.CancelScope()
        session.get_ended = ended = trio.Event()
        self.hub.write_now()  # if that passed the budget of all clients, whoever was dropped ends now
        try:
            with handler:
                if session.share is not None and self.shared is not None:  # its events are in the store
                    async with hold.watching(session.share.poke):
                        await self.shared.serve(
                            connection,
                            session,
                            stored,
                            stored is None and self.primes(session),
                            lambda: session.closed or hold.ended is not None,
                        )
                    if hold.ended is not None:
                        log.info("http session %d: its GET stream ended: %s", session.key, hold.ended)
                    return
                if not await connection.start_stream([]):
                    return
                if after is not None:
                    if not await connection.send_chunk(queue.replay_after(after)):
                        return
                elif self.primes(session):
                    if not await connection.send_chunk(b"id: %s-0\ndata: \n\n" % queue.event_prefix):
                        return
                async with hold.watching(queue.wake):
                    await pump(connection, queue, lambda: session.closed or hold.ended is not None)
                if session.closed:
                    await connection.end_stream()
                elif hold.ended is not None:
                    log.info("http session %d: its GET stream ended: %s", session.key, hold.ended)
                    await connection.end_stream()
            if handler.cancelled_caught:
                log.info("http session %d: its GET stream was resumed on another connection", session.key)
        finally:
            if session.get_stream is queue:
                session.get_stream = None
                for data in queue.remove_waiting():
                    session.backlog.append(data)
                session.backlog.drop_oldest(BACKLOG_BYTES)
            connection.closed = True
            ended.set()

    async def _take_over(self, session: HttpSession) -> None:
        """End the connection of the session's GET stream, which a GET with Last-Event-ID
        resumes: its client lost it, though this end has not noticed yet. What it had not
        written goes back to the backlog; what it had is in the stream's history, which the
        new connection replays from the Last-Event-ID on. Waits until that handler is done,
        so that one queue never has two writers."""
        ended = session.get_ended
        session.get_handler.cancel()
        await ended.wait()

    async def _resume_elsewhere(
        self, connection: HttpConnection, request: Request, session: HttpSession, owner: str, token: str
    ) -> None:
        """A client resumes a stream another replica wrote. A request's stream cannot be
        continued here: the request gets its retryable error (the replica that ran it
        stopped, or holds a stream this one cannot take over; there, nobody resuming it
        within the grace period cancels the request). The GET stream opens here anew."""
        request_id = request_of(token)
        if request_id is None:
            if session.get_stream is not None:
                await reject(connection, 409, INVALID_REQUEST, "Conflict: this session already has a GET stream")
                return
            log.info("http session %d: opens here the GET stream replica %r served", session.key, owner)
            hold = TokenHold(self.sessions.access, request.headers, f"http session {session.key}")
            queue = session.new_queue()
            session.open_stream(queue)
            await self._serve_get_stream(connection, session, queue, None, hold)
            return
        alive = await self._replica_alive(owner)
        if alive:
            message = (
                f"The stream of this request is written by replica {owner!r}, and cannot be resumed on this one"
                f" ({self.sessions.replica!r}): the call may be retried"
            )
        else:
            message = (
                f"The replica serving this request ({owner!r}) stopped before it answered: the call may be retried"
            )
        log.info(
            "http session %d: request %r was served by replica %r (%s)",
            session.key,
            request_id,
            owner,
            "up" if alive else "stopped",
        )
        data = {"source": "aggregator", "reason": "unavailable", "retryable": True, "replica": owner}
        error = {
            "jsonrpc": "2.0",
            "id": request_id,
            "error": {"code": INTERNAL_ERROR, "message": message, "data": data},
        }
        if await connection.start_stream([]):
            if await connection.send_chunk(sse_event(dumps(error), None)):
                await connection.end_stream()
        connection.closed = True

    async def _replica_alive(self, replica: str) -> bool:
        """Whether a replica listens on its channel of the store (a store that is down, or
        the embedded one: not known to be)."""
        try:
            return await self.hub.store.publish(replica_channel(replica), b"{}") > 0
        except StoreError:
            return False

    def _resumable(self, session: HttpSession, stream: int, seq: int) -> tuple[MessageQueue, int] | None:
        """The stream and position a Last-Event-ID names in this session, if any."""
        queue = session.streams.get(stream)
        return (queue, seq) if queue is not None else None

    async def _resume_request_stream(
        self, connection: HttpConnection, session: HttpSession, queue: MessageQueue, after: int
    ) -> None:
        """Continue a request's event stream that the client lost, where it left off. A
        connection still writing it (its POST, or an earlier resumption: the client lost it
        before this end noticed) ends first: the newest takes the stream over, and every
        event after Last-Event-ID is sent once, on this connection."""
        queue.resumed = True
        log.info(
            "http session %d: resuming the stream of request %r after event %d", session.key, queue.request_id, after
        )
        await queue.take_over()
        resumes = queue.resumes
        if not await connection.start_stream([]) or not await connection.send_chunk(queue.replay_after(after)):
            connection.closed = True
            if queue.resumes == resumes and queue.stream_id in session.streams:  # the grace period starts over
                queue.resumed = False
                self.start_grace(session, queue.request_id, queue)
            return
        async with queue.writing(), until_client_leaves(connection):
            while True:
                if not queue.waiting and queue.final:
                    await connection.end_stream()
                    session.streams.pop(queue.stream_id, None)
                    break
                await queue.wait()
                if queue.overflowed or not await queue.send_events(connection):
                    break
        connection.closed = True
        if queue.resumes != resumes:
            log.info(
                "http session %d: the stream of request %r was resumed on another connection",
                session.key,
                queue.request_id,
            )
        elif queue.stream_id in session.streams:  # lost again: the grace period starts over
            queue.resumed = False
            self.start_grace(session, queue.request_id, queue)

    def primes(self, session: HttpSession) -> bool:
        """Whether the session's event streams open with an id-only event (its revision)."""
        client = self.hub.session_info(session.key)
        return client is not None and (client.protocol_version or "") >= PRIMING_SINCE

    def start_grace(self, session: HttpSession, id: Any, queue: MessageQueue) -> None:
        """Request ``id``'s stream was lost: cancel the request unless it is resumed within
        ``http.stream_drop_grace``."""
        assert self.grace_nursery is not None
        self.grace_nursery.start_soon(
            contained,
            f"http session {session.key}: the grace period of request {id!r}",
            self._cancel_after_grace,
            session,
            id,
            queue,
        )

    async def _cancel_after_grace(self, session: HttpSession, id: Any, queue: MessageQueue) -> None:
        resumes = queue.resumes
        await trio.sleep(self.config.stream_drop_grace)
        if queue.resumed or queue.resumes != resumes:  # resumed meanwhile: its own loss starts another
            return
        session.streams.pop(queue.stream_id, None)
        if session.requests.get(id) is queue and not session.closed:
            log.info("http session %d: stream for request %r dropped; cancelling it", session.key, id)
            self.abandon(session, id, queue, "the client's stream closed")

    def abandon(self, session: HttpSession, id: Any, queue: MessageQueue, reason: str) -> None:
        """Forget a request nobody will receive the answer of, and cancel it upstream."""
        if session.requests.get(id) is not queue or session.closed:
            return
        del session.requests[id]
        self.hub.client_cancelled(session.key, id, reason)
