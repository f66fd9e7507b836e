"""A legacy session's mutable state and its events, in the shared store.

A sealed ``Mcp-Session-Id`` carries what a session never changes (``sealing``); what it
does change lives here, so that every replica serving the session knows it:

- its **record** (a hash, ``session:<digest>``): the log level it set (``level``), the
  resources it is subscribed to (``sub:<exposed URI>``) and how far its GET streams have
  read its events (``seen``);
- its **events** (a stream, ``session:<digest>:events``): everything its GET stream carries
  (list changes, resource updates, log messages, a server's request outside any call),
  each entry one message, the stream kept to about ``MAX_EVENTS`` entries;
- its **channel** (``session:<digest>``): a short note when either changes, so that a
  replica serving the session re-reads its record (``{"state":1}``) or reads the new
  events (``{"event":"<entry id>"}``) instead of polling;
- its **lease** (``session:<digest>:lease``): the replica keeping its subscriptions
  upstream, held for ``LEASE_SECONDS`` and renewed while that replica serves the session.

Every key is named by a digest of the session id (never the id: it is a bearer of the
session) and expires ``lifetime`` seconds after its last write. Each call may raise
``StoreError`` (the caller decides whether it can go on without it).

Floor 4: imports ``cluster.store`` and ``errors`` only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import attrs
import orjson

from aggregator.cluster.store import Entry, Store

MAX_EVENTS = 1000  # entries a session's event stream keeps (about: Redis trims whole nodes)
READ_COUNT = 100  # entries read at once
LEASE_SECONDS = 15.0  # how long a subscription lease lasts unless renewed
LEVEL = "level"
SEEN = "seen"
SUBSCRIBED = "sub:"


@attrs.frozen(kw_only=True)
class SessionRecord:
    """What the store holds of a session's mutable state."""

    level: str | None = None
    subscriptions: frozenset[str] = frozenset()
    seen: str = "0"  # the last event a GET stream of the session wrote ("0": none)


def digest(session_id: str) -> str:
    """What names a session in the store: a digest of its id, never the id."""
    return hashlib.sha256(b"session\0" + session_id.encode()).hexdigest()[:32]


def later(one: str, other: str) -> bool:
    """Whether stream id ``one`` comes after ``other`` ("<ms>-<seq>")."""

    def parts(text: str) -> tuple[int, int]:
        milliseconds, _, sequence = text.partition("-")
        return int(milliseconds), int(sequence or 0)

    return parts(one) > parts(other)


class SessionRecords:
    """The store's operations on sessions' records, events, channels and leases."""

    def __init__(self, store: Store, *, lifetime: float, max_events: int = MAX_EVENTS) -> None:
        self.store = store
        self.lifetime = lifetime
        self.max_events = max_events

    # --- the record ----------------------------------------------------------------------

    async def read(self, session_id: str) -> SessionRecord:
        fields = await self.store.hgetall(_record(session_id))
        level = fields.get(LEVEL)
        seen = fields.get(SEEN)
        return SessionRecord(
            level=level.decode() if level else None,
            subscriptions=frozenset(name[len(SUBSCRIBED) :] for name in fields if name.startswith(SUBSCRIBED)),
            seen=seen.decode() if seen else "0",
        )

    async def set_level(self, session_id: str, level: str) -> None:
        await self.store.hset(_record(session_id), {LEVEL: level.encode()}, ttl=self.lifetime)
        await self._changed(session_id)

    async def subscribed(self, session_id: str, uri: str) -> None:
        await self.store.hset(_record(session_id), {SUBSCRIBED + uri: b"1"}, ttl=self.lifetime)
        await self._changed(session_id)

    async def unsubscribed(self, session_id: str, uri: str) -> None:
        if await self.store.hdel(_record(session_id), [SUBSCRIBED + uri]):
            await self._changed(session_id)

    async def mark_seen(self, session_id: str, entry_id: str) -> None:
        """A GET stream wrote the events up to ``entry_id``: a GET stream opened later
        without Last-Event-ID starts after it."""
        await self.store.hset(_record(session_id), {SEEN: entry_id.encode()}, ttl=self.lifetime)

    async def forget(self, session_id: str) -> None:
        """The session was deleted: its record, events and lease go."""
        for key in (_record(session_id), _events(session_id), _lease(session_id)):
            await self.store.delete(key)

    async def _changed(self, session_id: str) -> None:
        await self.store.publish(channel(session_id), b'{"state":1}')

    # --- the events ----------------------------------------------------------------------

    async def append(self, session_id: str, message: bytes) -> str:
        """Add one message to the session's events; its entry id (the replicas serving
        the session hear of it on its channel)."""
        entry_id = await self.store.append(
            _events(session_id), {"m": message}, maxlen=self.max_events, ttl=self.lifetime
        )
        await self.store.publish(channel(session_id), orjson.dumps({"event": entry_id}))
        return entry_id

    async def append_many(self, messages: Sequence[tuple[str, bytes]]) -> list[str]:
        """Add messages to their sessions' events (``(session id, message)`` each, in order),
        their entry ids back; one note per session on its channel, naming its last entry.
        Two round trips for all."""
        entry_ids = await self.store.append_many(
            [(_events(session_id), {"m": message}) for session_id, message in messages],
            maxlen=self.max_events,
            ttl=self.lifetime,
        )
        last = {session_id: entry_id for (session_id, _), entry_id in zip(messages, entry_ids, strict=True)}
        await self.store.publish_many(
            [(channel(session_id), orjson.dumps({"event": entry_id})) for session_id, entry_id in last.items()]
        )
        return entry_ids

    async def events(self, session_id: str, after: str, count: int = READ_COUNT) -> list[Entry]:
        """At most ``count`` events after entry ``after``."""
        return await self.store.read(_events(session_id), after, count=count)

    # --- the lease -----------------------------------------------------------------------

    async def hold_lease(self, session_id: str, replica: str, seconds: float = LEASE_SECONDS) -> tuple[bool, bool]:
        """Take or renew the session's subscription lease for ``replica``: whether it holds
        it now, and whether it has just taken it (its subscriptions are to be made upstream).
        A renewal reads then writes: a replica that loses its lease between the two keeps it
        once more, which costs a duplicate update at worst."""
        key = _lease(session_id)
        holder = await self.store.get(key)
        if holder is None:
            taken = await self.store.set_new(key, replica.encode(), ttl=seconds)
            return taken, taken
        if holder.decode() != replica:
            return False, False
        await self.store.set(key, replica.encode(), ttl=seconds)
        return True, False


def channel(session_id: str) -> str:
    """The channel where a session's changes and new events are announced."""
    return f"session:{digest(session_id)}"


def _record(session_id: str) -> str:
    return f"session:{digest(session_id)}"


def _events(session_id: str) -> str:
    return f"session:{digest(session_id)}:events"


def _lease(session_id: str) -> str:
    return f"session:{digest(session_id)}:lease"
