"""HTTP/1.1 server connections: the connection loop over ``http_parse``'s request reader.

One ``HttpConnection`` per TCP connection. It reads one request at a time (pipelined ones
wait their turn, parsed) and answers with a whole response, written in one send, or a
stream of Server-Sent Events (chunked). Everything the parser or the socket can raise is
turned into one of three outcomes at this edge: a request, an error response already sent
(400, 408, 413, 431, 501), or the end of the connection. Nothing above this module sees
the parser.

Deadlines are totals, never reset by a byte that arrives (a client dripping one byte a
second must not hold a connection for ever): a request's headers are due
``header_timeout`` after its first byte (after the connection opened, for the first
request), its body ``body_timeout`` after the headers; between requests a keep-alive
connection may stay idle for ``keepalive_timeout``.

Writes are made by the one task that handles the connection; ``watch_disconnect`` may
read at the same time (to notice a client that goes away while its answer is pending)
and feeds whatever it reads to the parser, so pipelined requests are not lost. A write
is first tried on the socket directly; only what the kernel does not take at once is
waited for, under ``write_timeout``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import trio

from aggregator.transports.http_parse import Refusal, Request, RequestReader
from aggregator.transports.http_wire import BUSY_RESPONSE, STATUS_LINES, refuse_connection, sse_event, status_line
from aggregator.transports.outbox import cannot_take_more, fd_of, send_in_steps
from aggregator.transports.socket_io import READ_SIZE, read_when_ready, write_now

log = logging.getLogger(__name__)

__all__ = ["BUSY_RESPONSE", "HttpConnection", "HttpLimits", "Request", "refuse_connection", "sse_event"]

LARGE = 65536  # a body longer than this is written without being copied into one buffer
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_STREAM_HEADERS = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
# Where a connection is in answering its request.
_NO_REQUEST, _UNANSWERED, _STREAMING, _ANSWERED = range(4)
# What a read waits for: the next request's first byte, the rest of its head, its body.
_IDLE, _HEAD, _BODY = range(3)


class HttpLimits(NamedTuple):
    max_body: int
    max_header: int
    header_timeout: float
    body_timeout: float = 30.0
    write_timeout: float = 30.0
    keepalive_timeout: float = 30.0


class HttpConnection:
    def __init__(self, stream: trio.abc.Stream, limits: HttpLimits) -> None:
        self.progressed_at = trio.current_time()  # when a write last got bytes out
        self.stream = stream
        self.limits = limits
        self.reader = RequestReader(limits.max_body, limits.max_header)
        self.closed = False
        self.requests = 0  # requests read so far on this connection
        self.head = False  # the request being answered is a HEAD: its response has no body
        self._write: trio.CancelScope | None = None  # the write in progress
        self._fd = fd_of(stream)
        self.aborted = False
        self._phase = _NO_REQUEST
        self._keep_alive = True  # of the request being answered
        self._chunked = True  # whether its client reads chunked bodies (HTTP/1.1)
        self._eof = False  # the client closed its side
        self._deadlines: trio.CancelScope | None = None  # what serve() reads under
        self._reading = _HEAD  # what the read in progress waits for
        self._timeouts = {_IDLE: limits.keepalive_timeout, _HEAD: limits.header_timeout, _BODY: limits.body_timeout}
        self.current: Request | None = None  # the request being handled (by serve())
        # Reads go straight to the socket when there is one (see _receive).
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) and self._fd is not None else None

    # --- reading ------------------------------------------------------------------------

    async def serve(self, handle: Callable[[Request], Awaitable[None]]) -> None:
        """Read requests and ``handle`` each, in turn, while the connection lasts.

        One cancel scope serves every read's deadline (moved, not made anew, per read)."""
        scope = self._deadlines = trio.CancelScope()
        with scope:
            while True:
                request = await self.next_request()
                if request is None:
                    return
                self.current = request
                await handle(request)
                if not self.next_cycle():
                    return
        if scope.cancelled_caught:
            await self._late(self._reading)

    async def next_request(self) -> Request | None:
        """The next complete request, or None when the connection is over."""
        reader = self.reader
        # The first request is due from the connection's opening; a later one may wait
        # keepalive_timeout for its first byte, then has header_timeout for its head, then
        # body_timeout for its body.
        self._reading = _IDLE if self.requests > 0 and not reader.in_message else _HEAD
        if reader.head_complete:
            self._reading = _BODY
        deadline: float | None = None
        continued = False
        while not reader.ready:
            if reader.finished:
                return None
            reading = self._reading
            if deadline is None:
                deadline = trio.current_time() + self._timeouts[reading]
            if reading == _BODY and reader.expects_continue and not continued:
                continued = True  # the client waits to be told to send its body
                if not await self._send_bytes(_CONTINUE):
                    return None
            if self._deadlines is not None:
                self._deadlines.deadline = deadline
                data = await self._receive()
            else:
                data = None
                with trio.move_on_at(deadline):
                    data = await self._receive()
                if data is None:
                    await self._late(reading)
                    return None
            if not data:
                self._eof = True
                reader.end()
                continue
            reader.feed(data)
            if reading == _IDLE:
                self._reading = _HEAD
                deadline = None
            if self._reading == _HEAD and reader.head_complete:
                self._reading = _BODY
                deadline = None
        if self._deadlines is not None:
            self._deadlines.deadline = math.inf
        item = reader.ready.popleft()
        if type(item) is Refusal:
            await self.respond_error(item.status, item.reason)
            return None
        assert type(item) is Request
        self.requests += 1
        self.head = item.head_only
        self._keep_alive = item.keep_alive
        self._chunked = item.version11
        self._phase = _UNANSWERED
        return item

    async def _receive(self) -> bytes | bytearray:
        """What the client sent next (b"" when it closed its side or the connection broke)."""
        sock = self._socket
        try:
            if sock is None:
                return await self.stream.receive_some(READ_SIZE)
            return await read_when_ready(sock, self._fd)  # type: ignore[arg-type]
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return b""

    async def _late(self, reading: int) -> None:
        """A read's deadline passed: answer 408 to a body that stalled, drop the rest."""
        if reading == _BODY:
            await self.respond_error(408, f"request body not complete within {self.limits.body_timeout:g}s")
        elif reading == _HEAD:
            log.debug("http: closed a connection whose request headers took over %gs", self.limits.header_timeout)

    async def watch_disconnect(self) -> None:
        """Return when the client closes its side (or the connection breaks)."""
        buffered = 0
        while True:
            data = await self._receive()
            if not data:
                self._eof = True
                self.reader.end()
                return
            self.reader.feed(data)
            buffered += len(data)
            if buffered > self.limits.max_body + self.limits.max_header:
                await trio.sleep_forever()  # enough pipelined input held; stop reading

    def next_cycle(self) -> bool:
        """Prepare for the next request on this connection; False if it cannot be reused."""
        if self.closed or self._phase != _ANSWERED or not self._keep_alive:
            return False
        self._phase = _NO_REQUEST
        self.current = None
        return True

    # --- writing ------------------------------------------------------------------------

    async def _send_bytes(self, data: bytes | bytearray | memoryview, *more: bytes | bytearray) -> bool:
        """Write ``data`` (and ``more``, not copied into it): directly while the socket
        takes it, then waiting (at most ``write_timeout``) for a client that reads."""
        if self.closed:
            return False
        fd = self._fd
        if fd is not None and not more and self._write is None:
            try:
                sent = write_now(fd, data)
            except OSError:
                self.closed = True
                return False
            if sent == len(data):
                self.progressed_at = trio.current_time()
                return True
            if sent:
                data = memoryview(data)[sent:]
        try:
            with trio.move_on_after(self.limits.write_timeout) as scope:
                self._write = scope
                try:
                    for part in (data, *more):
                        await send_in_steps(self.stream, part, self._progressed)
                finally:
                    self._write = None
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.closed = True
            return False
        if scope.cancelled_caught:
            # The client stopped reading (or its session was dropped); a half-written
            # response cannot be resumed.
            if not self.aborted:
                log.warning(
                    "http: a client stopped reading for %.0fs; closing its connection", self.limits.write_timeout
                )
            self.closed = True
            await self.stream.aclose()
            return False
        return True

    def _head(self, status: int, headers: list[tuple[str, str]], framing: bytes) -> bytearray | None:
        """A response's head, or None (and the connection closed) if a header cannot be sent."""
        head = bytearray(STATUS_LINES.get(status) or status_line(status))
        close = not self._keep_alive
        for name, value in headers:
            if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
                log.error("http: refused to send a %s header holding a line break", name[:40])
                self.closed = True
                return None
            if name == "connection" and value == "close":
                close = True
                continue
            head += f"{name}: {value}\r\n".encode("latin-1", "replace")
        if close:
            self._keep_alive = False
            head += b"connection: close\r\n"
        elif not self._chunked:  # an HTTP/1.0 client that asked to keep the connection
            head += b"connection: keep-alive\r\n"
        head += framing
        return head

    async def respond(self, status: int, headers: list[tuple[str, str]], body: bytes = b"") -> bool:
        if self._phase not in (_NO_REQUEST, _UNANSWERED):
            self.closed = True  # a response was already begun: this one cannot be sent
            return False
        head = self._head(status, headers, b"content-length: %d\r\n\r\n" % len(body))
        if head is None:
            return False
        self._phase = _ANSWERED
        if not body or self.head:
            return await self._send_bytes(head)
        if len(body) > LARGE:
            return await self._send_bytes(head, body)
        head += body
        return await self._send_bytes(head)

    def response_pending(self) -> bool:
        """True while a request is read and nothing of its response was sent yet."""
        return not self.closed and self._phase == _UNANSWERED

    async def respond_error(self, status: int, reason: str) -> bool:
        if self._phase not in (_NO_REQUEST, _UNANSWERED):
            self.closed = True
            return False
        body = (reason + "\n").encode()
        return await self.respond(
            status, [("content-type", "text/plain; charset=utf-8"), ("connection", "close")], body
        )

    async def start_stream(self, headers: list[tuple[str, str]]) -> bool:
        """Start a 200 text/event-stream response (chunked; to an HTTP/1.0 client, ended by
        closing the connection)."""
        if self._phase != _UNANSWERED:
            self.closed = True
            return False
        if not self._chunked:
            self._keep_alive = False
        framing = b"transfer-encoding: chunked\r\n\r\n" if self._chunked and not self.head else b"\r\n"
        head = self._head(200, [*_STREAM_HEADERS, *headers], framing)
        if head is None:
            return False
        self._phase = _STREAMING
        return await self._send_bytes(head)

    def _progressed(self) -> None:
        self.progressed_at = trio.current_time()

    def blocked(self) -> bool:
        """Whether a write is waiting for the client to read."""
        return self._write is not None and cannot_take_more(self._fd)

    def abort(self) -> None:
        """Cut a write in progress and close (what it carried is no longer wanted)."""
        self.aborted = True
        self.closed = True
        if self._write is not None:
            self._write.cancel()

    async def send_chunk(self, data: bytes | bytearray) -> bool:
        if self._phase != _STREAMING or self.head:
            self.closed = True
            return False
        if not data:
            return True  # an empty chunk would end the body
        if not self._chunked:
            return await self._send_bytes(data)
        size = b"%x\r\n" % len(data)
        if len(data) > LARGE:
            return await self._send_bytes(size, data, b"\r\n")
        return await self._send_bytes(size + data + b"\r\n")

    async def end_stream(self) -> bool:
        if self._phase != _STREAMING:
            self.closed = True
            return False
        self._phase = _ANSWERED
        if not self._chunked or self.head:
            return not self.closed
        return await self._send_bytes(b"0\r\n\r\n")

    async def aclose(self) -> None:
        """Close, lingering briefly if the client may still be sending.

        Closing a socket with unread input makes the kernel send a reset, and the client
        may lose the response we just sent (a 413 for a body we refused to read). So we
        shut our side, then read and discard for a moment (bounded in time and bytes).
        """
        self.closed = True
        with trio.CancelScope(shield=True):
            try:
                # (A head that never ended was answered nothing: nothing to linger for.)
                if not self._eof and (self.reader.head_complete or self.reader.refused):
                    send_eof = getattr(self.stream, "send_eof", None)
                    if send_eof is not None:
                        await send_eof()
                        with trio.move_on_after(2):
                            discarded = 0
                            while discarded < 16 * 1024 * 1024:
                                data = await self.stream.receive_some(READ_SIZE)
                                if not data:
                                    break
                                discarded += len(data)
                await self.stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
