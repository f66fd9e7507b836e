"""The Streamable HTTP endpoint (MCP 2025-06-18 / 2025-11-25), safe by default.

One URL (``/mcp``). POST carries exactly one JSON-RPC message: a notification or response
gets 202; a request gets ``application/json`` when its answer is the first thing to send,
and switches to ``text/event-stream`` when progress or a server-to-client request for it
comes first. GET opens the session's stream for everything not tied to a request (list
changes, subscription updates, log messages). DELETE ends the session.

Every request is checked before anything else: Host against an allowlist (DNS
rebinding), Origin against an allowlist (403), then the bearer token if tokens are
configured (401). Sessions get ids from ``secrets`` (192 bits, URL-safe, visible ASCII),
are bound to the token that created them, expire when idle, and are capped in number
together with the legacy SSE and WebSocket sessions (``hub.admission``), as are open
connections. Tokens, cookies and Authorization headers are never logged. A header this
endpoint reads that holds something it cannot have sent or accept (an event id that is
not two ASCII numbers, a session id outside visible ASCII) is a 400, never an exception.

Containment: each connection's task is a boundary (``aggregator.containment``). An
exception while handling a request is logged with its traceback, answered with 500 and a
JSON-RPC internal error if no response had started, its request is cancelled upstream,
and only that connection closes; the session, other connections and the process go on.
Ending a session (DELETE, expiry) answers every request still open on it at once.

Each session is a client of the hub like a stdio client: ``HttpSession`` receives the
router's messages through ``put_message`` and hands each to the stream it belongs to.
"""

from __future__ import annotations

import itertools
import logging
import re
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio

from aggregator.access import AccessPolicy
from aggregator.admission import Refusal
from aggregator.config import HttpConfig, parse_listen
from aggregator.containment import contained, internal_error
from aggregator.core.router import proxy_error
from aggregator.hub import Hub
from aggregator.jsonrpc.codec import REQUEST, decode_message, dumps
from aggregator.jsonrpc.errors import INVALID_REQUEST, RemoteProtocolError, error_response
from aggregator.mcp.versions import DISCOVER, SUPPORTED, discover_refused
from aggregator.transports.budget import ClientMemory, release_all
from aggregator.transports.buffer import MessageLog
from aggregator.transports.http_server import HttpConnection, HttpLimits, Request, refuse_connection, sse_event

log = logging.getLogger(__name__)

KEEPALIVE = 25.0  # seconds between SSE comments on an idle GET stream
QUICK_ANSWER = 0.02  # seconds a request waits for its answer before a watcher starts
# Kept per session, oldest dropped first: messages for a GET stream while none is open,
# and per event stream the events already written (a client that lost the connection
# resumes with Last-Event-ID; the last event is kept whatever its size).
BACKLOG_BYTES = 256 * 1024
HISTORY_BYTES = 256 * 1024
PRIMING_SINCE = "2025-11-25"  # event streams open with an id-only event from this revision
JSON = ("content-type", "application/json")
# An SSE event id as this endpoint writes them: "<stream>-<seq>", ASCII digits only (a
# Unicode digit such as "\xb2" passes str.isdigit() and fails int()).
EVENT_ID = re.compile(r"([0-9]{1,15})-([0-9]{1,15})")


class MessageQueue:
    """Messages for one response stream, in order; the last one ends it.

    Stored compactly (one ``MessageLog``): what waits, then what was written (kept for a
    resumption). The bytes waiting count against the budget of the session that owns the
    stream (``owner``: its ``waiting`` and ``limit``); past it the session is dropped and
    every one of its queues is closed (``overflowed``), which ends its stream and cuts a
    write to it in progress. What waits and what is being written also count in the
    owner's ``held`` and the budget of all clients (``owner.memory``).
    """

    def __init__(self, owner: Any, keep: int = HISTORY_BYTES) -> None:
        self.log = MessageLog(keep)
        self.owner = owner
        self.final = False
        self.overflowed = False
        self._lot = trio.lowlevel.ParkingLot()
        self._writing: HttpConnection | None = None  # the connection a write of ours is on
        # As an event stream: its id in the session (event ids are "<stream>-<message
        # number>"), whether a client resumed it, and the request it answers.
        self.stream_id = 0
        self.resumed = False
        self.request_id: Any = None

    @property
    def waiting(self) -> int:
        """How many messages wait to be written."""
        return self.log.last - self.log.sent

    def push(self, data: bytes, final: bool = False) -> None:
        if self.overflowed:
            return
        self.log.append(data)
        owner = self.owner
        size = len(data)
        owner.waiting += size
        if owner.waiting > owner.limit and owner.waiting > size:
            owner.over_limit = True
        if not owner.held:  # it had nothing waiting: it is not stalled yet
            owner.progress_at = trio.current_time()
        owner.held += size
        memory = owner.memory
        memory.total += size
        self.final = self.final or final
        self._lot.unpark_all()
        if memory.total > memory.limit:
            memory.exceeded()

    def _written(self, size: int) -> None:
        owner = self.owner
        owner.held -= size
        owner.memory.total -= size
        owner.progress_at = trio.current_time()

    async def respond(self, connection: HttpConnection, headers: list[tuple[str, str]]) -> bool:
        """Send the next message as the whole (JSON) response."""
        data = self.log.take()
        self.owner.waiting -= len(data)
        self._writing = connection
        try:
            return await connection.respond(200, headers, data)
        finally:
            self._writing = None
            self._written(len(data))

    async def send_events(self, connection: HttpConnection) -> bool:
        """Send everything waiting as SSE events, in one chunk (built with one copy)."""
        stream = self.stream_id
        chunk, size = self.log.take_all_framed(
            lambda number, _: b"id: %d-%d\nevent: message\ndata: " % (stream, number), b"\n\n"
        )
        self.owner.waiting -= size
        framing = len(chunk) - size  # while it is written, the chunk costs its framing too
        owner = self.owner
        owner.held += framing
        owner.memory.total += framing
        self._writing = connection
        try:
            return await connection.send_chunk(chunk)
        finally:
            self._writing = None
            self._written(len(chunk))

    def blocked(self) -> bool:
        """Whether a write of this stream waits for the client to read."""
        return self._writing is not None and self._writing.blocked()

    def last_progress(self) -> float:
        """When a write of this stream last got bytes out (or its owner's, if later)."""
        writing = self._writing
        return self.owner.progress_at if writing is None else max(writing.progressed_at, self.owner.progress_at)

    def remove_waiting(self) -> list[bytes]:
        """What waits, taken back unwritten (a GET stream that closed hands it on)."""
        items = self.log.remove_waiting()
        size = sum(map(len, items))
        self.owner.waiting -= size
        self._written(size)
        return items

    def replay_after(self, seq: int) -> bytes:
        return b"".join(sse_event(data, f"{self.stream_id}-{n}") for n, data in self.log.history(seq))

    def close(self) -> None:
        """The session was dropped: forget everything, end the stream (a write in progress
        is cut: the connection closes)."""
        if not self.overflowed:
            size = self.log.waiting_bytes
            self.owner.waiting -= size
            self._written(size)
            self.log.clear()
            self.overflowed = True
            if self._writing is not None:
                self._writing.abort()
        self._lot.unpark_all()

    async def wait(self) -> None:
        while self.log.last == self.log.sent and not self.overflowed:
            await self._lot.park()


class HttpSession:
    """One MCP session over HTTP: a hub client whose messages go to several streams.

    Its budget (``proxy.client_buffer_bytes``) covers what waits in all its streams
    together; the backlog for a GET stream not open is a ring of ``BACKLOG_BYTES``. What
    waits and what is being written count in ``held`` and in the budget of all clients.
    """

    def __init__(self, endpoint: StreamableHttpEndpoint, session_id: str, principal: int | None) -> None:
        self.endpoint = endpoint
        self.id = session_id
        self.principal = principal
        self.key = 0
        self.profile = "default"
        self.requests: dict[Any, MessageQueue] = {}  # client request id -> its stream
        self.get_stream: MessageQueue | None = None
        self.streams: dict[int, MessageQueue] = {}  # event streams a client may resume
        self._stream_ids = itertools.count(1)
        self.backlog = MessageLog()
        self.last_seen = trio.current_time()
        self.closed = False
        self.waiting = 0  # bytes waiting in this session's streams
        self.limit = endpoint.hub.config.proxy.client_buffer_bytes
        self.held = 0  # waiting, or being written
        self.progress_at = trio.current_time()  # when a write to it last finished
        self.memory: ClientMemory = endpoint.hub.client_memory
        # The hub's bookkeeping, as for an Outbox.
        self.dirty = False
        self.over_limit = False
        self.drop_reason = ""

    def put_message(self, message: Any, related: Any = None) -> None:
        if type(message) is bytes:
            data, response_to = message, related
        else:
            data = dumps(message)
            response_to = message.get("id") if "method" not in message else None
            if response_to is None and "method" not in message:
                response_to = related
        if response_to is not None:
            queue = self.requests.pop(response_to, None)
            if queue is not None:
                queue.push(data, final=True)
            return
        if related is not None:
            queue = self.requests.get(related)
            if queue is not None:
                queue.push(data)
                return
        if self.get_stream is not None:
            self.get_stream.push(data)
        else:
            backlog = self.backlog
            backlog.append(data)
            if backlog.retained_bytes > BACKLOG_BYTES:
                backlog.drop_oldest(BACKLOG_BYTES)

    def open_stream(self, queue: MessageQueue) -> None:
        queue.stream_id = next(self._stream_ids)
        self.streams[queue.stream_id] = queue

    def new_queue(self) -> MessageQueue:
        return MessageQueue(self)

    def flush(self) -> None:
        """Pushing a message wakes its stream's handler; here only a session past its
        budget is dropped (after the hub's batch, never in the middle of it)."""
        self.dirty = False
        if self.over_limit and not self.closed:
            log.error(
                "http session %d dropped: %s (it does not read its streams); its requests are cancelled",
                self.key,
                self.drop_reason or f"more than {self.limit} bytes are waiting for it",
            )
            self._close_queues()
            self.endpoint._end_session(self)

    def blocked(self) -> bool:
        """Whether a write to one of its streams waits for the client to read."""
        return any(
            queue.blocked()
            for queue in {*self.requests.values(), *self.streams.values(), self.get_stream}
            if queue is not None
        )

    def last_progress(self) -> float:
        """When a write to any of its streams last got bytes out."""
        return max(
            (
                queue.last_progress()
                for queue in {*self.requests.values(), *self.streams.values(), self.get_stream}
                if queue is not None
            ),
            default=self.progress_at,
        )

    def shed(self, reason: str) -> None:
        """Drop this session to free memory: its queues close now, it ends at ``flush``."""
        if self.over_limit or self.closed:
            return
        self.over_limit = True
        self.drop_reason = reason
        self._close_queues()

    def _close_queues(self) -> None:
        for queue in {*self.requests.values(), *self.streams.values(), self.get_stream}:
            if queue is not None:
                queue.close()
        release_all(self)

    async def wait_writable(self) -> None:
        return

    async def wait_drained(self) -> None:
        """Returns at once: at shutdown nothing waits for an HTTP session's streams."""
        return


class LegacySession:
    """A 2024-11-05 HTTP+SSE session: everything goes on its one event stream."""

    def __init__(
        self, session_id: str, principal: int | None, limit: int, endpoint: StreamableHttpEndpoint | None = None
    ) -> None:
        self.endpoint = endpoint
        self.id = session_id
        self.principal = principal
        self.key = 0
        self.waiting = 0
        self.limit = limit
        self.held = 0
        self.progress_at = trio.current_time()
        self.memory: ClientMemory = endpoint.hub.client_memory if endpoint is not None else ClientMemory()
        self.queue = MessageQueue(self, keep=0)
        self.dirty = False
        self.over_limit = False
        self.drop_reason = ""

    def put_message(self, message: Any, related: Any = None) -> None:
        self.queue.push(message if type(message) is bytes else dumps(message))

    def flush(self) -> None:
        self.dirty = False
        if self.over_limit and self.endpoint is not None and self.id in self.endpoint.legacy:
            log.error(
                "legacy sse session %d dropped: %s (it does not read its stream); its requests are cancelled",
                self.key,
                self.drop_reason or f"more than {self.limit} bytes are waiting for it",
            )
            self.shed("")  # wakes its handler, which ends the stream
            # Gone at once, even while a write to it hangs.
            self.endpoint.legacy.pop(self.id, None)
            self.endpoint.hub.remove_client(self.key)

    def blocked(self) -> bool:
        return self.queue.blocked()

    def last_progress(self) -> float:
        return self.queue.last_progress()

    def shed(self, reason: str) -> None:
        """Drop this session to free memory: its queue closes now, it ends at ``flush``."""
        self.over_limit = True
        self.drop_reason = self.drop_reason or reason
        self.queue.close()
        release_all(self)

    async def wait_writable(self) -> None:
        return

    async def wait_drained(self) -> None:
        """Returns at once: at shutdown nothing waits for an HTTP session's streams."""
        return


class StreamableHttpEndpoint:
    def __init__(self, hub: Hub, config: HttpConfig) -> None:
        self.hub = hub
        self.config = config
        self.sessions: dict[str, HttpSession] = {}
        self.legacy: dict[str, LegacySession] = {}
        self.limits = HttpLimits(
            config.max_body_bytes,
            config.max_header_bytes,
            config.header_timeout,
            body_timeout=config.body_timeout,
            write_timeout=config.write_timeout,
            keepalive_timeout=config.keepalive_timeout,
        )
        self.admission = hub.admission
        self._nursery: trio.Nursery | None = None
        self.access = AccessPolicy(config, hub.config.profiles)

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
            self._nursery = nursery
            nursery.start_soon(self._expire_idle_sessions)
            await nursery.start(trio.serve_listeners, self._connection, listeners)
            task_status.started(addresses)

    async def _connection(self, stream: trio.SocketStream) -> None:
        """One connection's task, and its boundary: whatever fails in it ends only it."""
        if not self.admission.admit_connection():
            await refuse_connection(stream)
            return
        connection = HttpConnection(stream, self.limits)
        request: Request | None = None
        try:
            while True:
                request = await connection.next_request()
                if request is None:
                    return
                await self._handle(connection, request)
                if not connection.next_cycle():
                    return
        except Exception:
            where = f"{request.method} {request.path[:100]}" if request is not None else "reading a request"
            log.exception("http: internal error in %s; closing this connection only", where)
            if request is not None and connection.response_pending():
                await connection.respond(500, [JSON, ("connection", "close")], dumps(internal_error(request.body)))
        finally:
            try:
                await connection.aclose()
            finally:
                self.admission.release_connection()

    async def _expire_idle_sessions(self) -> None:
        while True:
            await trio.sleep(min(60.0, self.config.session_idle_timeout / 2))
            now = trio.current_time()
            for session in list(self.sessions.values()):
                idle = not session.requests and session.get_stream is None
                if idle and now - session.last_seen > self.config.session_idle_timeout:
                    log.info("http session %s: expired after %.0fs idle", session.key, now - session.last_seen)
                    try:
                        self._end_session(session)
                    except Exception:
                        log.exception("http session %s: internal error while expiring it", session.key)

    # --- requests -----------------------------------------------------------------------

    async def _handle(self, connection: HttpConnection, request: Request) -> None:
        path, _, query = request.path.partition("?")
        known = (self.config.path, self.config.sse_path, self.config.messages_path)
        if path not in known and self.access.named_profile(path) is None:
            await connection.respond_error(404, f"not found; the MCP endpoint is {self.config.path}")
            return
        refusal = self.access.refusal(request.headers)
        if refusal is not None:
            status, reason, headers = refusal
            log.warning("http: refused %s %s: %s", request.method, path, reason)
            body = dumps(error_response(None, INVALID_REQUEST, reason))
            await connection.respond(status, [JSON, *headers], body)
            return
        handlers = {
            self.config.sse_path: {"GET": self._legacy_stream},
            self.config.messages_path: {"POST": partial(self._legacy_post, query=query)},
        }.get(path, {"POST": self._post, "GET": self._get, "DELETE": self._delete})
        handler = handlers.get(request.method)
        if handler is None:
            await connection.respond(
                405,
                [("allow", ", ".join(handlers)), JSON],
                dumps(error_response(None, INVALID_REQUEST, "method not allowed")),
            )
            return
        await handler(connection, request)

    async def _reject(self, connection: HttpConnection, status: int, code: int, message: str, id: Any = None) -> None:
        await connection.respond(status, [JSON], dumps(error_response(id, code, message)))

    async def _refuse_session(self, connection: HttpConnection, refusal: Refusal, id: Any = None) -> None:
        """503: the session cap is reached, or the aggregator is shutting down."""
        headers = [JSON] if refusal.retry_after is None else [JSON, ("retry-after", str(refusal.retry_after))]
        await connection.respond(503, headers, dumps(proxy_error(id, refusal.message, reason=refusal.reason)))

    def _session(self, request: Request) -> tuple[HttpSession | None, int, str]:
        """The session a request names: (session, or None with an HTTP status and reason)."""
        session_id = request.headers.get("mcp-session-id")
        if session_id is None:
            return None, 400, "Bad request: Mcp-Session-Id header is required after initialize"
        session = self.sessions.get(session_id)
        if session is None and not _is_session_id(session_id):
            return None, 400, "Bad request: Mcp-Session-Id must be 1 to 128 visible ASCII characters"
        named = self.access.named_profile(request.path)
        if (
            session is None
            or session.closed
            or session.principal != self.access.principal(request.headers)
            or (named and named != session.profile)
        ):
            return None, 404, "Session not found: it ended or never existed; initialize again"
        version = request.headers.get("mcp-protocol-version")
        if version is not None and version not in SUPPORTED:
            return (
                None,
                400,
                (f"Bad request: unsupported MCP-Protocol-Version {version[:40]!r} (supported: {', '.join(SUPPORTED)})"),
            )
        session.last_seen = trio.current_time()
        return session, 200, ""

    async def _post(self, connection: HttpConnection, request: Request) -> None:
        content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if content_type != "application/json":
            await self._reject(connection, 415, INVALID_REQUEST, "Unsupported media type: send application/json")
            return
        accept = request.headers.get("accept", "*/*").lower()
        if not any(kind in accept for kind in ("application/json", "text/event-stream", "*/*")):
            await self._reject(
                connection, 406, INVALID_REQUEST, "Not acceptable: accept application/json and text/event-stream"
            )
            return
        decoded = await self._decode(connection, request)
        if decoded is None:
            return
        kind, message = decoded
        if kind == REQUEST and message["method"] == "initialize":
            await self._initialize(connection, request, message)
            return
        session, status, reason = self._session(request)
        if session is None:
            if kind == REQUEST and message["method"] == DISCOVER:
                await connection.respond(status, [JSON], dumps(discover_refused(message["id"])))
            else:
                await self._reject(
                    connection, status, INVALID_REQUEST, reason, message.get("id") if kind == REQUEST else None
                )
            return
        if kind != REQUEST:
            self.hub.dispatch_now(await self.hub.client_event(session.key, kind, message))
            await connection.respond(202, [])
            return
        await self._exchange(connection, session, message)

    async def _initialize(self, connection: HttpConnection, request: Request, message: dict[str, Any]) -> None:
        if "mcp-session-id" in request.headers:
            await self._reject(
                connection,
                400,
                INVALID_REQUEST,
                "Bad request: initialize starts a session; send it without Mcp-Session-Id",
                message["id"],
            )
            return
        principal = self.access.principal(request.headers)
        profile = self.access.profile(principal)
        named = self.access.named_profile(request.path)
        if named:  # /mcp/<profile>: that profile, if the token (when tokens are used) gives it
            if principal is not None and profile != named:
                await self._reject(
                    connection,
                    403,
                    INVALID_REQUEST,
                    f"this token does not give access to profile {named!r}",
                    message["id"],
                )
                return
            profile = named
        refusal = self.admission.admit_session()
        if refusal is not None:
            await self._refuse_session(connection, refusal, message["id"])
            return
        # Admitted: from here the session exists, and _end_session releases its place.
        session = HttpSession(self, secrets.token_urlsafe(24), principal)
        session.profile = profile
        session.key = self.hub.add_client(session, profile)
        self.sessions[session.id] = session
        log.info("http session %d: opened", session.key)
        ok = False
        try:
            ok = await self._exchange(connection, session, message, [("mcp-session-id", session.id)])
        finally:
            if not ok:
                self._end_session(session)

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
            await self._reject(
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
            self._abandon(session, id, queue, "the aggregator failed while handling it")
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
        self.hub.dispatch_now(await self.hub.client_event(session.key, REQUEST, message))
        # Most answers come back within milliseconds and alone: send them as JSON without
        # starting a task to watch the connection. Only a slower or chattier request gets
        # the watcher (to notice a client that leaves) and, if need be, an event stream.
        with trio.move_on_after(QUICK_ANSWER):
            await queue.wait()
        if queue.final and queue.waiting == 1:
            answered = await queue.respond(connection, [JSON, *headers])
            return answered and self.hub.router.session_info(session.key) is not None
        answered = False
        streaming = False
        async with _until_client_leaves(connection):
            while True:
                await queue.wait()
                if queue.overflowed:
                    break
                if not streaming and queue.final and queue.waiting == 1:
                    answered = await queue.respond(connection, [JSON, *headers])
                    break
                if not streaming:
                    streaming = True
                    session.open_stream(queue)
                    if not await connection.start_stream(headers):
                        break
                    if self._primes(session):
                        # An id before anything else: a client that loses the stream at
                        # once can still resume it (2025-11-25), and the delay to resume
                        # after: half the grace period it has to, at most a second.
                        retry = min(1000, int(self.config.stream_drop_grace * 500))
                        if not await connection.send_chunk(
                            f"id: {queue.stream_id}-0\nretry: {retry}\ndata: \n\n".encode()
                        ):
                            break
                # Everything that waits goes in one write: a client that reads promptly
                # keeps up with any burst.
                last = queue.final
                if not await queue.send_events(connection):
                    break
                if last:
                    answered = await connection.end_stream()
                    break
        if queue.overflowed:  # the session was dropped: it did not read what it was sent
            if not streaming:
                await self._reject(
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
        elif session.requests.get(id) is queue or queue.waiting:
            # The client went away before its answer. It may resume the stream (GET with
            # Last-Event-ID); if it does not within the grace period, cancel the request.
            connection.closed = True
            self._start_grace(session, id, queue)
        return answered and self.hub.router.session_info(session.key) is not None

    def _primes(self, session: HttpSession) -> bool:
        client = self.hub.router.session_info(session.key)
        return client is not None and (client.protocol_version or "") >= PRIMING_SINCE

    def _start_grace(self, session: HttpSession, id: Any, queue: MessageQueue) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(
            contained,
            f"http session {session.key}: the grace period of request {id!r}",
            self._cancel_after_grace,
            session,
            id,
            queue,
        )

    async def _cancel_after_grace(self, session: HttpSession, id: Any, queue: MessageQueue) -> None:
        await trio.sleep(self.config.stream_drop_grace)
        if queue.resumed:
            return
        session.streams.pop(queue.stream_id, None)
        if session.requests.get(id) is queue and not session.closed:
            log.info("http session %d: stream for request %r dropped; cancelling it", session.key, id)
            self._abandon(session, id, queue, "the client's stream closed")

    def _abandon(self, session: HttpSession, id: Any, queue: MessageQueue, reason: str) -> None:
        """Forget a request nobody will receive the answer of, and cancel it upstream."""
        if session.requests.get(id) is not queue or session.closed:
            return
        del session.requests[id]
        self.hub.dispatch_now(
            self.hub.router.client_message(
                session.key,
                dumps(
                    {
                        "jsonrpc": "2.0",
                        "method": "notifications/cancelled",
                        "params": {"requestId": id, "reason": reason},
                    }
                ),
            )
        )

    async def _get(self, connection: HttpConnection, request: Request) -> None:
        accept = request.headers.get("accept", "").lower()
        if "text/event-stream" not in accept and "*/*" not in accept:
            await self._reject(connection, 406, INVALID_REQUEST, "Not acceptable: GET opens a text/event-stream")
            return
        session, status, reason = self._session(request)
        if session is None:
            await self._reject(connection, status, INVALID_REQUEST, reason)
            return
        last_event_id = request.headers.get("last-event-id")
        resume = None
        if last_event_id is not None:
            position = EVENT_ID.fullmatch(last_event_id.strip())
            if position is None:
                await self._reject(
                    connection,
                    400,
                    INVALID_REQUEST,
                    "Bad request: Last-Event-ID must be the id of an event this server sent, like 3-17",
                )
                return
            resume = self._resumable(session, int(position[1]), int(position[2]))
        if resume is not None and resume[0].request_id is not None:
            await self._resume_request_stream(connection, session, *resume)
            return
        if session.get_stream is not None:
            await self._reject(connection, 409, INVALID_REQUEST, "Conflict: this session already has a GET stream")
            return
        if resume is not None:  # the session's own GET stream, back after a drop
            queue, after = resume
        else:
            queue, after = session.new_queue(), 0
            session.open_stream(queue)
        for data in session.backlog.take_all():
            queue.push(data)
        session.get_stream = queue
        self.hub.dispatch_now([])  # if that passed the budget of all clients, whoever was dropped ends now
        try:
            if not await connection.start_stream([]):
                return
            if after or resume is not None:
                if not await connection.send_chunk(queue.replay_after(after)):
                    return
            elif self._primes(session):
                if not await connection.send_chunk(f"id: {queue.stream_id}-0\ndata: \n\n".encode()):
                    return
            await _pump(connection, queue, lambda: session.closed)
            if session.closed:
                await connection.end_stream()
        finally:
            if session.get_stream is queue:
                session.get_stream = None
                for data in queue.remove_waiting():
                    session.backlog.append(data)
                session.backlog.drop_oldest(BACKLOG_BYTES)
            connection.closed = True

    # --- the legacy HTTP+SSE transport (2024-11-05) ------------------------------------

    async def _legacy_stream(self, connection: HttpConnection, request: Request) -> None:
        """GET /sse: one session whose every message travels on this one stream."""
        refusal = self.admission.admit_session()
        if refusal is not None:
            await self._refuse_session(connection, refusal)
            return
        try:
            principal = self.access.principal(request.headers)
            session = LegacySession(secrets.token_urlsafe(24), principal, self.config.max_stream_buffer_bytes, self)
            session.key = self.hub.add_client(session, self.access.profile(principal))
        except BaseException:
            self.admission.release_session()
            raise
        self.legacy[session.id] = session
        log.info("legacy sse session %d: opened", session.key)
        try:
            if not await connection.start_stream([]):
                return
            endpoint = f"{self.config.messages_path}?session_id={session.id}".encode()
            if not await connection.send_chunk(b"event: endpoint\ndata: " + endpoint + b"\n\n"):
                return
            await _pump(connection, session.queue, lambda: False)
        finally:
            connection.closed = True
            release_all(session)
            self.legacy.pop(session.id, None)
            self.admission.release_session()
            self.hub.remove_client(session.key)
            log.info("legacy sse session %d: closed", session.key)

    async def _legacy_post(self, connection: HttpConnection, request: Request, *, query: str) -> None:
        session_id = next(
            (value for key, _, value in (part.partition("=") for part in query.split("&")) if key == "session_id"), None
        )
        session = self.legacy.get(session_id or "")
        if session is None or session.principal != self.access.principal(request.headers):
            await self._reject(connection, 404, INVALID_REQUEST, "Session not found: open the SSE stream again")
            return
        decoded = await self._decode(connection, request, session)
        if decoded is not None:
            self.hub.dispatch_now(await self.hub.client_event(session.key, *decoded))
            await connection.respond(202, [("content-type", "text/plain")], b"Accepted")

    async def _decode(
        self, connection: HttpConnection, request: Request, session: Any = None
    ) -> tuple[int, dict[str, Any]] | None:
        """The body's one JSON-RPC message, or None after answering 400 with the error."""
        try:
            return decode_message(request.body, self.hub.router.max_json_depth)
        except RemoteProtocolError as exc:
            if exc.response_to is not None:  # a refused answer to a server's request: it hears so
                session = session or self._session(request)[0]
                if session is not None:
                    self.hub.dispatch_now(self.hub.router.refused_answer(session.key, exc))
            await connection.respond(400, [JSON], dumps(exc.to_response()))
            return None

    def _resumable(self, session: HttpSession, stream: int, seq: int) -> tuple[MessageQueue, int] | None:
        """The stream and position a Last-Event-ID names in this session, if any."""
        queue = session.streams.get(stream)
        return (queue, seq) if queue is not None else None

    async def _resume_request_stream(
        self, connection: HttpConnection, session: HttpSession, queue: MessageQueue, after: int
    ) -> None:
        """Continue a request's event stream that the client lost, where it left off."""
        queue.resumed = True
        log.info(
            "http session %d: resuming the stream of request %r after event %d", session.key, queue.request_id, after
        )
        if not await connection.start_stream([]) or not await connection.send_chunk(queue.replay_after(after)):
            queue.resumed = False
            return
        async with _until_client_leaves(connection):
            while True:
                if not queue.waiting and queue.final:
                    await connection.end_stream()
                    session.streams.pop(queue.stream_id, None)
                    break
                await queue.wait()
                if queue.overflowed or not await queue.send_events(connection):
                    break
        connection.closed = True
        if queue.stream_id in session.streams:  # lost again: the grace period starts over
            queue.resumed = False
            self._start_grace(session, queue.request_id, queue)

    async def _delete(self, connection: HttpConnection, request: Request) -> None:
        session, status, reason = self._session(request)
        if session is None:
            await self._reject(connection, status, INVALID_REQUEST, reason)
            return
        self._end_session(session)
        await connection.respond(200, [])

    def _end_session(self, session: HttpSession) -> None:
        """End a session: its work upstream is cancelled, and every stream still open on it
        (a POST waiting for its answer, the GET stream) finishes now."""
        if session.closed:
            return
        session.closed = True
        release_all(session)  # what its streams still send counts no more
        self.sessions.pop(session.id, None)
        self.admission.release_session()
        self.hub.remove_client(session.key)  # the router cancels what it had in flight upstream
        open_requests = list(session.requests.items())
        session.requests.clear()
        for id, queue in open_requests:
            queue.push(
                dumps(proxy_error(id, "The session ended before this request was answered", reason="unavailable")),
                final=True,
            )
        if session.get_stream is not None:
            session.get_stream.push(b"", final=True)  # wakes the GET handler, which ends
        log.info(
            "http session %d: closed%s",
            session.key,
            f"; answered {len(open_requests)} request(s) still open" if open_requests else "",
        )


def _is_session_id(value: str) -> bool:
    """Could this be a session id (MCP: visible ASCII, 0x21 to 0x7E)?"""
    return 0 < len(value) <= 128 and value.isascii() and value.isprintable() and " " not in value


@asynccontextmanager
async def _until_client_leaves(connection: HttpConnection) -> AsyncIterator[None]:
    """Run the body, cancelling it if the client closes the connection meanwhile."""
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            await connection.watch_disconnect()
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        yield
        nursery.cancel_scope.cancel()


async def _pump(connection: HttpConnection, queue: MessageQueue, ended: Any) -> None:
    """Send a stream's messages as they come, with keep-alive comments while idle, until
    the client leaves, stops reading, or ``ended()`` says the session is over."""
    async with _until_client_leaves(connection):
        while not ended():
            with trio.move_on_after(KEEPALIVE) as idle:
                await queue.wait()
            if ended():
                break
            if idle.cancelled_caught:
                if not await connection.send_chunk(b": keepalive\n\n"):
                    break
                continue
            if queue.overflowed or not await queue.send_events(connection):
                break
