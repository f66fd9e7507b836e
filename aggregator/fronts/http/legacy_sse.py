"""The legacy HTTP+SSE front (MCP 2024-11-05): ``GET /sse`` and ``POST /messages``.

GET on ``http.sse_path`` opens a session whose every message travels on that one event
stream; its first event names the URL (``http.messages_path?session_id=...``) to which the
client POSTs its messages, each answered 202. A request refused for what it holds (nested
too deep, unreadable, ``params`` not an object) whose id can be read is answered there
too, on the stream, and its POST is 202: the stream is where such a client reads every
answer, and a client (the official SDKs') takes a POST that fails for a broken transport.
What names no request to answer (no readable id, a notification, an answer to a
server's request) keeps its 400 with the error. The session is bound to the token that
opened it, admitted through the same path as every front (``aggregator.fronts.access``), and
counted in the session cap; it ends when its stream closes, and its stream ends when the
access token that opened it does (``access.TokenHold``: its ``exp`` passes, or it is revoked). Each POST carries its
token in ``Authorization`` and is checked as a Streamable HTTP POST is: an expired or
revoked token is a 401, another principal's token a 404 (the session is not theirs, and
is not said to exist), and the same user's refreshed token is the one a token exchange
trades from then on. A session never changes whom it acts for.

With ``[cluster]`` keys a session's id names its replica (``<replica>~<random>``, the
replica's name in base64url): a POST that reaches another replica is handed to that one
over the store (``relay``) and answered 202 there, as here, or 404 when nobody took it.

``LegacySse`` owns the legacy sessions by id and the handlers of the two URLs; it shares
no state with the Streamable HTTP parts.

Imports of the HTTP front: ``answers``, ``queue`` and ``sessions`` (``refuse_message``).
"""

from __future__ import annotations

import base64
import binascii
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from aggregator.cluster.sealing import binding
from aggregator.config import HttpConfig
from aggregator.fronts.access import AccessPolicy, Denial, TokenHold, choose_profile
from aggregator.fronts.authorization import Principal
from aggregator.fronts.http.answers import refuse_session, reject
from aggregator.fronts.http.queue import MessageQueue, pump
from aggregator.fronts.http.sessions import refuse_message
from aggregator.fronts.port import ClientPort
from aggregator.hub.caps import Admission
from aggregator.jsonrpc.codec import decode_message, dumps
from aggregator.jsonrpc.errors import INVALID_REQUEST, RemoteProtocolError
from aggregator.transports.budget import ClientMemory, release_all
from aggregator.transports.http_server import HttpConnection, Request

log = logging.getLogger(__name__)
# [cluster]: a session of another replica's, its message handed there (``relay.Relay.legacy``):
# (session id, the principal's binding, kind, message) -> whether that replica took it.
HandOver = Callable[[str, Any, int, dict[str, Any]], Awaitable[bool]]


def session_id(replica: str) -> str:
    """A new session's id: random, and naming ``replica`` (if any) for the other replicas."""
    token = secrets.token_urlsafe(24)
    if not replica:
        return token
    return base64.urlsafe_b64encode(replica.encode()).decode().rstrip("=") + "~" + token


def replica_of(session_id: str) -> str | None:
    """The replica a session's id names, or None (an id of no replica, or not one of ours)."""
    named, sep, _ = session_id.partition("~")
    if not sep or not named or len(named) > 200:
        return None
    try:
        return base64.urlsafe_b64decode(named + "=" * (-len(named) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


class LegacySession:
    """A 2024-11-05 HTTP+SSE session: everything goes on its one event stream."""

    def __init__(
        self, session_id: str, principal: int | Principal | None, limit: int, front: LegacySse | None = None
    ) -> None:
        self.front = front  # forgets it when it is dropped
        self.id = session_id
        self.principal = principal
        self.key = 0
        self.waiting = 0
        self.limit = limit
        self.held = 0
        self.progress_at = trio.current_time()
        self.memory: ClientMemory = front.hub.client_memory if front is not None else ClientMemory()
        self.queue = MessageQueue(self, keep=0)
        self.dirty = False
        self.over_limit = False
        self.drop_reason = ""

    def put_message(self, message: Any, related: Any = None) -> None:
        self.queue.push(message if type(message) is bytes else dumps(message))

    def flush(self) -> None:
        self.dirty = False
        if self.over_limit and self.front is not None and self.id in self.front.by_id:
            log.error(
                "legacy sse session %d dropped: %s (it does not read its stream); its requests are cancelled",
                self.key,
                self.drop_reason or f"more than {self.limit} bytes are waiting for it",
            )
            self.shed("")  # wakes its handler, which ends the stream
            # Gone at once, even while a write to it hangs.
            self.front.by_id.pop(self.id, None)
            self.front.hub.client_disconnected(self.key)

    def blocked(self) -> bool:
        return self.queue.blocked()

    def last_progress(self) -> float:
        return self.queue.last_progress()

    def request_ended(self, id: Any) -> None:
        """Nothing to end: one event stream carries every answer (``ClientSink``)."""

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


class LegacySse:
    """The handlers of the legacy front's two URLs, and its sessions by id."""

    def __init__(self, hub: ClientPort, config: HttpConfig, access: AccessPolicy, admission: Admission) -> None:
        self.hub = hub
        self.config = config
        self.access = access
        self.admission = admission
        self.by_id: dict[str, LegacySession] = {}
        # With [cluster] keys: this replica's name, in each session's id, and what hands a
        # message of another replica's session over to it.
        self.replica = hub.keys.replica if hub.keys.shared else ""
        self.hand_over: HandOver | None = None

    async def stream(self, connection: HttpConnection, request: Request) -> None:
        """GET /sse: one session whose every message travels on this one stream."""
        admitted = choose_profile(self.access, request.headers, "")  # no profile path here
        if isinstance(admitted, Denial):
            await reject(connection, admitted.status, INVALID_REQUEST, admitted.reason, headers=admitted.headers)
            return
        refusal = self.admission.admit_session()
        if refusal is not None:
            await refuse_session(connection, refusal)
            return
        try:
            limit = self.config.max_stream_buffer_bytes
            session = LegacySession(session_id(self.replica), admitted.principal, limit, self)
            token = self.access.access_token(request.headers)
            session.key = self.hub.client_connected(
                session, admitted.profile, principal=admitted.principal, access_token=token
            )
        except BaseException:
            self.admission.release_session()
            raise
        self.by_id[session.id] = session
        log.info("legacy sse session %d: opened", session.key)
        hold = TokenHold(self.access, request.headers, f"legacy sse session {session.key}")
        try:
            if not await connection.start_stream([]):
                return
            endpoint = f"{self.config.messages_path}?session_id={session.id}".encode()
            if not await connection.send_chunk(b"event: endpoint\ndata: " + endpoint + b"\n\n"):
                return
            # The stream is the session: it ends when the token it was opened with does
            # (its exp passes, or it is revoked); the client opens another with its new one.
            async with hold.watching(session.queue.wake):
                await pump(connection, session.queue, lambda: hold.ended is not None)
            if hold.ended is not None:
                log.info("legacy sse session %d: ended: %s", session.key, hold.ended)
                await connection.end_stream()
        finally:
            connection.closed = True
            release_all(session)
            self.by_id.pop(session.id, None)
            self.admission.release_session()
            self.hub.client_disconnected(session.key)
            log.info("legacy sse session %d: closed", session.key)

    async def post(self, connection: HttpConnection, request: Request) -> None:
        """POST /messages?session_id=...: one message of that session."""
        query = request.path.partition("?")[2]
        session_id = next(
            (value for key, _, value in (part.partition("=") for part in query.split("&")) if key == "session_id"), None
        )
        session = self.by_id.get(session_id or "")
        if session is None and session_id and await self._handed_over(connection, request, session_id):
            return
        if session is None or session.principal != self.access.principal(request.headers):
            await reject(connection, 404, INVALID_REQUEST, "Session not found: open the SSE stream again")
            return
        # The same user's token, refreshed: what a token exchange trades from now on.
        self.hub.caller_token(session.key, self.access.access_token(request.headers))
        try:
            decoded = decode_message(request.body, self.hub.max_json_depth)
        except RemoteProtocolError as exc:
            if not (exc.answer and exc.id is not None):
                await refuse_message(self.hub, connection, exc, session)
                return
            # A request: its error goes where its client reads every answer, the stream.
            self.hub.client_refused(session.key, exc, now=True)
        else:
            await self.hub.client_decoded(session.key, *decoded)
        await connection.respond(202, [("content-type", "text/plain")], b"Accepted")

    async def _handed_over(self, connection: HttpConnection, request: Request, session_id: str) -> bool:
        """A message of a session another replica holds: handed to it (``relay``), which
        checks the principal, says whether it serves the session, and acts on the message as
        if posted there; whether the POST was answered (202; or 400, a message that cannot
        be read: nobody there could answer it on its stream). A session its replica does not
        serve: not answered, for the 404 of a session not found."""
        owner = replica_of(session_id)
        if self.hand_over is None or owner is None or owner == self.replica:
            return False
        try:
            kind, message = decode_message(request.body, self.hub.max_json_depth)
        except RemoteProtocolError as exc:
            await refuse_message(self.hub, connection, exc, None)
            return True
        if not await self.hand_over(session_id, binding(self.access.principal(request.headers)), kind, message):
            return False
        await connection.respond(202, [("content-type", "text/plain")], b"Accepted")
        return True

    def take_over(self, session_id: str, principal: Any) -> LegacySession | None:
        """The session another replica handed a message of (``relay``), if it is here and
        bound to ``principal``'s binding."""
        session = self.by_id.get(session_id)
        if session is None or binding(session.principal) != principal:
            return None
        return session
