"""Bytes on their way out of the proxy: the write queue in front of one byte stream (a
client's stdout or socket, a server's stdin: ``Outbox``), the compact storage every queue of
messages keeps them in (``MessageLog``), and reading and writing a socket or pipe directly.

Producers (reader tasks running the sans-IO router) call ``put_message`` synchronously
while they work through one read's worth of messages, then ``flush`` once: so a batch of
messages decoded from one read becomes one write per destination, not one per message.
When the stream has a file descriptor and nothing is being written, ``flush`` writes
directly (non-blocking) from the producer's task: no task switch on the hot path.
Whatever the pipe does not take at once is left to the writer task (``run``), which takes
everything queued in one write. Order is preserved either way: a direct write happens
only when the writer holds nothing.

Rules (see "Containment" in the design notes):

1. Nobody but the party's own reader ever waits on this queue. ``wait_writable`` is for
   the reader of the same connection (a client that sends faster than it reads is made
   to wait); every other producer only ever queues and moves on.
2. The queue has a byte budget (``limit``) and a deadline (``write_timeout``). More than
   ``limit`` bytes waiting (one message of any size is always taken when nothing else
   waits), or one write that has not finished after ``write_timeout``, makes the queue
   *congested*; ``on_congestion(reason)`` is called once when that starts and
   ``on_congestion(None)`` when it ends. The owner decides: a client is dropped, a
   server's requests fail. While congested, notifications are dropped (counted), since
   nothing is waiting for them.
3. What waits is stored in one ``bytearray``: a small message costs its length, not the
   allocation it was serialized into. What counts against the budget is what waits, not
   the write in progress. A network server's queue, writing into a ``pipe.PipeSend``,
   also keeps each message with its size until it is written: the server's connection
   gets the message with its line and never decodes what was just encoded.
4. A client's queue also counts what it holds (what waits and the write in progress) in
   the hub's ``ClientMemory``, the budget of all clients together; past it, a client
   that has stopped reading (``blocked``, and no progress for a moment: large writes go
   out in ``PROGRESS_STEP`` steps that mark it) is dropped through ``shed``, as if it were
   congested. A server's queue counts into a private, unlimited one.

Compact storage (``MessageLog``)
--------------------------------
Why not a list of ``bytes``: every small ``orjson.dumps`` result pins an allocation of
about 4 KB, whatever its length (measured: 100,000 log notifications of 118 bytes held as
``dumps`` results took 393 MB of RSS; the same bytes appended to one ``bytearray``, 11 MB).
A queue that holds messages for a client that reads slowly, or history kept for a client
that may resume, must cost what its bytes cost, so it copies each message into one
``bytearray`` (a C-level copy of a few hundred bytes) and lets the original go.

``MessageLog`` numbers messages from 1 in the order they arrive. Messages up to ``sent``
have been taken for writing and are kept only as history, up to ``keep`` bytes (the
oldest are dropped first; with ``keep > 0`` the last one taken is always kept, so a final
answer can be replayed whatever its size). Messages after ``sent`` are waiting. Deleting
from the front of a ``bytearray`` is cheap in CPython (it moves the start), so trimming
history or taking the oldest waiting message never copies what stays.

Reading and writing a socket directly
-------------------------------------
For the HTTP server and client connections (and the queues above). A connection that
answers one request at a time waits for its peer before every read: trio's
``receive_some`` would first try a read that finds nothing, then wait. And most writes fit
in the socket's buffer: ``send_all``'s machinery is only needed for what does not.
``read_when_ready`` and ``write_now`` do the common case with one system call each; the
callers fall back to the stream's own methods (``send_in_steps`` for a large write) for
the rest. ``fd_of`` finds a stream's descriptor, ``cannot_take_more`` asks the kernel
whether its party stopped reading.
"""

from __future__ import annotations

import logging
import math
import os
import select
from array import array
from collections.abc import Callable
from typing import Any

import trio

from aggregator.jsonrpc.codec import dumps
from aggregator.transports.budget import ClientMemory, release_all
from aggregator.transports.pipe import PipeSend

log = logging.getLogger(__name__)


def cannot_take_more(fd: int | None) -> bool:
    """Whether the kernel would refuse a write to ``fd`` now: its party stopped reading
    (its buffer is full), as opposed to a write of ours that simply has not run yet.
    Unknown (no descriptor, as for a stream in memory): True."""
    if fd is None:
        return True
    try:
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        return not poll.poll(0)
    except (OSError, ValueError):
        return True


def fd_of(stream: Any) -> int | None:
    """The file descriptor under a trio stream (a socket's, a pipe's), if it has one."""
    socket = getattr(stream, "socket", None)
    fileno = getattr(socket if socket is not None else stream, "fileno", None)
    try:
        return fileno() if fileno is not None else None
    except (OSError, ValueError):
        return None


# A large write goes out in steps of this size, each one marking progress: a client that
# reads a 15 MB answer slowly but steadily is seen reading, not taken for one that stopped.
PROGRESS_STEP = 256 * 1024


async def send_in_steps(
    stream: trio.abc.SendStream, data: bytes | bytearray | memoryview, progressed: Callable[[], None]
) -> None:
    """``stream.send_all(data)``, calling ``progressed`` after every ``PROGRESS_STEP`` bytes."""
    if len(data) <= PROGRESS_STEP:
        await stream.send_all(data)
        progressed()
        return
    with memoryview(data) as view:
        for start in range(0, len(view), PROGRESS_STEP):
            await stream.send_all(view[start : start + PROGRESS_STEP])
            progressed()


READ_SIZE = 65536


async def read_when_ready(sock: trio.socket.SocketType, fd: int) -> bytes:
    """Wait until ``sock`` is readable, then what it holds (b"" once the peer closed).
    OSError (and trio's errors for a closed socket) propagate."""
    while True:
        await trio.lowlevel.wait_readable(sock)
        try:
            return os.read(fd, READ_SIZE)
        except BlockingIOError:
            continue


def write_now(fd: int, data: bytes | bytearray | memoryview) -> int:
    """Write what the socket takes at once; how many bytes that was (0 if none). An
    OSError other than a full buffer propagates."""
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0


class Outbox:
    def __init__(
        self,
        stream: trio.abc.SendStream,
        *,
        limit: int,
        name: str,
        write_timeout: float = math.inf,
        on_congestion: Callable[[str | None], None] | None = None,
        memory: ClientMemory | None = None,
    ) -> None:
        self.stream = stream
        self.limit = limit
        self.name = name
        self.write_timeout = write_timeout
        self.on_congestion = on_congestion
        fileno = getattr(stream, "fileno", None)
        self._fd: int | None = fileno() if fileno is not None else None
        self._buffer = bytearray()
        # Into a pipe to a network server's connection: each message waiting, with its size
        # in ``_buffer``, written with its line (``PipeSend.send_messages``).
        self._pipe = stream if isinstance(stream, PipeSend) else None
        self._messages: list[tuple[Any, int]] = []
        self._has_data = trio.lowlevel.ParkingLot()
        self._has_room = trio.lowlevel.ParkingLot()
        self._idle = trio.lowlevel.ParkingLot()
        self._send_began = trio.lowlevel.ParkingLot()
        self._send_ended = trio.lowlevel.ParkingLot()
        self._sending = False
        self._sending_since: float | None = None
        self._sends = 0  # writes the writer task has started
        self.over = False  # more than ``limit`` bytes waiting
        self.stalled = False  # a write has waited longer than ``write_timeout``
        self._reported: str | None = None
        self.dropped = 0  # notifications dropped while congested
        self.closed = False
        self.dirty = False  # queued since the last flush (the hub's bookkeeping)
        self.memory = memory if memory is not None else ClientMemory()
        self.held = 0  # bytes waiting or being written, as counted in ``memory``
        self.written = 0  # bytes written to the stream, in all
        self.progress_at = trio.current_time()  # when a write to it last took bytes

    # --- producers ----------------------------------------------------------------------

    def put_message(self, message: Any, related: Any = None) -> None:
        """Queue one JSON-RPC message (a dict, or bytes already serialized) as one line.

        ``related`` (the client request a message belongs to) means nothing on a stream.
        """
        if self.closed:
            return
        if (self.over or self.stalled) and type(message) is dict and "id" not in message:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10000 == 0:
                log.warning("%s: dropped %d notification(s): it is not keeping up", self.name, self.dropped)
            return
        data = message if type(message) is bytes else dumps(message)
        buffer = self._buffer
        buffer += data
        buffer += b"\n"
        size = len(data) + 1
        if self._pipe is not None:
            self._messages.append((message, size))
        if not self.held:  # it had nothing waiting: it is not stalled yet
            self.progress_at = trio.current_time()
        self.held += size
        memory = self.memory
        memory.total += size
        if len(buffer) > self.limit and not self.over and len(buffer) > size:
            self.over = True
            self._report()
        if memory.total > memory.limit:
            memory.exceeded()

    def flush(self) -> None:
        """Start writing what is queued: directly if possible, else by the writer task."""
        self.dirty = False
        if not self._buffer or self.closed:
            return
        if self._fd is None or self._sending:
            self._has_data.unpark_all()
            return
        buffer = self._buffer
        try:
            written = os.write(self._fd, buffer)
        except BlockingIOError:
            written = 0
        except OSError as exc:  # EPIPE and friends: the reader is gone
            log.debug("%s: stream closed while writing: %r", self.name, exc)
            self._close()
            return
        self.held -= written
        self.written += written
        self.memory.total -= written
        if written:
            self.progress_at = trio.current_time()
        if written == len(buffer):
            buffer.clear()
        else:
            del buffer[:written]
            self._has_data.unpark_all()
        if self.over and len(buffer) <= self.limit:
            self.over = False
            self._report()

    @property
    def waiting(self) -> int:
        """Bytes queued and not yet handed to a write."""
        return len(self._buffer)

    async def wait_writable(self) -> None:
        """For this connection's own reader: wait while more than half the budget waits."""
        while len(self._buffer) > self.limit // 2 and not self.closed:
            await self._has_room.park()

    async def wait_drained(self) -> None:
        """Wait until everything queued so far has been written (or the stream broke)."""
        self.flush()
        while (self._buffer or self._sending) and not self.closed:
            await self._idle.park()

    def abort(self) -> None:
        """Forget what is queued and take nothing more (its reader is being dropped)."""
        self._close()

    def blocked(self) -> bool:
        """Whether a write is waiting for its party to read."""
        return self._sending and cannot_take_more(self._fd)

    def last_progress(self) -> float:
        """When a write to it last took bytes."""
        return self.progress_at

    def _progressed(self) -> None:
        self.progress_at = trio.current_time()

    def request_ended(self, id: Any) -> None:
        """Nothing to end: one byte stream carries every answer (``ClientSink``)."""

    def shed(self, reason: str) -> None:
        """Drop this queue's party to free memory: its owner hears ``reason`` as it hears
        congestion (a client is dropped), and everything queued is forgotten."""
        if self.closed:
            return
        self._reported = reason
        if self.on_congestion is not None:
            self.on_congestion(reason)
        self._close()

    # --- the writer ---------------------------------------------------------------------

    async def run(self) -> None:
        """The writer task: send what ``flush`` could not, until the stream breaks."""
        try:
            async with trio.open_nursery() as nursery:
                if self.write_timeout < math.inf:
                    nursery.start_soon(self._watch)
                await self._write()
                nursery.cancel_scope.cancel()
        finally:
            self._close()

    async def _write(self) -> None:
        while True:
            while not self._buffer:
                self._idle.unpark_all()
                if self.closed:
                    return
                await self._has_data.park()
            data, self._buffer = self._buffer, bytearray()
            messages, self._messages = self._messages, []
            self._sending = True
            self._sending_since = trio.current_time()
            self._sends += 1
            self._send_began.unpark_all()
            self._has_room.unpark_all()
            if self.over and not self._buffer:
                self.over = False
                self._report()
            try:
                if self._pipe is not None:
                    await self._pipe.send_messages(data, messages)
                else:
                    await send_in_steps(self.stream, data, self._progressed)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                log.debug("%s: stream closed while writing: %r", self.name, exc)
                return
            self.held -= len(data)
            self.written += len(data)
            self.memory.total -= len(data)
            self.progress_at = trio.current_time()
            del data, messages
            self._sending = False
            self._sending_since = None
            self._send_ended.unpark_all()
            if self.stalled:
                self.stalled = False
                self._report()

    async def _watch(self) -> None:
        """Notice a write that takes longer than ``write_timeout`` (without cancelling it:
        a server's stdin must never get half a message)."""
        while True:
            since = self._sending_since
            if since is None:
                await self._send_began.park()
                continue
            sends = self._sends
            await trio.sleep_until(since + self.write_timeout)
            if self._sends == sends and self._sending_since is not None:
                self.stalled = True
                self._report()
                while self._sends == sends and self._sending_since is not None:
                    await self._send_ended.park()

    def _report(self) -> None:
        if self.stalled:
            reason: str | None = f"it has read nothing for {self.write_timeout:g}s"
        elif self.over:
            reason = f"more than {self.limit} bytes are waiting for it"
        else:
            reason = None
        if reason != self._reported:
            self._reported = reason
            if self.on_congestion is not None and not self.closed:
                self.on_congestion(reason)

    def _close(self) -> None:
        self.closed = True
        self._buffer = bytearray()
        self._messages = []
        release_all(self)
        self._sending = False
        self._has_room.unpark_all()
        self._idle.unpark_all()
        self._has_data.unpark_all()
        self._send_ended.unpark_all()


class MessageLog:
    __slots__ = ("_data", "_ends", "_head", "_base", "first", "last", "sent", "keep")

    def __init__(self, keep: int = 0) -> None:
        self._data = bytearray()
        # Where each stored message ends, as an offset in the stream of every byte ever
        # appended; _ends[_head] belongs to message ``first``. _base is the offset of _data[0].
        self._ends = array("q")
        self._head = 0
        self._base = 0
        self.first = 1  # the oldest message still stored
        self.last = 0  # the newest message (0: none yet)
        self.sent = 0  # every message up to this one has been taken
        self.keep = keep

    def append(self, message: bytes) -> None:
        self._data += message
        self._ends.append(self._base + len(self._data))
        self.last += 1

    @property
    def waiting(self) -> int:
        """How many messages are waiting to be taken."""
        return self.last - self.sent

    @property
    def waiting_bytes(self) -> int:
        return self._end_of(self.last) - self._end_of(self.sent)

    @property
    def retained_bytes(self) -> int:
        """What the stored messages (waiting and history) cost."""
        return len(self._data)

    def _end_of(self, number: int) -> int:
        if number < self.first:
            return self._base
        return self._ends[self._head + number - self.first]

    def _slice(self, start: int, end: int) -> bytes:
        with memoryview(self._data) as view:
            return bytes(view[start - self._base : end - self._base])

    def take(self) -> bytes:
        """The oldest waiting message (there must be one)."""
        number = self.sent + 1
        data = self._slice(self._end_of(number - 1), self._end_of(number))
        self.sent = number
        self._trim()
        return data

    def take_all(self) -> list[bytes]:
        """Every waiting message, oldest first."""
        out = self._waiting_copies()
        self.sent = self.last
        self._trim()
        return out

    def take_all_framed(self, prefix: Callable[[int, int], bytes], suffix: bytes = b"") -> tuple[bytearray, int]:
        """Every waiting message, each between ``prefix(number, length)`` and ``suffix``, in
        one buffer built with one copy of each; and how many bytes the messages had."""
        out = bytearray()
        base = self._base
        start = first = self._end_of(self.sent)
        number = self.sent + 1
        ends = self._ends
        with memoryview(self._data) as view:
            for index in range(self._head + self.sent + 1 - self.first, self._head + self.last + 1 - self.first):
                end = ends[index]
                out += prefix(number, end - start)
                out += view[start - base : end - base]
                out += suffix
                start = end
                number += 1
        self.sent = self.last
        self._trim()
        return out, start - first

    def remove_waiting(self) -> list[bytes]:
        """Take the waiting messages out as if they had never come (not into history)."""
        out = self._waiting_copies()
        del self._data[self._end_of(self.sent) - self._base :]
        del self._ends[self._head + self.sent + 1 - self.first :]
        self.last = self.sent
        return out

    def _waiting_copies(self) -> list[bytes]:
        out = []
        base = self._base
        start = self._end_of(self.sent)
        with memoryview(self._data) as view:
            for index in range(self._head + self.sent + 1 - self.first, self._head + self.last + 1 - self.first):
                end = self._ends[index]
                out.append(bytes(view[start - base : end - base]))
                start = end
        return out

    def history(self, after: int) -> list[tuple[int, bytes]]:
        """The messages already taken, numbered, from the one after ``after`` on."""
        return [
            (number, self._slice(self._end_of(number - 1), self._end_of(number)))
            for number in range(max(after + 1, self.first), self.sent + 1)
        ]

    def drop_oldest(self, limit: int) -> int:
        """Forget the oldest messages, waiting or not, until at most ``limit`` bytes are
        stored (a ring buffer); return how many were dropped."""
        dropped = 0
        while self.first <= self.last and len(self._data) > limit:
            self._forget_first()
            dropped += 1
        if self.sent < self.first - 1:
            self.sent = self.first - 1
        return dropped

    def _trim(self) -> None:
        keep = self.keep
        while self.first <= self.sent and self._end_of(self.sent) - self._base > keep:
            if keep and self.first == self.sent:
                break
            self._forget_first()

    def _forget_first(self) -> None:
        end = self._ends[self._head]
        del self._data[: end - self._base]
        self._base = end
        self._head += 1
        self.first += 1
        if self._head > 1024 and self._head * 2 > len(self._ends):
            del self._ends[: self._head]
            self._head = 0

    def clear(self) -> None:
        """Forget everything stored; numbering goes on."""
        self._data = bytearray()
        self._ends = array("q")
        self._head = 0
        self._base = 0
        self.first = self.last + 1
        self.sent = self.last
