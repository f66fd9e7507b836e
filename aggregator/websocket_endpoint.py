"""The WebSocket endpoint: one MCP session per connection, one message per text frame.

The handshake takes the admission path every front shares (``aggregator.admission``:
Host, Origin, bearer token, then the profile its path names) before it is accepted; the
subprotocol ``mcp`` is chosen when the client offers it. What the session sends goes
through a ``WebSocketSink`` (``aggregator.websocket_sink``). Frames larger than
the body limit close the connection (trio-websocket enforces it while reading).

Admission is shared with the HTTP endpoint (``hub.admission``): a connection over
``http.max_connections`` gets 503 before its handshake is read, a handshake over
``http.max_sessions`` (or while the aggregator drains) is rejected with 503. The whole
handshake must arrive within ``http.header_timeout``.

Containment: every connection runs inside a boundary. A handshake the WebSocket library
cannot parse (bytes no header may hold) is a client's mistake: 400, one warning line. A
head (its first byte through the blank line) over ``http.max_header_bytes`` gets 431 and
one with an obs-fold (a line continuing the previous header) 400 before the library reads
it; one the client stops sending halfway is closed. A handshake refused at the library stage
(wrong path, admission), or one the library refuses by itself (a POST, no key), is
answered and its connection closed at once. An
exception while the session runs is ours: logged with its traceback, the message being
handled is answered with a JSON-RPC internal error, and the connection closes with 1011;
other connections and the process go on.
"""

from __future__ import annotations

import contextvars
import logging
import re
from http import HTTPStatus
from typing import Any

import trio
import trio_websocket
from wsproto.utilities import ProtocolError

from aggregator.access import AccessPolicy
from aggregator.admission import Denial, admit, check_access
from aggregator.config import HttpConfig, parse_listen
from aggregator.containment import internal_error
from aggregator.hub import Hub
from aggregator.jsonrpc.codec import dumps
from aggregator.transports.http_server import refuse_connection
from aggregator.websocket_sink import WebSocketSink

log = logging.getLogger(__name__)
BAD_HANDSHAKE = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    b"content-length: 29\r\n\r\nmalformed WebSocket handshake"
)
# Set by a connection's task, read by the handler it calls: the connection's HandshakeTap.
_handshake: contextvars.ContextVar[HandshakeTap] = contextvars.ContextVar("handshake")
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


class WebSocketEndpoint:
    def __init__(self, hub: Hub, config: HttpConfig) -> None:
        self.hub = hub
        self.config = config
        self.access = AccessPolicy(config, hub.config.profiles)
        self.admission = hub.admission

    async def serve(self, listen: str, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        host, port = parse_listen(listen)
        listeners = await trio.open_tcp_listeners(port, host=host)
        server = _ContainedServer(
            self,
            self._handle,
            listeners,
            max_message_size=self.config.max_body_bytes,
            message_queue_size=16,
            connect_timeout=self.config.header_timeout,
            disconnect_timeout=self.config.header_timeout,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            log.info("serving MCP over WebSocket at ws://%s:%d%s", host, server.port, self.config.path)
            task_status.started(server)

    async def _connection(self, stream: trio.abc.Stream, serve: Any) -> None:
        """One connection's task, and its boundary: the cap, the handshake, the session."""
        if not self.admission.admit_connection():
            await refuse_connection(stream)
            return
        tap = HandshakeTap(stream)
        _handshake.set(tap)
        try:
            if not await self._access_checked(tap):
                return
            with tap.scope:
                await serve(tap)
        except Exception as exc:
            leaves = _leaves(exc)
            what = "; ".join(f"{type(leaf).__name__}: {str(leaf)[:200]}" for leaf in leaves[:3])
            if tap.read and all(isinstance(leaf, ProtocolError) for leaf in leaves):
                # The library's reader tripped over the client's frames (a ping after our
                # close frame makes it answer with a pong that wsproto refuses).
                log.warning("websocket: closed a connection whose frames the WebSocket library refused (%s)", what)
            elif tap.read:
                log.exception("websocket: internal error; closing this connection only")
            else:
                # The library choked on the handshake's bytes (a Host that is not IDNA,
                # a header that is not ASCII): the client's mistake, not a bug of ours.
                log.warning("websocket: refused a malformed handshake (%s)", what)
                with trio.move_on_after(1):
                    try:
                        await stream.send_all(BAD_HANDSHAKE)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        pass
        finally:
            try:
                await trio.aclose_forcefully(stream)
            finally:
                self.admission.release_connection()

    async def _access_checked(self, tap: HandshakeTap) -> bool:
        """Read the handshake's head and check Host, Origin and token, before the WebSocket
        library reads it (which answers 400 to a request that is no upgrade): False after
        refusing it, or when the head did not come within ``http.header_timeout``."""
        with trio.move_on_after(self.config.header_timeout):
            await tap.read_head(self.config.max_header_bytes)
            refusal = tap.bad_head(self.config.max_header_bytes)
            if refusal is None and not tap.complete:
                return False  # the client stopped sending before its head was complete
            if refusal is not None:
                status, reason = refusal
                log.warning("websocket: refused a handshake: %s", reason)
                extra: list[tuple[str, str]] = []
            else:
                head = tap.headers()
                if head is None:
                    return True
                target, headers = head
                denial = check_access(self.access, headers)
                if denial is None:
                    return True
                log.log(denial.level, "websocket: refused a request for %s: %s", target[:100], denial.reason)
                status, reason, extra = denial.status, denial.reason, list(denial.headers)
            body = reason.encode()
            lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
            lines += ["content-type: text/plain; charset=utf-8", "connection: close", f"content-length: {len(body)}"]
            lines += [f"{name}: {value}" for name, value in extra]
            try:
                await tap.stream.send_all("\r\n".join(lines).encode() + b"\r\n\r\n" + body)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        return False

    async def _handle(self, request: trio_websocket.WebSocketRequest) -> None:
        admitted = admit(self.access, _handshake_headers(request), request.path)
        if isinstance(admitted, Denial):
            log.log(admitted.level, "websocket: refused a handshake for %s: %s", request.path[:100], admitted.reason)
            extra = [(name.encode(), value.encode()) for name, value in admitted.headers]
            await _reject(request, admitted.status, extra, admitted.reason)
            return
        session_refusal = self.admission.admit_session()
        if session_refusal is not None:
            extra_headers = (
                []
                if session_refusal.retry_after is None
                else [(b"retry-after", str(session_refusal.retry_after).encode())]
            )
            await _reject(request, 503, extra_headers, session_refusal.message)
            return
        try:
            await self._session(request, admitted.profile)
        finally:
            self.admission.release_session()

    async def _session(self, request: trio_websocket.WebSocketRequest, profile: str) -> None:
        """One admitted session, from accepting the handshake to the connection's end."""
        subprotocol = "mcp" if "mcp" in request.proposed_subprotocols else None
        socket = await request.accept(subprotocol=subprotocol)
        tap = _handshake.get(None)
        if tap is not None:
            tap.accepted.set()  # a frame that came with the handshake may be read now
        connection = trio.CancelScope()
        key = 0

        def dropped(reason: str) -> None:
            log.error(
                "websocket session %d dropped: %s (it does not read what it is sent); its requests are cancelled",
                key,
                reason,
            )
            connection.cancel()

        proxy = self.hub.config.proxy
        sink = WebSocketSink(
            proxy.client_buffer_bytes, proxy.client_write_timeout, on_drop=dropped, memory=self.hub.client_memory
        )
        key = self.hub.add_client(sink, profile)
        log.info("websocket session %d: opened", key)
        try:
            with connection:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sink.run, socket)
                    try:
                        while True:
                            message = await socket.get_message()
                            raw = message.encode("utf-8") if isinstance(message, str) else bytes(message)
                            try:
                                self.hub.dispatch(await self.hub.client_message(key, raw))
                                await self.hub.flush(sink)
                            except Exception:
                                log.exception(
                                    "websocket session %d: internal error handling a message;"
                                    " closing this connection only",
                                    key,
                                )
                                with trio.move_on_after(1):
                                    await socket.send_message(dumps(internal_error(raw)).decode())
                                    await socket.aclose(1011, "internal error")
                                break
                    except trio_websocket.ConnectionClosed:
                        pass
                    nursery.cancel_scope.cancel()
        finally:
            sink.close()
            self.hub.remove_client(key)
            log.info("websocket session %d: closed", key)


async def _reject(
    request: trio_websocket.WebSocketRequest, status: int, headers: list[tuple[bytes, bytes]], reason: str
) -> None:
    """Answer a handshake with ``status`` and end its connection at once: trio-websocket
    would otherwise keep it open (and its slot under ``http.max_connections`` taken) until
    the client closes it."""
    try:
        await request.reject(status, extra_headers=headers, body=reason.encode())
    finally:
        tap = _handshake.get(None)
        if tap is not None:
            tap.scope.cancel()


def _handshake_headers(request: trio_websocket.WebSocketRequest) -> dict[str, str]:
    """The handshake's headers by lower-case name (repeated ones joined), Host included."""
    tap = _handshake.get(None)
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


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (possibly nested) exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


class _ContainedServer(trio_websocket.WebSocketServer):
    """trio-websocket's server with each connection run through the endpoint's boundary
    (its cap, and a guard against what the library raises on a hostile handshake)."""

    def __init__(self, endpoint: WebSocketEndpoint, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._endpoint = endpoint

    async def _handle_connection(self, stream: trio.abc.Stream) -> None:
        await self._endpoint._connection(stream, super()._handle_connection)
