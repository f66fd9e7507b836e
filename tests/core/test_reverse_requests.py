"""Server-to-client requests (``aggregator.core.handlers.reverse_requests``): routed under a proxy id
to the one client they are for, answered back under the server's id, or refused at once."""

from __future__ import annotations

import pytest

from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.events import ClientMessage, ServerItems, ServerMessage, ServerReady, StartupCompleted
from aggregator.core.reverse.reverse_table import replica_of
from tests.core.helpers import Clock, connect, msg, new_router, unpack


def one_client(caps, **kw):
    servers = [ServerConfig(name="a", command="x")]
    r = new_router(Catalog(servers, "__", 50), servers, clock=Clock(), list_changed_debounce=0, **kw)
    r.handle(ServerReady("a", {"capabilities": {"tools": {}}}))
    r.handle(ServerItems("a", "tools", [{"name": "t"}]))
    r.handle(StartupCompleted())
    connect(r, 1, caps)
    r.handle(ClientMessage(1, msg(id="call", method="tools/call", params={"name": "a__t"})))
    return r


ALL = {"sampling": {"tools": {}}, "elicitation": {"form": {}, "url": {}}}

# (client capabilities, method, params, routing settings, the reason it is refused or None when it goes to the client)
CASES = [
    (ALL, "sampling/createMessage", {}, {}, None),
    (ALL, "sampling/createMessage", {"tools": []}, {}, None),
    ({"sampling": {}}, "sampling/createMessage", {"tools": []}, {}, "unsupported"),
    ({}, "sampling/createMessage", {}, {}, "unsupported"),
    (ALL, "elicitation/create", {"mode": "url", "elicitationId": "e"}, {}, None),
    ({"elicitation": {}}, "elicitation/create", {"mode": "url"}, {}, "unsupported"),
    ({"elicitation": {}}, "elicitation/create", {}, {}, None),
    (ALL, "sampling/createMessage", {}, {"server_requests": ("elicitation",)}, "unroutable"),
    (ALL, "no/such", {}, {}, "unroutable"),
    (ALL, "sampling/createMessage", {}, {"server_request_policy": lambda s, m, p: False}, "denied"),
]


@pytest.mark.parametrize(("caps", "method", "params", "settings", "reason"), CASES)
def test_a_server_request_goes_to_its_client_or_is_refused_with_why(caps, method, params, settings, reason):
    r = one_client(caps, **settings)
    out = unpack(r.handle(ServerMessage("a", msg(id=41, method=method, params=params))))
    if reason is None:
        [(kind, session, asked)] = out
        assert (kind, session, asked["method"], asked["params"]) == ("ToClient", 1, method, params)
        back = unpack(r.handle(ClientMessage(1, msg(id=asked["id"], result={"ok": True}))))
        assert back == [("ToServer", "a", {"jsonrpc": "2.0", "id": 41, "result": {"ok": True}})]
    else:
        [(kind, server, refused)] = out
        assert (kind, server, refused["id"]) == ("ToServer", "a", 41)
        assert refused["error"]["data"]["reason"] == reason
    assert r.reverse.requests == {} and r.reverse.asked == {}


@pytest.mark.parametrize("method", ["sampling/createMessage", "elicitation/create"])
def test_in_a_cluster_the_id_a_client_is_asked_under_names_this_replica(method):
    # A client's answer may reach another replica: the id says which one asked.
    r = one_client(ALL, reverse_replica="eu-1")
    [(_, _, asked)] = unpack(r.handle(ServerMessage("a", msg(id=41, method=method, params={}))))
    assert type(asked["id"]) is str and asked["id"].startswith("eu-1.") and replica_of(asked["id"]) == "eu-1"
    assert unpack(r.handle(ClientMessage(1, msg(id=asked["id"], result={"ok": True})))) == [
        ("ToServer", "a", {"jsonrpc": "2.0", "id": 41, "result": {"ok": True}})
    ]
    [(_, _, again)] = unpack(r.handle(ServerMessage("a", msg(id="s1", method=method, params={}))))
    out = unpack(r.handle(ServerMessage("a", msg(method="notifications/cancelled", params={"requestId": "s1"}))))
    assert out == [
        ("ToClient", 1, {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": again["id"]}})
    ]
    assert r.reverse.requests == {} and r.reverse.asked == {}


def test_ping_is_answered_by_the_proxy():
    r = one_client(ALL)
    assert unpack(r.handle(ServerMessage("a", msg(id=1, method="ping")))) == [
        ("ToServer", "a", {"jsonrpc": "2.0", "id": 1, "result": {}})
    ]


def test_a_client_that_answers_nothing_is_asked_no_more_than_the_limit():
    r = one_client(ALL, max_in_flight=2)
    reasons = []
    for id in range(3):
        [(kind, _, m)] = unpack(r.handle(ServerMessage("a", msg(id=id, method="sampling/createMessage", params={}))))
        reasons.append(m["error"]["data"]["reason"] if kind == "ToServer" else "asked")
    assert reasons == ["asked", "asked", "overloaded"]


def test_the_server_cancelling_its_request_tells_the_client_under_the_proxy_id():
    r = one_client(ALL)
    [(_, _, asked)] = unpack(r.handle(ServerMessage("a", msg(id="s1", method="sampling/createMessage", params={}))))
    out = unpack(r.handle(ServerMessage("a", msg(method="notifications/cancelled", params={"requestId": "s1"}))))
    assert out == [
        ("ToClient", 1, {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": asked["id"]}})
    ]
    assert r.handle(ClientMessage(1, msg(id=asked["id"], result={}))) == []  # too late: nobody waits


def test_a_url_elicitation_completion_goes_to_its_client_once():
    r = one_client(ALL)
    r.handle(ServerMessage("a", msg(id=2, method="elicitation/create", params={"mode": "url", "elicitationId": "e1"})))
    done = msg(method="notifications/elicitation/complete", params={"elicitationId": "e1"})
    assert [c.session for c in r.handle(ServerMessage("a", done))] == [1]
    assert r.handle(ServerMessage("a", done)) == []
