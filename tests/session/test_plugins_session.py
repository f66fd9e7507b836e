"""Plugins inside a running proxy (memory streams, fake servers, virtual clock)."""

import json

import trio
import trio.lowlevel

from aggregator.plugins.api import Deny
from tests.session.harness import running_proxy


class Recorder:
    """Records every hook call; changes params; answers one tool itself."""

    name = "recorder"
    instances: list["Recorder"] = []

    def __init__(self):
        self.requests, self.responses = [], []
        Recorder.instances.append(self)

    async def request(self, request):
        await trio.lowlevel.checkpoint()
        self.requests.append(request)
        if request.exposed == "a__add":
            request.params = {**request.params, "arguments": {"a": 40, "b": 2}}
        if request.exposed == "a__links":
            request.answer = {"content": [{"type": "text", "text": "answered by the plugin"}]}
        if request.exposed == "a__fail":
            raise Deny("not today")

    def response(self, response):
        self.responses.append(response)


async def test_request_response_and_answers(autojump_clock):
    Recorder.instances.clear()
    plugins = [{"use": "tests.session.test_plugins_session:Recorder"}]
    async with running_proxy({"a": []}, plugins=plugins) as proxy:
        client = await proxy.connect()
        recorder = Recorder.instances[-1]
        with trio.fail_after(10):
            await client.initialize()
            answer = await client.request("tools/call", {"name": "a__add", "arguments": {"a": 1, "b": 1}})
            assert answer["result"]["structuredContent"] == {"sum": 42}  # the plugin changed the arguments
            answer = await client.request("tools/call", {"name": "a__links"})
            assert answer["result"]["content"][0]["text"] == "answered by the plugin"
            assert not any(m.get("params", {}).get("name") == "links" for m in proxy.upstreams.latest("a").seen)
            answer = await client.request("tools/call", {"name": "a__fail"})
            assert answer["error"]["message"] == "not today" and answer["error"]["data"]["reason"] == "denied"
            answer = await client.request("tools/call", {"name": "a__nope"})
            assert answer["error"]["code"] == -32602  # unknown names never reach plugins
            assert [r.exposed for r in recorder.requests] == ["a__add", "a__links", "a__fail"]
            assert [r.request.exposed for r in recorder.responses] == ["a__add", "a__links", "a__fail"]
            assert recorder.responses[0].result["structuredContent"] == {"sum": 42}
            assert recorder.responses[2].error["message"] == "not today"


async def test_rate_limit_and_example_plugin(autojump_clock):
    plugins = [
        {"use": "rate-limit", "options": {"rate": 1.0, "burst": 2}},
        {"use": "example", "options": {"blocked_words": ["secret"]}},
    ]
    async with running_proxy({"a": []}, plugins=plugins) as proxy:
        one, two = await proxy.connect(), await proxy.connect()
        with trio.fail_after(10):
            await one.initialize()
            await two.initialize()
            tools = {tool["name"]: tool for tool in await one.list_all("tools/list", "tools")}
            assert tools["a__echo"]["description"].startswith("[read-only] Echo")  # it says readOnlyHint
            assert "description" not in tools["a__add"]
            for _ in range(2):
                assert "result" in await one.request("tools/call", {"name": "a__echo", "arguments": {}})
            limited = await one.request("tools/call", {"name": "a__echo", "arguments": {}})
            assert limited["error"]["data"]["reason"] == "rate_limited"
            assert 0 < limited["error"]["data"]["retry_after"] <= 1
            assert "result" in await two.request("tools/call", {"name": "a__echo", "arguments": {}})
            await trio.sleep(1.0)
            assert "result" in await one.request("tools/call", {"name": "a__echo", "arguments": {}})
            blocked = await two.request("tools/call", {"name": "a__echo", "arguments": {"x": "my secret"}})
            assert "not allowed" in blocked["error"]["message"]


class QuietLogs:
    """Drops log lines below warning and marks the others."""

    def notification(self, notification):
        if notification.method != "notifications/message":
            return None
        if notification.params.get("level") in ("debug", "info"):
            return False
        notification.params = {**notification.params, "data": "[checked] " + str(notification.params.get("data"))}
        return None


async def test_notification_hook(autojump_clock):
    plugins = [{"use": "tests.session.test_plugins_session:QuietLogs"}]
    async with running_proxy({"a": []}, plugins=plugins) as proxy:
        client = await proxy.connect()
        with trio.fail_after(10):
            await client.initialize()
            await client.request("logging/setLevel", {"level": "debug"})
            await client.request("tools/call", {"name": "a__flood", "arguments": {"count": 3}})
            assert not [n for n in client.notifications if n["method"] == "notifications/message"]


class Deliberate:
    """An async request hook that takes its time over some calls."""

    async def request(self, request):
        if request.params.get("arguments", {}).get("wait") == "forever":
            await trio.sleep_forever()
        if request.params.get("arguments", {}).get("wait") == "a while":
            await trio.sleep(3)


async def test_a_waiting_request_hook_holds_up_only_its_own_request(autojump_clock):
    plugins = [{"use": "tests.session.test_plugins_session:Deliberate"}]
    async with running_proxy({"a": [], "b": []}, {"request_timeout": 5.0}, plugins=plugins) as proxy:
        client = await proxy.connect()
        with trio.fail_after(30):
            await client.initialize()
            started = trio.current_time()
            await client.send(
                {"id": "stuck", "method": "tools/call", "params": {"name": "a__echo", "arguments": {"wait": "forever"}}}
            )
            await client.send(
                {"id": "slow", "method": "tools/call", "params": {"name": "b__echo", "arguments": {"wait": "a while"}}}
            )
            # The same session goes on at once: a ping, a list, a call to the other server.
            assert "result" in await client.request("ping")
            assert await client.list_all("tools/list", "tools")
            assert "result" in await client.request("tools/call", {"name": "b__echo", "arguments": {"x": 1}})
            assert trio.current_time() - started < 0.5
            # A duplicate id while its plugins still decide is refused, not cross-wired.
            await client.send({"id": "stuck", "method": "ping"})
            duplicate = await client.response("stuck")
            assert duplicate["error"]["code"] == -32600 and "already in flight" in duplicate["error"]["message"]
            slow = await client.response("slow")
            assert "result" in slow and 3 <= trio.current_time() - started < 4
            # A hook that never decides is bounded by the server's request timeout.
            stuck = await client.response("stuck")
            assert stuck["error"]["data"] == {"source": "aggregator", "reason": "timeout", "server": "a"}
            assert 5 <= trio.current_time() - started < 6
            assert not any(
                m.get("params", {}).get("arguments", {}).get("wait") == "forever"
                for m in proxy.upstreams.latest("a").seen
            )


async def test_a_request_cancelled_while_its_hooks_decide_never_goes_upstream(autojump_clock):
    plugins = [{"use": "tests.session.test_plugins_session:Deliberate"}]
    async with running_proxy({"a": []}, {"request_timeout": 5.0}, plugins=plugins) as proxy:
        client = await proxy.connect()
        with trio.fail_after(30):
            await client.initialize()
            await client.send(
                {"id": 7, "method": "tools/call", "params": {"name": "a__echo", "arguments": {"wait": "forever"}}}
            )
            await trio.sleep(0.1)
            await client.send({"method": "notifications/cancelled", "params": {"requestId": 7}})
            await trio.sleep(10)  # past the timeout: a cancelled request gets no answer at all
            assert "result" in await client.request("ping")
            assert not [m for m in client.inbox if m.get("id") == 7]
            # The id is free again.
            await client.send({"id": 7, "method": "tools/call", "params": {"name": "a__echo", "arguments": {}}})
            assert "result" in await client.response(7)
            assert sum(1 for m in proxy.upstreams.latest("a").seen if m.get("method") == "tools/call") == 1


class Lifecycle:
    """Records when its hooks run, and whether any upstream had started at load."""

    events: list[str] = []

    def load(self):
        Lifecycle.events.append("load")

    def catalog(self, profile, kind, items):
        Lifecycle.events.append("catalog")

    async def after_catalog(self):
        await trio.lowlevel.checkpoint()
        Lifecycle.events.append("after_catalog")

    async def done(self):
        await trio.sleep(0.5)  # may wait: the shutdown's cancellation does not cut it short
        Lifecycle.events.append("done")


class Boom(Exception):
    pass


async def test_load_before_serving_done_at_shutdown_even_after_an_error(autojump_clock, tmp_path):
    Lifecycle.events.clear()
    pins, audit = tmp_path / "pins.json", tmp_path / "audit.jsonl"
    plugins = [
        {"use": "tests.session.test_plugins_session:Lifecycle"},
        {"use": "pin-definitions", "options": {"path": str(pins)}},
        {"use": "audit-log", "options": {"path": str(audit)}},
    ]
    ended_by_error = False
    try:
        async with running_proxy({"a": []}, plugins=plugins) as proxy:
            assert Lifecycle.events == ["load"]  # before any client, before any listing
            client = await proxy.connect()
            with trio.fail_after(10):
                await client.initialize()
                names = [tool["name"] for tool in await client.list_all("tools/list", "tools")]
                assert "result" in await client.request("tools/call", {"name": "a__echo", "arguments": {}})
            # The pins were written outside the core, while the proxy runs, with every tool.
            assert "after_catalog" in Lifecycle.events
            assert sorted(json.loads(pins.read_text())) == sorted(names)
            audit_log = proxy.hub.plugins.plugins[2]
            assert not audit_log._file.closed
            raise Boom
    except* Boom:
        ended_by_error = True
    assert ended_by_error
    assert Lifecycle.events[0] == "load" and Lifecycle.events[-1] == "done" and Lifecycle.events.count("done") == 1
    assert audit_log._file.closed  # the audit log's done closed it
    assert [json.loads(line)["exposed"] for line in audit.read_text().splitlines()] == ["a__echo"]


async def test_plugins_see_the_tool_behind_call_tool(autojump_clock):
    """In search mode a call_tool call is the call it names, for plugins as for the router:
    they see the real tool and its arguments, may change or deny them, and rate limits count it."""
    Recorder.instances.clear()
    plugins = [
        {"use": "tests.session.test_plugins_session:Recorder"},
        {"use": "rate-limit", "options": {"rate": 1.0, "burst": 1}},
    ]
    async with running_proxy({"a": []}, plugins=plugins, discovery={"mode": "search"}) as proxy:
        client = await proxy.connect()
        recorder = Recorder.instances[-1]
        with trio.fail_after(10):
            await client.initialize()
            listed = await client.list_all("tools/list", "tools")
            assert [tool["name"] for tool in listed] == ["find_tools", "call_tool"]
            wrapped = {"name": "a__add", "arguments": {"a": 1, "b": 1}}
            answer = await client.request("tools/call", {"name": "call_tool", "arguments": wrapped})
            assert answer["result"]["structuredContent"] == {"sum": 42}  # the plugin changed its arguments
            assert [(r.exposed, r.name) for r in recorder.requests] == [("a__add", "add")]
            limited = await client.request("tools/call", {"name": "call_tool", "arguments": wrapped})
            assert limited["error"]["data"]["reason"] == "rate_limited"  # the same bucket as a direct call
            await trio.sleep(1.0)
            denied = await client.request("tools/call", {"name": "call_tool", "arguments": {"name": "a__fail"}})
            assert denied["error"]["message"] == "not today"
            assert [r.request.exposed for r in recorder.responses][-1] == "a__fail"


async def test_a_request_its_waiting_hooks_allowed_is_traced_upstream(autojump_clock):
    """A request whose hooks decide in a task of their own is routed there, after its
    client's message: traced, its hop still gets its client span and trace context."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    from aggregator.telemetry.tracing import Tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    plugins = [{"use": "tests.session.test_plugins_session:Deliberate"}]
    async with running_proxy({"a": []}, {"request_timeout": 5.0}, plugins=plugins) as proxy:
        proxy.hub.trace(Tracing(provider))
        client = await proxy.connect()
        with trio.fail_after(30):
            await client.initialize()
            params = {"name": "a__echo", "arguments": {"wait": "a while"}, "_meta": {"traceparent": parent}}
            assert "result" in await client.request("tools/call", params)
    [sent] = [m for m in proxy.upstreams.latest("a").seen if m.get("method") == "tools/call"]
    spans = {span.kind: span for span in exporter.get_finished_spans() if span.name.startswith("tools/call")}
    assert spans[SpanKind.CLIENT].parent.span_id == spans[SpanKind.SERVER].context.span_id
    traceparent = sent["params"]["_meta"]["traceparent"]
    assert traceparent == f"00-4bf92f3577b34da6a3ce929d0e0e4736-{spans[SpanKind.CLIENT].context.span_id:016x}-01"
