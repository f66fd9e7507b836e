"""A live reload, without I/O: what ``plan_changes`` makes of two configurations, and what
the router does when servers are removed and added and its catalogs renewed while clients
stay connected."""

from __future__ import annotations

import attrs
import pytest

from aggregator.config import Config, KindPolicy, ProfileConfig, ProxyConfig, RuleSet, ServerConfig, structure_config
from aggregator.config.changes import plan_changes
from aggregator.config.core_settings import link_settings
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.catalogs.policy import ProfilePolicy
from aggregator.core.events import (
    CatalogsRenewed,
    ClientMessage,
    ServerAdded,
    ServerItems,
    ServerListed,
    ServerListing,
    ServerLost,
    ServerMessage,
    ServerReady,
    ServerRemoved,
    ServerReplaced,
    ServerRestarting,
    StartupCompleted,
)
from aggregator.core.router import Router
from tests.core.helpers import Clock, connect, msg, new_router, unpack


def config(**servers: dict) -> Config:
    return structure_config({"servers": servers})


A = {"command": "a-server", "args": ["--x"]}
B = {"command": "b-server"}


# --- plan_changes -------------------------------------------------------------------------


def test_nothing_changed_plans_nothing() -> None:
    changes = plan_changes(config(a=A, b=B), config(a=A, b=B))
    assert not changes.anything
    assert changes.unchanged == ("a", "b")
    assert changes.describe() == []


def test_servers_added_removed_and_changed_are_told_apart() -> None:
    changes = plan_changes(config(a=A, b=B), config(a={**A, "args": ["--y"]}, c={"command": "c-server"}))
    assert (changes.added, changes.removed, changes.changed, changes.unchanged) == (("c",), ("b",), ("a",), ())
    assert changes.restarts == ("b", "a")
    assert changes.starts == ("c", "a")
    assert changes.describe() == ["servers.c: added", "servers.b: removed", "servers.a: changed; restarted"]


def test_a_changed_lazy_server_is_not_said_to_restart() -> None:
    changes = plan_changes(config(a={**A, "start": "lazy"}), config(a={**A, "start": "lazy", "init_timeout": 9}))
    assert changes.describe() == ["servers.a: changed; stopped, then lazy as at launch"]


def test_enabling_and_disabling_add_and_remove() -> None:
    changes = plan_changes(config(a=A, b={**B, "enabled": False}), config(a={**A, "enabled": False}, b=B))
    assert (changes.added, changes.removed) == (("b",), ("a",))


@pytest.mark.parametrize(
    "edit",
    [{"env": {"K": "v"}}, {"prefix": "p"}, {"request_timeout": 3.0}, {"isolation": "per-session"}, {"cwd": "/"}],
)
def test_what_reaches_the_server_restarts_it(edit: dict) -> None:
    assert plan_changes(config(a=A), config(a={**A, **edit})).changed == ("a",)


def test_a_servers_own_rules_rebuild_the_catalogs_without_a_restart() -> None:
    changes = plan_changes(config(a=A), config(a={**A, "tools": {"deny": ["x"]}, "server_requests": []}))
    assert changes.changed == ()
    assert changes.unchanged == ("a",)
    assert changes.policy_changed and changes.anything


def test_policy_and_profile_rules_apply_live() -> None:
    before = structure_config({"servers": {"a": A}, "profiles": {"ro": {"tokens": ["t" * 32]}}})
    after = structure_config(
        {"servers": {"a": A}, "policy": {"tools": {"deny": ["x"]}}, "profiles": {"ro": {"tokens": ["t" * 32]}}}
    )
    assert plan_changes(before, after).policy_changed
    ruled = structure_config(
        {"servers": {"a": A}, "profiles": {"ro": {"tokens": ["t" * 32], "tools": {"allow": ["r*"]}}}}
    )
    changes = plan_changes(before, ruled)
    assert changes.policy_changed and changes.needs_restart == ()
    assert changes.effective.profiles["ro"].tools.allow == ("r*",)


def test_what_cannot_change_live_needs_a_restart_and_keeps_its_running_value() -> None:
    token = "t" * 32
    before = Config(
        servers={"a": ServerConfig(name="a", command="x")},
        profiles={"ro": ProfileConfig(name="ro", tokens=(token,)), "gone": ProfileConfig(name="gone")},
    )
    loaded = attrs.evolve(
        before,
        proxy=ProxyConfig(page_size=7),
        http=attrs.evolve(before.http, listen="127.0.0.1:9000"),
        profiles={
            "ro": ProfileConfig(name="ro", tokens=("u" * 32,), tools=KindPolicy(deny=("x",))),
            "new": ProfileConfig(name="new"),
        },
    )
    changes = plan_changes(before, loaded)
    assert changes.needs_restart == (
        "proxy",
        "http",
        "profiles.ro.tokens",
        "profiles.gone (removed)",
        "profiles.new (added)",
    )
    effective = changes.effective
    assert effective.proxy == before.proxy and effective.http == before.http
    assert set(effective.profiles) == {"ro", "gone"}
    assert effective.profiles["ro"].tokens == (token,)  # the running tokens
    assert effective.profiles["ro"].tools.deny == ("x",)  # the new rules
    assert changes.policy_changed
    assert "proxy: changed; takes a restart (ignored until then)" in changes.describe()


def test_only_a_restart_needing_change_applies_nothing() -> None:
    before = config(a=A)
    changes = plan_changes(before, attrs.evolve(before, proxy=ProxyConfig(page_size=7)))
    assert not changes.anything
    assert changes.describe() == ["proxy: changed; takes a restart (ignored until then)"]


def test_plugins_changed() -> None:
    before = config(a=A)
    after = structure_config({"servers": {"a": A}, "plugins": [{"use": "audit-log"}]})
    assert plan_changes(before, after).plugins_changed


def test_a_new_server_order_rebuilds_the_catalogs() -> None:
    assert plan_changes(config(a=A, b=B), config(b=B, a=A)).policy_changed


# --- the router -----------------------------------------------------------------------------


def two_servers() -> tuple[Router, Clock, list[ServerConfig]]:
    servers = [ServerConfig(name="a", command="x"), ServerConfig(name="b", command="x")]
    clock = Clock()
    router = new_router(Catalog(servers, "__", 50), servers, clock=clock, list_changed_debounce=0)
    for name in ("a", "b"):
        router.handle(ServerReady(name, {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}))
        router.handle(ServerItems(name, "tools", [{"name": "echo"}, {"name": "other"}]))
    router.handle(StartupCompleted())
    connect(router, 1, {})
    return router, clock, servers


def tool_names(router: Router, key: int = 1) -> list[str]:
    [(_, _, answer)] = unpack(router.handle(ClientMessage(key, msg(id="l", method="tools/list"))))
    return [tool["name"] for tool in answer["result"]["tools"]]


def test_a_removed_server_answers_its_calls_and_leaves_the_catalog() -> None:
    router, _, servers = two_servers()
    [(kind, server, sent)] = unpack(
        router.handle(ClientMessage(1, msg(id=7, method="tools/call", params={"name": "b__echo", "arguments": {}})))
    )
    assert (kind, server) == ("ToServer", "b")
    out = unpack(router.handle(ServerRemoved("b", "it was removed from the configuration")))
    errors = [m for k, s, m in out if k == "ToClient" and m.get("id") == 7]
    assert len(errors) == 1
    assert errors[0]["error"]["data"]["reason"] == "unavailable"
    assert "removed from the configuration" in errors[0]["error"]["message"]
    assert ("ToClient", 1, {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}) in out
    assert "b" not in router.links and "b" not in router.outages
    router.handle(CatalogsRenewed(servers[:1], {"default": None}))
    assert tool_names(router) == ["a__echo", "a__other"]
    [(_, _, unknown)] = unpack(
        router.handle(ClientMessage(1, msg(id=8, method="tools/call", params={"name": "b__echo", "arguments": {}})))
    )
    assert unknown["error"]["code"] == -32602
    # Its late answer goes nowhere.
    assert router.handle(ServerMessage("b", msg(id=sent["id"], result={}))) == []


def test_an_added_server_is_starting_until_listed_then_announced() -> None:
    router, _, servers = two_servers()
    c = ServerConfig(name="c", command="x")
    assert router.handle(CatalogsRenewed([*servers, c], {"default": None})) == []  # nothing visible changed yet
    router.handle(ServerAdded(link_settings(c)))
    assert router.links["c"].prefix == "c"
    # A call naming it waits for it (held), it is not "Unknown".
    assert (
        router.handle(ClientMessage(1, msg(id=9, method="tools/call", params={"name": "c__echo", "arguments": {}})))
        == []
    )
    router.handle(ServerReady("c", {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}))
    out = unpack(router.handle(ServerItems("c", "tools", [{"name": "echo"}])))
    assert ("ToClient", 1, {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}) in out
    out = unpack(router.handle(ServerListed("c")))
    assert [(k, s) for k, s, _ in out] == [("ToServer", "c")]  # the held call goes now
    assert tool_names(router) == ["a__echo", "a__other", "b__echo", "b__other", "c__echo"]


def test_renewed_rules_hide_what_they_deny_and_tell_the_clients() -> None:
    router, _, servers = two_servers()
    cursor_catalog = router.catalogs["default"]
    rules = Config(servers={s.name: s for s in servers}, policy=RuleSet(tools=KindPolicy(deny=("other",))))
    out = unpack(router.handle(CatalogsRenewed(servers, {"default": ProfilePolicy(rules)})))
    assert out == [("ToClient", 1, {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})]
    assert router.catalogs["default"] is cursor_catalog  # the same catalog, renewed in place
    assert tool_names(router) == ["a__echo", "b__echo"]
    [(_, _, denied)] = unpack(
        router.handle(ClientMessage(1, msg(id=3, method="tools/call", params={"name": "a__other", "arguments": {}})))
    )
    assert denied["error"]["code"] == -32602
    # The same rules again: nothing to tell.
    assert router.handle(CatalogsRenewed(servers, {"default": ProfilePolicy(rules)})) == []


def test_a_new_prefix_renames_a_servers_items() -> None:
    router, _, servers = two_servers()
    renamed = [servers[0], attrs.evolve(servers[1], prefix="bee")]
    router.handle(CatalogsRenewed(renamed, {"default": None}))
    assert tool_names(router) == ["a__echo", "a__other", "bee__echo", "bee__other"]


def test_a_changed_server_restarts_in_place_and_calls_meanwhile_wait() -> None:
    router, clock, servers = two_servers()
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(1, msg(id=7, method="tools/call", params={"name": "b__echo", "arguments": {}})))
    )
    out = unpack(router.handle(ServerRestarting("b", "its configuration changed")))
    [error] = [m for k, s, m in out if k == "ToClient" and m.get("id") == 7]
    assert "its configuration changed" in error["error"]["message"]
    # The old connection's own report of its end comes later, and changes nothing more.
    router.handle(ServerLost("b", "stopped"))
    assert (
        router.handle(ClientMessage(1, msg(id=8, method="tools/call", params={"name": "b__echo", "arguments": {}})))
        == []
    )
    changed = attrs.evolve(servers[1], request_timeout=30.0)
    router.handle(CatalogsRenewed([servers[0], changed], {"default": None}))
    router.handle(ServerReplaced(link_settings(changed), "its configuration changed"))
    assert router.links["b"].request_timeout == 30.0
    [(_, _, status)] = unpack(
        router.handle(ClientMessage(1, msg(id=9, method="tools/call", params={"name": "b__nope", "arguments": {}})))
    )
    assert status["error"]["code"] == -32602  # a name it never listed is unknown, restart or not
    router.handle(ServerReady("b", {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}))
    router.handle(ServerItems("b", "tools", [{"name": "echo"}]))
    [(kind, server, held)] = unpack(router.handle(ServerListed("b")))
    assert (kind, server, held["params"]["name"]) == ("ToServer", "b", "echo")  # the held call goes now
    [(_, _, answer)] = unpack(router.handle(ServerMessage("b", msg(id=held["id"], result={"content": []}))))
    assert answer["id"] == 8 and "result" in answer
    assert router.handle(ServerMessage("b", msg(id=sent["id"], result={}))) == []  # the old call's late answer


def test_a_removed_per_session_server_stops_every_sessions_connection() -> None:
    servers = [ServerConfig(name="a", command="x"), ServerConfig(name="p", command="x", isolation="per-session")]
    router = new_router(Catalog(servers, "__", 50), servers, clock=Clock(), list_changed_debounce=0)
    for name in ("a", "p"):
        router.handle(ServerReady(name, {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}))
        router.handle(ServerItems(name, "tools", [{"name": "echo"}]))
    router.handle(StartupCompleted())
    connect(router, 1, {})
    [start] = router.handle(
        ClientMessage(1, msg(id=5, method="tools/call", params={"name": "p__echo", "arguments": {}}))
    )
    assert type(start).__name__ == "StartUpstream" and start.name == "p@1"
    out = unpack(router.handle(ServerRemoved("p", "it was removed from the configuration")))
    assert ("StopUpstream", "p@1", ()) in out
    [held] = [m for k, s, m in out if k == "ToClient" and m.get("id") == 5]
    assert held["error"]["data"]["reason"] == "unavailable"
    assert set(router.links) == {"a"} and router.per_session == set()


def test_a_sessions_own_listing_takes_the_new_rules_too() -> None:
    servers = [ServerConfig(name="a", command="x"), ServerConfig(name="p", command="x", isolation="per-session")]
    router = new_router(Catalog(servers, "__", 50), servers, clock=Clock(), list_changed_debounce=0)
    for name in ("a", "p"):
        router.handle(ServerReady(name, {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}))
        router.handle(ServerItems(name, "tools", [{"name": "echo"}]))
    router.handle(StartupCompleted())
    connect(router, 1, {})
    connect(router, 2, {})
    [start] = router.handle(
        ClientMessage(1, msg(id=5, method="tools/call", params={"name": "p__echo", "arguments": {}}))
    )
    assert start.name == "p@1"
    [(_, _, sent)] = unpack(
        router.handle(ServerReady("p@1", {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}))
    )
    router.handle(ServerMessage("p@1", msg(id=sent["id"], result={"content": []})))
    router.handle(ServerListing("p@1", {"tools": [{"name": "echo"}, {"name": "gzip"}]}))
    assert tool_names(router, 1) == ["a__echo", "p__echo", "p__gzip"]  # its own listing
    rules = Config(servers={s.name: s for s in servers}, policy=RuleSet(tools=KindPolicy(deny=("gzip",))))
    out = unpack(router.handle(CatalogsRenewed(servers, {"default": ProfilePolicy(rules)})))
    # Only session 1 saw gzip: only it is told.
    assert out == [("ToClient", 1, {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})]
    assert tool_names(router, 1) == ["a__echo", "p__echo"]
    assert tool_names(router, 2) == ["a__echo", "p__echo"]
    [(_, _, denied)] = unpack(
        router.handle(ClientMessage(1, msg(id=6, method="tools/call", params={"name": "p__gzip", "arguments": {}})))
    )
    assert denied["error"]["code"] == -32602


def test_the_credentials_table_takes_a_restart():
    import base64

    key = base64.b64encode(b"k" * 32).decode()
    running = structure_config({"credentials": {"vault_key": key}, "servers": {"a": {"command": "a"}}}, environ={})
    loaded = structure_config(
        {"credentials": {"vault_key": key, "vault": "elsewhere.db"}, "servers": {"a": {"command": "a"}}}, environ={}
    )
    changes = plan_changes(running, loaded)
    assert changes.needs_restart == ("credentials",) and changes.effective.credentials == running.credentials
    assert not changes.anything
