"""One response stream of the Streamable HTTP and legacy SSE fronts: ``MessageQueue``.

A queue holds the messages for one stream (a request's answer and what belongs to it, a
session's GET stream, a legacy session's one stream), in order, and writes them as a JSON
response or as SSE events whose ids (``<stream>-<message number>``) let a client resume.
Also here: running a stream while the client stays (``until_client_leaves``) and the
write loop of an open-ended stream with keep-alive comments (``pump``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import trio

from aggregator.transports.budget import ClientMemory
from aggregator.transports.http_server import HttpConnection, sse_event
from aggregator.transports.outbox import MessageLog

KEEPALIVE = 25.0  # seconds between SSE comments on an idle GET stream
QUICK_ANSWER = 0.02  # seconds a request waits for its answer before a watcher starts
# Kept per event stream, oldest dropped first: the events already written (a client that
# lost the connection resumes with Last-Event-ID; the last event is kept whatever its size).
HISTORY_BYTES = 256 * 1024
JSON = ("content-type", "application/json")


class StreamOwner(Protocol):
    """The session a queue belongs to: its budget and its bookkeeping of bytes held."""

    waiting: int  # bytes waiting in all its streams
    limit: int  # ... and how many may
    over_limit: bool
    held: int  # waiting, or being written
    progress_at: float  # when a write to it last finished
    memory: ClientMemory  # the budget of all clients


class MessageQueue:
    """Messages for one response stream, in order; the last one ends it.

    Stored compactly (one ``MessageLog``): what waits, then what was written (kept for a
    resumption). The bytes waiting count against the budget of the session that owns the
    stream (``owner``: its ``waiting`` and ``limit``); past it the session is dropped and
    every one of its queues is closed (``overflowed``), which ends its stream and cuts a
    write to it in progress. What waits and what is being written also count in the
    owner's ``held`` and the budget of all clients (``owner.memory``).
    """

    def __init__(self, owner: StreamOwner, keep: int = HISTORY_BYTES) -> None:
        self.log = MessageLog(keep)
        self.owner = owner
        self.final = False
        self.overflowed = False
        self._lot = trio.lowlevel.ParkingLot()
        self._poked = False
        self._woken = False  # the writer is to stop waiting (``wake``)
        self._writing: HttpConnection | None = None  # the connection a write of ours is on
        # As an event stream: its id in the session (event ids are "<stream>-<message
        # number>"), whether a client resumed it, and the request it answers.
        self.stream_id = 0
        # What its event ids start with: the stream's id, or under [cluster] keys the replica,
        # the stream and the request it answers (``sessions.HttpSession.open_stream``).
        self.event_prefix = b"0"
        self.resumed = False
        self.request_id: Any = None
        self.unanswered = False  # the client cancelled the request: the stream ends with no answer
        self.cancelled = False  # ... after events: the stream stays open, idle, with no answer
        # The handler writing this stream, and set when it is done: a resumption takes the
        # stream over from it (one writer per queue). ``resumes`` counts takeovers.
        self.writer: trio.CancelScope | None = None
        self.writer_done: trio.Event | None = None
        self.resumes = 0

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

    async def respond(
        self,
        connection: HttpConnection,
        headers: list[tuple[str, str]],
        status_of: Callable[[bytes], int] | None = None,
    ) -> bool:
        """Send the next message as the whole (JSON) response; its status is 200, or what
        ``status_of`` says of it."""
        data = self.log.take()
        self.owner.waiting -= len(data)
        self._writing = connection
        try:
            return await connection.respond(200 if status_of is None else status_of(data), headers, data)
        finally:
            self._writing = None
            self._written(len(data))

    async def send_events(self, connection: HttpConnection) -> bool:
        """Send everything waiting as SSE events, in one chunk (built with one copy). A
        stream with no id (a modern request's: not resumable) has events with no id."""
        stream = self.event_prefix
        chunk, size = self.log.take_all_framed(
            (lambda number, _: b"id: %s-%d\nevent: message\ndata: " % (stream, number))
            if self.stream_id
            else (lambda _number, _data: b"event: message\ndata: "),
            b"\n\n",
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
        prefix = self.event_prefix.decode()
        return b"".join(sse_event(data, f"{prefix}-{n}") for n, data in self.log.history(seq))

    def end_unanswered(self) -> None:
        """The client cancelled the request: end its stream after what waits, with no answer."""
        self.unanswered = self.final = True
        self._lot.unpark_all()

    async def take_over(self) -> None:
        """End the handler writing this stream (a resumption replaces it) and wait until it
        is done, so that the queue never has two writers."""
        self.resumes += 1
        writer, done = self.writer, self.writer_done
        if writer is not None and done is not None:
            writer.cancel()
            await done.wait()

    @asynccontextmanager
    async def writing(self) -> AsyncIterator[trio.CancelScope]:
        """Run the body as this stream's one writer, until done or taken over."""
        scope = trio.CancelScope()
        done = trio.Event()
        self.writer, self.writer_done = scope, done
        try:
            with scope:
                yield scope
        finally:
            if self.writer is scope:
                self.writer = self.writer_done = None
            done.set()

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

    async def wait(self, quick: bool = False) -> None:
        """Until there is something to write (or the stream ends); ``quick``: or until
        ``poke()`` (``QuickWaits``)."""
        while self.log.last == self.log.sent and not self.overflowed and not self.unanswered:
            if (quick and self._poked) or self._woken:
                break
            await self._lot.park()
        self._poked = self._woken = False

    def poke(self) -> None:
        self._poked = True
        self._lot.unpark_all()

    def wake(self) -> None:
        """End the writer's ``wait`` now, quick or not: its stream is to end (it checks why)."""
        self._woken = True
        self._lot.unpark_all()


class QuickWaits:
    """Waits of at most ``delay`` for a request's answer, without a cancel scope each (trio's
    scopes are among the dearest things on a request's way): the waits are kept in the
    order they began, and one task (``run``) pokes each that is due."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self._due: dict[MessageQueue, float] = {}
        self._lot = trio.lowlevel.ParkingLot()
        self._running = False

    async def wait(self, queue: MessageQueue) -> None:
        """Until something is pushed to ``queue`` or ``delay`` has passed."""
        if not self._running:  # no sweeper (an endpoint not serving): a scope of its own
            with trio.move_on_after(self.delay):
                await queue.wait()
            return
        self._due[queue] = trio.current_time() + self.delay
        if len(self._due) == 1:
            self._lot.unpark_all()
        try:
            await queue.wait(quick=True)
        finally:
            self._due.pop(queue, None)

    async def run(self) -> None:
        self._running = True
        try:
            while True:
                if not self._due:
                    await self._lot.park()
                    continue
                now = trio.current_time()
                for queue, at in list(self._due.items()):
                    if at > now:
                        break
                    del self._due[queue]
                    queue.poke()
                if self._due:
                    await trio.sleep_until(next(iter(self._due.values())))
        finally:
            self._running = False


@asynccontextmanager
async def until_client_leaves(connection: HttpConnection) -> AsyncIterator[None]:
    """Run the body, cancelling it if the client closes the connection meanwhile."""
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            await connection.watch_disconnect()
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        yield
        nursery.cancel_scope.cancel()


async def pump(connection: HttpConnection, queue: MessageQueue, ended: Callable[[], bool]) -> None:
    """Send a stream's messages as they come, with keep-alive comments while idle, until
    the client leaves, stops reading, or ``ended()`` says the session is over."""
    async with until_client_leaves(connection):
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
