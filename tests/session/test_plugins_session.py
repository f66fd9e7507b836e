"""Plugins inside a running proxy (memory streams, fake servers, virtual clock)."""

import trio
import trio.lowlevel

from aggregator.plugins import Deny
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
    plugins = [{"use": "rate-limit", "options": {"rate": 1.0, "burst": 2}},
               {"use": "example", "options": {"blocked_words": ["secret"]}}]
    async with running_proxy({"a": []}, plugins=plugins) as proxy:
        one, two = await proxy.connect(), await proxy.connect()
        with trio.fail_after(10):
            await one.initialize()
            await two.initialize()
            tools = await one.list_all("tools/list", "tools")
            assert tools[0]["description"].startswith("[from a] ")
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
