"""Deep JSON from either side and upstreams that answer initialize wrongly, through the
hub and a stdio session over memory streams (virtual clock)."""

import json
import logging

import pytest
import trio

from tests.session.harness import running_proxy


def deep(levels: int):
    value: object = 1
    for level in range(levels):
        value = [value] if level % 2 else {"k": value}
    return value


async def initialize_with_sampling(client):
    answer = await client.request(
        "initialize",
        {
            "protocolVersion": "2025-06-18",
            "capabilities": {"sampling": {}},
            "clientInfo": {"name": "t", "version": "0"},
        },
    )
    await client.send({"method": "notifications/initialized"})
    return answer


async def test_deep_client_messages_are_refused_and_the_session_lives(autojump_clock):
    async with running_proxy({"a": ["odd_json"]}) as proxy:
        client = await proxy.connect()
        with trio.fail_after(10):
            await initialize_with_sampling(client)
            for params in (
                {"name": "a__echo", "arguments": deep(990)},
                {"name": "a__echo", "arguments": {}, "_meta": deep(990)},
                {"name": "a__echo", "arguments": {"under": deep(200)}},
            ):
                answer = await client.request("tools/call", params)
                assert answer["error"]["code"] == -32600
                assert answer["error"]["data"]["reason"] == "too_large"
            # A cancel with a deep reason is dropped; the call it names still gets its answer.
            await client.send({"id": 50, "method": "tools/call", "params": {"name": "a__echo", "arguments": {}}})
            await client.send({"method": "notifications/cancelled", "params": {"requestId": 50, "reason": deep(990)}})
            assert "result" in await client.response(50)
            assert (await client.request("ping"))["result"] == {}
            assert not any(
                m.get("params", {}).get("name") == "echo" and "_meta" in m.get("params", {})
                for m in proxy.upstreams.latest("a").seen
            )


async def test_a_deep_sampling_answer_is_refused_and_the_server_told(autojump_clock):
    async with running_proxy({"a": ["odd_json"]}) as proxy:
        client = await proxy.connect()
        with trio.fail_after(10):
            await initialize_with_sampling(client)
            await client.send({"id": 7, "method": "tools/call", "params": {"name": "a__sample", "arguments": {}}})
            asked = await client.receive()
            assert asked["method"] == "sampling/createMessage"
            await client.send({"id": asked["id"], "result": {"role": "assistant", "content": deep(990)}})
            answer = await client.response(7)
            told = json.loads(answer["result"]["content"][0]["text"])
            assert told["answer"] is None and told["error"]["data"]["reason"] == "too_large"
            assert "sampling/createMessage" in told["error"]["message"]
            assert (await client.request("ping"))["result"] == {}


async def test_deep_or_unreadable_upstream_answers_fail_only_their_request(autojump_clock):
    async with running_proxy({"a": ["odd_json"]}) as proxy:
        client = await proxy.connect()
        with trio.fail_after(10):
            await client.initialize()
            answer = await client.request("tools/call", {"name": "a__deep", "arguments": {"depth": 990}})
            assert answer["error"]["data"] == {"source": "aggregator", "reason": "too_large", "server": "a"}
            assert "tools/call" in answer["error"]["message"]
            answer = await client.request("tools/call", {"name": "a__deep_note", "arguments": {"depth": 990}})
            assert answer["result"]["content"][0]["text"] == "sent"
            answer = await client.request("tools/call", {"name": "a__deep", "arguments": {"depth": 100}})
            assert "result" in answer  # within the limit: forwarded
            # Same server process throughout: nothing was treated as the server failing.
            assert len(proxy.upstreams.servers["a"]) == 1
            assert proxy.hub.upstreams["a"].state == "ready"


@pytest.mark.parametrize(
    ("field", "named"),
    [
        ("serverInfo", "serverInfo must be an object, not a string"),
        ("capabilities", "capabilities must be an object, not an array"),
        ("protocolVersion", "protocolVersion is missing"),
        ("tools", "capabilities.tools must be an object, not a boolean"),
    ],
)
async def test_a_malformed_initialize_result_fails_that_server_with_backoff(autojump_clock, caplog, field, named):
    caplog.set_level(logging.INFO)
    async with running_proxy(
        {"bad": [f"bad_init:{field}"], "ok": []}, restart_backoff_initial=0.5, restart_backoff_max=8.0
    ) as proxy:
        client = await proxy.connect()
        with trio.fail_after(120):
            await client.initialize()
            names = [t["name"] for t in await client.list_all("tools/list", "tools")]
            assert names and all(name.startswith("ok__") for name in names)
            assert "result" in await client.request("tools/call", {"name": "ok__echo", "arguments": {}})
            await trio.sleep(60)
            starts = len(proxy.upstreams.servers["bad"])
            assert 3 <= starts <= 60  # retried with the backoff: never a storm, never given up
            upstream = proxy.hub.upstreams["bad"]
            assert upstream.state != "ready"
            assert upstream.last_error.startswith(f"its initialize result is unusable: {named}")
            assert "result" in await client.request("tools/call", {"name": "ok__echo", "arguments": {}})
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("aggregator")]
    assert any("server bad did not start" in line and named in line for line in lines)
    assert not [r for r in caplog.records if r.exc_info], "a malformed result is not an internal error"


async def test_the_configured_depth_holds_for_clients_and_servers(autojump_clock):
    async with running_proxy({"a": ["odd_json"]}, max_json_depth=16) as proxy:
        client = await proxy.connect()
        with trio.fail_after(10):
            await client.initialize()
            # arguments is level 3, "d" holds levels 4 and on: 13 levels fit, 14 do not.
            answer = await client.request("tools/call", {"name": "a__echo", "arguments": {"d": deep(13)}})
            assert "result" in answer
            answer = await client.request("tools/call", {"name": "a__echo", "arguments": {"d": deep(14)}})
            assert answer["error"]["data"]["max_depth"] == 16
            # The fake's structuredContent (level 3) is the outermost of `depth` nested objects.
            answer = await client.request("tools/call", {"name": "a__deep", "arguments": {"depth": 14}})
            assert "result" in answer
            answer = await client.request("tools/call", {"name": "a__deep", "arguments": {"depth": 15}})
            assert answer["error"]["data"]["reason"] == "too_large"
