"""The session table of the Streamable HTTP front: ``HttpSession`` and ``SessionTable``.

A session is a hub client whose messages go to several streams (``HttpSession``). The
table owns the sessions of one endpoint by id: it finds the session a request names (its
id, bound to the principal that created it and to the path it was opened on; the request's
token must still give the session's profile, checked once per token), ends sessions
(DELETE, expiry, a budget overrun: every request still open on it is answered at once),
and expires idle ones. Sessions count against the cap shared with every front
(``hub.admission``).

Session ids: random (``secrets``), or, with ``[cluster] keys``, **sealed** (``new_id``,
``aggregator.cluster.sealing``): the id carries the session's handshake, profile and
principal, encrypted, and ``find`` adopts an id it does not know that opens under the keys
and is bound to the request's principal (and to the profile its path names, if any): the
hub takes the client over as initialized (``client_adopted``), so the session goes on here
after its replica stopped, or behind a balancer that sends each request anywhere. What it
cannot open is not found (404), as an unknown id always was, and so is one issued more than
``[cluster] session_lifetime`` ago (counted from its issue: the id is all a replica without
a shared store has of it; a session its replica holds goes on while in use). An id this
table ended (DELETE, a budget overrun) is not adopted again here; a DELETE also leaves a
tombstone in the shared store (``[cluster] store``: a digest of the id, never the id, kept
``[cluster] session_lifetime``, as long as the id could be adopted), which every replica
reads before it adopts an id, so none adopts it again. Any session id is at most
``MAX_ID`` characters of visible ASCII (400 past that).
Also here: a body's one JSON-RPC message, or the 400 that refuses it (``refuse_message``, shared with
``legacy_sse``).

Imports of the HTTP front: ``answers`` and ``queue`` only.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

import orjson
import trio

from aggregator.cluster.keys import SESSION
from aggregator.cluster.sealing import MAX_ID, PREFIX, SessionSealer, SessionState, binding, shared_name
from aggregator.config import HttpConfig
from aggregator.core.router import proxy_error
from aggregator.errors import StoreError
from aggregator.fronts.access import AccessPolicy, Denial, bearer_token, choose_profile
from aggregator.fronts.authorization import Principal
from aggregator.fronts.http.answers import reject
from aggregator.fronts.http.queue import JSON, MessageQueue
from aggregator.fronts.port import ClientPort
from aggregator.hub.caps import Admission
from aggregator.jsonrpc.codec import decode_message, dumps
from aggregator.jsonrpc.errors import INVALID_REQUEST, RemoteProtocolError
from aggregator.mcp.versions import SUPPORTED, negotiate
from aggregator.transports.budget import ClientMemory, release_all
from aggregator.transports.http_server import HttpConnection, Request
from aggregator.transports.outbox import MessageLog

log = logging.getLogger(__name__)

# Kept per session, oldest dropped first: messages for a GET stream while none is open.
BACKLOG_BYTES = 256 * 1024
# Sealed ids of sessions ended here (DELETE, a budget overrun), not adopted again; oldest forgotten first.
ENDED_IDS = 4096
NOT_FOUND = "Session not found: it ended or never existed; initialize again"


class SessionShare:
    """What this replica knows of a session whose state is in the shared store
    (``shared_sessions``): the state as last read or written, what this replica keeps
    subscribed upstream for it, whether it holds the session's lease, and what wakes its
    GET stream when an event comes."""

    def __init__(self) -> None:
        self.level: str | None = None
        self.subscribed: set[str] = set()  # the session's subscriptions (exposed URIs)
        self.upstream: set[str] = set()  # ... those this replica's router holds
        self.leased = False
        self.unread = False  # adopted while the store was down: its record is still to be read
        self.tried_at = float("-inf")  # ... last tried then (trio's clock)
        self.scope = trio.CancelScope()  # its listening on the session's channel
        self.arrived = trio.Event()  # an event (or the session's end) for its GET stream

    def poke(self) -> None:
        self.arrived.set()


class HttpSession:
    """One MCP session over HTTP: a hub client whose messages go to several streams.

    Its budget (``proxy.client_buffer_bytes``) covers what waits in all its streams
    together; the backlog for a GET stream not open is a ring of ``BACKLOG_BYTES``. What
    waits and what is being written count in ``held`` and in the budget of all clients.
    """

    def __init__(self, table: SessionTable, session_id: str, principal: int | Principal | None) -> None:
        self.table = table  # ends it when it is dropped
        self.id = session_id
        self.principal = principal
        self.key = 0
        self.profile = "default"
        # The profile its path named when it was opened ("" for the MCP endpoint itself),
        # and the last bearer token seen to give its profile (the re-check is once per token).
        self.named = ""
        self.token_seen: str | None = None
        self.requests: dict[Any, MessageQueue] = {}  # client request id -> its stream
        self.get_stream: MessageQueue | None = None
        # The handler writing the GET stream: cancelled when another GET resumes the stream.
        self.get_handler = trio.CancelScope()
        self.get_ended = trio.Event()
        self.streams: dict[int, MessageQueue] = {}  # event streams a client may resume
        self._stream_ids = itertools.count(1)
        self.backlog = MessageLog()
        self.last_seen = trio.current_time()
        self.closed = False
        self.waiting = 0  # bytes waiting in this session's streams
        self.limit = table.hub.config.proxy.client_buffer_bytes
        self.held = 0  # waiting, or being written
        self.progress_at = trio.current_time()  # when a write to it last finished
        self.memory: ClientMemory = table.hub.client_memory
        # The hub's bookkeeping, as for an Outbox.
        self.dirty = False
        self.over_limit = False
        self.drop_reason = ""
        # With a shared store: its state there, and its GET stream's events (``shared_sessions``).
        self.share: SessionShare | None = None

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
        if self.share is not None and self.table.shared is not None:
            self.table.shared.send(self, data)  # to its events in the store, for any replica's GET stream
            return
        if self.get_stream is not None:
            self.get_stream.push(data)
        else:
            backlog = self.backlog
            backlog.append(data)
            if backlog.retained_bytes > BACKLOG_BYTES:
                backlog.drop_oldest(BACKLOG_BYTES)

    def request_ended(self, id: Any) -> None:
        """The client cancelled request ``id``: it gets no answer and the id is free again.
        A stream that carried nothing yet ends (an event stream with no event id). One that
        did (its client holds a Last-Event-ID and would resume an ended one) stays open and
        idle, resumable as any request's stream, until its client closes it (then the
        grace period forgets it) or the session ends."""
        queue = self.requests.pop(id, None)
        if queue is not None:
            if queue.stream_id or queue.log.last:
                queue.cancelled = True
            else:
                queue.end_unanswered()

    def open_stream(self, queue: MessageQueue) -> None:
        queue.stream_id = next(self._stream_ids)
        queue.event_prefix = event_prefix(self.table.replica, queue.stream_id, queue.request_id)
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
            self.table.end(self)

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


class Lookup(NamedTuple):
    """The session a request names, or None with the HTTP status, reason and headers to refuse with."""

    session: HttpSession | None
    status: int = 200
    reason: str = ""
    headers: Sequence[tuple[str, str]] = ()


class SessionTable:
    """The Streamable HTTP sessions of one endpoint, by id: finds the one a request names,
    ends them, expires idle ones."""

    def __init__(self, hub: ClientPort, config: HttpConfig, access: AccessPolicy, admission: Admission) -> None:
        self.hub = hub
        self.config = config
        self.access = access
        self.admission = admission
        self.by_id: dict[str, HttpSession] = {}
        # With [cluster] keys: what seals session ids and opens those of other replicas.
        self.sealer = SessionSealer(hub.keys.keys_for(SESSION)) if hub.keys.shared else None
        # With them: this replica's name, in event ids (``event_prefix``); "": none.
        self.replica = hub.keys.replica if hub.keys.shared else ""
        self.ended: dict[str, None] = {}  # sealed ids ended here, in order (at most ENDED_IDS)
        # [cluster]: tells the other replicas a session was deleted (``relay``), so that one
        # serving it too ends it there.
        self.on_deleted: Callable[[HttpSession], Awaitable[None]] | None = None
        # [cluster] store: the sessions' state and GET streams in the store (``shared_sessions``).
        self.shared: Any = None
        self.lifetime = hub.config.cluster.session_lifetime  # of a sealed id, from its issue
        self.wall_clock = time.time  # what sealed ids' issued_at is in

    def add(self, session: HttpSession) -> None:
        """Count in a session admitted (``admission.admit_session``) and known to the hub."""
        self.by_id[session.id] = session
        if self.shared is not None:
            self.shared.opened(session)

    def new_id(self, principal: Any, profile: str, initialize: dict[str, Any]) -> str:
        """The id of a session ``initialize`` opens: sealed with its state when the cluster
        has keys (random when that state cannot fit in an id), else random."""
        if self.sealer is None:
            return secrets.token_urlsafe(24)
        params = initialize.get("params")
        params = params if type(params) is dict else {}
        capabilities, info = params.get("capabilities"), params.get("clientInfo")
        state = SessionState(
            protocol_version=negotiate(params.get("protocolVersion")),  # as the handshake agrees it
            capabilities=capabilities if type(capabilities) is dict else {},
            client_info=info if type(info) is dict else {},
            profile=profile,
            principal=binding(principal),
            issued_at=self.wall_clock(),
        )
        return self.sealer.seal(state) or secrets.token_urlsafe(24)

    async def find(self, request: Request) -> Lookup:
        """The session a request names, or None with the status, reason and headers to answer.

        A session answers only its own principal (another's token: 404, as for an id never
        issued) on the path it was opened on (``/mcp/<profile>``; one opened on ``/mcp``
        also on its profile's path); anywhere else it is a 404 too. The request's token must
        still give the session's profile, as it did at initialize (claims change: a token
        refreshed without the group that chose it), else the 403 a new session would get;
        a token is checked once, then found in one comparison.

        A sealed id this table does not know is looked up in the store's tombstones first
        (``bury``).
        """
        session_id = request.headers.get("mcp-session-id")
        if (
            session_id is not None
            and self.sealer is not None
            and session_id not in self.by_id
            and session_id.startswith(PREFIX)
            and session_id not in self.ended
            and await self._tombstoned(session_id)
        ):
            return Lookup(None, 404, NOT_FOUND)
        known = session_id is not None and session_id in self.by_id
        found = self._find(request)
        if found.session is not None and self.shared is not None:
            if not known:
                await self.shared.adopted(found.session)  # its log level and subscriptions, once
            else:
                await self.shared.catch_up(found.session)  # (adopted while the store was down)
        return found

    async def _tombstoned(self, session_id: str) -> bool:
        """Whether a replica deleted this session (a store that is down: not known, adopted)."""
        try:
            return await self.hub.store.get(_tombstone(session_id)) is not None
        except StoreError as exc:
            log.debug("http: could not read a session's tombstone: %s", exc)
            return False

    async def bury(self, session: HttpSession) -> None:
        """Leave a deleted session's tombstone in the store, so that no replica adopts it: for
        ``session_lifetime`` from now, past which its id, issued before, is adopted nowhere."""
        if self.sealer is None or not session.id.startswith(PREFIX):
            return
        try:
            await self.hub.store.set(_tombstone(session.id), b"1", ttl=self.lifetime)
        except StoreError as exc:
            log.warning("http session %d: deleted, but its tombstone could not be stored: %s", session.key, exc)

    def _find(self, request: Request) -> Lookup:
        session_id = request.headers.get("mcp-session-id")
        if session_id is None:
            return Lookup(None, 400, "Bad request: Mcp-Session-Id header is required after initialize")
        session = self.by_id.get(session_id)
        sealed = self.sealer is not None and session_id.startswith(PREFIX)
        if session is None and not _is_session_id(session_id):
            return Lookup(None, 400, f"Bad request: Mcp-Session-Id must be 1 to {MAX_ID} visible ASCII characters")
        if session is None and sealed and session_id not in self.ended:
            adopted = self._adopt(request, session_id)
            if adopted.session is None:
                return adopted
            session = adopted.session
        if session is None or session.closed:
            return Lookup(None, 404, NOT_FOUND)
        named = self.access.named_profile(request.path)
        if named != session.named and not (named and not session.named and named == session.profile):
            return Lookup(None, 404, NOT_FOUND)
        if session.principal != self.access.principal(request.headers):
            return Lookup(None, 404, NOT_FOUND)
        if session.principal is not None:
            token = bearer_token(request.headers)
            if token != session.token_seen:
                refused = self._profile_refused(session, request)
                if refused is not None:
                    return refused
                session.token_seen = token
        version = request.headers.get("mcp-protocol-version")
        if version is not None and version not in SUPPORTED:
            return Lookup(
                None,
                400,
                (f"Bad request: unsupported MCP-Protocol-Version {version[:40]!r} (supported: {', '.join(SUPPORTED)})"),
            )
        session.last_seen = trio.current_time()
        return Lookup(session)

    def _profile_refused(self, session: HttpSession, request: Request) -> Lookup | None:
        """The 403 of a request whose token no longer gives its session's profile, or None."""
        admitted = choose_profile(self.access, request.headers, session.named)
        if isinstance(admitted, Denial):
            status, reason, headers, _ = admitted
        elif admitted.profile != session.profile:
            status, reason, headers = self.access.profile_refusal(admitted.principal, session.profile)
        else:
            return None
        log.info("http session %d: refused a request: %s", session.key, reason)
        return Lookup(None, status, reason, headers)

    def _adopt(self, request: Request, session_id: str) -> Lookup:
        """A session this table does not know, whose id is sealed: taken over if it opens
        under the keys and is bound to the request's principal (and to the profile its
        path names); else not found. Past the session cap, or once closing (``hub.drain``), it
        is not taken over: 503 with Retry-After (a balancer's other replicas take it)."""
        assert self.sealer is not None
        state = self.sealer.unseal(session_id)
        principal = self.access.principal(request.headers)
        named = self.access.named_profile(request.path)
        if state is None or state.principal != binding(principal) or (named and named != state.profile):
            return Lookup(None, 404, NOT_FOUND)
        if self.wall_clock() - state.issued_at > self.lifetime:
            log.info("http: a sealed session id past cluster.session_lifetime was not adopted; initialize again")
            return Lookup(None, 404, NOT_FOUND)
        refusal = self.admission.admit_session(movable=True)
        if refusal is not None:
            retry = () if refusal.retry_after is None else (("retry-after", str(refusal.retry_after)),)
            return Lookup(None, 503, refusal.message, retry)
        session = HttpSession(self, session_id, principal)
        session.profile = state.profile
        session.named = named or ""  # (a sealed id does not say the path it was opened on)
        try:
            session.key = self.hub.client_adopted(
                session,
                state.profile,
                principal=principal,
                access_token=self.access.access_token(request.headers),
                protocol_version=state.protocol_version,
                capabilities=state.capabilities,
                client_info=state.client_info,
                shared_name=shared_name(session_id),
            )
        except ValueError:
            self.admission.release_session()
            log.warning("http: a sealed session id names profile %r, which this proxy does not have", state.profile)
            return Lookup(None, 404, NOT_FOUND)
        self.add(session)
        log.info("http session %d: adopted (its sealed id was issued by a replica with the same keys)", session.key)
        return Lookup(session)

    async def decode(self, connection: HttpConnection, request: Request) -> tuple[int, dict[str, Any]] | None:
        """The body's one JSON-RPC message, or None after answering 400 with the error."""
        try:
            return decode_message(request.body, self.hub.max_json_depth)
        except RemoteProtocolError as exc:
            session = (await self.find(request))[0] if exc.response_to is not None else None
            await refuse_message(self.hub, connection, exc, session)
            return None

    async def delete(self, connection: HttpConnection, request: Request) -> None:
        """DELETE: end the session the request names (no replica adopts it again)."""
        session, status, reason, headers = await self.find(request)
        if session is None:
            await reject(connection, status, INVALID_REQUEST, reason, headers=headers)
            return
        self.end(session)
        await self.bury(session)
        if self.shared is not None:
            await self.shared.deleted(session)
        if self.on_deleted is not None:
            await self.on_deleted(session)
        await connection.respond(200, [])

    def end(self, session: HttpSession, *, resumable: bool = False) -> None:
        """End a session: its work upstream is cancelled, and every stream still open on it
        (a POST waiting for its answer, a cancelled request's idle stream, the GET stream)
        finishes now. Its sealed id is not adopted again here, unless ``resumable`` (it
        only idled out: it holds nothing, and its client may come back)."""
        if session.closed:
            return
        session.closed = True
        if not resumable and self.sealer is not None and session.id.startswith(PREFIX):
            self.ended[session.id] = None
            if len(self.ended) > ENDED_IDS:
                del self.ended[next(iter(self.ended))]
        release_all(session)  # what its streams still send counts no more
        if self.shared is not None:
            self.shared.ended(session)
        self.by_id.pop(session.id, None)
        self.admission.release_session()
        self.hub.client_disconnected(session.key)  # the router cancels what it had in flight upstream
        open_requests = list(session.requests.items())
        session.requests.clear()
        for id, queue in open_requests:
            queue.push(
                dumps(proxy_error(id, "The session ended before this request was answered", reason="unavailable")),
                final=True,
            )
        for queue in list(session.streams.values()):
            if not queue.final:  # a cancelled request's idle stream (or a GET resuming it)
                queue.end_unanswered()
        if session.get_stream is not None:
            session.get_stream.push(b"", final=True)  # wakes the GET handler, which ends
        log.info(
            "http session %d: closed%s",
            session.key,
            f"; answered {len(open_requests)} request(s) still open" if open_requests else "",
        )

    async def expire_idle(self) -> None:
        """End the sessions idle past ``http.session_idle_timeout``, forever."""
        while True:
            await trio.sleep(min(60.0, self.config.session_idle_timeout / 2))
            now = trio.current_time()
            for session in list(self.by_id.values()):
                idle = not session.requests and session.get_stream is None
                if idle and now - session.last_seen > self.config.session_idle_timeout:
                    log.info("http session %s: expired after %.0fs idle", session.key, now - session.last_seen)
                    try:
                        self.end(session, resumable=True)
                    except Exception:
                        log.exception("http session %s: internal error while expiring it", session.key)


async def refuse_message(hub: ClientPort, connection: HttpConnection, exc: RemoteProtocolError, session: Any) -> None:
    """400 with the error of a message refused; if it was the answer to a server's request,
    that server hears so (when the message's session, of either HTTP transport, is known)."""
    if exc.response_to is not None and session is not None:
        hub.client_answer_refused(session.key, exc)
    await connection.respond(400, [JSON], dumps(exc.to_response()))


def _is_session_id(value: str, longest: int = MAX_ID) -> bool:
    """Could this be a session id (MCP: visible ASCII, 0x21 to 0x7E)?"""
    return 0 < len(value) <= longest and value.isascii() and value.isprintable() and " " not in value


def _tombstone(session_id: str) -> str:
    """The store key of a deleted session's tombstone: a digest of its id, never the id."""
    return "ended:" + hashlib.sha256(session_id.encode()).hexdigest()[:32]


MAX_ID_IN_EVENT = 96  # bytes of a request id's JSON an event id carries; a longer one is not


def event_prefix(replica: str, stream: int, request_id: Any) -> bytes:
    """What a stream's event ids start with: ``<stream>``, or with ``[cluster]`` keys
    ``<replica>.<stream>.<request id>`` (its JSON in base64url; empty for the GET stream or
    an id too long), so that a resumption another replica gets names the request it was."""
    if not replica:
        return b"%d" % stream
    encoded = dumps(request_id) if request_id is not None else b""
    token = base64.urlsafe_b64encode(encoded).rstrip(b"=") if len(encoded) <= MAX_ID_IN_EVENT else b""
    return b"%s.%d.%s" % (replica.encode(), stream, token)


def request_of(token: str) -> Any:
    """The request id an event id's token carries (``event_prefix``); None if none."""
    if not token:
        return None
    try:
        id = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, orjson.JSONDecodeError):
        return None
    return id if type(id) in (int, str) else None
