"""The network fronts in-process: a hub with in-memory fake servers behind the Streamable
HTTP (with legacy SSE) and WebSocket endpoints, listening on loopback, and small raw
clients for them. Tests can reach inside (the hub, the endpoints) to inject faults."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
import trio_websocket

from aggregator.config import structure_config
from aggregator.fronts.http.endpoint import StreamableHttpEndpoint
from aggregator.fronts.websocket.endpoint import WebSocketEndpoint
from aggregator.hub.hub import Hub
from aggregator.ops.admin import AdminRoutes
from tests.loopback import INIT, free_port
from tests.rawhttp import Response, ResponseReader, read_response_async, request_bytes
from tests.session.harness import FakeUpstreams


@attrs.define
class Fronts:
    hub: Hub
    upstreams: FakeUpstreams
    http: StreamableHttpEndpoint
    ws: WebSocketEndpoint
    http_port: int
    ws_port: int

    def headers(self, **extra: str) -> dict[str, str]:
        base = {
            "host": f"127.0.0.1:{self.http_port}",
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
        }
        base.update({key.replace("_", "-"): value for key, value in extra.items()})
        return base

    async def connect(self) -> trio.SocketStream:
        return await trio.open_tcp_stream("127.0.0.1", self.http_port)

    async def send(
        self,
        stream: trio.abc.Stream,
        method: str,
        path: str = "/mcp",
        headers: dict[str, str] | list[tuple[str, str]] | None = None,
        body: Any = b"",
        reader: ResponseReader | None = None,
    ) -> Response:
        """One request on an open connection; its response (the head only, for a stream)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        await stream.send_all(request_bytes(method, path, self.headers() if headers is None else headers, data))
        with trio.fail_after(10):
            return await read_response_async(stream, reader)

    async def request(self, method: str, path: str = "/mcp", headers: Any = None, body: Any = b"") -> Response:
        """One request on a new connection, which is closed after the response."""
        stream = await self.connect()
        try:
            return await self.send(stream, method, path, headers, body)
        finally:
            await stream.aclose()

    async def initialize(self) -> str:
        response = await self.request("POST", body=INIT)
        assert response.status == 200, response
        return response.headers["mcp-session-id"]

    async def ping(self, session: str, id: Any = 2) -> dict[str, Any]:
        response = await self.request(
            "POST", headers=self.headers(mcp_session_id=session), body={"jsonrpc": "2.0", "id": id, "method": "ping"}
        )
        assert response.status == 200, response
        return json.loads(response.body)

    @asynccontextmanager
    async def websocket(self):
        async with trio_websocket.open_websocket_url(f"ws://127.0.0.1:{self.ws_port}/mcp") as socket_:
            yield socket_


@asynccontextmanager
async def running_fronts(
    modes: list[str] | None = None,
    profiles: dict[str, Any] | None = None,
    auth: dict[str, Any] | None = None,
    cluster: dict[str, Any] | None = None,
    share_sessions: bool = False,
    **http: Any,
):
    """Hub + HTTP + WebSocket endpoints with one fake server ``a``; ``http`` sets [http] keys,
    ``profiles`` the [profiles] table, ``auth`` the [auth] table, ``cluster`` the [cluster] one;
    ``share_sessions``: sessions' state and GET streams in the (embedded) store, as with a
    configured one."""
    upstreams = FakeUpstreams({"a": modes or []})
    config = structure_config(
        {
            "proxy": {"startup_timeout": 5.0},
            "http": http,
            "servers": {"a": {"command": "fake", "init_timeout": 2.0}},
            **({"profiles": profiles} if profiles else {}),
            **({"auth": auth} if auth else {}),
            **({"cluster": cluster} if cluster else {}),
        },
        environ={},
    )
    hub = Hub(config, connector=upstreams)
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.run)
        with trio.fail_after(5):
            await hub.startup_done.wait()
        endpoint = StreamableHttpEndpoint(hub, config.http, admin=AdminRoutes(hub, config.http, reload=False))
        if share_sessions:
            endpoint.share_sessions()
        http_port = free_port()
        await nursery.start(endpoint.serve, f"127.0.0.1:{http_port}")
        ws = WebSocketEndpoint(hub, config.http)
        ws_port = free_port()
        await nursery.start(ws.serve, f"127.0.0.1:{ws_port}")
        yield Fronts(hub, upstreams, endpoint, ws, http_port, ws_port)
        nursery.cancel_scope.cancel()


class EventStream:
    """The events of a chunked text/event-stream response, read from its connection."""

    def __init__(self, stream: trio.abc.Stream, response: Response) -> None:
        assert response.status == 200 and response.streaming, response
        self.stream = stream
        self.raw = bytearray(response.body)  # chunked bytes not yet decoded
        self.text = bytearray()  # decoded SSE text not yet split into events
        self.ended = False

    async def next(self) -> tuple[str, bytes]:
        """The next event with data, as (event name, data); AssertionError if the stream ends."""
        _id, name, data = await self._next_event()
        return name, data

    async def next_message(self) -> tuple[str, Any]:
        """The next event with data, as (its event id, the JSON message it carries)."""
        id, _name, data = await self._next_event()
        return id, json.loads(data)

    async def _next_event(self) -> tuple[str, str, bytes]:
        while True:
            while b"\n\n" in self.text:
                block, _, rest = bytes(self.text).partition(b"\n\n")
                self.text = bytearray(rest)
                id, name, data = "", "message", []
                for line in block.split(b"\n"):
                    if line.startswith(b"data: "):
                        data.append(line[6:])
                    elif line.startswith(b"event: "):
                        name = line[7:].decode()
                    elif line.startswith(b"id: "):
                        id = line[4:].decode()
                if any(data):
                    return id, name, b"\n".join(data)
            self._dechunk()
            if b"\n\n" in self.text:
                continue
            assert not self.ended, "the event stream ended"
            data_in = await self.stream.receive_some(65536)
            assert data_in, "the connection closed"
            self.raw += data_in

    async def wait_closed(self) -> None:
        """Read until the server ends the stream (last chunk) or closes the connection."""
        while not self.ended:
            self._dechunk()
            if self.ended:
                return
            data = await self.stream.receive_some(65536)
            if not data:
                return
            self.raw += data

    def _dechunk(self) -> None:
        while True:
            end = self.raw.find(b"\r\n")
            if end == -1:
                return
            size = int(bytes(self.raw[:end]).split(b";")[0], 16)
            if size == 0:
                self.ended = True
                return
            if len(self.raw) < end + 2 + size + 2:
                return
            self.text += self.raw[end + 2 : end + 2 + size]
            del self.raw[: end + 2 + size + 2]
