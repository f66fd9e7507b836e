"""The router's side of the boundary with the trio layer: what the hub, the upstreams and
the fronts tell it and ask it, through methods (they never write its fields). Also a check
that the trio layer's source keeps to those methods. Pure: a fake clock, no I/O."""

import re
from pathlib import Path

import pytest

from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.events import (
    ClientConnected,
    ClientDisconnected,
    ClientMessage,
    DrainingStarted,
    LinkEnded,
    ServerCongested,
    ServerItems,
    ServerLost,
    ServerMessage,
    ServerReady,
    ServerStreams,
    StartupCompleted,
)
from aggregator.core.router import SessionInfo, StartUpstream, WaitForStartup
from tests.core.helpers import Clock, connect, msg, new_router, unpack

ROOT = Path(__file__).parents[2] / "aggregator"
TRIO_LAYER = sorted(p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] not in ("core", "jsonrpc", "mcp"))
# What the trio layer must not do to the router: assign or delete its fields, reach into its tables.
POKES = [
    re.compile(r"router\.[a-z_]+\s*=[^=]"),
    re.compile(r"del\s+[\w.]*router\b"),
    re.compile(r"router\.(clients|links|catalogs|outages|views|reverse|held|tasks|subscriptions)\b"),
]


@pytest.mark.parametrize("path", TRIO_LAYER, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_trio_layer_only_calls_the_router(path):
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for poke in POKES:
            assert not poke.search(line), f"{path.name}:{number} reaches into the router: {line.strip()}"


def test_the_poke_check_sees_a_poke():
    lines = ["self.router.draining = True", "del self.router.links[name]", "hub.router.clients.get(key)"]
    assert all(any(p.search(line) for p in POKES) for line in lines)
    assert not any(p.search("self.router.handle(DrainingStarted())") for p in POKES)
    assert len(TRIO_LAYER) >= 10 and any(p.name == "hub.py" for p in TRIO_LAYER)


def per_session_router(clock):
    servers = [ServerConfig(name="a", command="x"), ServerConfig(name="p", command="x", isolation="per-session")]
    router = new_router(Catalog(servers, "__", 50), servers, clock=clock, list_changed_debounce=0)
    for name in ("a", "p"):
        router.handle(ServerReady(name, {"capabilities": {"tools": {}}}))
        router.handle(ServerItems(name, "tools", [{"name": "echo"}]))
    router.handle(StartupCompleted())
    connect(router, 1)
    return router


def started(router):
    """Client 1's first call to p starts its own connection p@1 (not ready yet)."""
    [start] = router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "p__echo"})))
    assert type(start) is StartUpstream and start.name == "p@1"


def ready(router):
    started(router)
    router.handle(ServerReady("p@1", {"capabilities": {"tools": {}}}))


# (what happened to the link before it ended, which link, whether the router still knows it)
LINK_ENDED = [
    ("started, never ready", started, "p@1", False),
    ("ready", ready, "p@1", True),
    ("shared server", lambda router: None, "a", True),
    ("unknown", lambda router: None, "nothing", False),
]


@pytest.mark.parametrize(("case", "before", "name", "kept"), LINK_ENDED, ids=[c[0] for c in LINK_ENDED])
def test_link_ended_forgets_only_a_per_session_link_that_never_got_ready(case, before, name, kept):
    router = per_session_router(Clock())
    before(router)
    router.handle(LinkEnded(name))
    assert (name in router.links) is kept


def test_a_forgotten_link_is_started_afresh():
    router = per_session_router(Clock())
    started(router)
    router.handle(ServerLost("p@1", "cannot start 'x'"))
    router.handle(LinkEnded("p@1"))
    [start] = router.handle(ClientMessage(1, msg(id=2, method="tools/call", params={"name": "p__echo"})))
    assert type(start) is StartUpstream and start.name == "p@1"


def test_session_info_and_request_in_flight(router):
    assert router.session_info(1) == SessionInfo("default", "2025-11-25", 0)
    assert router.session_info(99) is None
    [(_, server, sent)] = unpack(
        router.handle(ClientMessage(1, msg(id="x", method="tools/call", params={"name": "a__slow"})))
    )
    assert server == "a"
    assert router.session_info(1).in_flight == 1 and router.session_info(2).in_flight == 0
    assert router.request_in_flight(1, "x") and not router.request_in_flight(2, "x")
    assert not router.request_in_flight(99, "x")
    router.handle(ServerMessage("a", msg(id=sent["id"], result={})))
    assert router.session_info(1).in_flight == 0 and not router.request_in_flight(1, "x")
    router.handle(ClientDisconnected(1))
    assert router.session_info(1) is None


def test_a_congested_server_refuses_new_requests_until_it_reads_again(router):
    router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "a__slow"})))
    assert router.handle(ServerCongested("a", "more than 10 bytes wait for it")) == []
    assert router.in_flight_on("a") == 1
    [(_, _, refused)] = unpack(
        router.handle(ClientMessage(1, msg(id=2, method="tools/call", params={"name": "a__fast"})))
    )
    assert refused["error"]["data"]["reason"] == "overloaded"
    assert "more than 10 bytes wait for it" in refused["error"]["message"]
    assert router.handle(ServerCongested("a", None)) == []
    assert router.in_flight_on("a") == 1
    [(kind, server, _)] = unpack(
        router.handle(ClientMessage(1, msg(id=3, method="tools/call", params={"name": "a__fast"})))
    )
    assert (kind, server) == ("ToServer", "a")
    assert router.handle(ServerCongested("nothing", "x")) == []
    assert router.in_flight_on("nothing") is None


def test_server_streams_is_remembered_for_the_link(router):
    router.handle(ServerStreams("a", True))
    assert router.links["a"].streams and not router.links["b"].streams
    router.handle(ServerStreams("nothing", True))  # a link gone meanwhile: nothing to remember


def test_the_handshake_waits_for_startup_until_it_completes(clock):
    servers = [ServerConfig(name="a", command="x")]
    router = new_router(Catalog(servers, "__", 50), servers, clock=clock)
    router.handle(ClientConnected(1))
    initialize = msg(id=1, method="initialize", params={"protocolVersion": "2025-11-25", "capabilities": {}})
    assert [type(c) for c in router.handle(ClientMessage(1, initialize))] == [WaitForStartup]
    router.handle(StartupCompleted())
    [(_, _, answer)] = unpack(router.handle(ClientMessage(1, initialize)))
    assert answer["result"]["protocolVersion"] == "2025-11-25"


def test_draining_refuses_new_requests(router):
    router.handle(DrainingStarted())
    [(_, _, answer)] = unpack(
        router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "a__fast"})))
    )
    assert "error" in answer and router.in_flight() == 0


def test_the_server_request_policy_is_given_at_construction(clock):
    asked = []

    def policy(server, method, params):
        asked.append((server, method))
        return False

    servers = [ServerConfig(name="a", command="x")]
    router = new_router(Catalog(servers, "__", 50), servers, clock=clock, server_request_policy=policy)
    router.handle(ServerReady("a", {"capabilities": {}}))
    router.handle(StartupCompleted())
    connect(router, 1)
    [(kind, server, answer)] = unpack(
        router.handle(ServerMessage("a", msg(id=7, method="sampling/createMessage", params={"messages": []})))
    )
    assert (kind, server, asked) == ("ToServer", "a", [("a", "sampling/createMessage")])
    assert answer["id"] == 7 and "error" in answer


def test_profile_catalog_is_the_profiles_catalog(router):
    assert router.profile_catalog("default") is router.catalog
    with pytest.raises(KeyError):
        router.profile_catalog("nobody")
