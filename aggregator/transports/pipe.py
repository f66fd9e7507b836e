"""An in-memory pipe of messages, one way: what an upstream session writes to a network server.

The session's ``Outbox`` queues lines whatever the transport (its budget and deadline are
the same for every server). Into this pipe it writes each line together with the message
it encodes (``send_messages``), so the server's connection (``upstreams.network_link``),
reading off the other end, has both: the line to send as it is, the message to read what
it needs (its method, its id, its ``_meta``) without decoding what was just encoded.
Bounded: a writer waits while the reader is behind.
"""

from __future__ import annotations

from typing import Any

import trio

# A message written to a network server, as (message, line): ``line`` its encoding (no
# newline); ``message`` what the router said to send (a dict, or bytes it had already).
Outgoing = tuple[Any, bytes]


class PipeSend(trio.abc.SendStream):
    """The session's end. An ``Outbox`` writes whole messages with ``send_messages``;
    ``send_all`` takes bytes of whole lines too (their messages read back from them)."""

    def __init__(self, send: trio.MemorySendChannel[list[Outgoing]]) -> None:
        self._send = send

    async def send_messages(self, data: bytes | bytearray, messages: list[tuple[Any, int]]) -> None:
        """Send ``messages``, each with its size in ``data`` (the lines they were queued
        as, one after another, each with its newline)."""
        view = memoryview(data)
        batch: list[Outgoing] = []
        start = 0
        for message, size in messages:
            batch.append((message, bytes(view[start : start + size - 1])))
            start += size
        await self._put(batch)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        lines = bytes(data).split(b"\n")
        await self._put([(line, line) for line in lines if line.strip()])

    async def _put(self, batch: list[Outgoing]) -> None:
        if batch:
            try:
                await self._send.send(batch)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                raise trio.BrokenResourceError("the other end of the pipe is closed") from None

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await self._send.aclose()


class PipeReceive:
    """The connection's end: what the session wrote, a batch at a time."""

    def __init__(self, receive: trio.MemoryReceiveChannel[list[Outgoing]]) -> None:
        self._receive = receive

    async def receive(self) -> list[Outgoing]:
        """The next batch of messages; empty once the session closed its end."""
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError, trio.BrokenResourceError):
            return []

    async def aclose(self) -> None:
        await self._receive.aclose()


def message_pipe(capacity: int = 64) -> tuple[PipeSend, PipeReceive]:
    """Two connected ends: what is sent to the first, the second receives."""
    send, receive = trio.open_memory_channel[list[Outgoing]](capacity)
    return PipeSend(send), PipeReceive(receive)
