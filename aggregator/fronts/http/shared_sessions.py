"""Legacy sessions whose mutable state and GET stream live in the shared store.

With ``[cluster] store`` (and keys: sealed session ids, adopted by any replica), a
Streamable HTTP session's log level, its resource subscriptions and everything its GET
stream carries are kept in the store (``cluster.session_record``), so that whichever
replica a balancer picks serves the session as the one that opened it would:

- **State.** A client's ``logging/setLevel``, ``resources/subscribe`` and
  ``resources/unsubscribe`` are written to the session's record once the router took them
  (``client_changed``). A replica that adopts the session reads the record once
  (``adopted``); every replica serving it hears of a change on the session's channel and
  reads it again (``_watch``). A session adopted while the store is down is read again on
  its next request, a note on its channel, or the lease check (``catch_up``, at most every
  ``RETRY_SECONDS``) until the store answers. Nothing else reads the store on a call's way. This replica's
  router learns a state it did not see by the requests that made it, replayed under ids of
  the proxy's own (``aggregator:restore:<n>``), whose answers nobody waits for.
- **Events.** What the router sends a session outside any request (list changes, resource
  updates, log messages, a server's request outside a call) is appended to the session's
  event stream in the store, in order, by one writer task (``send``, ``_write``: what
  waits is written in batches of up to ``BATCH``, two round trips each); the
  session's GET stream, on whichever replica holds it, reads from there (``serve``): woken
  by the session's channel, or by a poll every ``POLL_SECONDS`` should a note be lost
  (pub/sub is at most once). Event ids are the entries' ids (``@<ms>-<seq>``), so a GET
  with ``Last-Event-ID`` on any replica replays what followed; one without starts after
  what a GET stream of the session last wrote (``seen``), as the backlog did.
- **Subscriptions upstream.** The replica holding the session's lease keeps all its
  subscriptions upstream (``_keep_leases``: renewed every third of ``LEASE_SECONDS`` while
  it serves the session; taken, and the subscriptions made, by another replica serving
  the session once it lapses). A replica that serves a subscribe keeps that one upstream
  too, so a client may get an update twice; none is lost while a replica holds the lease.

Bounded: ``OUTGOING`` events wait for the writer, ``OUTGOING_PER_SESSION`` of one session
(past that, one is dropped and logged);
the stream keeps ``MAX_EVENTS``; a read takes ``READ_COUNT``.

Imports of the HTTP front: ``queue`` and ``sessions``.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import trio

from aggregator.cluster.session_record import LEASE_SECONDS, READ_COUNT, SessionRecords, channel
from aggregator.core.records.log_levels import LEVELS
from aggregator.errors import StoreError
from aggregator.fronts.http.queue import KEEPALIVE, until_client_leaves
from aggregator.fronts.http.sessions import HttpSession, SessionShare, SessionTable
from aggregator.fronts.port import ClientPort
from aggregator.jsonrpc.kinds import REQUEST
from aggregator.transports.http_server import HttpConnection, sse_event

log = logging.getLogger(__name__)

OUTGOING = 4096  # events waiting for the writer, of all sessions
OUTGOING_PER_SESSION = 1024  # ... of one session (one that sends a burst leaves room for the others)
BATCH = 256  # events written to the store at once
RETRY_SECONDS = 1.0  # a record not read at adoption (the store down) is read again at most this often
POLL_SECONDS = 2.0  # a GET stream reads the store at least this often (a lost note)
STORE_EVENT = re.compile(r"@([0-9]{1,15}-[0-9]{1,15})")  # a Last-Event-ID of a stored event
CLOCK_SKEW_MS = 60_000  # how far ahead of this replica's clock the store's may be
SET_LEVEL = "logging/setLevel"
SUBSCRIBE = "resources/subscribe"
UNSUBSCRIBE = "resources/unsubscribe"


def sent_by_now(entry_id: str) -> bool:
    """Whether a stored event's id (``<ms>-<seq>``) may name one already sent: its time is
    not later than this replica's clock, give or take ``CLOCK_SKEW_MS`` (the store's clock
    names it). A later one was made up: a stream resumed after it would stay silent."""
    return int(entry_id.partition("-")[0]) <= time.time() * 1000 + CLOCK_SKEW_MS


class SharedSessions:
    """This endpoint's sessions, their state and GET streams kept in the shared store."""

    def __init__(self, hub: ClientPort, sessions: SessionTable, records: SessionRecords, replica: str) -> None:
        self.hub = hub
        self.sessions = sessions
        self.records = records
        self.replica = replica
        self._send, self._receive = trio.open_memory_channel[tuple[HttpSession, bytes]](OUTGOING)
        self._nursery: trio.Nursery | None = None
        self._restores = itertools.count(1)
        self.written = 0  # events written to the store
        self.dropped = 0  # ... and lost (the writer was behind, or the store down)
        self._failing = False  # the writer's store is down (logged once per outage)
        self._waiting: dict[int, int] = {}  # session key -> its events waiting for the writer

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._write)
            nursery.start_soon(self._keep_leases)
            task_status.started()

    # --- a session's life on this replica --------------------------------------------------

    def opened(self, session: HttpSession) -> None:
        """A session this replica serves from now on (opened here, or adopted): it listens
        on its channel until it ends here."""
        share = session.share = SessionShare()
        if self._nursery is not None:
            self._nursery.start_soon(self._watch, session, share)

    async def adopted(self, session: HttpSession) -> None:
        """A session adopted here: its state as the store has it, taken over once (a store
        that is down: read again on the session's next use or lease check, at most every
        ``RETRY_SECONDS``, until it is read)."""
        share = session.share
        if share is None:
            return
        share.tried_at = trio.current_time()
        try:
            record = await self.records.read(session.id)
        except StoreError as exc:
            if not share.unread:
                log.warning(
                    "http session %d: adopted without its state (log level, subscriptions), read again once "
                    "the store answers: %s",
                    session.key,
                    exc,
                )
            share.unread = True
            return
        if share.unread:
            log.info("http session %d: its state is read from the store at last", session.key)
        share.unread = False
        if session.closed:
            return
        share.subscribed |= record.subscriptions  # (with what the client subscribed to here meanwhile)
        if record.level is not None and share.level is None and record.level in LEVELS:
            share.level = record.level
            await self._replay(session, SET_LEVEL, {"level": record.level})
        if share.subscribed:
            await self._lease(session, share)

    async def catch_up(self, session: HttpSession) -> None:
        """A session adopted while the store was down: its record read now, unless tried
        within ``RETRY_SECONDS``."""
        share = session.share
        if share is not None and share.unread and trio.current_time() - share.tried_at >= RETRY_SECONDS:
            await self.adopted(session)

    def ended(self, session: HttpSession) -> None:
        share = session.share
        if share is not None:
            share.scope.cancel()
            share.poke()

    async def deleted(self, session: HttpSession) -> None:
        try:
            await self.records.forget(session.id)
        except StoreError as exc:
            log.debug("http session %d: could not remove its state from the store: %s", session.key, exc)

    async def _watch(self, session: HttpSession, share: SessionShare) -> None:
        name = channel(session.id)
        try:
            notes = await self.hub.store.subscribe(name)
        except ValueError:
            return  # (a second table of one process serving the same session: the first listens)
        try:
            with share.scope:
                async for raw in notes:
                    if raw.startswith(b'{"state"'):
                        await self._refresh(session, share)
                    else:
                        share.poke()
        finally:
            self.hub.store.unsubscribe(name)  # (a no-op once the store stopped)

    async def _refresh(self, session: HttpSession, share: SessionShare) -> None:
        """The session's state changed on some replica: this one's router follows."""
        if share.unread:
            await self.adopted(session)  # (a note: the store answers again)
            return
        try:
            record = await self.records.read(session.id)
        except StoreError as exc:
            log.debug("http session %d: could not read its changed state: %s", session.key, exc)
            return
        if session.closed:
            return
        if record.level is not None and record.level != share.level and record.level in LEVELS:
            share.level = record.level
            await self._replay(session, SET_LEVEL, {"level": record.level})
        share.subscribed = set(record.subscriptions)
        for uri in sorted(share.upstream - share.subscribed):
            share.upstream.discard(uri)
            await self._replay(session, UNSUBSCRIBE, {"uri": uri})
        if share.leased:
            await self._subscribe_upstream(session, share)

    # --- what the client changed here -------------------------------------------------------

    async def client_changed(self, session: HttpSession, message: dict[str, Any]) -> None:
        """A request the router took that may change the session's state: written to the
        record (a store that is down: logged, and this replica alone knows it)."""
        share = session.share
        method = message.get("method")
        if share is None or method not in (SET_LEVEL, SUBSCRIBE, UNSUBSCRIBE):
            return
        params = message.get("params")
        params = params if type(params) is dict else {}
        try:
            if method == SET_LEVEL:
                level = params.get("level")
                if level in LEVELS and level != share.level:
                    share.level = level
                    await self.records.set_level(session.id, level)
                return
            uri = params.get("uri")
            if type(uri) is not str or len(uri) > MAX_URI:
                return
            if method == SUBSCRIBE:
                share.upstream.add(uri)
                if uri not in share.subscribed:
                    share.subscribed.add(uri)
                    await self.records.subscribed(session.id, uri)
                await self._lease(session, share)
            else:
                share.upstream.discard(uri)
                share.subscribed.discard(uri)
                await self.records.unsubscribed(session.id, uri)
        except StoreError as exc:
            log.warning("http session %d: its %s could not be written to the store: %s", session.key, method, exc)

    # --- the subscription lease ---------------------------------------------------------------

    async def _lease(self, session: HttpSession, share: SessionShare) -> None:
        try:
            held, taken = await self.records.hold_lease(session.id, self.replica)
        except StoreError as exc:
            log.debug("http session %d: could not hold its subscription lease: %s", session.key, exc)
            return
        share.leased = held
        if taken:
            log.info("http session %d: keeps its subscriptions upstream on this replica", session.key)
            await self._subscribe_upstream(session, share)

    async def _subscribe_upstream(self, session: HttpSession, share: SessionShare) -> None:
        for uri in sorted(share.subscribed - share.upstream):
            share.upstream.add(uri)
            await self._replay(session, SUBSCRIBE, {"uri": uri})

    async def _keep_leases(self) -> None:
        """Renew the leases held here, take those that lapsed, of sessions served here."""
        while True:
            await trio.sleep(LEASE_SECONDS / 3)
            for session in list(self.sessions.by_id.values()):
                share = session.share
                if share is None or session.closed:
                    continue
                if share.unread:
                    await self.catch_up(session)
                elif share.subscribed:
                    await self._lease(session, share)

    async def _replay(self, session: HttpSession, method: str, params: dict[str, Any]) -> None:
        """Tell this replica's router what the client asked on another replica, as that
        request (its answer goes nowhere: no stream waits for its id)."""
        if session.closed:
            return
        id = f"aggregator:restore:{next(self._restores)}"
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method, "params": params}
        log.debug("http session %d: %s replayed from its state in the store", session.key, method)
        await self.hub.client_decoded(session.key, REQUEST, message)

    # --- the events --------------------------------------------------------------------------

    def send(self, session: HttpSession, data: bytes) -> None:
        """A message for the session's GET stream: to its stream in the store, in order
        (dropped and logged past ``OUTGOING_PER_SESSION`` of this session, or ``OUTGOING``
        of all, waiting for the writer)."""
        waiting = self._waiting.get(session.key, 0)
        if waiting >= OUTGOING_PER_SESSION:
            self._drop(session, f"{waiting} of this session wait for the store already")
            return
        try:
            self._send.send_nowait((session, data))
        except trio.WouldBlock:
            self._drop(session, f"{OUTGOING} wait for the store already")
            return
        self._waiting[session.key] = waiting + 1

    def _drop(self, session: HttpSession, why: str) -> None:
        self.dropped += 1
        if self.dropped & (self.dropped - 1) == 0:  # the 1st, 2nd, 4th, 8th...: never a flood
            log.warning("http session %d: an event was dropped: %s (%d dropped so far)", session.key, why, self.dropped)

    async def _write(self) -> None:
        """Write what waits, up to ``BATCH`` events at once: their entries in one round trip
        to the store, the notes on their sessions' channels in another."""
        async for first in self._receive:
            batch = [first]
            while len(batch) < BATCH:
                try:
                    batch.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            for session, _ in batch:
                left = self._waiting.pop(session.key, 1) - 1
                if left > 0:
                    self._waiting[session.key] = left
            try:
                await self.records.append_many([(session.id, data) for session, data in batch])
            except StoreError as exc:
                self.dropped += len(batch)
                if not self._failing:
                    log.warning("http sessions: events are lost while the store is down: %s", exc)
                self._failing = True
                continue
            self._failing = False
            self.written += len(batch)
            for session in {session.key: session for session, _ in batch}.values():
                if session.share is not None:
                    session.share.poke()  # a GET stream on this replica reads it at once

    async def serve(
        self,
        connection: HttpConnection,
        session: HttpSession,
        after: str | None,
        prime: bool,
        ended: Callable[[], bool],
    ) -> None:
        """Write the session's GET stream from the store: the events after entry ``after``
        (None: after what a GET stream of it last wrote), then each as it comes, with
        keep-alive comments, until the client leaves or ``ended()``."""
        share = session.share
        assert share is not None
        if after is None:
            try:
                after = (await self.records.read(session.id)).seen
            except StoreError:
                after = "0"
        position = after if "-" in after else f"{after}-0"
        if not await connection.start_stream([]):
            return
        if prime and not await connection.send_chunk(b"id: @%s\ndata: \n\n" % position.encode()):
            return
        written_at = trio.current_time()
        async with until_client_leaves(connection):
            while not ended():
                share.arrived = trio.Event()  # a note while reading wakes the next wait
                try:
                    entries = await self.records.events(session.id, position)
                except StoreError as exc:
                    log.debug("http session %d: could not read its events: %s", session.key, exc)
                    entries = []
                if entries:
                    chunk = b"".join(sse_event(fields.get("m", b""), "@" + entry) for entry, fields in entries)
                    if not await connection.send_chunk(chunk):
                        break
                    written_at = trio.current_time()
                    position = entries[-1][0]
                    try:
                        await self.records.mark_seen(session.id, position)
                    except StoreError:
                        pass
                    if len(entries) == READ_COUNT:
                        continue
                with trio.move_on_after(POLL_SECONDS):
                    await share.arrived.wait()
                if not ended() and trio.current_time() - written_at >= KEEPALIVE:
                    if not await connection.send_chunk(b": keepalive\n\n"):
                        break
                    written_at = trio.current_time()
            else:
                await connection.end_stream()

    def statistics(self) -> dict[str, int]:
        return {"written": self.written, "dropped": self.dropped}


MAX_URI = 4096  # a subscribed URI longer than this is not kept in the store
