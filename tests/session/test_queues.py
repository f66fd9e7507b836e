"""Queues towards slow parties: compact storage, byte budgets, deadlines, and the rule that
nothing shared waits for one slow client or server."""

from __future__ import annotations

import json
import socket
import tracemalloc
from contextlib import asynccontextmanager
from typing import Any

import orjson
import trio
import trio.testing
import trio_websocket

from aggregator.config import structure_config
from aggregator.fronts.session import serve_stream_session
from aggregator.fronts.websocket.endpoint import WebSocketEndpoint
from aggregator.hub.hub import Hub
from aggregator.jsonrpc import LineSplitter, dumps
from aggregator.transports.channel import Channel
from aggregator.transports.outbox import MessageLog, Outbox
from tests.fakesrv import FakeServer
from tests.session.harness import Client, FakeUpstreams, make_config, running_proxy

NOTICE = {
    "jsonrpc": "2.0",
    "method": "notifications/message",
    "params": {"level": "info", "logger": "a/flood", "data": "message 12345"},
}


# --- MessageLog ----------------------------------------------------------------------------


def test_message_log_takes_in_order_and_keeps_history_within_its_budget():
    log = MessageLog(keep=10)
    for text in (b"aaaa", b"bbbb", b"cccc"):
        log.append(text)
    assert log.waiting == 3 and log.waiting_bytes == 12
    assert log.take() == b"aaaa"
    assert log.take_all() == [b"bbbb", b"cccc"]
    assert log.waiting == 0 and log.waiting_bytes == 0
    # 12 bytes were written; 10 may be kept: the oldest goes.
    assert log.history(0) == [(2, b"bbbb"), (3, b"cccc")]
    assert log.history(2) == [(3, b"cccc")]
    assert log.retained_bytes == 8
    log.append(b"d" * 50)
    assert log.take_all() == [b"d" * 50]
    # The last message is kept whatever its size, so a final answer can be replayed.
    assert log.history(0) == [(4, b"d" * 50)]


def test_message_log_without_history_keeps_only_what_waits():
    log = MessageLog()
    for number in range(3000):  # past the point where the offsets are compacted
        log.append(b"%d" % number)
        if number % 3 == 2:
            assert log.take_all() == [b"%d" % n for n in range(number - 2, number + 1)]
            assert log.retained_bytes == 0
    assert log.history(0) == []


def test_message_log_gives_back_what_waits_and_drops_the_oldest_as_a_ring():
    log = MessageLog(keep=100)
    log.append(b"sent")
    log.take()
    log.append(b"one")
    log.append(b"two")
    assert log.remove_waiting() == [b"one", b"two"]
    assert log.waiting == 0 and log.history(0) == [(1, b"sent")]
    log.append(b"three")  # numbering goes on from what was sent
    assert log.last == 2 and log.take() == b"three"

    ring = MessageLog()
    for number in range(10):
        ring.append(b"%02d" % number)
        ring.drop_oldest(6)
    assert ring.take_all() == [b"07", b"08", b"09"]


def test_many_small_messages_cost_their_size():
    """The reason for MessageLog: 20,000 orjson results held as bytes pin ~80 MB."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        log = MessageLog()
        for _ in range(20000):
            log.append(orjson.dumps(NOTICE))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    size = len(orjson.dumps(NOTICE)) * 20000
    assert log.waiting_bytes == size
    assert held < 2 * size, (held, size)


# --- Outbox --------------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.reports: list[str | None] = []

    def __call__(self, reason: str | None) -> None:
        self.reports.append(reason)


async def test_outbox_past_its_budget_reports_and_drops_notifications(autojump_clock):
    send, receive = trio.testing.lockstep_stream_pair()
    recorder = Recorder()
    outbox = Outbox(send, limit=1000, name="test", on_congestion=recorder)
    outbox.put_message(b"x" * 5000)  # one message of any size is taken when nothing waits
    assert recorder.reports == [] and not outbox.over
    outbox.put_message({"jsonrpc": "2.0", "id": 1, "result": {}})
    assert outbox.over and recorder.reports == ["more than 1000 bytes are waiting for it"]
    waiting = outbox.waiting
    outbox.put_message(NOTICE)  # nothing waits for a notification: dropped
    assert outbox.waiting == waiting and outbox.dropped == 1
    outbox.put_message({"jsonrpc": "2.0", "id": 2, "result": {}})  # answers still queue
    assert outbox.waiting > waiting
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        received = b""
        with trio.fail_after(5):
            while received.count(b"\n") < 3:
                received += await receive.receive_some(65536)
        assert recorder.reports[-1] is None and not outbox.over
        nursery.cancel_scope.cancel()


async def test_outbox_reports_a_write_that_does_not_finish_and_its_end(autojump_clock):
    send, receive = trio.testing.lockstep_stream_pair()
    recorder = Recorder()
    outbox = Outbox(send, limit=1 << 20, name="test", write_timeout=2.0, on_congestion=recorder)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        outbox.put_message(b"hello")
        outbox.flush()
        await trio.sleep(1.9)
        assert recorder.reports == []
        await trio.sleep(0.2)
        assert outbox.stalled and recorder.reports == ["it has read nothing for 2s"]
        with trio.fail_after(1):
            assert await receive.receive_some(65536) == b"hello\n"
        await trio.testing.wait_all_tasks_blocked()
        assert not outbox.stalled and recorder.reports[-1] is None
        nursery.cancel_scope.cancel()


async def test_only_its_own_reader_waits_on_a_backed_up_outbox(autojump_clock):
    send, receive = trio.testing.lockstep_stream_pair()
    outbox = Outbox(send, limit=100, name="test")
    outbox.put_message(b"y" * 80)
    outbox.put_message(b"z")
    waited = []

    async def own_reader():
        await outbox.wait_writable()
        waited.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(own_reader)
        await trio.sleep(3)
        assert waited == []  # 83 bytes wait: more than half the budget
        nursery.start_soon(outbox.run)
        with trio.fail_after(1):
            await receive.receive_some(65536)
        await trio.testing.wait_all_tasks_blocked()
        assert len(waited) == 1
        nursery.cancel_scope.cancel()


# --- slow clients and servers through the hub ------------------------------------------------


async def test_a_client_that_stops_reading_is_dropped_and_others_go_on(autojump_clock):
    async with running_proxy({"a": []}, client_buffer_bytes=65536, client_write_timeout=2.0) as proxy:
        fast = await proxy.connect()
        await fast.initialize()
        # The slow client's stream takes nothing it does not read (no buffer at all).
        ours, theirs = trio.testing.lockstep_stream_pair()
        proxy.nursery.start_soon(serve_stream_session, proxy.hub, theirs, theirs)
        slow = Client(ours)
        await slow.initialize()
        slow_key = max(proxy.hub.clients)
        await slow.send({"id": "h", "method": "tools/call", "params": {"name": "a__hang"}})
        await slow.send(
            {"id": "f", "method": "tools/call", "params": {"name": "a__flood", "arguments": {"count": 5000}}}
        )
        # The shared server and the other client are never held up by the slow one.
        with trio.fail_after(5):
            answer = await fast.request("tools/call", {"name": "a__echo", "arguments": {"n": 1}})
        assert answer["result"]["content"][0]["text"] == '{"n": 1}'
        with trio.fail_after(5):
            while slow_key in proxy.hub.clients:  # noqa: ASYNC110 - polls a state, bounded above
                await trio.sleep(0.1)
        server = proxy.upstreams.latest("a")
        hang = next(m for m in server.seen if (m.get("params") or {}).get("name") == "hang")
        with trio.fail_after(5):
            while not any(  # noqa: ASYNC110 - bounded above
                m.get("method") == "notifications/cancelled" and m["params"]["requestId"] == hang["id"]
                for m in server.seen
            ):
                await trio.sleep(0.1)
        # Its stream was closed: the client reads what was on the way, then the end.
        with trio.fail_after(5):
            while await ours.receive_some(65536):
                pass
        with trio.fail_after(5):
            assert (await fast.request("ping"))["result"] == {}


class StallingServer:
    """A FakeServer in memory whose input takes nothing it does not read; ``slow`` makes it
    stop reading for that many seconds (as a single-threaded server busy with a call)."""

    def __init__(self) -> None:
        self.server = FakeServer([])

    async def __call__(self, config: Any, *, task_status: trio.TaskStatus[Channel]) -> str:
        ours, theirs = trio.testing.lockstep_stream_pair()
        task_status.started(Channel(ours, ours))
        splitter = LineSplitter(1 << 24)
        while True:
            data = await theirs.receive_some(65536)
            if not data:
                return "the server closed its stdout"
            for line in splitter.feed(data):
                message = json.loads(line)
                params = message.get("params") or {}
                if message.get("method") == "tools/call" and params.get("name") == "slow":
                    await trio.sleep(params["arguments"]["seconds"])
                    await theirs.send_all(
                        dumps(
                            {
                                "jsonrpc": "2.0",
                                "id": message["id"],
                                "result": {"content": [{"type": "text", "text": "slept"}]},
                            }
                        )
                        + b"\n"
                    )
                    continue
                for out in self.server.handle(line):
                    await theirs.send_all(out + b"\n")


@asynccontextmanager
async def stalling_proxy(**proxy_settings: Any):
    stalling = StallingServer()
    others = FakeUpstreams({"b": []})

    async def connector(config: Any, *, task_status: trio.TaskStatus[Channel]) -> str:
        target = stalling if config.name == "a" else others
        return await target(config, task_status=task_status)

    # One client only (as with `serve --stdio`), with roots: its roots/list_changed reach
    # the shared servers, which see its roots.
    hub = Hub(make_config({"a": [], "b": []}, **proxy_settings), connector=connector, single_client=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.run)
        ours, theirs = trio.testing.memory_stream_pair()
        nursery.start_soon(serve_stream_session, hub, theirs, theirs)
        client = Client(ours)
        await client.initialize({"roots": {"listChanged": True}})
        yield hub, stalling, client
        nursery.cancel_scope.cancel()


async def test_a_server_that_stops_reading_fails_its_calls_and_others_answer(autojump_clock):
    async with stalling_proxy(server_write_timeout=2.0) as (hub, stalling, client):
        await client.send(
            {"id": "slow", "method": "tools/call", "params": {"name": "a__slow", "arguments": {"seconds": 30}}}
        )
        for index in range(3):
            await client.send(
                {
                    "id": f"e{index}",
                    "method": "tools/call",
                    "params": {"name": "a__echo", "arguments": {"text": "x" * 20000}},
                }
            )
        # The client's reader keeps reading: ping and the other server answer at once.
        with trio.fail_after(1):
            assert (await client.request("ping"))["result"] == {}
            answer = await client.request("tools/call", {"name": "b__echo", "arguments": {"n": 2}})
        assert answer["result"]["content"][0]["text"] == '{"n": 2}'
        # After the deadline, everything in flight to the stalled server fails, overloaded.
        with trio.fail_after(5):
            for id in ("slow", "e0", "e1", "e2"):
                error = (await client.response(id))["error"]
                assert error["data"] == {"source": "aggregator", "reason": "overloaded", "server": "a"}, error
                assert "has read nothing for 2s" in error["message"]
        # While it stays stalled, new requests are refused at once.
        with trio.fail_after(0.1):
            refused = await client.request("tools/call", {"name": "a__echo", "arguments": {}})
        assert refused["error"]["data"]["reason"] == "overloaded"
        # Once it reads again it takes requests again.
        await trio.sleep(30)
        with trio.fail_after(5):
            answer = await client.request("tools/call", {"name": "a__echo", "arguments": {"n": 3}})
        assert answer["result"]["content"][0]["text"] == '{"n": 3}'


async def test_what_waits_for_a_server_that_does_not_read_stays_within_its_budget(autojump_clock):
    async with stalling_proxy(server_write_timeout=1000.0, server_buffer_bytes=65536) as (hub, stalling, client):
        await client.send(
            {"id": "slow", "method": "tools/call", "params": {"name": "a__slow", "arguments": {"seconds": 30}}}
        )
        # A flood of roots changes is one notice to a server that has not asked for them since.
        spam = dumps({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}) + b"\n"
        for _ in range(20):
            await client.send_raw(spam * 1000)
        with trio.fail_after(1):
            assert (await client.request("ping"))["result"] == {}
        outbox = hub.upstreams["a"].outbox
        assert outbox.dropped == 0 and outbox.waiting < 1000
        # Requests fill it up to its budget; past it, they are refused at once (reason overloaded).
        for index in range(8):  # 8 x 20 kB: past 64 kB (and what the stalled stream took)
            await client.send(
                {
                    "id": f"big{index}",
                    "method": "tools/call",
                    "params": {"name": "a__echo", "arguments": {"text": "x" * 20000}},
                }
            )
        await client.send({"id": "ping", "method": "ping"})
        refused = []
        with trio.fail_after(1):
            while (answer := await client.receive()).get("id") != "ping":
                refused.append(answer)
        assert outbox.waiting < 65536 + 21000
        assert refused and all(answer["error"]["data"]["reason"] == "overloaded" for answer in refused)
        assert "more than 65536 bytes are waiting" in refused[0]["error"]["message"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_a_websocket_client_that_stops_reading_is_dropped_and_the_server_stays_shared():
    upstreams = FakeUpstreams({"a": []})
    config = structure_config(
        {
            "proxy": {"startup_timeout": 5.0, "client_write_timeout": 2.0},  # the default budget: 16 MiB
            "servers": {"a": {"command": "fake"}},
        },
        environ={},
    )
    hub = Hub(config, connector=upstreams)
    port = _free_port()
    url = f"ws://127.0.0.1:{port}/mcp"

    async def initialize(socket: trio_websocket.WebSocketConnection) -> None:
        await socket.send_message(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {},
                        "clientInfo": {"name": "t", "version": "0"},
                    },
                }
            )
        )
        assert json.loads(await socket.get_message())["id"] == 0
        await socket.send_message(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(hub.run)
            await nursery.start(WebSocketEndpoint(hub, config.http).serve, f"127.0.0.1:{port}")
            # The slow client: a small receive buffer, and it never reads after initialize.
            sock = trio.socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await sock.connect(("127.0.0.1", port))
            slow = await trio_websocket.wrap_client_stream(
                nursery, trio.SocketStream(sock), "127.0.0.1", "/mcp", message_queue_size=1
            )
            await initialize(slow)
            slow_key = max(hub.clients)
            await slow.send_message(
                json.dumps({"jsonrpc": "2.0", "id": "h", "method": "tools/call", "params": {"name": "a__hang"}})
            )
            for index in range(20):  # 20 MB of answers
                await slow.send_message(
                    json.dumps(
                        {
                            "jsonrpc": "2.0",
                            "id": index,
                            "method": "tools/call",
                            "params": {"name": "a__echo", "arguments": {"t": "x" * 1000000}},
                        }
                    )
                )
            async with trio_websocket.open_websocket_url(url) as fast:
                await initialize(fast)
                for id in range(100, 103):
                    with trio.fail_after(5):
                        await fast.send_message(
                            json.dumps(
                                {
                                    "jsonrpc": "2.0",
                                    "id": id,
                                    "method": "tools/call",
                                    "params": {"name": "a__echo", "arguments": {"id": id}},
                                }
                            )
                        )
                        answer = json.loads(await fast.get_message())
                    assert answer["id"] == id and "result" in answer
                with trio.fail_after(10):
                    while slow_key in hub.clients:  # noqa: ASYNC110 - polls a state, bounded above
                        await trio.sleep(0.05)
                server = upstreams.latest("a")
                hang = next(m for m in server.seen if (m.get("params") or {}).get("name") == "hang")
                with trio.fail_after(5):  # its calls are cancelled upstream
                    while not any(  # noqa: ASYNC110 - bounded above
                        m.get("method") == "notifications/cancelled" and m["params"]["requestId"] == hang["id"]
                        for m in server.seen
                    ):
                        await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
