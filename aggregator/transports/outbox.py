"""A write queue in front of one byte stream, drained by one writer task.

Producers (reader tasks running the sans-IO router) call ``put`` synchronously, so a batch
of messages decoded from one read becomes one ``send_all``: when a pipe delivers sixteen
requests at once, the upstream gets one write, not sixteen. Order is preserved. The
queue is bounded in bytes: past ``limit`` a producer awaits ``wait_writable`` before it
reads more (backpressure), so a slow reader can never make the proxy buffer without end.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from aggregator.jsonrpc.codec import dumps

log = logging.getLogger(__name__)


class Outbox:
    def __init__(self, stream: trio.abc.SendStream, *, limit: int, name: str) -> None:
        self.stream = stream
        self.limit = limit
        self.name = name
        self._chunks: list[bytes] = []
        self._size = 0
        self._has_data = trio.lowlevel.ParkingLot()
        self._has_room = trio.lowlevel.ParkingLot()
        self._idle = trio.lowlevel.ParkingLot()
        self._sending = False
        self.closed = False

    def put_message(self, message: Any) -> None:
        """Queue one JSON-RPC message (a dict, or bytes already serialized) as one line."""
        data = message if type(message) is bytes else dumps(message)
        self.put(data + b"\n")

    def put(self, data: bytes) -> None:
        if self.closed:
            return
        self._chunks.append(data)
        self._size += len(data)
        self._has_data.unpark_all()

    @property
    def over_limit(self) -> bool:
        return self._size > self.limit

    async def wait_writable(self) -> None:
        while self._size > self.limit and not self.closed:
            await self._has_room.park()

    async def wait_drained(self) -> None:
        """Wait until everything queued so far has been written (or the stream broke)."""
        while (self._chunks or self._sending) and not self.closed:
            await self._idle.park()

    async def run(self) -> None:
        """The writer task: send queued bytes until the stream breaks or is cancelled."""
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
            self.closed = True
            self._chunks = []
            self._size = 0
            self._sending = False
            self._has_room.unpark_all()
            self._idle.unpark_all()
