"""The WebSocket handshake as the endpoint reads it, before trio-websocket does: the head
read up to ``http.max_header_bytes`` (431 above, 400 for an obs-fold) for the access check,
then handed on with what followed it kept until the handshake is accepted; the handshake's
headers with Host; a refusal that ends its connection at once."""

from __future__ import annotations

import contextvars
import re

import trio
import trio_websocket

# Set by a connection's task, read by the handler it calls: the connection's HandshakeTap.
current_tap: contextvars.ContextVar[HandshakeTap] = contextvars.ContextVar("handshake")
_LINE_END = re.compile(rb"\r?\n")
READ_SIZE = 65536


class HandshakeTap(trio.abc.Stream):
    """A connection's stream as trio-websocket reads it: the handshake's head is read first
    (``read_head``, for the access check), handed to trio-websocket as if it came from the
    stream, and kept; then the tap steps aside.

    The access check comes before the WebSocket library sees anything (a request that is no
    upgrade would otherwise get its 400 before a foreign Host its 421). The DNS-rebinding
    check needs the handshake's Host, which trio-websocket parses but does not expose (its
    ``WebSocketRequest.headers`` leave Host out). Bytes that came after the head (a first
    frame sent with the handshake) are handed on only once the handshake is accepted
    (``accepted``): wsproto drops what it holds when it accepts. Then ``receive_some`` is
    the stream's own: frames pass through no extra call.
    """

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.socket = getattr(stream, "socket", None)  # for fd_of
        self.head = bytearray()
        self.unread = bytearray()  # read by read_head, not yet by trio-websocket: the head
        self.after_head = bytearray()  # ... and what followed it, for after the handshake
        self.accepted = trio.Event()
        self.read = False  # set when trio-websocket has read the whole handshake
        self.complete = False  # set when read_head found the blank line that ends the head
        self.scope = trio.CancelScope()  # the library's handling of this connection
        self.send_all = stream.send_all  # type: ignore[method-assign]
        self.wait_send_all_might_not_block = stream.wait_send_all_might_not_block  # type: ignore[method-assign]

    async def read_head(self, limit: int) -> None:
        """Read until the head is complete, the client stops sending, or it holds over ``limit``
        bytes (then the head, blank line included, is over ``limit`` however it was split)."""
        head = self.head
        while not (b"\n\r\n" in head or b"\n\n" in head or len(head) > limit):
            data = await self.stream.receive_some(READ_SIZE)
            if not data:
                break
            head += data
        ends = [i + n for i, n in ((head.find(b"\n\r\n"), 3), (head.find(b"\n\n"), 2)) if i >= 0]
        self.complete = bool(ends)
        end = min(ends, default=len(head))
        self.unread = head[:end]
        self.after_head = head[end:]

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        unread = self.unread
        if not unread and self.after_head:
            await self.accepted.wait()
            unread, self.after_head = self.after_head, bytearray()
            self.unread = unread
        if not unread:
            self.receive_some = self.stream.receive_some  # type: ignore[method-assign]
            return await self.stream.receive_some(max_bytes)
        size = len(unread) if max_bytes is None else max_bytes
        data = bytes(unread[:size])
        del unread[:size]
        return data

    def bad_head(self, limit: int) -> tuple[int, str] | None:
        """The (status, reason) to refuse the head with before the WebSocket library reads
        it: 431 when the head, from its first byte through the blank line that ends it, is
        over ``limit`` bytes; 400 for an obs-fold (which h11 and ``headers`` would read
        differently)."""
        head = bytes(self.head)
        end = len(self.unread)  # the head, blank line included (read_head split it off)
        if end > limit:
            return 431, "request headers too large"
        if b"\n " in head[:end] or b"\n\t" in head[:end]:
            return 400, "a header line continues the previous one (obs-fold), which is not accepted"
        return None

    def headers(self) -> tuple[str, dict[str, str]] | None:
        """The head's target and headers by lower-case name (repeated ones joined; Host
        IDNA-decoded): what the access check reads. None without exactly one Host, which the
        WebSocket library refuses with 400 (as the HTTP front's parser does)."""
        lines = _LINE_END.split(bytes(self.head))
        target = lines[0].split(b" ")[1].decode("latin-1") if lines[0].count(b" ") >= 2 else ""
        headers: dict[str, str] = {}
        hosts = 0
        for line in lines[1:]:
            if not line:
                break
            name, colon, value = line.partition(b":")
            if colon:
                key = name.strip().decode("latin-1").lower()
                text = value.strip(b" \t").decode("latin-1")
                headers[key] = f"{headers[key]}, {text}" if key in headers else text
                hosts += key == "host"
        if hosts != 1:
            return None
        host = self._host()
        headers["host"] = host if host is not None else ""
        return target, headers

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """Close the stream. When trio-websocket closes it before handing the handshake to
        the endpoint, the library refused the handshake itself (a POST, no key, a version
        it does not speak) after answering it; its handling ends now, not after
        ``connect_timeout`` (it would still wait for a handshake that cannot come)."""
        try:
            await self.stream.aclose()
        finally:
            if not self.read:
                self.scope.cancel()

    def host(self) -> str | None:
        """The head's Host as the WebSocket library read it: the last one, IDNA-decoded."""
        host = self._host()
        self.head = bytearray()
        return host

    def _host(self) -> str | None:
        host = None
        for line in _LINE_END.split(bytes(self.head))[1:]:
            if not line:
                break
            name, colon, value = line.partition(b":")
            if colon and name.lower() == b"host":
                try:
                    host = value.strip(b" \t").decode("idna")
                except UnicodeError:
                    host = None
        return host


async def reject(
    request: trio_websocket.WebSocketRequest, status: int, headers: list[tuple[bytes, bytes]], reason: str
) -> None:
    """Answer a handshake with ``status`` and end its connection at once: trio-websocket
    would otherwise keep it open (and its slot under ``http.max_connections`` taken) until
    the client closes it."""
    try:
        await request.reject(status, extra_headers=headers, body=reason.encode())
    finally:
        tap = current_tap.get(None)
        if tap is not None:
            tap.scope.cancel()


def handshake_headers(request: trio_websocket.WebSocketRequest) -> dict[str, str]:
    """The handshake's headers by lower-case name (repeated ones joined), Host included."""
    tap = current_tap.get(None)
    if tap is not None:
        tap.read = True
    headers: dict[str, str] = {}
    for name, value in request.headers:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    # trio-websocket leaves Host out of .headers; the DNS-rebinding check needs it.
    host = None if tap is None else tap.host()
    if host is not None:
        headers["host"] = host
    return headers
