"""Reading and writing a trio socket directly, for the HTTP server and client connections.

A connection that answers one request at a time waits for its peer before every read:
trio's ``receive_some`` would first try a read that finds nothing, then wait. And most
writes fit in the socket's buffer: ``send_all``'s machinery is only needed for what does
not. These two do the common case with one system call each; the callers fall back to the
stream's own methods for the rest.
"""

from __future__ import annotations

import os

import trio

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
