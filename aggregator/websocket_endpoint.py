"""The WebSocket endpoint: one MCP session per connection, one message per text frame.

The handshake passes the same checks as HTTP (Host, Origin, bearer token) before it is
accepted; the subprotocol ``mcp`` is chosen when the client offers it. Frames larger than
the body limit close the connection (trio-websocket enforces it while reading).

Admission is shared with the HTTP endpoint (``hub.admission``): a connection over
``http.max_connections`` gets 503 before its handshake is read, a handshake over
``http.max_sessions`` (or while the aggregator drains) is rejected with 503. The whole
handshake must arrive within ``http.header_timeout``.

Containment: every connection runs inside a boundary. A handshake the WebSocket library
cannot parse (bytes no header may hold) is a client's mistake: 400, one warning line. An
exception while the session runs is ours: logged with its traceback, the message being
handled is answered with a JSON-RPC internal error, and the connection closes with 1011;
other connections and the process go on.
"""

from __future__ import annotations

import contextvars
import logging
import math
import re
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import trio
import trio_websocket
from wsproto.connection import ConnectionState
from wsproto.events import TextMessage
from wsproto.utilities import LocalProtocolError, ProtocolError

from aggregator.access import AccessPolicy
from aggregator.config import HttpConfig, parse_listen
from aggregator.containment import internal_error
from aggregator.hub import Hub
from aggregator.jsonrpc.codec import dumps
from aggregator.transports.budget import ClientMemory, release_all
from aggregator.transports.buffer import MessageLog
from aggregator.transports.http_server import refuse_connection
from aggregator.transports.outbox import cannot_take_more, fd_of, send_in_steps

log = logging.getLogger(__name__)
BAD_HANDSHAKE = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    b"content-length: 29\r\n\r\nmalformed WebSocket handshake"
)
# Set by a connection's task, read by the handler it calls: the connection's HandshakeTap.
_handshake: contextvars.ContextVar[HandshakeTap] = contextvars.ContextVar("handshake")
# More than any head the WebSocket library accepts (its h11 stops at 16 KiB).
HEAD_LIMIT = 64 * 1024
_LINE_END = re.compile(rb"\r?\n")


class HandshakeTap(trio.abc.Stream):
    """A connection's stream as trio-websocket reads it: keeps the bytes of the handshake's
    head, then steps aside.

    The DNS-rebinding check needs the handshake's Host, which trio-websocket parses but
    does not expose (its ``WebSocketRequest.headers`` leave Host out). Once the head is
    complete, ``receive_some`` is the stream's own: frames pass through no extra call.
    """

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.socket = getattr(stream, "socket", None)  # for fd_of
        self.head = bytearray()
        self.read = False  # set when trio-websocket has read the whole handshake
        self.send_all = stream.send_all  # type: ignore[method-assign]
        self.wait_send_all_might_not_block = stream.wait_send_all_might_not_block  # type: ignore[method-assign]
        self.aclose = stream.aclose  # type: ignore[method-assign]

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.stream.receive_some(max_bytes)
        head = self.head
        head += data
        if not data or b"\n\r\n" in head or b"\n\n" in head or len(head) > HEAD_LIMIT:
            self.receive_some = self.stream.receive_some  # type: ignore[method-assign]
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()

    def host(self) -> str | None:
        """The head's Host as the WebSocket library read it: the last one, IDNA-decoded."""
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
        self.head = bytearray()
        return host


class WebSocketSink:
    """A hub client whose messages become text frames, sent by one writer task.

    Like an Outbox: what waits is stored compactly and has a byte budget
    (``proxy.client_buffer_bytes``); every write has a deadline
    (``proxy.client_write_timeout``). Past either, ``on_drop`` ends the connection (its
    requests are cancelled upstream when the handler removes the client). Only the
    connection's own reader waits on it (``wait_writable``). What waits and what is being
    written count in ``held`` and in the budget of all clients (``memory``).
    """

    def __init__(
        self,
        limit: int,
        write_timeout: float = math.inf,
        on_drop: Callable[[str], None] | None = None,
        memory: ClientMemory | None = None,
    ) -> None:
        self.messages = MessageLog()
        self.limit = limit
        self.write_timeout = write_timeout
        self.on_drop = on_drop
        self.memory = memory if memory is not None else ClientMemory()
        self.held = 0
        self.progress_at = trio.current_time()  # when a write to it last finished
        self.dirty = False
        self.closed = False
        self._writing = False
        self._fd: int | None = None
        self._lot = trio.lowlevel.ParkingLot()
        self._room = trio.lowlevel.ParkingLot()

    def put_message(self, message: Any, related: Any = None) -> None:
        if self.closed:
            return
        data = message if type(message) is bytes else dumps(message)
        messages = self.messages
        messages.append(data)
        size = len(data)
        if not self.held:  # it had nothing waiting: it is not stalled yet
            self.progress_at = trio.current_time()
        self.held += size
        memory = self.memory
        memory.total += size
        if messages.retained_bytes > self.limit and messages.retained_bytes > size:
            self.drop(f"more than {self.limit} bytes are waiting for it")
        if memory.total > memory.limit:
            memory.exceeded()

    def flush(self) -> None:
        self.dirty = False
        if self.messages.last != self.messages.sent:
            self._lot.unpark_all()

    async def wait_writable(self) -> None:
        """For this connection's own reader: wait while more than half the budget waits."""
        while self.messages.retained_bytes > self.limit // 2 and not self.closed:
            await self._room.park()

    def drop(self, reason: str) -> None:
        """Forget what waits and end the connection."""
        if self.closed:
            return
        self.close()
        if self.on_drop is not None:
            self.on_drop(reason)

    shed = drop  # the budget of all clients is past, and this one is the first to go

    def blocked(self) -> bool:
        """Whether a write is waiting for the client to read."""
        return self._writing and cannot_take_more(self._fd)

    def last_progress(self) -> float:
        """When a write to it last finished."""
        return self.progress_at

    async def wait_drained(self) -> None:
        """Returns at once: at shutdown nothing waits for a WebSocket's writer."""
        return

    def close(self) -> None:
        """Forget what waits and take nothing more (the connection ended)."""
        self.closed = True
        self.messages.clear()
        release_all(self)
        self._lot.unpark_all()
        self._room.unpark_all()

    def _progressed(self) -> None:
        self.progress_at = trio.current_time()

    async def run(self, socket: trio_websocket.WebSocketConnection) -> None:
        send = _frame_writer(socket, self._progressed)
        self._fd = fd_of(getattr(socket, "_stream", None))
        while not self.closed:
            if self.messages.last == self.messages.sent:
                await self._lot.park()
                continue
            # Every frame that waits goes in one write: a client that reads promptly
            # keeps up with any burst (one write per frame would yield to the busy
            # producer after every message, and fall behind).
            size = self.messages.waiting_bytes
            self._writing = True
            with trio.move_on_after(self.write_timeout) as scope:
                try:
                    await send(self.messages, self._room.unpark_all)
                except trio_websocket.ConnectionClosed:
                    return
                finally:
                    self._writing = False
                    self.held -= size
                    self.memory.total -= size
                    self.progress_at = trio.current_time()
            if scope.cancelled_caught:
                self.drop(f"a write did not finish within {self.write_timeout:g}s")
                return


def _text_frame_head(number: int, length: int) -> bytes:
    """The head of an unmasked, final text frame (RFC 6455 5.2) of ``length`` bytes."""
    if length < 126:
        return struct.pack("!BB", 0x81, length)
    if length < 65536:
        return struct.pack("!BBH", 0x81, 126, length)
    return struct.pack("!BBQ", 0x81, 127, length)


def _frame_writer(
    socket: trio_websocket.WebSocketConnection,
    progressed: Callable[[], None],
) -> Callable[[MessageLog, Callable[[], object]], Awaitable[None]]:
    """How to send every waiting message, as text frames, in one write on this connection.

    trio-websocket has no public call for that, so this writes under its send lock, as its
    ``send_message`` does for one message. With no extension negotiated (trio-websocket
    offers none) a server's text frame is a head and the message's bytes, so the frames
    are built straight from the queue in one copy (through wsproto, each message would be
    copied four times more: decoded, encoded, framed, joined); otherwise they are built by
    the connection's own wsproto state. Should trio-websocket's internals ever change, it
    falls back to one ``send_message`` per frame (correct, only slower). ``taken`` is
    called once the messages are out of the queue.
    """
    protocol = getattr(socket, "_wsproto", None)
    stream = getattr(socket, "_stream", None)
    lock = getattr(socket, "_stream_lock", None)
    if protocol is None or stream is None or lock is None or not hasattr(protocol, "send"):

        async def one_by_one(messages: MessageLog, taken: Callable[[], object]) -> None:
            batch = messages.take_all()
            taken()
            while batch:
                await socket.send_message(batch.pop(0).decode("utf-8"))

        return one_by_one

    def plain() -> bool:
        connection = getattr(protocol, "connection", None)
        frames = getattr(connection, "_proto", None)
        return (
            frames is not None
            and not getattr(frames, "extensions", True)
            and getattr(frames, "_outbound_opcode", True) is None
            and not protocol.client
        )

    async def together(messages: MessageLog, taken: Callable[[], object]) -> None:
        if socket.closed is not None:
            raise trio_websocket.ConnectionClosed(socket.closed)
        if protocol.state is not ConnectionState.OPEN:  # closing
            raise trio_websocket.ConnectionClosed(socket.closed)
        data: bytes | bytearray
        if plain():
            data = messages.take_all_framed(_text_frame_head)[0]
        else:
            batch = messages.take_all()
            try:
                data = b"".join(protocol.send(TextMessage(data=item.decode("utf-8"))) for item in batch)
            except LocalProtocolError:  # the connection is closing
                raise trio_websocket.ConnectionClosed(socket.closed) from None
            del batch
        taken()
        async with lock:
            try:
                await send_in_steps(stream, data, progressed)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise trio_websocket.ConnectionClosed(socket.closed) from None

    return together


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

    async def _handle(self, request: trio_websocket.WebSocketRequest) -> None:
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
        refusal = self.access.refusal(headers)
        if refusal is not None:
            status, reason, extra = refusal
            log.warning("websocket: refused a connection: %s", reason)
            await request.reject(
                status, extra_headers=[(k.encode(), v.encode()) for k, v in extra], body=reason.encode()
            )
            return
        principal = self.access.principal(headers)
        profile = self.access.profile(principal)
        named = self.access.named_profile(request.path)
        if named is None:
            await request.reject(404, body=f"not found; the MCP endpoint is {self.config.path}".encode())
            return
        if named:  # /mcp/<profile>: that profile, if the token (when tokens are used) gives it
            if principal is not None and profile != named:
                await request.reject(403, body=f"this token does not give access to profile {named!r}".encode())
                return
            profile = named
        session_refusal = self.admission.admit_session()
        if session_refusal is not None:
            extra_headers = (
                []
                if session_refusal.retry_after is None
                else [(b"retry-after", str(session_refusal.retry_after).encode())]
            )
            await request.reject(503, extra_headers=extra_headers, body=session_refusal.message.encode())
            return
        try:
            await self._session(request, profile)
        finally:
            self.admission.release_session()

    async def _session(self, request: trio_websocket.WebSocketRequest, profile: str) -> None:
        """One admitted session, from accepting the handshake to the connection's end."""
        subprotocol = "mcp" if "mcp" in request.proposed_subprotocols else None
        socket = await request.accept(subprotocol=subprotocol)
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
