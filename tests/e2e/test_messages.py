"""Every message finds its way, end to end: the SDK client, `aggregator serve --stdio`,
@modelcontextprotocol/server-everything and mcp-server-time behind it."""

from __future__ import annotations

import json
import sys
import time

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp import types as t

from tests.e2e.conftest import RawProxy, write_config

# The 2.x SDK warns that subscribe and logging are gone in the 2026 revision; they are the
# 2025 features under test here.
pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*2026-07-28")]


def everything_and_time(tmp_path, everything_js, **proxy):
    return write_config(
        tmp_path,
        f'''
[servers.everything]
command = "node"
args = ["{everything_js}", "stdio"]

[servers.time]
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]
''',
        startup_timeout=20.0,
        **proxy,
    )


class Recorder:
    """The client side of server-to-client traffic: canned answers, everything recorded."""

    def __init__(self) -> None:
        self.sampling: list[t.CreateMessageRequestParams] = []
        self.elicitations: list[t.ElicitRequestParams] = []
        self.roots_asked = 0
        self.logs: list[t.LoggingMessageNotificationParams] = []
        self.notifications: list[t.ServerNotification] = []

    async def sample(self, context, params):
        self.sampling.append(params)
        return t.CreateMessageResult(
            role="assistant", model="canned-model", content=t.TextContent(type="text", text="a canned answer")
        )

    async def elicit(self, context, params):
        self.elicitations.append(params)
        return t.ElicitResult(action="accept", content={"name": "Ada Lovelace"})

    async def roots(self, context):
        self.roots_asked += 1
        return t.ListRootsResult(roots=[t.Root(uri="file:///projects/demo", name="demo project")])

    async def log(self, params):
        self.logs.append(params)

    async def message(self, message):
        if not isinstance(message, Exception):
            self.notifications.append(message)

    def methods(self) -> list[str]:
        return [n.method for n in self.notifications]


def session_for(config, recorder: Recorder):
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "aggregator", "serve", "--stdio", "--config", str(config)]
    )
    return stdio_client(params), recorder


async def wait_for(condition, seconds: float) -> None:
    """Poll a condition on what the recorder saw (it has no event to wait on), bounded."""
    with anyio.fail_after(seconds):
        while not condition():  # noqa: ASYNC110
            await anyio.sleep(0.05)


def test_progress_sampling_elicitation_roots(tmp_path, everything_js):
    config = everything_and_time(tmp_path, everything_js)
    recorder = Recorder()

    async def main():
        transport, _ = session_for(config, recorder)
        async with (
            transport as (read, write),
            ClientSession(
                read,
                write,
                sampling_callback=recorder.sample,
                elicitation_callback=recorder.elicit,
                list_roots_callback=recorder.roots,
                logging_callback=recorder.log,
                message_handler=recorder.message,
            ) as session,
        ):
            await session.initialize()
            names = {tool.name for tool in (await session.list_tools()).tools}
            # These tools register only for clients that declared the capability, so their
            # presence shows the proxy declared it upstream.
            assert {
                "everything__trigger-sampling-request",
                "everything__trigger-elicitation-request",
                "everything__get-roots-list",
                "time__get_current_time",
            } <= names

            progress = []

            async def on_progress(value, total, message):
                progress.append((value, total))

            result = await session.call_tool(
                "everything__trigger-long-running-operation", {"duration": 1, "steps": 4}, progress_callback=on_progress
            )
            assert "completed" in result.content[0].text
            assert progress == [(1, 4), (2, 4), (3, 4), (4, 4)]

            result = await session.call_tool(
                "everything__trigger-sampling-request", {"prompt": "What is 2+2?", "maxTokens": 20}
            )
            assert "a canned answer" in result.content[0].text and "canned-model" in result.content[0].text
            assert recorder.sampling and "What is 2+2?" in recorder.sampling[0].messages[0].content.text

            result = await session.call_tool("everything__trigger-elicitation-request", {})
            text = " ".join(c.text for c in result.content if c.type == "text")
            assert "User provided the requested information" in text and "Ada Lovelace" in text
            assert recorder.elicitations[0].requested_schema["required"] == ["name"]

            result = await session.call_tool("everything__get-roots-list", {})
            assert "file:///projects/demo" in result.content[0].text
            assert recorder.roots_asked >= 1

            # The other server keeps answering in between.
            result = await session.call_tool("time__get_current_time", {"timezone": "UTC"})
            assert not result.is_error

    anyio.run(main)


def test_subscriptions_logging_and_list_changes(tmp_path, everything_js):
    config = everything_and_time(tmp_path, everything_js)
    recorder = Recorder()

    async def main():
        transport, _ = session_for(config, recorder)
        async with (
            transport as (read, write),
            ClientSession(
                read,
                write,
                logging_callback=recorder.log,
                message_handler=recorder.message,
            ) as session,
        ):
            init = await session.initialize()
            assert init.capabilities.resources.subscribe and init.capabilities.logging is not None
            uri = "everything+demo://resource/static/document/architecture.md"
            await session.subscribe_resource(uri)
            await session.set_logging_level("debug")
            await session.call_tool("everything__toggle-subscriber-updates", {})
            await session.call_tool("everything__toggle-simulated-logging", {})
            await wait_for(lambda: recorder.logs and "notifications/resources/updated" in recorder.methods(), 15)
            updated = [n for n in recorder.notifications if n.method == "notifications/resources/updated"]
            assert {str(n.params.uri) for n in updated} == {uri}
            assert all(log.logger == "everything" or log.logger.startswith("everything/") for log in recorder.logs)

            # At "emergency" only emergencies may come through.
            await session.set_logging_level("emergency")
            seen = len(recorder.logs)
            await anyio.sleep(6)
            assert all(log.level == "emergency" for log in recorder.logs[seen:])

            # A new resource appears: the client is told its list changed and sees it.
            await session.unsubscribe_resource(uri)
            before = {r.uri for r in (await session.list_resources()).resources}
            changed = recorder.methods().count("notifications/resources/list_changed")
            result = await session.call_tool(
                "everything__gzip-file-as-resource",
                {
                    "name": "hello.txt.gz",
                    "data": "data:text/plain;base64,aGVsbG8gd29ybGQ=",
                    "outputType": "resourceLink",
                },
            )
            link = next(c for c in result.content if c.type == "resource_link")
            assert str(link.uri).startswith("everything+demo://")
            await wait_for(lambda: recorder.methods().count("notifications/resources/list_changed") > changed, 10)
            after = set()
            cursor = None
            while True:
                page = await session.list_resources(params=t.PaginatedRequestParams(cursor=cursor) if cursor else None)
                after |= {r.uri for r in page.resources}
                cursor = page.next_cursor
                if not cursor:
                    break
            assert str(link.uri) in after - before
            read = await session.read_resource(str(link.uri))
            assert read.contents[0].uri == str(link.uri)

    anyio.run(main)


def test_cancelled_call_never_answers_and_progress_stops(tmp_path, everything_js):
    config = everything_and_time(tmp_path, everything_js)
    proxy = RawProxy(config)
    try:
        proxy.request(
            1,
            "initialize",
            {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
        )
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        proxy.send(
            b'{"jsonrpc":"2.0","id":"long","method":"tools/call","params":{"name":'
            b'"everything__trigger-long-running-operation","arguments":{"duration":3,"steps":6},'
            b'"_meta":{"progressToken":"mine"}}}\n'
        )
        first = proxy.receive_any()
        while first.get("method") != "notifications/progress":  # list changes may come first
            assert "id" not in first, first
            first = proxy.receive_any()
        assert first["params"]["progressToken"] == "mine"
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"long"}}\n')
        cancelled_at = time.monotonic()
        # Keep talking for longer than the operation would have taken.
        answers = []
        while time.monotonic() - cancelled_at < 4:
            answers.append(proxy.request(len(answers) + 10, "ping"))
            time.sleep(0.2)
        assert all(a["id"] != "long" for a in answers)
        late = [n for n in proxy.notifications if n.get("method") == "notifications/progress"]
        assert len(late) <= 1  # at most one already on its way when the cancel was sent
        answer = proxy.request(99, "tools/call", {"name": "time__get_current_time", "arguments": {"timezone": "UTC"}})
        assert "result" in answer
    finally:
        code, log = proxy.close()
    assert code == 0, log


def test_timeout_answers_and_cancels(tmp_path, everything_js):
    config = write_config(
        tmp_path,
        f'''
[servers.everything]
command = "node"
args = ["{everything_js}", "stdio"]
request_timeout = 1.0
timeout_resets_on_progress = false
''',
        startup_timeout=20.0,
    )
    proxy = RawProxy(config)
    try:
        proxy.request(
            1,
            "initialize",
            {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
        )
        started = time.monotonic()
        answer = proxy.request(
            2,
            "tools/call",
            {"name": "everything__trigger-long-running-operation", "arguments": {"duration": 5, "steps": 5}},
        )
        assert 0.9 < time.monotonic() - started < 3
        assert answer["error"]["data"] == {"source": "aggregator", "reason": "timeout", "server": "everything"}
        assert proxy.request(3, "ping")["result"] == {}
    finally:
        code, log = proxy.close()
    assert code == 0 and "timed out" in log


def test_tasks_with_an_elicitation_on_the_way(tmp_path, everything_js):
    """A task-augmented tools/call (2025-11-25): ids mapped both ways, and the server's
    elicitation, sent while the client waits on tasks/result, reaches that client."""
    config = everything_and_time(tmp_path, everything_js)
    proxy = RawProxy(config)
    try:
        init = proxy.request(
            1,
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {"elicitation": {}},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        )
        assert "list" in init["result"]["capabilities"]["tasks"]
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        created = proxy.request(
            2,
            "tools/call",
            {
                "name": "everything__simulate-research-query",
                "arguments": {"topic": "python", "ambiguous": True},
                "task": {"ttl": 60000},
            },
        )
        task_id = created["result"]["task"]["taskId"]
        assert task_id.startswith("everything/")
        status = proxy.request(3, "tasks/get", {"taskId": task_id})
        assert status["result"]["taskId"] == task_id and status["result"]["status"] in ("working", "input_required")
        listed = proxy.request(4, "tasks/list", {})
        assert task_id in [t["taskId"] for t in listed["result"]["tasks"]]
        assert proxy.request(5, "tasks/get", {"taskId": "everything/nope"})["error"]["code"] == -32602

        proxy.send(
            json.dumps({"jsonrpc": "2.0", "id": 6, "method": "tasks/result", "params": {"taskId": task_id}}).encode()
            + b"\n"
        )
        deadline = time.monotonic() + 30
        result = None
        while result is None and time.monotonic() < deadline:
            message = proxy.receive_any()
            if message.get("method") == "elicitation/create":
                schema = message["params"]["requestedSchema"]["properties"]["interpretation"]
                choice = schema["oneOf"][0]["const"] if "oneOf" in schema else "the language"
                proxy.send(
                    json.dumps(
                        {
                            "jsonrpc": "2.0",
                            "id": message["id"],
                            "result": {"action": "accept", "content": {"interpretation": choice}},
                        }
                    ).encode()
                    + b"\n"
                )
            elif message.get("id") == 6:
                result = message
        assert result is not None, "no tasks/result answer"
        text = result["result"]["content"][0]["text"]
        assert "Research Report" in text and "Clarification" in text
        related = result["result"].get("_meta", {}).get("io.modelcontextprotocol/related-task")
        assert related is None or related["taskId"] == task_id
    finally:
        code, log = proxy.close()
    assert code == 0, log
