"""Messages of a legacy session that reach one replica but belong to another.

Behind a balancer with no stickiness, a client's POSTs go to any replica, while what they
answer or cancel runs on one. With ``[cluster]`` keys (sealed session ids, adopted
anywhere) and a shared store, this replica hands such a message over the store's pub/sub
and answers the POST 202 at once:

- A client's answer to a server-to-client request (sampling, elicitation, roots): the id
  it answers names the replica that asked (``core.reverse.reverse_table.replica_of``);
  another replica's goes to that replica's channel (``replica:<name>``).
- A client's ``notifications/cancelled`` of a request not in flight here: it is handled
  here as ever (a request of this replica's is cancelled here, and nothing is sent) and
  broadcast on ``replicas`` too, for the replica that runs it (a request's id names no
  replica, and recording each request's replica in the store would cost a write per
  call; a cancel is rare, so every replica hears it and those that do not run it ignore
  it, as the protocol says of a cancel of an unknown request).

A message of a legacy HTTP+SSE session (``legacy_sse``) posted to another replica than
its stream's: the session's id names its replica, so the message, whatever it is (a
request, an answer, a cancel: each is answered on the stream), goes to that replica's
channel with the binding of the principal that posted it, which the owner checks. The
owner answers on the message's own channel (``legacy:<random>``) whether it serves the
session, and the POST is answered 202 or 404 after it (within ``LEGACY_WAIT``; past that,
202).

A session deleted (``DELETE``) on one replica is broadcast too: a replica that serves it
ends it there (its streams end, its work upstream is cancelled), as if deleted there.

A 2026-07-28 retry whose ``requestState`` names the replica holding its parked call
(``RequestStates.held_by``) is forwarded there whole (path, headers, body) on that replica's
channel; the owner serves it as if its client had posted it there (admission, the token,
the state: all checked there) on a ``RemoteConnection`` that publishes the answer (JSON, or
an event stream chunk by chunk) on the call's own channel (``call:<random>``), which this
replica writes to its client. A client that leaves cancels it there. An owner that does
not listen (stopped): the retry is served here, which answers the retryable error saying
the call is held elsewhere.

The replica that receives a message hands it to its hub as if its client had sent it on
this replica, for the session its id names, if it serves it (the sender checked the
client's principal before it published). Pub/sub is at most once: an answer sent while
the store is down, or to a replica that stopped, is lost, and the server that asked gets
its request's timeout (or the error of a replica that stopped, on its own replica), as
for a client that never answers. A message nobody subscribes to is handled here, as
without ``[cluster]``.

Imports of the HTTP front: ``legacy_sse``, ``modern``, ``queue`` and ``sessions``.
"""

from __future__ import annotations

import base64
import logging
import secrets
from typing import Any, cast

import orjson
import trio

from aggregator.cluster.store import Store
from aggregator.core import defaults
from aggregator.core.era.request_state import RequestStates
from aggregator.core.reverse.reverse_table import replica_of
from aggregator.errors import StoreError
from aggregator.fronts.http.legacy_sse import LegacySse
from aggregator.fronts.http.legacy_sse import replica_of as replica_of_legacy
from aggregator.fronts.http.modern import StatelessRequests
from aggregator.fronts.http.queue import JSON, until_client_leaves
from aggregator.fronts.http.sessions import HttpSession, SessionTable
from aggregator.fronts.port import ClientPort
from aggregator.jsonrpc.codec import decode_message
from aggregator.jsonrpc.errors import INTERNAL_ERROR
from aggregator.jsonrpc.kinds import NOTIFICATION, REQUEST
from aggregator.mcp.constants import CANCELLED
from aggregator.mcp.modern import request_meta
from aggregator.transports.http_server import HttpConnection, Request

log = logging.getLogger(__name__)

EVERY_REPLICA = "replicas"  # the channel every replica listens on
MAX_RELAYED = 1024 * 1024  # a relayed message past this size is not read (the POST limit bounds what is sent)


def replica_channel(replica: str) -> str:
    """The channel a replica listens on for what is addressed to it."""
    return f"replica:{replica}"


class Relay:
    """Hands a session's messages to the replica they belong to, and takes those of others."""

    def __init__(
        self, hub: ClientPort, sessions: SessionTable, stateless: StatelessRequests, legacy: LegacySse
    ) -> None:
        self.hub = hub
        self.sessions = sessions
        self.stateless = stateless
        self.legacy_sse = legacy
        self.calls: dict[str, RemoteConnection] = {}  # retries served here for another replica
        self._nursery: trio.Nursery | None = None
        self.replica = hub.keys.replica
        self.store = hub.store
        self.relayed = 0  # messages sent to another replica
        self.received = 0  # messages handed to this replica's hub

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Take what other replicas hand this one (until cancelled)."""
        own = await self.store.subscribe(replica_channel(self.replica))
        every = await self.store.subscribe(EVERY_REPLICA)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                nursery.start_soon(self._take, own)
                nursery.start_soon(self._take, every)
        finally:
            for channel in (replica_channel(self.replica), EVERY_REPLICA):
                self.store.unsubscribe(channel)  # a no-op once the store stopped

    async def _take(self, channel: trio.MemoryReceiveChannel[bytes]) -> None:
        async for raw in channel:
            try:
                await self._deliver(raw)
            except Exception:  # noqa: BLE001 - one bad message ends nothing else
                log.exception("cluster: could not deliver a message another replica relayed")

    async def _deliver(self, raw: bytes) -> None:
        if len(raw) > MAX_RELAYED:
            log.warning("cluster: dropped a relayed message of %d bytes (the limit: %d)", len(raw), MAX_RELAYED)
            return
        note = orjson.loads(raw)
        if type(note) is not dict or note.get("from") == self.replica:
            return  # what this replica broadcast itself
        if type(note.get("call")) is str:
            self._call_note(note)
            return
        if type(note.get("legacy")) is str:
            await self._legacy_note(note)
            return
        session = self.sessions.by_id.get(note.get("session"))  # type: ignore[arg-type]
        if session is not None and note.get("ended") is True:
            log.info("http session %d: deleted on replica %r", session.key, note.get("from"))
            self.sessions.end(session)
            return
        kind, message = note.get("kind"), note.get("message")
        if session is None or session.closed or type(kind) is not int or kind == REQUEST or type(message) is not dict:
            return  # a session this replica does not serve (a broadcast cancel), or ended
        self.received += 1
        log.debug("http session %d: a message relayed from replica %r", session.key, note.get("from"))
        await self.hub.client_decoded(session.key, kind, message)

    async def handled_elsewhere(self, session: HttpSession, kind: int, message: dict[str, Any]) -> bool:
        """Relay a client's answer or cancel that belongs to another replica: whether it was
        (then the POST is answered 202 and nothing is done here)."""
        if kind == NOTIFICATION:
            if message.get("method") == CANCELLED:
                params = message.get("params")
                request_id = params.get("requestId") if type(params) is dict else None
                if type(request_id) in (int, str) and request_id not in session.requests:
                    await self._publish(EVERY_REPLICA, session, kind, message)
            return False  # handled here as well
        owner = replica_of(message.get("id"))
        if owner is None or owner == self.replica:
            return False
        return await self._publish(replica_channel(owner), session, kind, message)

    async def legacy(self, session_id: str, principal: Any, kind: int, message: dict[str, Any]) -> bool:
        """Hand a message of a legacy HTTP+SSE session to the replica its id names
        (``legacy_sse.replica_of``): whether that replica took it. It answers on a channel
        of this message's own whether it serves the session for that principal; no answer
        within ``LEGACY_WAIT`` (an owner slow to answer): taken, as it heard it."""
        owner = replica_of_legacy(session_id)
        if owner is None:
            return False
        reply = f"{LEGACY_REPLY}{secrets.token_urlsafe(12)}"
        note = {
            "from": self.replica,
            "legacy": session_id,
            "principal": principal,
            "kind": kind,
            "message": message,
            "reply": reply,
        }
        try:
            answers = await self.store.subscribe(reply)
        except (StoreError, ValueError) as exc:
            log.debug("http: could not relay a legacy sse message to replica %r: %s", owner, exc)
            return False
        try:
            heard = await self.store.publish(replica_channel(owner), orjson.dumps(note))
            if not heard:
                return False
            self.relayed += 1
            with trio.move_on_after(LEGACY_WAIT):
                async for raw in answers:
                    answer = orjson.loads(raw)
                    return not (type(answer) is dict and answer.get("known") is False)
            return True
        except (StoreError, orjson.JSONDecodeError) as exc:
            log.debug("http: could not relay a legacy sse message to replica %r: %s", owner, exc)
            return False
        finally:
            self.store.unsubscribe(reply)

    async def _legacy_note(self, note: dict[str, Any]) -> None:
        """A message of a legacy HTTP+SSE session of this replica's, posted to another one:
        that replica hears whether this one serves the session (for its 202 or 404)."""
        session = self.legacy_sse.take_over(note["legacy"], note.get("principal"))
        kind, message = note.get("kind"), note.get("message")
        known = session is not None and type(kind) is int and type(message) is dict
        reply = note.get("reply")
        if type(reply) is str and reply.startswith(LEGACY_REPLY) and len(reply) <= 64:
            try:
                await self.store.publish(reply, orjson.dumps({"known": known}))
            except StoreError as exc:
                log.debug(
                    "http: could not answer replica %r whether a legacy sse session is here: %s", note.get("from"), exc
                )
        if session is None or not known:
            return  # gone meanwhile, or another principal's: as a POST here would get 404
        self.received += 1
        log.debug("legacy sse session %d: a message relayed from replica %r", session.key, note.get("from"))
        await self.hub.client_decoded(session.key, cast(int, kind), cast(dict[str, Any], message))

    async def deleted(self, session: HttpSession) -> None:
        """A session was deleted here: any other replica that serves it ends it too."""
        note = orjson.dumps({"from": self.replica, "session": session.id, "ended": True})
        try:
            await self.store.publish(EVERY_REPLICA, note)
        except StoreError as exc:
            log.debug("http session %d: could not tell the other replicas it ended: %s", session.key, exc)

    async def _publish(self, channel: str, session: HttpSession, kind: int, message: dict[str, Any]) -> bool:
        note = orjson.dumps({"from": self.replica, "session": session.id, "kind": kind, "message": message})
        try:
            heard = await self.store.publish(channel, note)
        except StoreError as exc:
            log.debug("http session %d: could not relay to %s: %s", session.key, channel, exc)
            return False
        if heard:
            self.relayed += 1
        return heard > 0

    # --- a retry for a parked call another replica holds ------------------------------------

    async def forwarded(self, connection: HttpConnection, request: Request, message: dict[str, Any]) -> bool:
        """Send a modern retry to the replica holding the call its ``requestState`` names,
        and its answer back to this client: whether it was (else it is served here)."""
        params = message.get("params")
        owner = RequestStates.held_by(params.get("requestState")) if type(params) is dict else None
        if owner is None or owner == self.replica:
            return False
        call = secrets.token_urlsafe(12)
        replies = await self.store.subscribe(f"call:{call}")  # confirmed before the owner is asked
        try:
            note = {
                "from": self.replica,
                "call": call,
                "path": request.path,
                "headers": request.headers,
                "body": base64.b64encode(request.body).decode(),
            }
            try:
                heard = await self.store.publish(replica_channel(owner), orjson.dumps(note))
            except StoreError as exc:
                log.debug("http: could not forward a retry to replica %r: %s", owner, exc)
                return False
            if not heard:
                return False  # that replica stopped: served here (its retryable error)
            self.relayed += 1
            log.debug("http: a retry for the call replica %r holds, forwarded there", owner)
            await self._write_back(connection, replies, owner, call, message.get("id"))
            return True
        finally:
            self.store.unsubscribe(f"call:{call}")

    async def _write_back(
        self, connection: HttpConnection, replies: trio.MemoryReceiveChannel[bytes], owner: str, call: str, id: Any
    ) -> None:
        started = False
        deadline = FORWARD_WAIT
        async with until_client_leaves(connection):
            with trio.move_on_after(deadline):
                async for raw in replies:
                    reply = orjson.loads(raw)
                    if "respond" in reply:
                        body = base64.b64decode(reply["body"])
                        await connection.respond(reply["respond"], [tuple(h) for h in reply["headers"]], body)
                        return
                    if "stream" in reply:
                        started = True
                        if not await connection.start_stream([tuple(h) for h in reply["stream"]]):
                            break
                    elif "chunk" in reply:
                        if not await connection.send_chunk(base64.b64decode(reply["chunk"])):
                            break
                    elif "end" in reply:
                        await connection.end_stream()
                        return
                    else:  # "closed": the answer was cut short there
                        break
            if not started:
                message = f"Replica {owner!r}, which holds this call, did not answer in time: the call may be retried"
                data = {"source": "aggregator", "reason": "unavailable", "retryable": True, "replica": owner}
                error = {
                    "jsonrpc": "2.0",
                    "id": id,
                    "error": {"code": INTERNAL_ERROR, "message": message, "data": data},
                }
                await connection.respond(200, [JSON], orjson.dumps(error))
                return
        # The client left, the stream was cut or it took too long: the call there ends too.
        connection.closed = True
        try:
            await self.store.publish(replica_channel(owner), orjson.dumps({"from": self.replica, "call": call}))
        except StoreError:
            pass

    def _call_note(self, note: dict[str, Any]) -> None:
        """A retry another replica forwards here, or its client leaving."""
        call = note["call"]
        if "body" not in note:
            remote = self.calls.get(call)
            if remote is not None:
                remote.left.set()
            return
        if self._nursery is None or len(self.calls) >= MAX_FORWARDED:
            return  # its replica answers the retryable error when it hears nothing
        remote = self.calls[call] = RemoteConnection(self.store, f"call:{call}")
        self._nursery.start_soon(self._serve_forwarded, remote, note)

    async def _serve_forwarded(self, remote: RemoteConnection, note: dict[str, Any]) -> None:
        try:
            headers = note.get("headers")
            request = Request(
                "POST",
                str(note.get("path")),
                {str(k): str(v) for k, v in headers.items()} if type(headers) is dict else {},
                base64.b64decode(str(note.get("body"))),
            )
            kind, message = decode_message(request.body, self.hub.max_json_depth)
            if kind != REQUEST:
                return
            await self.stateless.serve(cast(HttpConnection, remote), request, message, request_meta(message))
        except Exception:  # noqa: BLE001 - a forwarded retry that fails ends only itself
            log.exception("http: a retry forwarded by replica %r failed", note.get("from"))
        finally:
            del self.calls[note["call"]]
            if not remote.done:
                await remote.publish({"closed": True})


MAX_FORWARDED = 256  # retries served at once for other replicas
# How long a forwarded retry's answer is waited for (a call waits at most its server's
# max_request_timeout, an hour by default, and a retry of a parked call usually much less).
FORWARD_WAIT = defaults.MAX_REQUEST_TIMEOUT + 5
LEGACY_REPLY = "legacy:"  # the channel a legacy session's owner answers on: this and a random name
LEGACY_WAIT = 2.0  # seconds a relayed legacy message waits for its owner's answer


class RemoteConnection:
    """An HTTP connection on another replica, as ``StatelessRequests`` writes one: what it
    would send goes on the call's channel of the store, for that replica to write."""

    def __init__(self, store: Store, channel: str) -> None:
        self.store: Store = store
        self.channel = channel
        self.closed = False
        self.done = False  # an answer was sent whole (or the connection gave up)
        self.left = trio.Event()  # the client on the other replica left
        self.progressed_at = trio.current_time()

    async def publish(self, reply: dict[str, Any]) -> bool:
        try:
            heard = int(await self.store.publish(self.channel, orjson.dumps(reply))) > 0
        except StoreError:
            heard = False
        if not heard:
            self.closed = self.done = True
        self.progressed_at = trio.current_time()
        return heard

    async def respond(self, status: int, headers: list[tuple[str, str]], body: bytes = b"") -> bool:
        self.done = True
        return await self.publish({"respond": status, "headers": headers, "body": base64.b64encode(body).decode()})

    async def start_stream(self, headers: list[tuple[str, str]]) -> bool:
        return await self.publish({"stream": headers})

    async def send_chunk(self, data: bytes) -> bool:
        return await self.publish({"chunk": base64.b64encode(data).decode()})

    async def end_stream(self) -> bool:
        self.done = True
        return await self.publish({"end": True})

    async def watch_disconnect(self) -> None:
        await self.left.wait()

    def blocked(self) -> bool:
        return False
