"""The client sinks keep the ``ClientSink`` protocol the hub relies on, the hub is what an
upstream, a front and the plugin gate need of it (their ports), and the hub sends every one of the router's
commands to its handler by type."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from aggregator.core import router as core_router
from aggregator.core.router import ToClient, ToServer, UpstreamServing
from aggregator.fronts.http.legacy_sse import LegacySession
from aggregator.fronts.http.sessions import HttpSession
from aggregator.fronts.websocket.sink import WebSocketSink
from aggregator.transports.budget import ClientMemory
from aggregator.transports.outbox import Outbox
from aggregator.transports.sink import ClientSink
from tests.session.harness import running_proxy

SINKS = [Outbox, HttpSession, LegacySession, WebSocketSink]
METHODS = ["put_message", "flush", "wait_writable", "wait_drained", "blocked", "last_progress", "shed", "request_ended"]


@pytest.mark.parametrize("sink", SINKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("method", METHODS)
def test_every_sink_has_every_method_of_the_protocol(sink, method):
    declared = getattr(ClientSink, method)
    assert callable(getattr(sink, method, None)), f"{sink.__name__} has no {method}"
    assert inspect.iscoroutinefunction(getattr(sink, method)) == inspect.iscoroutinefunction(declared)


def test_the_method_list_is_the_protocol():
    members = {name for name in vars(ClientSink) if not name.startswith("_")}
    assert members == set(METHODS)
    assert set(ClientSink.__annotations__) == {"dirty", "held"}


async def test_sinks_built_as_the_fronts_build_them_are_client_sinks():
    ours, _theirs = trio.testing.memory_stream_pair()
    hub = SimpleNamespace(
        config=SimpleNamespace(proxy=SimpleNamespace(client_buffer_bytes=1000)), client_memory=ClientMemory()
    )
    sinks = [
        Outbox(ours, limit=1000, name="stdio"),
        HttpSession(SimpleNamespace(hub=hub), "s", None),
        LegacySession("l", None, 1000),
        WebSocketSink(1000),
    ]
    for sink in sinks:
        assert isinstance(sink, ClientSink), type(sink).__name__
        assert sink.held == 0 and sink.dirty is False and not sink.blocked()
        assert sink.last_progress() <= trio.current_time()
        with trio.fail_after(1):
            await sink.wait_drained()  # nothing queued: returns at once
    assert not isinstance(object(), ClientSink)


def test_the_hub_has_a_handler_for_every_command_it_is_given():
    dispatched = {
        "ToClient",
        "ToServer",
        "UpstreamServing",
        "DropUpstream",
        "Answer",
        "StartUpstream",
        "StopUpstream",
        "WakeUpstream",
        "StopIdle",
    }
    assert all(isinstance(getattr(core_router, name), type) for name in dispatched)
    dispatched.update({"RequestEnded", "ShareKept", "FetchKept"})

    async def main():
        async with running_proxy({"a": []}) as proxy:
            assert {kind.__name__ for kind in proxy.hub._handlers} == dispatched
            with pytest.raises(TypeError, match="cannot dispatch"):
                proxy.hub.dispatch([core_router.WaitForStartup(1)])

    trio.run(main)


async def test_dispatch_queues_messages_for_the_client_and_the_server(autojump_clock, tmp_path):
    record = tmp_path / "a.log"
    async with running_proxy({"a": [f"record:{record}"]}) as proxy:
        await proxy.hub.startup_done.wait()
        client = await proxy.connect()
        await client.initialize()
        [key] = proxy.hub.clients
        proxy.hub.dispatch_now(
            [
                ToClient(
                    key,
                    {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "hello"}},
                )
            ]
        )
        notice = await client.receive()
        assert notice["params"]["data"] == "hello"
        proxy.hub.dispatch_now(
            [ToServer("a", {"jsonrpc": "2.0", "id": "own-1", "method": "ping"}), UpstreamServing("a")]
        )
        with trio.fail_after(5):
            while b'"own-1"' not in record.read_bytes():  # noqa: ASYNC110 - a file has no event to wait on
                await trio.sleep(0.01)


async def test_the_hub_is_what_upstreams_fronts_and_the_plugin_gate_need_of_it():
    from aggregator.fronts.port import ClientPort
    from aggregator.plugins.gate import GateHost
    from aggregator.upstreams.port import UpstreamPort

    async with running_proxy({"a": []}) as proxy:
        hub = proxy.hub
        for port in (UpstreamPort, ClientPort, GateHost):
            methods = [name for name, value in vars(port).items() if callable(value) and not name.startswith("_")]
            for base in port.__mro__[1:]:
                if base.__module__.startswith("aggregator"):
                    methods += [
                        name for name, value in vars(base).items() if callable(value) and not name.startswith("_")
                    ]
            assert methods, port
            for name in methods:
                declared, given = getattr(port, name), getattr(hub, name)
                assert inspect.iscoroutinefunction(given) == inspect.iscoroutinefunction(declared), (port, name)
            properties = [name for name, value in vars(port).items() if isinstance(value, property)]
            for name in [*port.__annotations__, *properties]:
                assert hasattr(hub, name), (port, name)
        assert "router" not in UpstreamPort.__annotations__ and "router" not in ClientPort.__annotations__
        assert hub.upstreams["a"].hub is hub
