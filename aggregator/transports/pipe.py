"""An in-memory byte pipe: a trio SendStream and ReceiveStream joined by a bounded queue.

It lets a message-oriented transport (HTTP, SSE, WebSocket) look like the NDJSON byte
stream an upstream session reads and writes, so the session has one shape whatever the
transport. Bounded: a writer waits while the reader is behind.
"""

from __future__ import annotations

import trio


class PipeEnd(trio.abc.SendStream, trio.abc.ReceiveStream):
    def __init__(self, send: trio.MemorySendChannel[bytes], receive: trio.MemoryReceiveChannel[bytes]) -> None:
        self._send = send
        self._receive = receive
        self._pending = b""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            try:
                await self._send.send(bytes(data))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                raise trio.BrokenResourceError("the other end of the pipe is closed") from None

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

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
        await self._send.aclose()
        await self._receive.aclose()


def byte_pipe(capacity: int = 64) -> tuple[PipeEnd, PipeEnd]:
    """Two connected ends: what one sends, the other receives."""
    a_send, b_receive = trio.open_memory_channel[bytes](capacity)
    b_send, a_receive = trio.open_memory_channel[bytes](capacity)
    return PipeEnd(a_send, a_receive), PipeEnd(b_send, b_receive)
