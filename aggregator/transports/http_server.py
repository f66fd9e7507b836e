"""HTTP/1.1 server connections: the connection loop, and the request reader it reads with.

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

Reading requests
----------------
llhttp (through httptools) parses, ``RequestReader`` keeps the limits.

``RequestReader.feed(data)`` parses whatever arrived in one pass and queues each complete
request (pipelined ones too) in ``ready``; a request that cannot be served queues a
``Refusal`` instead (the status to answer with and why), after which the connection reads
nothing more. llhttp is strict by default (no lenient flags are set): conflicting
``Content-Length`` and ``Transfer-Encoding``, a repeated ``Content-Length``, an obs-fold,
bare CR or LF, a NUL or a space before the colon are all refused, so a request cannot be
framed two ways (request smuggling). On top of it: only HTTP/1.0 and 1.1; a 1.1 request
must name its Host; the one transfer coding understood is chunked (anything else: 501, as
RFC 9112 6.1 asks); headers that may appear once and arrive twice are refused rather than
joined into a value nobody sent; the head is at most ``max_header`` bytes (431), counted
while it arrives, and the body at most ``max_body`` (413), refused from its declared length
before a byte of it is read.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import httptools
import trio

from aggregator.transports.http_wire import BUSY_RESPONSE, STATUS_LINES, refuse_connection, sse_event, status_line
from aggregator.transports.outbox import READ_SIZE, cannot_take_more, fd_of, read_when_ready, send_in_steps, write_now

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
        self._idle = False  # between requests, nothing of the next one read (see close_if_idle)
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
                self._idle = reading == _IDLE
                try:
                    data = await self._receive()
                finally:
                    self._idle = False
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
            if item.status in (413, 431):  # a size limit: said (never the request itself)
                log.warning("http: refused a request (%d): %s", item.status, item.reason)
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

    def close_if_idle(self) -> None:
        """End the connection now if it waits between requests with nothing of the next
        one read (served by ``serve``): a balancer's pooled connection is then dropped from
        its pool, and its next request opens a new connection (to another replica, once
        this one stopped listening). A connection in a request goes on."""
        if self._idle and self._deadlines is not None:
            self._deadlines.deadline = -math.inf

    def last_request(self) -> None:
        """Close the connection once the request being answered is (its response says
        ``connection: close``): a balancer then stops reusing it."""
        self._keep_alive = False

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


# --- reading requests ------------------------------------------------------------------------

# Headers whose repetition has no agreed meaning: two Hosts (RFC 9112 3.2), two session
# ids, two event ids. Any other repeated header is joined with ", " (RFC 9110 5.3).
SINGLE_VALUED = frozenset(
    {
        "host",
        "content-type",
        "authorization",
        "origin",
        "mcp-session-id",
        "mcp-protocol-version",
        "last-event-id",
    }
)
_VERSIONS = frozenset({"1.1", "1.0"})


class Request(NamedTuple):
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names; repeated headers joined with ", "
    body: bytes
    keep_alive: bool = True  # whether the client lets the connection serve another request
    head_only: bool = False  # a HEAD: its response has no body
    version11: bool = True  # HTTP/1.1 (chunked bodies can be sent), else 1.0


class Refusal(NamedTuple):
    status: int
    reason: str


class _Stop(Exception):
    """Raised in a parser callback to stop parsing: a limit was crossed."""


class RequestReader:
    """Feed it bytes; it queues complete requests and refusals in ``ready``."""

    def __init__(self, max_body: int, max_header: int) -> None:
        self.max_body = max_body
        self.max_header = max_header
        self.ready: deque[Request | Refusal] = deque()
        self.done = False  # nothing more is read (a refusal, an upgrade, or the end)
        self.expects_continue = False  # the request read now waits for 100 Continue
        self._parser = httptools.HttpRequestParser(self)
        self._in_message = False  # a request has begun and is not complete
        self._in_head = False  # ... and its head is not complete
        self._fed = 0  # bytes fed since the request being read began (see _count)
        self._began = False  # a request began in the feed being parsed
        self._ended = False  # ... and one ended in it
        self._after_chunk_size = False  # a chunk's size was read, not yet its data
        self._trailer = 0  # bytes fed since (the trailers, after the last chunk)
        self._trailer_reset = False  # chunk data came in the feed being parsed
        self._refusal: Refusal | None = None
        self._url = b""
        self._headers: dict[str, str] = {}
        self._head_size = 0
        self._body: list[bytes] = []
        self._body_size = 0
        self._upgrade: tuple[Request, int] | None = None  # an Upgrade request whose body is read

    @property
    def in_message(self) -> bool:
        """Whether a request has begun to arrive and is not complete."""
        return self._in_message

    @property
    def refused(self) -> bool:
        """Whether a request was refused (its client may still be sending it)."""
        return self._refusal is not None

    @property
    def head_complete(self) -> bool:
        return (self._in_message and not self._in_head) or self._upgrade is not None

    @property
    def finished(self) -> bool:
        """Whether nothing more will come of this connection's input."""
        return self.done and self._upgrade is None

    def feed(self, data: bytes | bytearray) -> None:
        if self.done:
            if self._upgrade is not None:
                self._upgrade_body(data)
            return
        was_after = self._after_chunk_size
        self._began = self._ended = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._upgraded(data, exc.args[0] if exc.args else len(data))
            return
        except _Stop:
            pass
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _Stop):
                raise
        except httptools.HttpParserError as exc:
            self._refuse(*_refusal_for(str(exc)))
        if self._refusal is None and self._in_message:
            # Trailing: a whole feed came after a chunk's size and none of its data (the
            # trailers after the last chunk, which the parser holds until each line ends).
            self._count(len(data), was_after and self._after_chunk_size and not self._trailer_reset)
        self._trailer_reset = False
        if self._refusal is not None:
            self.ready.append(self._refusal)
            self.done = True

    def _count(self, size: int, trailing: bool) -> None:
        """Bound what a request still arriving has taken, parsed or held by the parser (a
        header line is held whole before it is seen): its head at most ``max_header``
        bytes, its trailers too, and the whole of it (chunk sizes included) at most twice
        ``max_body`` plus ``max_header``. A feed in which a request ended and this one began
        is not counted (part of it was the one before): the bound is loose by one read then,
        never too tight."""
        if not self._began:
            self._fed += size
        else:
            self._fed = 0 if self._ended else size
        if self._in_head and self._fed > self.max_header:
            self._refuse(431, "request headers too large")
        elif trailing:
            self._trailer += size
            if self._trailer > self.max_header:
                self._refuse(431, "request trailers too large")
        elif self._fed > 2 * self.max_body + self.max_header:
            self._refuse(413, f"request larger than {self.max_body} bytes of body allow")

    def _upgraded(self, data: bytes | bytearray, offset: int) -> None:
        """An Upgrade (or CONNECT) request: llhttp stops at its head. It is answered as an
        ordinary request (we switch no protocol; a client asking for h2c gets HTTP/1.1), so
        its body, if it declared a length, is read here; then the connection closes."""
        self.done = True
        last = self.ready[-1] if self.ready else None
        if not isinstance(last, Request):
            return
        self.ready.pop()
        request = last._replace(keep_alive=False)
        if request.method == "CONNECT" or "transfer-encoding" in request.headers:
            if "transfer-encoding" in request.headers:
                self.ready.append(Refusal(400, "an Upgrade request with a chunked body is not served"))
            else:
                self.ready.append(request)
            return
        self._upgrade = (request, int(request.headers.get("content-length") or 0))
        self._upgrade_body(bytes(data[offset:]))

    def _upgrade_body(self, data: bytes | bytearray) -> None:
        request, length = self._upgrade  # type: ignore[misc]
        self._body.append(bytes(data[: length - self._body_size]))
        self._body_size = min(length, self._body_size + len(data))
        if self._body_size >= length:
            self._upgrade = None
            self.ready.append(request._replace(body=b"".join(self._body)))
            self._body = []

    def end(self) -> None:
        """The client closed its side: a request it had begun is not coming."""
        self.done = True
        self._upgrade = None

    def _refuse(self, status: int, reason: str) -> None:
        if self._refusal is None:
            self._refusal = Refusal(status, reason)

    # --- llhttp's callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_message = self._in_head = True
        self._url = b""
        self._headers = {}
        self._head_size = 0
        self._body = []
        self._body_size = 0
        self._began = True
        self._after_chunk_size = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        if self._head_size > self.max_header:
            self._refuse(431, "request headers too large")
            raise _Stop

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            return  # a trailer of a chunked body: not read
        self._head_size += len(name) + len(value) + 4
        if self._head_size > self.max_header:
            self._refuse(431, "request headers too large")
            raise _Stop
        key = name.decode("ascii").lower()  # llhttp admits only token characters in names
        text = value.decode("latin-1").strip(" \t")
        headers = self._headers
        if key in headers:
            if key in SINGLE_VALUED:
                self._refuse(400, f"the {key} header may appear only once")
                raise _Stop
            text = f"{headers[key]}, {text}"
        headers[key] = text

    def on_headers_complete(self) -> None:
        self._in_head = False
        headers = self._headers
        version = self._parser.get_http_version()
        if version not in _VERSIONS:
            self._refuse(400, f"malformed HTTP request: HTTP/{version} is not served; use HTTP/1.1")
            raise _Stop
        if version == "1.1" and "host" not in headers:
            self._refuse(400, "malformed HTTP request: an HTTP/1.1 request must have a Host header")
            raise _Stop
        coding = headers.get("transfer-encoding")
        if coding is not None and coding.lower() != "chunked":
            self._refuse(501, "unsupported Transfer-Encoding: only one, chunked, is understood")
            raise _Stop
        length = headers.get("content-length")
        if length is not None and int(length) > self.max_body:  # llhttp checked its digits (and their size)
            self._refuse(413, f"request body larger than {self.max_body} bytes")
            raise _Stop
        self.expects_continue = version == "1.1" and headers.get("expect", "").lower() == "100-continue"

    def on_chunk_header(self) -> None:
        self._after_chunk_size = True

    def on_chunk_complete(self) -> None:
        self._after_chunk_size = False
        self._trailer, self._trailer_reset = 0, True

    def on_body(self, body: bytes) -> None:
        self._after_chunk_size = False
        self._trailer, self._trailer_reset = 0, True
        self._body_size += len(body)
        if self._body_size > self.max_body:
            self._refuse(413, f"request body larger than {self.max_body} bytes")
            raise _Stop
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        self._ended = True
        self.expects_continue = False
        parser = self._parser
        method = parser.get_method().decode("ascii")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self.ready.append(
            Request(
                method,
                self._url.decode("ascii", "replace"),
                self._headers,
                body,
                parser.should_keep_alive(),
                method == "HEAD",
                parser.get_http_version() == "1.1",
            )
        )
        self._body = []


def _refusal_for(message: str) -> tuple[int, str]:
    """The status and reason for what llhttp refused (its message says what was wrong)."""
    if "Transfer-Encoding" in message and "Content-Length" not in message:
        return 501, f"unsupported Transfer-Encoding: only one, chunked, is understood ({message})"
    return 400, f"malformed HTTP request: {message}"
