"""The proxy's own requests to an upstream, one way through the router
(``aggregator.core.upstreams.upstream_control``): the link's lifecycle (handshake, listing) and the
router's own requests (gathers, renewed subscriptions) share the link's table, answered
through ``server_message`` and timed out through ``next_deadline``/``expire``."""

from __future__ import annotations

import logging

import pytest

from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.commands import RequestEnded
from aggregator.core.events import (
    ClientDisconnected,
    ClientMessage,
    OwnCallStarted,
    ServerLost,
    ServerMessage,
    StartupCompleted,
    TimePassed,
    UpstreamConnected,
)
from aggregator.core.replies import cancelled
from aggregator.core.router import DropUpstream, Router, ToClient, ToServer, UpstreamServing
from tests.core.helpers import Clock, connect, lifecycle_serves, msg, new_router, own_asks, unpack

CAPS = {"tools": {"listChanged": True}, "resources": {"subscribe": True}, "tasks": {"list": {}}}
INIT = {"protocolVersion": "2025-11-25", "capabilities": CAPS, "serverInfo": {"name": "s", "version": "1"}}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def router(clock: Clock) -> Router:
    """Servers ``a`` and ``b`` (request timeout 5 s, pinned to the legacy era), not connected yet."""
    servers = [ServerConfig(name=n, command="x", request_timeout=5.0, protocol="2025-11-25") for n in ("a", "b")]
    return new_router(Catalog(servers, "__", 50), servers, clock=clock, list_changed_debounce=0)


def started(router: Router, name: str = "a") -> dict:
    """Connect ``name``: the initialize its lifecycle sends."""
    [init] = own_asks(router.handle(UpstreamConnected(name, target="cmd x", init_timeout=10.0)))
    assert init["method"] == "initialize"
    return init


# (how the initialize is answered, or None: not at all; what comes out, at which time)
HANDSHAKES = [
    pytest.param({"result": INIT}, ["tools/list"], 0.0, id="answered"),
    pytest.param(
        {"error": {"code": -32000, "message": "no"}},
        [DropUpstream("a", "initialize failed: no (code -32000)")],
        0.0,
        id="failed",
    ),
    pytest.param(
        {"result": {"capabilities": {}}},
        ["unusable"],
        0.0,
        id="unusable",
    ),
    pytest.param(None, [DropUpstream("a", "no answer to initialize within 10.0s")], 10.0, id="timed out"),
]


@pytest.mark.parametrize(("answer", "expected", "after"), HANDSHAKES)
def test_a_handshake(router, clock, answer, expected, after):
    init = started(router)
    assert router.next_deadline() == clock.now + 10.0  # the hub's clock keeps the lifecycle's deadline
    if answer is None:
        clock.now += after - 0.001
        assert router.handle(TimePassed()) == []
        clock.now += 0.001
        out = router.handle(TimePassed())
    else:
        out = router.handle(ServerMessage("a", msg(id=init["id"], **answer)))
    if expected == ["unusable"]:
        [drop] = out
        assert type(drop) is DropUpstream and "its initialize result is unusable" in drop.reason
    elif type(expected[0]) is str:
        assert router.links["a"].ready and [m["method"] for m in own_asks(out)] == expected
        assert out[0] == ToServer("a", {"jsonrpc": "2.0", "method": "notifications/initialized"})
    else:
        assert out == expected and not router.links["a"].ready
        assert router.next_deadline() is None  # nothing of it waits any more


def test_a_listed_server_serves(router):
    out = lifecycle_serves(router, "a", CAPS, {"tools": [{"name": "echo"}]})
    assert UpstreamServing("a") in out
    assert [t["name"] for t in router.catalog.items_of("a", "tools")] == ["echo"]
    assert len(router.links["a"].own) == 0


def test_a_relist_after_a_list_change(router, clock):
    router.handle(StartupCompleted())
    lifecycle_serves(router, "a", CAPS, {"tools": [{"name": "echo"}]})
    connect(router, 1)
    [ask] = own_asks(router.handle(ServerMessage("a", msg(method="notifications/tools/list_changed"))))
    assert ask["method"] == "tools/list" and router.next_deadline() == clock.now + 5.0  # request_timeout
    out = router.handle(ServerMessage("a", msg(id=ask["id"], result={"tools": [{"name": "echo"}, {"name": "new"}]})))
    assert ("ToClient", 1, "notifications/tools/list_changed") in [(k, s, m.get("method")) for k, s, m in unpack(out)]
    assert [t["name"] for t in router.catalog.items_of("a", "tools")] == ["echo", "new"]


def test_a_relist_that_times_out_keeps_the_listing_and_the_connection(router, clock, caplog):
    lifecycle_serves(router, "a", CAPS, {"tools": [{"name": "echo"}]})
    [ask] = own_asks(router.handle(ServerMessage("a", msg(method="notifications/tools/list_changed"))))
    clock.now += 5.0
    with caplog.at_level(logging.WARNING):
        assert router.handle(TimePassed()) == [ToServer("a", cancelled(ask["id"], "timed out"))]  # given up: told so
    assert "re-listing tools failed: no answer within 5.0s" in caplog.text
    assert router.links["a"].ready and [t["name"] for t in router.catalog.items_of("a", "tools")] == ["echo"]


def test_a_subscription_renewed_after_a_restart_that_fails_is_logged_only(router, caplog):
    router.handle(StartupCompleted())
    lifecycle_serves(router, "a", CAPS, {"resources": [{"uri": "demo://r/1"}]})
    connect(router, 1)
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(1, msg(id=7, method="resources/subscribe", params={"uri": "a+demo://r/1"})))
    )
    router.handle(ServerMessage("a", msg(id=sent["id"], result={})))
    router.handle(ServerLost("a", "crashed"))
    init = started(router)
    out = router.handle(ServerMessage("a", msg(id=init["id"], result=INIT)))
    renew = [m for m in own_asks(out) if m["method"] == "resources/subscribe"]
    assert [m["params"] for m in renew] == [{"uri": "demo://r/1"}]
    with caplog.at_level(logging.INFO):
        answered = router.handle(ServerMessage("a", msg(id=renew[0]["id"], error={"code": -32001, "message": "gone"})))
    assert answered == []  # no client hears of it
    assert "server a: resources/subscribe failed: gone" in caplog.text
    assert list(router.subscriptions.of_server("a")) == ["demo://r/1"]


def test_a_tasks_list_gather_with_one_server_timing_out(router, clock, caplog):
    router.handle(StartupCompleted())
    lifecycle_serves(router, "a", CAPS)
    lifecycle_serves(router, "b", CAPS)
    connect(router, 1)
    asks = router.handle(ClientMessage(1, msg(id="t", method="tasks/list", params={})))
    by_server = {c.server: c.message for c in asks}
    assert sorted(by_server) == ["a", "b"] and {m["method"] for m in by_server.values()} == {"tasks/list"}
    assert router.handle(ServerMessage("b", msg(id=by_server["b"]["id"], result={"tasks": []}))) == []  # a still owes
    clock.now += 5.0
    with caplog.at_level(logging.WARNING):
        out = router.handle(TimePassed())
    cancel = {"requestId": by_server["a"]["id"], "reason": "timed out"}
    assert out == [
        ToServer("a", {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel}),
        ToClient(1, {"jsonrpc": "2.0", "id": "t", "result": {"tasks": []}}),
    ]
    assert f"server a: tasks/list timed out (upstream id {by_server['a']['id']})" in caplog.text
    assert router.handle(ServerMessage("a", msg(id=by_server["a"]["id"], result={"tasks": []}))) == []  # late: dropped


def test_a_gather_fails_with_its_server_lost(router):
    router.handle(StartupCompleted())
    lifecycle_serves(router, "a", CAPS)
    connect(router, 1)
    [ask] = router.handle(ClientMessage(1, msg(id="t", method="tasks/list", params={})))
    out = router.handle(ServerLost("a", "crashed"))
    assert ToClient(1, {"jsonrpc": "2.0", "id": "t", "result": {"tasks": []}}) in out
    assert (
        len(router.links["a"].own) == 0
        and router.handle(ServerMessage("a", msg(id=ask.message["id"], result={}))) == []
    )


def test_a_stale_answer_after_a_reconnect_is_dropped(router, clock):
    first = started(router)
    router.handle(ServerLost("a", "crashed"))
    second = started(router)
    assert second["id"] != first["id"]  # ids never repeat on a link
    assert router.handle(ServerMessage("a", msg(id=first["id"], result=INIT))) == []
    assert not router.links["a"].ready and len(router.links["a"].own) == 1
    out = router.handle(ServerMessage("a", msg(id=second["id"], result=INIT)))
    assert router.links["a"].ready and [m["method"] for m in own_asks(out)] == ["tools/list"]


def test_an_own_call_is_answered_to_its_caller(router, clock):
    lifecycle_serves(router, "a", CAPS)
    caller = object()
    [sent] = router.handle(OwnCallStarted("a", "tools/call", {"name": "x"}, caller))
    [answer] = router.handle(ServerMessage("a", msg(id=sent.message["id"], error={"code": -32042, "message": "no"})))
    assert (answer.caller, answer.result, answer.code, answer.message) == (caller, None, -32042, "no")
    [later] = router.handle(OwnCallStarted("a", "ping", None, caller))
    clock.now += 5.0
    cancel, late = router.handle(TimePassed())
    assert cancel == ToServer("a", cancelled(later.message["id"], "timed out"))  # the server is told
    assert (late.caller, late.error) == (caller, "ping: no answer in time")
    router.handle(ServerLost("a", "crashed"))
    [ended] = router.handle(OwnCallStarted("a", "ping", None, caller))
    assert ended.error == "ping: the connection ended before an answer"


# (how the client stops waiting for its tasks/list gather, the reason told upstream)
GATHER_ENDS = [
    pytest.param(lambda r: r.handle(ClientDisconnected(1)), "client disconnected", id="session ended"),
    pytest.param(
        lambda r: r.handle(ClientMessage(1, msg(method="notifications/cancelled", params={"requestId": "t"}))),
        "cancelled by the client",
        id="cancelled",
    ),
]


@pytest.mark.parametrize(("end", "why"), GATHER_ENDS)
def test_a_gather_nobody_waits_for_is_cancelled_upstream_at_once(router, clock, end, why):
    router.handle(StartupCompleted())
    lifecycle_serves(router, "a", CAPS)
    lifecycle_serves(router, "b", CAPS)
    connect(router, 1)
    connect(router, 2)
    by_server = {
        c.server: c.message for c in router.handle(ClientMessage(1, msg(id="t", method="tasks/list", params={})))
    }
    # another session's gather (the same client id): kept
    other = {c.server: c.message for c in router.handle(ClientMessage(2, msg(id="t", method="tasks/list", params={})))}
    for asks in (by_server, other):
        assert router.handle(ServerMessage("b", msg(id=asks["b"]["id"], result={"tasks": []}))) == []  # a still owes
    commands = end(router)
    out = [c for c in commands if type(c) is ToServer and c.message.get("method") == "notifications/cancelled"]
    assert out == [ToServer("a", cancelled(by_server["a"]["id"], why))]
    if why == "cancelled by the client":  # its client still reads: the request's stream ends
        assert RequestEnded(1, "t") in commands
    assert len(router.links["a"].own) == 1  # only the other session's is left
    assert router.handle(ServerMessage("a", msg(id=by_server["a"]["id"], result={"tasks": []}))) == []  # late: dropped
    clock.now += 5.0
    assert router.handle(TimePassed()) == [  # the other session's timed out as before; nothing more of the ended one
        ToServer("a", cancelled(other["a"]["id"], "timed out")),
        ToClient(2, {"jsonrpc": "2.0", "id": "t", "result": {"tasks": []}}),
    ]


# an own request the proxy makes: when it times out, the server hears of it
GIVEN_UP = [
    pytest.param(lambda r: r.handle(OwnCallStarted("a", "ping", None, object())), id="own call"),
    pytest.param(lambda r: r.handle(ServerMessage("a", msg(method="notifications/tools/list_changed"))), id="re-list"),
    pytest.param(lambda r: [*r.handle(ClientMessage(1, msg(id="t", method="tasks/list", params={})))][:1], id="gather"),
]


@pytest.mark.parametrize("make", GIVEN_UP)
def test_every_own_request_that_times_out_is_cancelled_upstream(router, clock, make):
    router.handle(StartupCompleted())
    lifecycle_serves(router, "a", CAPS, {"tools": [{"name": "echo"}]})
    connect(router, 1)
    [ask] = own_asks(make(router))
    clock.now += 5.0
    cancels = [c for c in router.handle(TimePassed()) if type(c) is ToServer]
    assert cancels == [ToServer("a", cancelled(ask["id"], "timed out"))]


def test_initialize_that_times_out_is_not_cancelled_and_a_hung_listing_is_named(router, clock):
    init = started(router)
    clock.now += 10.0
    assert router.handle(TimePassed()) == [DropUpstream("a", "no answer to initialize within 10.0s")]
    init = started(router)
    [ask] = own_asks(router.handle(ServerMessage("a", msg(id=init["id"], result=INIT))))
    assert ask["method"] == "tools/list"
    clock.now += 10.0
    assert router.handle(TimePassed()) == [  # initialize was answered: what hung is the listing
        ToServer("a", cancelled(ask["id"], "timed out")),
        DropUpstream("a", "no answer to tools/list within 10.0s"),
    ]
