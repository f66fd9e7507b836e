"""The WebSocket endpoint: one MCP session per connection, one message per text frame.

The handshake passes the same checks as HTTP (Host, Origin, bearer token) before it is
accepted; the subprotocol ``mcp`` is chosen when the client offers it. Frames larger than
the body limit close the connection (trio-websocket enforces it while reading).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio
import trio_websocket
from wsproto.events import TextMessage
from wsproto.utilities import LocalProtocolError

from aggregator.access import AccessPolicy
from aggregator.config import HttpConfig, parse_listen
from aggregator.hub import Hub
from aggregator.jsonrpc.codec import dumps
from aggregator.transports.buffer import MessageLog

log = logging.getLogger(__name__)


class WebSocketSink:
    """A hub client whose messages become text frames, sent by one writer task.

    Like an Outbox: what waits is stored compactly and has a byte budget
    (``proxy.client_buffer_bytes``); every write has a deadline
    (``proxy.client_write_timeout``). Past either, ``on_drop`` ends the connection (its
    requests are cancelled upstream when the handler removes the client). Only the
    connection's own reader waits on it (``wait_writable``).
    """

    def __init__(self, limit: int, write_timeout: float = math.inf,
                 on_drop: Callable[[str], None] | None = None) -> None:
        self.messages = MessageLog()
        self.limit = limit
        self.write_timeout = write_timeout
        self.on_drop = on_drop
        self.dirty = False
        self.closed = False
        self._lot = trio.lowlevel.ParkingLot()
        self._room = trio.lowlevel.ParkingLot()

    def put_message(self, message: Any, related: Any = None) -> None:
        if self.closed:
            return
        data = message if type(message) is bytes else dumps(message)
        messages = self.messages
        messages.append(data)
        if messages.retained_bytes > self.limit and messages.retained_bytes > len(data):
            self.drop(f"more than {self.limit} bytes are waiting for it")

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
        self.closed = True
        self.messages.clear()
        self._lot.unpark_all()
        self._room.unpark_all()
        if self.on_drop is not None:
            self.on_drop(reason)

    async def run(self, socket: trio_websocket.WebSocketConnection) -> None:
        send = _frame_writer(socket)
        while not self.closed:
            if self.messages.last == self.messages.sent:
                await self._lot.park()
                continue
            # Every frame that waits goes in one write: a client that reads promptly
            # keeps up with any burst (one write per frame would yield to the busy
            # producer after every message, and fall behind).
            batch = self.messages.take_all()
            self._room.unpark_all()
            with trio.move_on_after(self.write_timeout) as scope:
                try:
                    await send(batch)
                except trio_websocket.ConnectionClosed:
                    return
            del batch
            if scope.cancelled_caught:
                self.drop(f"a write did not finish within {self.write_timeout:g}s")
                return


def _frame_writer(socket: trio_websocket.WebSocketConnection) -> Callable[[list[bytes]], Awaitable[None]]:
    """How to send several text messages in one write on this connection.

    trio-websocket has no public call for that, so this builds the frames with the
    connection's own wsproto state and writes them under its send lock, exactly as its
    ``send_message`` does for one. Should its internals ever change, it falls back to one
    ``send_message`` per frame (correct, only slower).
    """
    protocol = getattr(socket, "_wsproto", None)
    stream = getattr(socket, "_stream", None)
    lock = getattr(socket, "_stream_lock", None)
    if protocol is None or stream is None or lock is None or not hasattr(protocol, "send"):
        async def one_by_one(batch: list[bytes]) -> None:
            for data in batch:
                await socket.send_message(data.decode("utf-8"))
        return one_by_one

    async def together(batch: list[bytes]) -> None:
        if socket.closed is not None:
            raise trio_websocket.ConnectionClosed(socket.closed)
        try:
            data = b"".join(protocol.send(TextMessage(data=item.decode("utf-8"))) for item in batch)
        except LocalProtocolError:  # the connection is closing
            raise trio_websocket.ConnectionClosed(socket.closed) from None
        async with lock:
            try:
                await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise trio_websocket.ConnectionClosed(socket.closed) from None
    return together


class WebSocketEndpoint:
    def __init__(self, hub: Hub, config: HttpConfig) -> None:
        self.hub = hub
        self.config = config
        self.access = AccessPolicy(config, hub.config.profiles)
        self.connections = 0

    async def serve(self, listen: str, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        host, port = parse_listen(listen)
        async with trio.open_nursery() as nursery:
            server = await nursery.start(partial(
                trio_websocket.serve_websocket, self._handle, host, port, None,
                max_message_size=self.config.max_body_bytes, message_queue_size=16,
            ))
            log.info("serving MCP over WebSocket at ws://%s:%d%s", host, server.port, self.config.path)
            task_status.started(server)

    async def _handle(self, request: trio_websocket.WebSocketRequest) -> None:
        headers: dict[str, str] = {}
        for name, value in request.headers:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        # trio-websocket leaves Host out of .headers (wsproto keeps it on the handshake
        # event); the DNS-rebinding check needs it.
        host = getattr(getattr(request, "_event", None), "host", None)
        if host is not None:
            headers["host"] = host
        refusal = self.access.refusal(headers)
        if refusal is not None:
            status, reason, extra = refusal
            log.warning("websocket: refused a connection: %s", reason)
            await request.reject(status, extra_headers=[(k.encode(), v.encode()) for k, v in extra],
                                 body=reason.encode())
            return
        path = request.path.split("?", 1)[0]
        principal = self.access.principal(headers)
        profile = self.access.profile(principal)
        if path != self.config.path:
            named = path[len(self.config.path) + 1:] if path.startswith(self.config.path + "/") else ""
            if named not in self.hub.config.profiles:
                await request.reject(404, body=f"not found; the MCP endpoint is {self.config.path}".encode())
                return
            if principal is not None and profile != named:
                await request.reject(403, body=f"this token does not give access to profile {named!r}".encode())
                return
            profile = named
        if self.connections >= self.config.max_sessions:
            await request.reject(503, body=b"too many sessions; try later")
            return
        subprotocol = "mcp" if "mcp" in request.proposed_subprotocols else None
        socket = await request.accept(subprotocol=subprotocol)
        connection = trio.CancelScope()
        key = 0

        def dropped(reason: str) -> None:
            log.error("websocket session %d dropped: %s (it does not read what it is sent); its requests are"
                      " cancelled", key, reason)
            connection.cancel()

        proxy = self.hub.config.proxy
        sink = WebSocketSink(proxy.client_buffer_bytes, proxy.client_write_timeout, on_drop=dropped)
        key = self.hub.add_client(sink, profile)
        self.connections += 1
        log.info("websocket session %d: opened", key)
        try:
            with connection:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sink.run, socket)
                    try:
                        while True:
                            message = await socket.get_message()
                            raw = message.encode("utf-8") if isinstance(message, str) else bytes(message)
                            self.hub.dispatch(await self.hub.client_message(key, raw))
                            await self.hub.flush(sink)
                    except trio_websocket.ConnectionClosed:
                        pass
                    nursery.cancel_scope.cancel()
        finally:
            self.connections -= 1
            self.hub.remove_client(key)
            log.info("websocket session %d: closed", key)
