"""Discovery modes (``aggregator.core.catalogs.discovery``): what tools/list shows, find_tools,
call_tool unwrapped into the call it names, auto mode's budget, policy before ranking."""

from __future__ import annotations

import json
from typing import Any

import pytest

from aggregator.config import Config, ServerConfig
from aggregator.config.model import KindPolicy, ProfileConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.catalogs.discovery import CALL_TOOL, FIND_TOOLS, META_TOOLS
from aggregator.core.catalogs.policy import ProfilePolicy
from aggregator.core.catalogs.tokens import tools_list_tokens
from aggregator.core.events import (
    ClientConnected,
    ClientMessage,
    ServerItems,
    ServerMessage,
    ServerReady,
    StartupCompleted,
)
from aggregator.core.settings import Discovery
from tests.core.helpers import Clock, connect, msg, new_router, unpack

TOOLS = {
    "git": [
        {"name": "git_log", "description": "Shows the commit logs", "inputSchema": {"type": "object"}},
        {"name": "git_status", "description": "Shows the working tree status", "inputSchema": {"type": "object"}},
        {"name": "git_reset", "description": "Unstages all staged changes", "inputSchema": {"type": "object"}},
    ],
    "time": [
        {
            "name": "get_current_time",
            "description": "Get the current time in a timezone",
            "inputSchema": {"type": "object", "properties": {"timezone": {"type": "string"}}},
        },
        {"name": "convert_time", "description": "Convert a time between timezones", "inputSchema": {"type": "object"}},
    ],
}


def build(discovery: dict[str, Discovery], config: Any = None, **kw: Any):
    servers = [ServerConfig(name=name, command="x") for name in TOOLS]
    policy = {name: ProfilePolicy(config, name) for name in (config.profiles if config else {})}
    profiles = {name: Catalog(servers, "__", 50, policy=p) for name, p in policy.items()}
    router = new_router(
        Catalog(servers, "__", 50), servers, clock=Clock(), discovery=discovery, profiles=profiles, **kw
    )
    for name, tools in TOOLS.items():
        router.handle(ServerReady(name, {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}))
        router.handle(ServerItems(name, "tools", tools))
    router.handle(StartupCompleted())
    return router


def call(router, key: int, name: str, arguments: Any = None, id: Any = "q", **extra: Any):
    params: dict[str, Any] = {"name": name, **extra}
    if arguments is not None:
        params["arguments"] = arguments
    return unpack(router.handle(ClientMessage(key, msg(id=id, method="tools/call", params=params))))


def tool_names(router, key: int = 1) -> list[str]:
    [(_, _, answer)] = unpack(router.handle(ClientMessage(key, msg(id="l", method="tools/list"))))
    return [tool["name"] for tool in answer["result"]["tools"]]


def test_all_mode_lists_every_tool_and_find_tools_is_unknown():
    router = build({"default": Discovery(mode="all")})
    connect(router, 1)
    assert len(tool_names(router)) == 5
    [(_, _, answer)] = call(router, 1, FIND_TOOLS, {"query": "time"})
    assert answer["error"]["code"] == -32602 and "Unknown tool" in answer["error"]["message"]


def test_search_mode_lists_exactly_the_two_tools():
    router = build({"default": Discovery(mode="search")})
    connect(router, 1)
    assert tool_names(router) == [FIND_TOOLS, CALL_TOOL]
    [(_, _, stale)] = unpack(router.handle(ClientMessage(1, msg(id="l", method="tools/list", params={"cursor": "x"}))))
    assert stale["error"]["code"] == -32602


def test_find_tools_returns_tools_as_listed_in_text_and_structured_content():
    router = build({"default": Discovery(mode="search")})
    connect(router, 1)
    [(kind, to, answer)] = call(router, 1, FIND_TOOLS, {"query": "the current time, please", "limit": 2})
    assert (kind, to) == ("ToClient", 1)
    found = answer["result"]["structuredContent"]["tools"]
    assert [tool["name"] for tool in found][0] == "time__get_current_time"
    assert len(found) <= 2
    assert found[0] == {**TOOLS["time"][0], "name": "time__get_current_time"}  # shaped as in tools/list
    assert json.loads(answer["result"]["content"][0]["text"]) == {"tools": found}
    assert not answer["result"].get("isError")


@pytest.mark.parametrize(
    ("arguments", "phrase"),
    [({}, "needs a query"), ({"query": "  "}, "needs a query"), ({"query": "x", "limit": 0}, "limit")],
)
def test_find_tools_mistakes_are_tool_errors(arguments, phrase):
    router = build({"default": Discovery(mode="search")})
    connect(router, 1)
    [(_, _, answer)] = call(router, 1, FIND_TOOLS, arguments)
    assert answer["result"]["isError"] is True
    assert phrase in answer["result"]["content"][0]["text"]


def test_call_tool_goes_upstream_exactly_as_the_direct_call():
    router = build({"default": Discovery(mode="search")})
    connect(router, 1)
    meta = {"progressToken": "p1"}
    wrapped = call(router, 1, CALL_TOOL, {"name": "git__git_log", "arguments": {"max_count": 3}}, _meta=meta)
    direct = call(router, 1, "git__git_log", {"max_count": 3}, id="r", _meta={"progressToken": "p2"})
    [(kind, server, sent)] = wrapped
    [(_, _, sent_direct)] = direct
    assert (kind, server) == ("ToServer", "git")
    assert sent["params"]["name"] == "git_log" and sent["params"]["arguments"] == {"max_count": 3}
    assert set(sent["params"]) == set(sent_direct["params"])  # the same shape: progress token kept
    # The answer reaches the client under its own id.
    out = unpack(router.handle(ServerMessage("git", msg(id=sent["id"], result={"content": []}))))
    assert out[0][:2] == ("ToClient", 1) and out[0][2]["id"] == "q"


def test_call_tool_errors_are_those_of_a_direct_call():
    router = build({"default": Discovery(mode="search")})
    connect(router, 1)
    [(_, _, wrapped)] = call(router, 1, CALL_TOOL, {"name": "nope"})
    [(_, _, direct)] = call(router, 1, "nope")
    assert wrapped["error"] == direct["error"]
    [(_, _, bad)] = call(router, 1, CALL_TOOL, {"name": "git__git_log", "arguments": [1]})
    assert "arguments must be an object" in bad["error"]["message"]
    [(_, _, nameless)] = call(router, 1, CALL_TOOL, {"arguments": {}})
    assert nameless["result"]["isError"] is True


def test_found_tools_and_others_stay_directly_callable():
    router = build({"default": Discovery(mode="search")})
    connect(router, 1)
    [(kind, server, _)] = call(router, 1, "time__convert_time", {})
    assert (kind, server) == ("ToServer", "time")


def test_auto_mode_lists_all_while_it_fits_then_searches():
    everything = []
    for name, tools in TOOLS.items():
        everything += [{**t, "name": f"{name}__{t['name']}"} for t in tools]
    size = tools_list_tokens(everything)
    router = build({"default": Discovery(mode="auto", budget_tokens=size)})
    connect(router, 1)
    assert len(tool_names(router)) == 5
    router.handle(ServerItems("time", "tools", [*TOOLS["time"], {"name": "more", "description": "x" * 4000}]))
    assert tool_names(router) == [FIND_TOOLS, CALL_TOOL]
    router.handle(ServerItems("time", "tools", TOOLS["time"]))
    assert len(tool_names(router)) == 5
    # Listing everything, auto mode still answers its two tools (a model may have learnt them).
    [(_, _, found)] = call(router, 1, FIND_TOOLS, {"query": "convert"}, id="f")
    assert found["result"]["structuredContent"]["tools"][0]["name"] == "time__convert_time"
    [(kind, server, _)] = call(router, 1, CALL_TOOL, {"name": "git__git_log"}, id="c")
    assert (kind, server) == ("ToServer", "git")


def test_auto_never_picks_the_larger_listing():
    router = build({"default": Discovery(mode="auto", budget_tokens=100)})  # every tool: ~200 tokens
    connect(router, 1)
    assert len(tool_names(router)) == 5


def test_find_tools_gives_fewer_whole_tools_within_the_result_budget():
    big = [{"name": f"t{i}", "description": "time " * 400, "inputSchema": {"type": "object"}} for i in range(5)]
    servers = [ServerConfig(name="s", command="x")]
    discovery = {"default": Discovery(mode="search", max_result_tokens=1200)}
    router = new_router(Catalog(servers, "__", 50), servers, clock=Clock(), discovery=discovery)
    router.handle(ServerReady("s", {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}))
    router.handle(ServerItems("s", "tools", big))
    router.handle(StartupCompleted())
    connect(router, 1)
    [(_, _, found)] = call(router, 1, FIND_TOOLS, {"query": "time", "limit": 5})
    tools = found["result"]["structuredContent"]["tools"]
    assert 1 <= len(tools) < 5 and all(t["description"] == "time " * 400 for t in tools)


def test_per_profile_modes_and_policy_before_ranking():
    config = Config(
        servers={name: ServerConfig(name=name, command="x") for name in TOOLS},
        profiles={"narrow": ProfileConfig(name="narrow", tools=KindPolicy(deny=("git_*",)))},
    )
    router = build({"default": Discovery(mode="all"), "narrow": Discovery(mode="search")}, config)
    connect(router, 1)
    router.handle(ClientConnected(2, profile="narrow"))
    router.handle(
        ClientMessage(2, msg(id=0, method="initialize", params={"protocolVersion": "2025-11-25", "capabilities": {}}))
    )
    assert len(tool_names(router, 1)) == 5
    assert tool_names(router, 2) == [FIND_TOOLS, CALL_TOOL]
    [(_, _, answer)] = call(router, 2, FIND_TOOLS, {"query": "git status log of the time", "limit": 10})
    names = [t["name"] for t in answer["result"]["structuredContent"]["tools"]]
    assert names and not any(n.startswith("git__") for n in names)
    # Ranked as if the hidden tools were not there at all: the same scores, the same order.
    alone = router.search.find_tools(router.catalogs["narrow"], "git status log of the time", 10)
    index = router.catalogs["narrow"].search_cache.index
    assert len(index.tools) == 2 and [t["name"] for t in alone] == names
    # A hidden tool stays hidden behind call_tool too.
    [(_, _, hidden)] = call(router, 2, CALL_TOOL, {"name": "git__git_log"})
    assert "Unknown tool" in hidden["error"]["message"]


def test_meta_tools_are_valid_tool_definitions():
    for tool in META_TOOLS:
        assert tool["inputSchema"]["type"] == "object" and tool["description"]


def test_a_server_tool_named_like_the_proxys_is_reached_through_call_tool():
    servers = [ServerConfig(name="w", command="x", prefix="")]
    router = new_router(
        Catalog(servers, "__", 50), servers, clock=Clock(), discovery={"default": Discovery(mode="search")}
    )
    router.handle(ServerReady("w", {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}))
    own = [{"name": FIND_TOOLS, "description": "the server's own"}, {"name": CALL_TOOL, "description": "also"}]
    router.handle(ServerItems("w", "tools", own))
    router.handle(StartupCompleted())
    connect(router, 1)
    [(_, _, found)] = call(router, 1, FIND_TOOLS, {"query": "own"})  # the proxy's find_tools
    assert [t["description"] for t in found["result"]["structuredContent"]["tools"]][0] == "the server's own"
    for name in (FIND_TOOLS, CALL_TOOL):
        [(kind, server, sent)] = call(router, 1, CALL_TOOL, {"name": name, "arguments": {"x": 1}}, id=name)
        assert (kind, server, sent["params"]["name"], sent["params"]["arguments"]) == ("ToServer", "w", name, {"x": 1})
    # What plugins are told: the proxy's own calls name no server tool; an unwrapped one names it.
    assert router.describe(1, {"id": 9, "method": "tools/call", "params": {"name": FIND_TOOLS}}) is None
    message = {"id": 9, "method": "tools/call", "params": {"name": CALL_TOOL, "arguments": {"name": FIND_TOOLS}}}
    router.unwrap_call_tool(1, message)
    assert router.describe(1, message) == ("w", FIND_TOOLS, FIND_TOOLS)


def test_a_limit_of_five_point_zero_is_five():
    router = build({"default": Discovery(mode="search")})
    connect(router, 1)
    [(_, _, answer)] = call(router, 1, FIND_TOOLS, {"query": "time", "limit": 1.0})
    assert len(answer["result"]["structuredContent"]["tools"]) == 1


def test_a_client_cannot_mark_its_own_request_as_unwrapped():
    router = build({"default": Discovery(mode="search")})
    connect(router, 1)
    raw = msg(id="m", method="tools/call", params={"name": FIND_TOOLS, "arguments": {"query": "time"}})
    forged = raw[:-1] + b',"aggregator/unwrapped":true}'
    [(_, _, answer)] = unpack(router.handle(ClientMessage(1, forged)))
    assert answer["result"]["structuredContent"]["tools"]  # still the proxy's own find_tools


def test_only_the_first_words_of_a_query_count():
    router = build({"default": Discovery(mode="search")})
    connect(router, 1)
    padding = " ".join(f"filler{i}" for i in range(32))
    [(_, _, late)] = call(router, 1, FIND_TOOLS, {"query": f"{padding} timezone"}, id="a")
    [(_, _, early)] = call(router, 1, FIND_TOOLS, {"query": f"timezone {padding}"}, id="b")
    assert late["result"]["structuredContent"]["tools"] == []  # the 33rd word is not read
    assert early["result"]["structuredContent"]["tools"]
    [(_, _, long)] = call(router, 1, FIND_TOOLS, {"query": "x" * 1000 + " timezone"}, id="c")
    assert long["result"]["structuredContent"]["tools"] == []  # past the first 1,000 characters
