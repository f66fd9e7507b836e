"""An in-memory byte pipe, one way: a trio SendStream and ReceiveStream joined by a bounded queue.

What an upstream session writes to a network server goes through one: the session's
``Outbox`` writes lines to a byte stream whatever the transport (its budget and deadline
are the same for every server), and the server's connection reads them off the other end
(``upstreams.network_link``). Bounded: a writer waits while the reader is behind.
"""

from __future__ import annotations

import trio


class PipeSend(trio.abc.SendStream):
    def __init__(self, send: trio.MemorySendChannel[bytes]) -> None:
        self._send = send

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            try:
                await self._send.send(bytes(data))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                raise trio.BrokenResourceError("the other end of the pipe is closed") from None

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await self._send.aclose()


class PipeReceive(trio.abc.ReceiveStream):
    def __init__(self, receive: trio.MemoryReceiveChannel[bytes]) -> None:
        self._receive = receive
        self._pending = b""

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if not self._pending:
            try:
                self._pending = await self._receive.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError, trio.BrokenResourceError):
                return b""
        else:
            await trio.lowlevel.checkpoint()
        if max_bytes is None or max_bytes >= len(self._pending):
            data, self._pending = self._pending, b""
        else:
            data, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return data

    async def aclose(self) -> None:
        await self._receive.aclose()


def byte_pipe(capacity: int = 64) -> tuple[PipeSend, PipeReceive]:
    """Two connected ends: what is sent to the first, the second receives."""
    send, receive = trio.open_memory_channel[bytes](capacity)
    return PipeSend(send), PipeReceive(receive)
