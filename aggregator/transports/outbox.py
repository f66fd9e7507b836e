"""A write queue in front of one byte stream.

Producers (reader tasks running the sans-IO router) call ``put`` synchronously while they
work through one read's worth of messages, then ``flush`` once: so a batch of messages
decoded from one read becomes one write per destination, not one per message. When the
stream has a file descriptor and nothing is being written, ``flush`` writes directly
(non-blocking) from the producer's task: no task switch on the hot path. Whatever the
pipe does not take at once is left to the writer task (``run``), which waits for room.
Order is preserved either way: a direct write happens only when the writer holds nothing.

The queue is bounded in bytes: past ``limit`` a producer awaits ``wait_writable`` before
it reads more (backpressure), so a slow reader never makes the proxy buffer without end.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import trio

from aggregator.jsonrpc.codec import dumps

log = logging.getLogger(__name__)


class Outbox:
    def __init__(self, stream: trio.abc.SendStream, *, limit: int, name: str) -> None:
        self.stream = stream
        self.limit = limit
        self.name = name
        fileno = getattr(stream, "fileno", None)
        self._fd: int | None = fileno() if fileno is not None else None
        self._chunks: list[bytes] = []
        self._size = 0
        self._has_data = trio.lowlevel.ParkingLot()
        self._has_room = trio.lowlevel.ParkingLot()
        self._idle = trio.lowlevel.ParkingLot()
        self._sending = False
        self.closed = False
        self.dirty = False  # queued since the last flush (the hub's bookkeeping)

    def put_message(self, message: Any, related: Any = None) -> None:
        """Queue one JSON-RPC message (a dict, or bytes already serialized) as one line.

        ``related`` (the client request a message belongs to) means nothing on a stream.
        """
        if self.closed:
            return
        data = message if type(message) is bytes else dumps(message)
        self._chunks.append(data)
        self._chunks.append(b"\n")
        self._size += len(data) + 1

    def flush(self) -> None:
        """Start writing what is queued: directly if possible, else by the writer task."""
        self.dirty = False
        if not self._chunks or self.closed:
            return
        if self._fd is None or self._sending:
            self._has_data.unpark_all()
            return
        chunks, self._chunks = self._chunks, []
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        try:
            written = os.write(self._fd, data)
        except BlockingIOError:
            written = 0
        except OSError as exc:  # EPIPE and friends: the reader is gone
            log.debug("%s: stream closed while writing: %r", self.name, exc)
            self._close()
            return
        if written < len(data):
            self._chunks = [data[written:]]
            self._size = len(data) - written
            self._has_data.unpark_all()
        else:
            self._size = 0

    @property
    def over_limit(self) -> bool:
        return self._size > self.limit

    async def wait_writable(self) -> None:
        while self._size > self.limit and not self.closed:
            await self._has_room.park()

    async def wait_drained(self) -> None:
        """Wait until everything queued so far has been written (or the stream broke)."""
        self.flush()
        while (self._chunks or self._sending) and not self.closed:
            await self._idle.park()

    async def run(self) -> None:
        """The writer task: send what ``flush`` could not, until the stream breaks."""
        try:
            while True:
                while not self._chunks:
                    self._idle.unpark_all()
                    await self._has_data.park()
                chunks, self._chunks = self._chunks, []
                self._size = 0
                self._has_room.unpark_all()
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                self._sending = True
                await self.stream.send_all(data)
                self._sending = False
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("%s: stream closed while writing: %r", self.name, exc)
        finally:
            self._close()

    def _close(self) -> None:
        self.closed = True
        self._chunks = []
        self._size = 0
        self._sending = False
        self._has_room.unpark_all()
        self._idle.unpark_all()
        self._has_data.unpark_all()
