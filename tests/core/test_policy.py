"""Policy in the core: layered rules, hidden items absent on every method, profiles,
overrides, the name budget. Pure: a fake clock, no I/O."""

import re
import tomllib

import pytest

from aggregator.config import structure_config
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.catalogs.policy import ProfilePolicy, server_request_allowed
from aggregator.core.events import (
    ClientConnected,
    ClientMessage,
    ServerItems,
    ServerMessage,
    ServerReady,
    StartupCompleted,
)
from aggregator.jsonrpc import loads
from tests.core.helpers import msg, new_router

CONFIG = """
[policy.tools]
deny = ["*delete*"]

[servers.e.tools]
deny = ["echo"]
[servers.e.tools.rename.get-sum]
name = "sum"
title = "Add two numbers"
description = "Adds a and b."
[servers.e.resources]
deny = ["demo://secret/*"]
[servers.e.templates]
deny = ["demo://hidden/{id}"]

[servers.g]
command = "x"
server_requests = ["roots"]

[profiles.reader]
tokens = ["reader-token-0123456789"]
[profiles.reader.tools]
read_only = true
[profiles.reader.servers.g.tools]
allow = ["git_status", "git_log"]
"""
E_TOOLS = [
    {"name": "echo", "description": "echo"},
    {"name": "get-sum", "description": "sum", "annotations": {"readOnlyHint": True}},
    {"name": "delete-all", "annotations": {"readOnlyHint": True}},
    {"name": "write", "annotations": {"destructiveHint": False}},
]
G_TOOLS = [
    {"name": "git_status", "annotations": {"readOnlyHint": True}},
    {"name": "git_log", "annotations": {"readOnlyHint": True}},
    {"name": "git_commit", "annotations": {"readOnlyHint": False}},
]


def answer(out):
    [command] = out
    message = command.message
    return type(command).__name__, loads(message) if type(message) is bytes else message


@pytest.fixture
def config():
    return structure_config(
        tomllib.loads(CONFIG.replace("[servers.e.tools]", '[servers.e]\ncommand = "x"\n[servers.e.tools]')), environ={}
    )


@pytest.fixture
def router(config):
    return policy_router(config)


def policy_router(config, **kw):
    """Servers e and g listed, clients 1 (default profile) and 2 (reader) initialized."""
    servers = list(config.servers.values())
    store = {}

    def catalog(profile):
        return Catalog(servers, "__", 50, store=store, policy=ProfilePolicy(config, profile))

    r = new_router(catalog(None), servers, list_changed_debounce=0, profiles={"reader": catalog("reader")}, **kw)
    for name in ("e", "g"):
        r.handle(
            ServerReady(
                name,
                {"capabilities": {"tools": {}, "resources": {"subscribe": True}, "prompts": {}, "completions": {}}},
            )
        )
    r.handle(ServerItems("e", "tools", E_TOOLS))
    r.handle(ServerItems("e", "resources", [{"uri": "demo://a"}, {"uri": "demo://secret/1"}]))
    r.handle(
        ServerItems(
            "e", "resourceTemplates", [{"uriTemplate": "demo://open/{id}"}, {"uriTemplate": "demo://hidden/{id}"}]
        )
    )
    r.handle(ServerItems("g", "tools", G_TOOLS))
    r.handle(StartupCompleted())
    for key, profile in ((1, "default"), (2, "reader")):
        r.handle(ClientConnected(key, profile))
        r.handle(
            ClientMessage(key, msg(id=0, method="initialize", params={"capabilities": {"roots": {}, "sampling": {}}}))
        )
    return r


def names(router, key):
    _, page = answer(router.handle(ClientMessage(key, msg(id=5, method="tools/list"))))
    return [t["name"] for t in page["result"]["tools"]]


def test_each_profile_sees_its_own_catalog(router):
    assert names(router, 1) == ["e__sum", "e__write", "g__git_status", "g__git_log", "g__git_commit"]
    assert names(router, 2) == ["e__sum", "g__git_status", "g__git_log"]
    _, page = answer(router.handle(ClientMessage(1, msg(id=5, method="tools/list"))))
    summed = page["result"]["tools"][0]
    assert (summed["title"], summed["description"]) == ("Add two numbers", "Adds a and b.")


@pytest.mark.parametrize(
    "name",
    [
        "e__echo",
        "echo",
        "E__echo",
        "e__Echo",
        " e__echo",
        "e__echo ",
        "e__echo\u200b",
        "ｅ__echo",
        "e__delete-all",
        "e__get-sum",
        "e__delete\u2010all",
    ],
)
def test_hidden_and_variant_names_are_unknown_and_reach_nothing(router, name):
    kind, reply = answer(router.handle(ClientMessage(1, msg(id=9, method="tools/call", params={"name": name}))))
    _, absent = answer(router.handle(ClientMessage(1, msg(id=9, method="tools/call", params={"name": "never-was"}))))
    assert kind == "ToClient" and reply["error"]["code"] == absent["error"]["code"] == -32602
    assert reply["error"]["message"].startswith("Unknown tool")
    assert all(not link.pending for link in router.links.values())


def test_profile_hidden_tool_is_callable_by_nobody_in_that_profile(router):
    kind, _ = answer(router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "g__git_commit"}))))
    assert kind == "ToServer"  # the default profile may
    kind, reply = answer(
        router.handle(ClientMessage(2, msg(id=1, method="tools/call", params={"name": "g__git_commit"})))
    )
    assert kind == "ToClient" and reply["error"]["code"] == -32602


def test_renamed_tool_calls_the_upstream_name(router):
    kind, sent = answer(router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "e__sum"}))))
    assert (kind, sent["params"]["name"]) == ("ToServer", "get-sum")


@pytest.mark.parametrize(
    "uri",
    [
        "e+demo://secret/1",
        "e+demo://secret/2",
        "e+demo://hidden/7",
        "e+demo://secret/x/y",
        "file:///etc/passwd",
        "http://127.0.0.1:1/",
    ],
)
def test_hidden_resources_and_templates_cannot_be_read_or_subscribed(router, uri):
    for method in ("resources/read", "resources/subscribe"):
        kind, reply = answer(router.handle(ClientMessage(1, msg(id=3, method=method, params={"uri": uri}))))
        assert kind == "ToClient" and reply["error"]["code"] == -32602, (method, uri)
    kind, reply = answer(
        router.handle(
            ClientMessage(
                1,
                msg(
                    id=4,
                    method="completion/complete",
                    params={
                        "ref": {"type": "ref/resource", "uri": "e+demo://hidden/{id}"},
                        "argument": {"name": "id", "value": ""},
                    },
                ),
            )
        )
    )
    assert kind == "ToClient" and reply["error"]["code"] == -32602
    assert all(not link.pending for link in router.links.values())


def test_visible_resources_still_work(router):
    _, page = answer(router.handle(ClientMessage(1, msg(id=1, method="resources/list"))))
    assert [r["uri"] for r in page["result"]["resources"]] == ["e+demo://a"]
    _, page = answer(router.handle(ClientMessage(1, msg(id=2, method="resources/templates/list"))))
    assert [t["uriTemplate"] for t in page["result"]["resourceTemplates"]] == ["e+demo://open/{id}"]
    for id, uri in enumerate(("e+demo://a", "e+demo://open/3")):
        kind, sent = answer(router.handle(ClientMessage(1, msg(id=id, method="resources/read", params={"uri": uri}))))
        assert kind == "ToServer", uri


def test_list_changes_reach_only_the_profiles_that_see_a_change(router):
    out = router.handle(ServerItems("g", "tools", [*G_TOOLS, {"name": "git_push", "annotations": {}}]))
    assert [c.session for c in out] == [1]  # the reader profile cannot see git_push
    out = router.handle(ServerItems("g", "tools", [*G_TOOLS[:1], *G_TOOLS[2:], {"name": "git_push"}]))
    assert sorted(c.session for c in out) == [1, 2]


def test_server_requests_can_be_limited_per_server(config):
    router = policy_router(
        config, server_request_policy=lambda server, method, params: server_request_allowed(config, server, method)
    )
    router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "g__git_status"})))
    kind, refused = answer(router.handle(ServerMessage("g", msg(id=1, method="sampling/createMessage", params={}))))
    assert kind == "ToServer" and refused["error"]["data"]["reason"] == "denied"
    # roots/list is allowed: a shared server gets the proxy's roots (none configured here).
    kind, roots = answer(router.handle(ServerMessage("g", msg(id=2, method="roots/list"))))
    assert kind == "ToServer" and roots["result"] == {"roots": []}


def test_explain_reasons(router):
    reader = router.catalogs["reader"]
    reasons = {(s, o): r for s, o, r in reader.hidden["tools"]}
    assert reasons[("e", "echo")] == "servers.e.tools.deny 'echo'"
    assert reasons[("e", "delete-all")] == "policy.tools.deny '*delete*'"
    assert reasons[("e", "write")].startswith("profiles.reader.tools.read_only")
    assert reasons[("g", "git_commit")].startswith("profiles.reader.tools.read_only")  # the first rule that hid it
    router.handle(ServerItems("g", "tools", [*G_TOOLS, {"name": "git_show", "annotations": {"readOnlyHint": True}}]))
    reasons = {(s, o): r for s, o, r in reader.hidden["tools"]}
    assert reasons[("g", "git_show")] == "profiles.reader.servers.g.tools.allow (matched by none of its patterns)"


def test_name_budget_for_llm_apis():
    from aggregator.config import ServerConfig

    servers = [ServerConfig(name="srv", command="x")]
    catalog = Catalog(servers, "__", 50, max_name_length=32, charset="llm")
    long_names = [{"name": "a.b/c"}, {"name": "x" * 60 + "1"}, {"name": "x" * 60 + "2"}, {"name": "a_b_c"}]
    catalog.set_items("srv", "tools", long_names)
    exposed = [t["name"] for t in catalog.exposed["tools"]]
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,32}", n) for n in exposed) and len(set(exposed)) == 4
    assert {catalog.tools[n].original for n in exposed} == {t["name"] for t in long_names}
    again = Catalog(servers, "__", 50, max_name_length=32, charset="llm")
    again.set_items("srv", "tools", list(reversed(long_names)))
    assert set(again.tools) == set(exposed)  # stable across restarts and listing order
