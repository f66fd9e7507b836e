"""roots/list and roots changes (``aggregator.core.reverse.roots``): asked of the client the roots
come from, held while it initializes (at most ``ROOTS_HOLD_SECONDS``), or answered by the
proxy; a change is told once until the server asks again."""

from __future__ import annotations

import pytest

from aggregator.core.events import ClientConnected, ClientDisconnected, ClientMessage, ServerMessage, TimePassed
from aggregator.core.router import ROOTS_HOLD_SECONDS
from tests.core.helpers import CLIENT_CAPS, connect, make_router, msg, unpack

# (one client only, client connected with roots, proxy roots) -> who answers a shared server's roots/list
SOURCES = [
    (False, True, None, ("ToServer", {"roots": []})),
    (False, True, ("file:///srv",), ("ToServer", {"roots": [{"uri": "file:///srv"}]})),
    (False, False, ("file:///srv",), ("ToServer", {"roots": [{"uri": "file:///srv"}]})),
    (True, True, None, ("ToClient", None)),
    (True, False, ("file:///srv",), ("ToServer", {"roots": [{"uri": "file:///srv"}]})),
]


@pytest.mark.parametrize(("single", "client_roots", "roots", "answer"), SOURCES)
def test_who_answers_roots(clock, single, client_roots, roots, answer):
    r = make_router(clock, single_client=single, roots=roots)
    caps = CLIENT_CAPS if client_roots else {"sampling": {}}
    connect(r, 1, caps)
    [(kind, _, m)] = unpack(r.handle(ServerMessage("a", msg(id=3, method="roots/list"))))
    assert kind == answer[0]
    if kind == "ToServer":
        assert m == {"jsonrpc": "2.0", "id": 3, "result": answer[1]}
    else:
        assert m["method"] == "roots/list"


@pytest.mark.parametrize(("wait", "answered"), [(ROOTS_HOLD_SECONDS - 0.1, False), (ROOTS_HOLD_SECONDS + 0.1, True)])
def test_a_held_roots_request_falls_back_after_the_bound(clock, wait, answered):
    r = make_router(clock, single_client=True, roots=("file:///srv",))
    assert r.handle(ServerMessage("a", msg(id=1, method="roots/list"))) == []
    assert r.next_deadline() == pytest.approx(clock.now + ROOTS_HOLD_SECONDS)
    clock.now += wait
    out = unpack(r.handle(TimePassed()))
    assert bool(out) is answered
    if answered:
        assert out == [("ToServer", "a", {"jsonrpc": "2.0", "id": 1, "result": {"roots": [{"uri": "file:///srv"}]}})]


def test_a_flood_of_changes_is_told_once_until_the_server_asks(clock):
    r = make_router(clock, single_client=True)
    connect(r, 1)
    change = msg(method="notifications/roots/list_changed")
    told = unpack(r.handle(ClientMessage(1, change)))
    assert sorted(server for _, server, _ in told) == ["a", "b"]
    assert r.handle(ClientMessage(1, change)) == []
    r.handle(ServerMessage("a", msg(id=5, method="roots/list")))
    assert [server for _, server, _ in unpack(r.handle(ClientMessage(1, change)))] == ["a"]


def test_a_client_without_roots_tells_no_server(clock):
    r = make_router(clock, single_client=True)
    connect(r, 1, {"sampling": {}})
    assert r.handle(ClientMessage(1, msg(method="notifications/roots/list_changed"))) == []


def test_a_held_request_fails_when_its_client_leaves(clock):
    r = make_router(clock, single_client=True)
    r.handle(ClientConnected(1))
    assert r.handle(ServerMessage("a", msg(id=1, method="roots/list"))) == []
    [(kind, server, m)] = unpack(r.handle(ClientDisconnected(1)))
    assert (kind, server, m["id"], m["error"]["data"]["reason"]) == ("ToServer", "a", 1, "unavailable")
    assert r.next_deadline() is None
