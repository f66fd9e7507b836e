"""Servers acting as each user in the router (``core.upstreams.own_listings``): a session's
lists wait for its own connection to such a server, which nobody connects without a user.
Pure: a fake clock, no I/O."""

from types import SimpleNamespace

import pytest

from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.commands import StartUpstream
from aggregator.core.events import (
    ClientConnected,
    ClientDisconnected,
    ClientMessage,
    LinkEnded,
    ServerItems,
    ServerListing,
    ServerLost,
    ServerReady,
    ServerRemoved,
    StartupCompleted,
    TimePassed,
)
from tests.core.helpers import msg, new_router, unpack

CAPS = {"capabilities": {"tools": {}}}
ALICE = SimpleNamespace(issuer="https://idp.example", subject="alice")
CONSENT = {"code": -32603, "message": "grant access first", "data": {"reason": "unauthorized", "url": "https://x/a"}}


@pytest.fixture
def router(clock):
    servers = [
        ServerConfig(name="a", command="x"),
        ServerConfig(name="u", url="http://127.0.0.1:1/mcp", auth="oauth", isolation="per-session", init_timeout=4.0),
    ]
    router = new_router(Catalog(servers, "__", 50), servers, clock=clock)
    router.handle(ServerReady("a", CAPS))
    router.handle(ServerItems("a", "tools", [{"name": "time"}]))
    router.handle(StartupCompleted())
    return router


def session(router, key, principal=ALICE):
    router.handle(ClientConnected(key, principal=principal))
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c"}}
    router.handle(ClientMessage(key, msg(id=0, method="initialize", params=init)))
    router.handle(ClientMessage(key, msg(method="notifications/initialized")))


def ask(router, key, id, method, **params):
    return router.handle(ClientMessage(key, msg(id=id, method=method, params=params)))


def tools_of(out, id):
    [listed] = [m for kind, _, m in unpack(out) if kind == "ToClient" and m.get("id") == id]
    return [tool["name"] for tool in listed["result"]["tools"]]


def test_a_users_first_list_waits_for_its_own_connection(router):
    session(router, 1)
    out = ask(router, 1, 5, "tools/list")
    assert [type(c) for c in out] == [StartUpstream] and out[0].name == "u@1"  # held, nothing answered
    router.handle(ServerReady("u@1", CAPS))
    listed = router.handle(ServerListing("u@1", {"tools": [{"name": "whoami"}]}))
    assert tools_of(listed, 5) == ["a__time", "u__whoami"]
    assert not router.clients[1].in_flight
    # Listed: the next list is answered at once, and no second connection starts.
    assert tools_of(ask(router, 1, 6, "tools/list"), 6) == ["a__time", "u__whoami"]


def test_a_session_acting_for_nobody_waits_for_nothing(router):
    session(router, 1, principal=None)
    out = ask(router, 1, 5, "tools/list")
    assert tools_of(out, 5) == ["a__time"] and "u@1" not in router.links


def test_a_list_waits_at_most_the_servers_init_timeout(router, clock):
    session(router, 1)
    ask(router, 1, 5, "tools/list")
    clock.now += 3.9
    assert router.handle(TimePassed()) == []
    clock.now += 0.2
    assert tools_of(router.handle(TimePassed()), 5) == ["a__time"]
    # Not waited for again by its lists; once it lists, the session is told its list changed.
    assert tools_of(ask(router, 1, 6, "tools/list"), 6) == ["a__time"]
    router.handle(ServerReady("u@1", CAPS))
    router.handle(ServerListing("u@1", {"tools": [{"name": "whoami"}]}))
    assert tools_of(ask(router, 1, 7, "tools/list"), 7) == ["a__time", "u__whoami"]


def test_a_user_who_must_grant_access_sees_the_grant_tool(router):
    session(router, 1)
    ask(router, 1, 5, "tools/list")
    router.links["u@1"].refusal = CONSENT  # its connection ended asking for the user's grant
    out = router.handle(ServerLost("u@1", "no credential of its user's could be sent to it"))
    assert tools_of(out, 5) == ["a__time", "u__grant_access"]
    router.handle(LinkEnded("u@1"))
    assert tools_of(ask(router, 1, 6, "tools/list"), 6) == ["a__time", "u__grant_access"]
    # Its call starts the connection again; refused again, the caller is asked for the grant.
    out = ask(router, 1, 7, "tools/call", name="u__grant_access")
    assert [type(c) for c in out] == [StartUpstream]
    router.links["u@1"].refusal = CONSENT
    [(_, _, refused)] = unpack(router.handle(ServerLost("u@1", "no credential")))
    assert refused["id"] == 7 and refused["error"]["data"]["url"] == "https://x/a"
    router.handle(LinkEnded("u@1"))
    # Granted: the call is answered by the proxy, and a list waits for the server's own listing.
    ask(router, 1, 8, "tools/call", name="u__grant_access")
    [(_, _, granted)] = unpack(router.handle(ServerReady("u@1", CAPS)))
    assert granted["id"] == 8 and "granted" in granted["result"]["content"][0]["text"]
    assert ask(router, 1, 9, "tools/list") == []
    listed = router.handle(ServerListing("u@1", {"tools": [{"name": "whoami"}]}))
    assert tools_of(listed, 9) == ["a__time", "u__whoami"]


def test_a_held_list_ends_with_its_session_or_its_server(router, clock):
    session(router, 1)
    ask(router, 1, 5, "tools/list")
    out = router.handle(ClientDisconnected(1))
    assert [type(c).__name__ for c in out] == ["StopUpstream"]
    router.handle(LinkEnded("u@1"))
    clock.now += 10
    assert router.handle(TimePassed()) == []
    # A reload that stops the server answers a list waiting for it, without it.
    session(router, 2)
    ask(router, 2, 6, "tools/list")
    out = router.handle(ServerRemoved("u", "it was removed from the configuration"))
    assert tools_of(out, 6) == ["a__time"]
    assert not router.clients[2].in_flight


def test_a_server_whose_token_exchange_failed_shows_the_session_nothing(clock):
    """Nothing to grant for a token exchange: no grant tool stands in for it (the exchange's
    own warning says why in the log; a call of one of its tools is told why)."""
    servers = [
        ServerConfig(name="a", command="x"),
        ServerConfig(
            name="x", url="http://127.0.0.1:1/mcp", auth="token-exchange", isolation="per-session", init_timeout=4.0
        ),
    ]
    router = new_router(Catalog(servers, "__", 50), servers, clock=clock)
    router.handle(ServerReady("a", CAPS))
    router.handle(ServerItems("a", "tools", [{"name": "time"}]))
    router.handle(StartupCompleted())
    session(router, 1)
    ask(router, 1, 5, "tools/list")
    refusal = {"code": -32603, "message": "token exchange failed: HTTP 500", "data": {"reason": "unauthorized"}}
    router.links["x@1"].refusal = refusal
    out = router.handle(ServerLost("x@1", "no credential of its user's could be sent to it"))
    assert tools_of(out, 5) == ["a__time"]
    router.handle(LinkEnded("x@1"))
    assert tools_of(ask(router, 1, 6, "tools/list"), 6) == ["a__time"]
    assert not router.clients[1].granting
