"""What a client session says (``aggregator.core.handlers.client_events``): requests checked before
their handler runs, notifications, answers to server requests, and what its going away ends."""

from __future__ import annotations

import pytest

from aggregator.core.events import ClientConnected, ClientDisconnected, ClientMessage, ServerMessage
from tests.core.helpers import msg, unpack

# (the request, the error code the client gets, a phrase of its message)
REFUSED = [
    ({"method": "no/such"}, -32601, "Method not found: no/such"),
    ({"method": "notifications/cancelled", "params": {"requestId": 1}}, -32600, "a notification, sent as a request"),
    ({"method": "notifications/anything"}, -32600, "notifications/anything is a notification"),
    ({"method": "subscriptions/listen", "params": {"notifications": {}}}, -32601, ""),  # a legacy session's
]


@pytest.mark.parametrize(("asked", "code", "phrase"), REFUSED)
def test_a_request_without_a_handler_is_refused(router, asked, code, phrase):
    [(kind, _, answer)] = unpack(router.handle(ClientMessage(1, msg(id=4, **asked))))
    assert (kind, answer["id"], answer["error"]["code"]) == ("ToClient", 4, code)
    assert phrase in answer["error"]["message"]


def test_a_request_before_initialize_is_refused_but_ping_answered(router):
    router.handle(ClientConnected(3))
    [(_, _, answer)] = unpack(router.handle(ClientMessage(3, msg(id=1, method="tools/list"))))
    assert answer["error"]["code"] == -32600 and "before initialize" in answer["error"]["message"]
    assert unpack(router.handle(ClientMessage(3, msg(id=2, method="ping")))) == [
        ("ToClient", 3, {"jsonrpc": "2.0", "id": 2, "result": {}})
    ]


def test_an_id_in_flight_cannot_be_used_again(router):
    router.handle(ClientMessage(1, msg(id=7, method="tools/call", params={"name": "a__slow"})))
    [(_, _, answer)] = unpack(
        router.handle(ClientMessage(1, msg(id=7, method="tools/call", params={"name": "a__fast"})))
    )
    assert answer["error"]["code"] == -32600 and "already in use" in answer["error"]["message"]


@pytest.mark.parametrize(
    "message",
    [
        {"method": "notifications/cancelled", "params": {"requestId": "never"}},
        {"method": "notifications/cancelled", "params": {"requestId": [1]}},
        {"method": "notifications/cancelled"},
        {"method": "notifications/whatever"},
        {"id": 12345, "result": {}},  # an answer to no request of a server
    ],
)
def test_what_names_nothing_in_flight_is_dropped(router, message):
    assert router.handle(ClientMessage(1, msg(**message))) == []


def test_a_cancel_goes_up_under_the_upstream_id(router):
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(1, msg(id="x", method="tools/call", params={"name": "b__slow"})))
    )
    [(kind, server, notice), ended] = unpack(
        router.handle(ClientMessage(1, msg(method="notifications/cancelled", params={"requestId": "x", "reason": "r"})))
    )
    assert (kind, server, notice["params"]) == ("ToServer", "b", {"requestId": sent["id"], "reason": "r"})
    # The client gets no answer: a front with a stream per request is told it ended.
    assert ended == ("RequestEnded", 1, ("x",))


def test_a_bug_in_a_handler_is_an_internal_error_for_that_request_only(router, monkeypatch):
    def broken(client, message):
        raise RuntimeError("bug")

    monkeypatch.setitem(router.client_requests.handlers, "ping", broken)
    [(_, _, answer)] = unpack(router.handle(ClientMessage(1, msg(id=1, method="ping"))))
    assert answer["error"]["code"] == -32603 and answer["error"]["data"]["reason"] == "internal"
    assert unpack(router.handle(ClientMessage(1, msg(id=2, method="tools/list"))))[0][2]["result"]["tools"]


def test_a_client_that_goes_away_leaves_nothing_behind(router):
    router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "a__slow"})))
    router.handle(ClientMessage(1, msg(id=2, method="resources/subscribe", params={"uri": "a+demo://r/1"})))
    out = unpack(router.handle(ClientDisconnected(1)))
    # Both requests cancelled upstream; the subscription it was making is undone there.
    assert sorted(m["method"] for _, _, m in out) == [
        "notifications/cancelled",
        "notifications/cancelled",
        "resources/unsubscribe",
    ]
    assert router.session_info(1) is None and router.in_flight() == 0
    assert router.handle(ClientDisconnected(1)) == []


def test_a_client_that_stops_sending_but_reads_hears_what_was_left_unanswered(router):
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(1, msg(id="x", method="tools/call", params={"name": "a__slow"})))
    )
    out = unpack(router.handle(ClientDisconnected(1, answer=True)))
    cancels = [(who, m["params"]["requestId"]) for kind, who, m in out if kind == "ToServer"]
    answers = [m for kind, who, m in out if kind == "ToClient" and who == 1]
    assert cancels == [("a", sent["id"])]
    assert [m["id"] for m in answers] == ["x"]
    assert answers[0]["error"]["data"]["reason"] == "unavailable"
    assert "did not answer before the aggregator stopped" in answers[0]["error"]["message"]
    assert router.handle(ServerMessage("a", msg(id=sent["id"], result={}))) == []  # a late answer is dropped


def test_a_client_is_idle_only_when_the_router_holds_nothing_of_it(router):
    """``client_idle``: what lets a stateless client stay connected between requests."""
    assert router.client_idle(1) and not router.client_idle(99)
    [(_, _, sent)] = unpack(router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "a__slow"}))))
    assert not router.client_idle(1)  # a request in flight
    router.handle(ServerMessage("a", msg(id=sent["id"], result={"content": []})))
    assert router.client_idle(1)
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(1, msg(id=2, method="resources/subscribe", params={"uri": "a+demo://r/1"})))
    )
    router.handle(ServerMessage("a", msg(id=sent["id"], result={})))
    assert not router.client_idle(1)  # a subscription
    router.handle(ClientMessage(1, msg(id=3, method="resources/unsubscribe", params={"uri": "a+demo://r/1"})))
    assert not router.client_idle(1)  # its unsubscribe is in flight
    for kind, _, message in unpack(
        router.handle(ClientMessage(1, msg(id=4, method="logging/setLevel", params={"level": "debug"})))
    ):
        if kind == "ToServer" and "id" in message:
            router.handle(ServerMessage("a", msg(id=message["id"], result={})))
    assert not router.client_idle(1)  # it set a log level the upstreams follow
