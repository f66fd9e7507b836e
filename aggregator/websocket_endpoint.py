"""The WebSocket endpoint: one MCP session per connection, one message per text frame.

The handshake passes the same checks as HTTP (Host, Origin, bearer token) before it is
accepted; the subprotocol ``mcp`` is chosen when the client offers it. Frames larger than
the body limit close the connection (trio-websocket enforces it while reading).
"""

from __future__ import annotations

import logging
from collections import deque
from functools import partial
from typing import Any

import trio
import trio_websocket

from aggregator.access import AccessPolicy
from aggregator.config import HttpConfig, parse_listen
from aggregator.hub import Hub
from aggregator.jsonrpc.codec import dumps

log = logging.getLogger(__name__)


class WebSocketSink:
    """A hub client whose messages become text frames, sent by one writer task."""

    def __init__(self, limit: int) -> None:
        self.frames: deque[bytes] = deque()
        self.limit = limit
        self.size = 0
        self.dirty = False
        self.over_limit = False
        self._lot = trio.lowlevel.ParkingLot()
        self._room = trio.lowlevel.ParkingLot()

    def put_message(self, message: Any, related: Any = None) -> None:
        data = message if type(message) is bytes else dumps(message)
        self.frames.append(data)
        self.size += len(data)
        self.over_limit = self.size > self.limit

    def flush(self) -> None:
        self.dirty = False
        if self.frames:
            self._lot.unpark_all()

    async def wait_writable(self) -> None:
        while self.over_limit:
            await self._room.park()

    async def run(self, socket: trio_websocket.WebSocketConnection) -> None:
        while True:
            while not self.frames:
                await self._lot.park()
            data = self.frames.popleft()
            self.size -= len(data)
            if self.over_limit and self.size <= self.limit // 2:
                self.over_limit = False
                self._room.unpark_all()
            try:
                await socket.send_message(data.decode("utf-8"))
            except trio_websocket.ConnectionClosed:
                return


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
        sink = WebSocketSink(self.hub.config.proxy.max_message_bytes)
        key = self.hub.add_client(sink, profile)
        self.connections += 1
        log.info("websocket session %d: opened", key)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sink.run, socket)
                try:
                    while True:
                        message = await socket.get_message()
                        raw = message.encode("utf-8") if isinstance(message, str) else bytes(message)
                        self.hub.dispatch(await self.hub.client_message(key, raw))
                        await self.hub.flush()
                except trio_websocket.ConnectionClosed:
                    pass
                nursery.cancel_scope.cancel()
        finally:
            self.connections -= 1
            self.hub.remove_client(key)
            log.info("websocket session %d: closed", key)
