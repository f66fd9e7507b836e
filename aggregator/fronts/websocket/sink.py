"""What a WebSocket session sends: ``WebSocketSink``, a hub client whose messages become
text frames, and the writer that sends every waiting frame in one write.

Like an Outbox, what waits has a byte budget and every write a deadline; past either the
connection ends. The frames are built straight from the queue when no extension is
negotiated, through trio-websocket's own state otherwise (``_frame_writer``).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio
import trio_websocket
from wsproto.connection import ConnectionState
from wsproto.events import TextMessage
from wsproto.utilities import LocalProtocolError

from aggregator.jsonrpc.codec import dumps
from aggregator.transports.budget import ClientMemory, release_all
from aggregator.transports.outbox import MessageLog, cannot_take_more, fd_of, send_in_steps


class WebSocketSink:
    """A hub client whose messages become text frames, sent by one writer task.

    Like an Outbox: what waits is stored compactly and has a byte budget
    (``proxy.client_buffer_bytes``); every write has a deadline
    (``proxy.client_write_timeout``). Past either, ``on_drop`` ends the connection (its
    requests are cancelled upstream when the handler removes the client). Only the
    connection's own reader waits on it (``wait_writable``). What waits and what is being
    written count in ``held`` and in the budget of all clients (``memory``).
    """

    def __init__(
        self,
        limit: int,
        write_timeout: float = math.inf,
        on_drop: Callable[[str], None] | None = None,
        memory: ClientMemory | None = None,
    ) -> None:
        self.messages = MessageLog()
        self.limit = limit
        self.write_timeout = write_timeout
        self.on_drop = on_drop
        self.memory = memory if memory is not None else ClientMemory()
        self.held = 0
        self.progress_at = trio.current_time()  # when a write to it last finished
        self.dirty = False
        self.closed = False
        self._writing = False
        self._fd: int | None = None
        self._lot = trio.lowlevel.ParkingLot()
        self._room = trio.lowlevel.ParkingLot()

    def put_message(self, message: Any, related: Any = None) -> None:
        if self.closed:
            return
        data = message if type(message) is bytes else dumps(message)
        messages = self.messages
        messages.append(data)
        size = len(data)
        if not self.held:  # it had nothing waiting: it is not stalled yet
            self.progress_at = trio.current_time()
        self.held += size
        memory = self.memory
        memory.total += size
        if messages.retained_bytes > self.limit and messages.retained_bytes > size:
            self.drop(f"more than {self.limit} bytes are waiting for it")
        if memory.total > memory.limit:
            memory.exceeded()

    def flush(self) -> None:
        self.dirty = False
        if self.messages.last != self.messages.sent:
            self._lot.unpark_all()

    async def wait_writable(self) -> None:
        """For this connection's own reader: wait while more than half the budget waits."""
        while self.messages.retained_bytes > self.limit // 2 and not self.closed:
            await self._room.park()

    def drop(self, reason: str) -> None:
        """Forget what waits and end the connection."""
        if self.closed:
            return
        self.close()
        if self.on_drop is not None:
            self.on_drop(reason)

    shed = drop  # the budget of all clients is past, and this one is the first to go

    def request_ended(self, id: Any) -> None:
        """Nothing to end: one connection carries every answer (``ClientSink``)."""

    def blocked(self) -> bool:
        """Whether a write is waiting for the client to read."""
        return self._writing and cannot_take_more(self._fd)

    def last_progress(self) -> float:
        """When a write to it last finished."""
        return self.progress_at

    async def wait_drained(self) -> None:
        """Returns at once: at shutdown nothing waits for a WebSocket's writer."""
        return

    def close(self) -> None:
        """Forget what waits and take nothing more (the connection ended)."""
        self.closed = True
        self.messages.clear()
        release_all(self)
        self._lot.unpark_all()
        self._room.unpark_all()

    def _progressed(self) -> None:
        self.progress_at = trio.current_time()

    async def run(self, socket: trio_websocket.WebSocketConnection) -> None:
        send = _frame_writer(socket, self._progressed)
        self._fd = fd_of(getattr(socket, "_stream", None))
        while not self.closed:
            if self.messages.last == self.messages.sent:
                await self._lot.park()
                continue
            # Every frame that waits goes in one write: a client that reads promptly
            # keeps up with any burst (one write per frame would yield to the busy
            # producer after every message, and fall behind).
            size = self.messages.waiting_bytes
            self._writing = True
            with trio.move_on_after(self.write_timeout) as scope:
                try:
                    await send(self.messages, self._room.unpark_all)
                except trio_websocket.ConnectionClosed:
                    return
                finally:
                    self._writing = False
                    self.held -= size
                    self.memory.total -= size
                    self.progress_at = trio.current_time()
            if scope.cancelled_caught:
                self.drop(f"a write did not finish within {self.write_timeout:g}s")
                return


def _text_frame_head(number: int, length: int) -> bytes:
    """The head of an unmasked, final text frame (RFC 6455 5.2) of ``length`` bytes."""
    if length < 126:
        return struct.pack("!BB", 0x81, length)
    if length < 65536:
        return struct.pack("!BBH", 0x81, 126, length)
    return struct.pack("!BBQ", 0x81, 127, length)


async def _one_by_one(
    socket: trio_websocket.WebSocketConnection, messages: MessageLog, taken: Callable[[], object]
) -> None:
    """Send every waiting message with trio-websocket's public call, one frame at a time."""
    batch = messages.take_all()
    taken()
    while batch:
        await socket.send_message(batch.pop(0).decode("utf-8"))


def _frame_writer(
    socket: trio_websocket.WebSocketConnection,
    progressed: Callable[[], None],
) -> Callable[[MessageLog, Callable[[], object]], Awaitable[None]]:
    """How to send every waiting message, as text frames, in one write on this connection.

    trio-websocket has no public call for that, so this writes under its send lock, as its
    ``send_message`` does for one message. With no extension negotiated (trio-websocket
    offers none) a server's text frame is a head and the message's bytes, so the frames
    are built straight from the queue in one copy (through wsproto, each message would be
    copied four times more: decoded, encoded, framed, joined); otherwise they are built by
    the connection's own wsproto state. Should trio-websocket's internals ever change, it
    falls back to one ``send_message`` per frame (correct, only slower). ``taken`` is
    called once the messages are out of the queue.
    """
    protocol = getattr(socket, "_wsproto", None)
    stream = getattr(socket, "_stream", None)
    lock = getattr(socket, "_stream_lock", None)
    if protocol is None or stream is None or lock is None or not hasattr(protocol, "send"):
        return partial(_one_by_one, socket)

    def plain() -> bool:
        connection = getattr(protocol, "connection", None)
        frames = getattr(connection, "_proto", None)
        return (
            frames is not None
            and not getattr(frames, "extensions", True)
            and getattr(frames, "_outbound_opcode", True) is None
            and not protocol.client
        )

    async def together(messages: MessageLog, taken: Callable[[], object]) -> None:
        if socket.closed is not None:
            raise trio_websocket.ConnectionClosed(socket.closed)
        if protocol.state is not ConnectionState.OPEN:  # closing
            raise trio_websocket.ConnectionClosed(socket.closed)
        data: bytes | bytearray
        if plain():
            data = messages.take_all_framed(_text_frame_head)[0]
        else:
            batch = messages.take_all()
            try:
                data = b"".join(protocol.send(TextMessage(data=item.decode("utf-8"))) for item in batch)
            except LocalProtocolError:  # the connection is closing
                raise trio_websocket.ConnectionClosed(socket.closed) from None
            del batch
        taken()
        async with lock:
            try:
                await send_in_steps(stream, data, progressed)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise trio_websocket.ConnectionClosed(socket.closed) from None

    return together
