"""The client handshake and what the proxy says about itself (``aggregator.core.clients.handshake``):
capabilities merged from the ready servers, the ones it declares upstream, instructions,
and the log level it asks of upstreams."""

from __future__ import annotations

import pytest

from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.events import ClientConnected, ClientMessage, ServerReady, StartupCompleted
from tests.core.helpers import Clock, connect, make_router, msg, new_router, unpack

# (capabilities of server a, of server b) -> what clients are told (always logging: every
# server's log lines are forwarded, whether it declared logging or not)
MERGED = [
    ({}, {}, {"logging": {}}),
    ({"tools": {}}, {}, {"tools": {"listChanged": True}, "logging": {}}),
    (
        {"resources": {}},
        {"resources": {"subscribe": True}},
        {"resources": {"listChanged": True, "subscribe": True}, "logging": {}},
    ),
    ({"logging": {}}, {"completions": {}}, {"logging": {}, "completions": {}}),
    ({"tasks": {"list": {}}}, {"tasks": {"cancel": {}}}, {"tasks": {"list": {}, "cancel": {}}, "logging": {}}),
    ({"prompts": {"listChanged": False}}, {"experimental": {}}, {"prompts": {"listChanged": True}, "logging": {}}),
]


def two_servers(**kw):
    servers = [ServerConfig(name="a", command="x"), ServerConfig(name="b", command="x")]
    return new_router(Catalog(servers, "__", 50), servers, clock=Clock(), list_changed_debounce=0, **kw)


@pytest.mark.parametrize(("a", "b", "merged"), MERGED)
def test_capabilities_are_merged_from_the_ready_servers(a, b, merged):
    r = two_servers()
    r.handle(ServerReady("a", {"capabilities": a}))
    r.handle(ServerReady("b", {"capabilities": b}))
    assert r.handshake.merged_capabilities() == merged


def test_while_a_server_starts_every_kind_is_advertised():
    r = two_servers()
    r.handle(ServerReady("a", {"capabilities": {}}))
    assert set(r.handshake.merged_capabilities()) == {"tools", "prompts", "resources", "logging"}


@pytest.mark.parametrize(
    ("server_requests", "declared"),
    [
        ((), {}),
        (("sampling",), {"sampling": {}}),
        (("elicitation", "roots"), {"elicitation": {"form": {}, "url": {}}, "roots": {"listChanged": True}}),
    ],
)
def test_upstreams_are_told_what_the_proxy_can_route_to_clients(server_requests, declared):
    assert two_servers(server_requests=server_requests).handshake.upstream_client_capabilities() == declared


def test_instructions_name_their_server_and_its_prefix():
    r = two_servers()
    r.handle(ServerReady("a", {"capabilities": {}, "instructions": " Be brief. "}))
    r.handle(ServerReady("b", {"capabilities": {}, "instructions": "   "}))
    assert r.handshake.merged_instructions() == "## Server a (its tools and prompts are prefixed a__)\nBe brief."


@pytest.mark.parametrize(
    ("asked", "code"),
    [
        ({"method": "initialize", "params": {}}, -32600),  # a second initialize
        ({"method": "logging/setLevel", "params": {"level": "loud"}}, -32602),
        ({"method": "logging/setLevel"}, -32602),
    ],
)
def test_handshake_mistakes_are_refused(router, asked, code):
    [(kind, _, answer)] = unpack(router.handle(ClientMessage(1, msg(id=3, **asked))))
    assert (kind, answer["id"], answer["error"]["code"]) == ("ToClient", 3, code)


@pytest.mark.parametrize(
    ("levels", "asked"),
    [(["error"], "error"), (["error", "debug"], "debug"), (["warning", "info"], "info")],
)
def test_upstreams_log_at_the_most_verbose_level_any_client_asked(clock, levels, asked):
    r = make_router(clock)
    sent = []
    for key, level in enumerate(levels, 1):
        connect(r, key)
        sent += unpack(r.handle(ClientMessage(key, msg(id=1, method="logging/setLevel", params={"level": level}))))
    last = {server: m["params"]["level"] for kind, server, m in sent if kind == "ToServer"}
    assert last == {"a": asked, "b": asked}
    assert r.links["a"].log_level == asked


def test_initialize_waits_for_startup_and_answers_after():
    servers = [ServerConfig(name="a", command="x")]
    r = new_router(Catalog(servers, "__", 3), servers)
    r.handle(ClientConnected(1))
    [(kind, session, _)] = [
        (type(c).__name__, c.session, None) for c in r.handle(ClientMessage(1, msg(id=1, method="initialize")))
    ]
    assert (kind, session) == ("WaitForStartup", 1)
    r.handle(StartupCompleted())
    [(kind, _, answer)] = unpack(r.handle(ClientMessage(1, msg(id=1, method="initialize", params={}))))
    assert answer["result"]["serverInfo"]["name"] == "aggregator"
