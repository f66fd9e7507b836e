"""HTTP/1.1 server connections: h11 does the framing, this module the connection loop.

One ``HttpConnection`` per TCP connection. It reads one request at a time and answers
with a whole response or a stream of Server-Sent Events (chunked). Everything h11 or the
socket can raise is turned into one of three outcomes at this edge: a request, an error
response already sent (400, 408, 413, 431), or the end of the connection. Nothing above
this module sees h11.

Deadlines are totals, never reset by a byte that arrives (a client dripping one byte a
second must not hold a connection for ever): a request's headers are due
``header_timeout`` after its first byte (after the connection opened, for the first
request), its body ``body_timeout`` after the headers; between requests a keep-alive
connection may stay idle for ``keepalive_timeout``. Headers that may appear once and
arrive twice are refused (400) rather than joined into a value nobody sent.

Writes are made by the one task that handles the connection; ``watch_disconnect`` may
read at the same time (to notice a client that goes away while its answer is pending)
and feeds whatever it reads to h11, so pipelined requests are not lost.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any, NamedTuple

import h11
import trio

from aggregator.transports.outbox import cannot_take_more, fd_of, send_in_steps

log = logging.getLogger(__name__)
READ_SIZE = 65536
LARGE = 65536  # a body longer than this is written without being copied into one buffer
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
# The body of the answer to a request h11 refuses, by the status h11 suggests.
_H11_REFUSALS = {
    400: "malformed HTTP request",
    431: "request headers too large",
    501: "unsupported Transfer-Encoding: only one, chunked, is understood",
}
# What a connection over the cap gets before it is closed: small enough for any socket buffer.
_BUSY_BODY = b"too many connections; try again in a moment\n"
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


class Request(NamedTuple):
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names; repeated headers joined with ", "
    body: bytes


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
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header)
        self.closed = False
        self.requests = 0  # requests read so far on this connection
        self.head = False  # the request being answered is a HEAD: its response has no body
        self._write: trio.CancelScope | None = None  # the write in progress
        self._fd = fd_of(stream)
        self.aborted = False

    # --- reading ------------------------------------------------------------------------

    async def next_request(self) -> Request | None:
        """The next complete request, or None when the connection is over."""
        method = path = ""
        headers: dict[str, str] = {}
        body = bytearray()
        started = False
        limits = self.limits
        # The first request is due from the connection's opening; a later one may wait
        # keepalive_timeout for its first byte. The body's deadline is set when the body
        # is first waited for (most arrive with their headers, and cost no clock read).
        idle = self.requests > 0
        deadline: float | None = trio.current_time() + (limits.keepalive_timeout if idle else limits.header_timeout)
        try:
            while True:
                event = self.conn.next_event()
                if event is h11.NEED_DATA:
                    if deadline is None:
                        deadline = trio.current_time() + limits.body_timeout
                    with trio.move_on_at(deadline):
                        data = await self.stream.receive_some(READ_SIZE)
                        if idle and data:
                            idle = False
                            deadline = trio.current_time() + limits.header_timeout
                        self.conn.receive_data(data)  # type: ignore[arg-type]  # h11 takes any bytes-like
                        continue
                    if started:
                        await self.respond_error(408, f"request body not complete within {limits.body_timeout:g}s")
                    elif not idle:
                        log.debug(
                            "http: closed a connection whose request headers took over %gs", limits.header_timeout
                        )
                    return None
                if type(event) is h11.Request:
                    started = True
                    self.requests += 1
                    self.head = event.method == b"HEAD"
                    deadline = None
                    method = event.method.decode("ascii", "replace")
                    path = event.target.decode("ascii", "replace")
                    refusal = _read_head(event, headers, limits)
                    if refusal is not None:
                        await self.respond_error(*refusal)
                        return None
                elif type(event) is h11.Data:
                    body += event.data
                    if len(body) > limits.max_body:
                        await self.respond_error(413, f"request body larger than {limits.max_body} bytes")
                        return None
                elif type(event) is h11.EndOfMessage:
                    return Request(method, path, headers, bytes(body))
                else:  # ConnectionClosed, or PAUSED after a response we could not finish
                    return None
        except h11.RemoteProtocolError as exc:
            # h11 says which status fits: 431 for headers over max_incomplete_event_size,
            # 501 for a transfer coding other than chunked, 400 for anything else.
            status = exc.error_status_hint
            await self.respond_error(status, _H11_REFUSALS.get(status, "malformed HTTP request"))
            return None
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return None

    async def watch_disconnect(self) -> None:
        """Return when the client closes its side (or the connection breaks)."""
        buffered = 0
        while True:
            try:
                data = await self.stream.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            buffered += len(data)
            if buffered > self.limits.max_body + self.limits.max_header:
                await trio.sleep_forever()  # enough pipelined input held; stop reading
            self.conn.receive_data(data)  # type: ignore[arg-type]  # h11 takes any bytes-like

    def next_cycle(self) -> bool:
        """Prepare for the next request on this connection; False if it cannot be reused."""
        if self.closed or self.conn.our_state is not h11.DONE or self.conn.their_state is not h11.DONE:
            return False
        try:
            self.conn.start_next_cycle()
        except h11.LocalProtocolError:
            return False
        return True

    # --- writing ------------------------------------------------------------------------

    async def _send(self, *events: h11.Event, large: bool = False) -> bool:
        if self.closed:
            return False
        try:
            if large:  # a large body goes out as it is, between h11's framing: not copied
                parts: list[Any] = []
                for event in events:
                    parts += self.conn.send_with_data_passthrough(event) or []
            else:
                parts = [b"".join(self.conn.send(event) or b"" for event in events)]
            with trio.move_on_after(self.limits.write_timeout) as scope:
                self._write = scope
                try:
                    for part in parts:
                        await send_in_steps(self.stream, part, self._progressed)
                finally:
                    self._write = None
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
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
            self.closed = True
            return False

    async def respond(self, status: int, headers: list[tuple[str, str]], body: bytes = b"") -> bool:
        all_headers = [*headers, ("content-length", str(len(body)))]
        events: list[h11.Event] = [h11.Response(status_code=status, headers=all_headers, reason=_reason(status))]
        if body and not self.head:
            events.append(h11.Data(data=body))
        events.append(h11.EndOfMessage())
        return await self._send(*events, large=len(body) > LARGE)

    def response_pending(self) -> bool:
        """True while a request is read and nothing of its response was sent yet."""
        return not self.closed and self.conn.our_state is h11.SEND_RESPONSE

    async def respond_error(self, status: int, reason: str) -> bool:
        if self.conn.our_state is not h11.IDLE and self.conn.our_state is not h11.SEND_RESPONSE:
            self.closed = True
            return False
        body = (reason + "\n").encode()
        return await self.respond(
            status, [("content-type", "text/plain; charset=utf-8"), ("connection", "close")], body
        )

    async def start_stream(self, headers: list[tuple[str, str]]) -> bool:
        """Start a 200 text/event-stream response (chunked)."""
        return await self._send(
            h11.Response(
                status_code=200,
                reason=b"OK",
                headers=[("content-type", "text/event-stream"), ("cache-control", "no-cache"), *headers],
            )
        )

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
        return await self._send(h11.Data(data=data), large=len(data) > LARGE)  # type: ignore[arg-type]

    async def end_stream(self) -> bool:
        return await self._send(h11.EndOfMessage())

    async def aclose(self) -> None:
        """Close, lingering briefly if the client may still be sending.

        Closing a socket with unread input makes the kernel send a reset, and the client
        may lose the response we just sent (a 413 for a body we refused to read). So we
        shut our side, then read and discard for a moment (bounded in time and bytes).
        """
        self.closed = True
        with trio.CancelScope(shield=True):
            try:
                if self.conn.their_state not in (h11.DONE, h11.CLOSED, h11.IDLE, h11.MUST_CLOSE):
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


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def sse_event(data: bytes, event_id: str | None = None) -> bytes:
    """One SSE event carrying one JSON-RPC message (which never holds a raw newline)."""
    head = f"id: {event_id}\n".encode() if event_id is not None else b""
    return head + b"event: message\ndata: " + data + b"\n\n"


def _read_head(event: h11.Request, headers: dict[str, str], limits: HttpLimits) -> tuple[int, str] | None:
    """Fill ``headers`` from a request head; the (status, reason) to refuse it with, if any."""
    size = len(event.target) + sum(len(name) + len(value) + 4 for name, value in event.headers)
    if size > limits.max_header:
        return 431, "request headers too large"
    for name, value in event.headers:
        key = name.decode("ascii", "replace")
        text = value.decode("latin-1")
        if key in headers:
            if key in SINGLE_VALUED:
                return 400, f"the {key} header may appear only once"
            text = f"{headers[key]}, {text}"
        headers[key] = text
    length = headers.get("content-length")
    if (
        length is not None
        and length.isascii()
        and length.isdigit()
        and (len(length) > 18 or int(length) > limits.max_body)
    ):
        return 413, f"request body larger than {limits.max_body} bytes"
    return None
