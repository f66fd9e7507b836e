"""HTTP/1.1 bytes the fronts write without a connection object: a refusal of a connection
over the cap, status lines, and one Server-Sent Event."""

from __future__ import annotations

from http import HTTPStatus

import trio

READ_SIZE = 65536
# What a connection over the cap gets before it is closed: small enough for any socket buffer.
_BUSY_BODY = b"too many connections; try again in a moment\n"
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


async def refuse_connection(stream: trio.abc.Stream) -> None:
    """Answer a connection over the cap with 503 and close it, parsing nothing it sends.

    What the client already sent is read and dropped for a moment (64 KiB, 0.1 s at most):
    closing on unread input makes the kernel send a reset, which would discard the 503."""
    with trio.move_on_after(0.1):  # fits in any socket buffer; a client that does not read is not waited for
        try:
            await stream.send_all(BUSY_RESPONSE)
            send_eof = getattr(stream, "send_eof", None)
            if send_eof is not None:
                await send_eof()
            discarded = 0
            while discarded < 65536:
                data = await stream.receive_some(READ_SIZE)
                if not data:
                    break
                discarded += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
    await trio.aclose_forcefully(stream)


def status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


STATUS_LINES = {status.value: status_line(status.value) for status in HTTPStatus}


def sse_event(data: bytes, event_id: str | None = None) -> bytes:
    """One SSE event carrying one JSON-RPC message (which never holds a raw newline)."""
    head = f"id: {event_id}\n".encode() if event_id is not None else b""
    return head + b"event: message\ndata: " + data + b"\n\n"
