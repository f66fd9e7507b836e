"""Run the hub over trio memory streams: fake upstreams in memory, a scripted client."""

from __future__ import annotations

import itertools
from typing import Any

import trio
import trio.testing

from aggregator.config import structure_config
from aggregator.fronts.session import serve_stream_session
from aggregator.hub.hub import Hub
from aggregator.jsonrpc import LineSplitter, dumps, loads
from aggregator.transports.channel import Channel
from tests.fakesrv import FakeServer


class FakeUpstreams:
    """A connector that runs FakeServer instances in memory and remembers them."""

    def __init__(self, modes: dict[str, list[str]]) -> None:
        self.modes = modes
        self.servers: dict[str, list[FakeServer]] = {name: [] for name in modes}

    def latest(self, name: str) -> FakeServer:
        return self.servers[name][-1]

    async def __call__(self, config: Any, *, task_status: trio.TaskStatus[Channel]) -> str:
        server = FakeServer(self.modes[config.name])
        self.servers[config.name].append(server)
        ours, theirs = trio.testing.memory_stream_pair()
        # "streams": the channel says what belongs to a request comes on that request's own
        # stream, as a Streamable HTTP upstream's does; the fake writes lines, of no request,
        # so all it sends arrives as if on its GET stream.
        task_status.started(Channel(ours, ours, streams="streams" in server.modes))
        if "exit_at_start" in server.modes:
            return "the server exited with status 3"
        try:
            return await self._serve(server, theirs)
        finally:
            if "slow_stop" in server.modes:  # as a child that takes the stop ladder's 2 s to go
                with trio.CancelScope(shield=True):
                    await trio.sleep(2)

    async def _serve(self, server: FakeServer, theirs: trio.abc.Stream) -> str:
        splitter = LineSplitter(1 << 24)
        writing = trio.Lock()  # the answers and the progress task write one stream: one at a time
        async with trio.open_nursery() as nursery:
            while True:
                data = await theirs.receive_some(65536)
                if not data:
                    nursery.cancel_scope.cancel()
                    return "the server closed its stdout"
                for line in splitter.feed(data):
                    for out in server.handle(line):
                        async with writing:
                            await theirs.send_all(out + b"\n")
                    if server.exit_code is not None:
                        nursery.cancel_scope.cancel()
                        return f"the server exited with status {server.exit_code}"
                    if server.progress_forever is not None:
                        nursery.start_soon(self._progress_forever, theirs, writing, server.progress_forever)
                        server.progress_forever = None

    @staticmethod
    async def _progress_forever(stream: trio.abc.Stream, writing: trio.Lock, token: Any) -> None:
        sent = 0
        while True:
            await trio.sleep(0.5)
            sent += 1
            async with writing:
                await stream.send_all(
                    dumps(
                        {
                            "jsonrpc": "2.0",
                            "method": "notifications/progress",
                            "params": {"progressToken": token, "progress": sent},
                        }
                    )
                    + b"\n"
                )


def make_config(
    servers: dict[str, list[str]],
    server_settings: dict[str, Any] | None = None,
    plugins: list[dict[str, Any]] | None = None,
    **proxy: Any,
):
    return structure_config(
        {
            "proxy": {"startup_timeout": 5.0, **proxy},
            "plugins": plugins or [],
            "servers": {name: {"command": "fake", "init_timeout": 2.0, **(server_settings or {})} for name in servers},
        },
        environ={},
    )


class Client:
    """A scripted MCP client on a memory stream."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.splitter = LineSplitter(1 << 24)
        self.ids = itertools.count(1)
        self.inbox: list[dict[str, Any]] = []
        self.notifications: list[dict[str, Any]] = []

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def send(self, message: dict[str, Any]) -> None:
        await self.stream.send_all(dumps({"jsonrpc": "2.0", **message}) + b"\n")

    async def receive(self) -> dict[str, Any]:
        while not self.inbox:
            data = await self.stream.receive_some(65536)
            assert data, "the proxy closed the connection"
            self.inbox += [loads(line) for line in self.splitter.feed(data)]
        return self.inbox.pop(0)

    async def response(self, id: Any) -> dict[str, Any]:
        while True:
            message = await self.receive()
            if "method" in message and "id" not in message:
                self.notifications.append(message)
                continue
            assert message.get("id") == id, message
            return message

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        id = next(self.ids)
        message: dict[str, Any] = {"id": id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return await self.response(id)

    async def initialize(self, capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
        answer = await self.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": capabilities or {},
                "clientInfo": {"name": "test", "version": "0"},
            },
        )
        await self.send({"method": "notifications/initialized"})
        return answer["result"]

    async def list_all(self, method: str, key: str) -> list[dict[str, Any]]:
        items, cursor = [], None
        for _ in range(100):
            answer = await self.request(method, {"cursor": cursor} if cursor else {})
            items += answer["result"][key]
            cursor = answer["result"].get("nextCursor")
            if not cursor:
                return items
        raise AssertionError("pagination did not end")


class Proxy:
    def __init__(self, hub: Hub, upstreams: FakeUpstreams, nursery: trio.Nursery) -> None:
        self.hub = hub
        self.upstreams = upstreams
        self.nursery = nursery

    async def connect(self) -> Client:
        ours, theirs = trio.testing.memory_stream_pair()
        self.nursery.start_soon(serve_stream_session, self.hub, theirs, theirs)
        return Client(ours)


def running_proxy(
    servers: dict[str, list[str]],
    server_settings: dict[str, Any] | None = None,
    plugins: list[dict[str, Any]] | None = None,
    **proxy: Any,
):
    """An async context manager yielding a Proxy with the given fake servers."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def run():
        upstreams = FakeUpstreams(servers)
        hub = Hub(make_config(servers, server_settings, plugins, **proxy), connector=upstreams)
        async with trio.open_nursery() as nursery:
            await nursery.start(hub.run)
            yield Proxy(hub, upstreams, nursery)
            nursery.cancel_scope.cancel()

    return run()
