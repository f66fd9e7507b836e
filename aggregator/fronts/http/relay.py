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

A session deleted (``DELETE``) on one replica is broadcast too: a replica that serves it
ends it there (its streams end, its work upstream is cancelled), as if deleted there.

The replica that receives a message hands it to its hub as if its client had sent it on
this replica, for the session its id names, if it serves it (the sender checked the
client's principal before it published). Pub/sub is at most once: an answer sent while
the store is down, or to a replica that stopped, is lost, and the server that asked gets
its request's timeout (or the error of a replica that stopped, on its own replica), as
for a client that never answers. A message nobody subscribes to is handled here, as
without ``[cluster]``.

Imports of the HTTP front: ``sessions``.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import trio

from aggregator.core.reverse.reverse_table import replica_of
from aggregator.errors import StoreError
from aggregator.fronts.http.sessions import HttpSession, SessionTable
from aggregator.fronts.port import ClientPort
from aggregator.jsonrpc.kinds import NOTIFICATION, REQUEST
from aggregator.mcp.constants import CANCELLED

log = logging.getLogger(__name__)

EVERY_REPLICA = "replicas"  # the channel every replica listens on
MAX_RELAYED = 1024 * 1024  # a relayed message past this size is not read (the POST limit bounds what is sent)


def replica_channel(replica: str) -> str:
    """The channel a replica listens on for what is addressed to it."""
    return f"replica:{replica}"


class Relay:
    """Hands a session's messages to the replica they belong to, and takes those of others."""

    def __init__(self, hub: ClientPort, sessions: SessionTable) -> None:
        self.hub = hub
        self.sessions = sessions
        self.replica = hub.keys.replica
        self.store = hub.store
        self.relayed = 0  # messages sent to another replica
        self.received = 0  # messages handed to this replica's hub

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Take what other replicas hand this one (until cancelled)."""
        own = self.store.subscribe(replica_channel(self.replica))
        every = self.store.subscribe(EVERY_REPLICA)
        try:
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._take, own)
                nursery.start_soon(self._take, every)
        finally:
            for channel in (replica_channel(self.replica), EVERY_REPLICA):
                try:
                    self.store.unsubscribe(channel)
                except RuntimeError:
                    pass  # the store stopped first (the process is stopping): nothing to undo

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
