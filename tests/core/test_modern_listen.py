"""subscriptions/listen (``aggregator.core.era.modern_callers``, ``subscriptions.Listens``): the
acknowledgement first, the honoured subset, list changes and resource updates fanned in
from every upstream and tagged with the listen's id, refcounted upstream subscriptions,
cancel, disconnect and the graceful end at shutdown."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.core.events import (
    Abandoned,
    ClientConnected,
    ClientDisconnected,
    ClientMessage,
    ServerItems,
    ServerMessage,
    TimePassed,
)
from aggregator.mcp.modern import CLIENT_CAPABILITIES, PROTOCOL_VERSION, SERVER_INFO, SUBSCRIPTION_ID
from tests.core.helpers import connect, make_router, msg, own_asks, unpack

META = {PROTOCOL_VERSION: "2026-07-28", CLIENT_CAPABILITIES: {}}
ACK = "notifications/subscriptions/acknowledged"


def listen(router, key: int, id: Any, **notifications: Any) -> list[Any]:
    raw = msg(id=id, method="subscriptions/listen", params={"_meta": META, "notifications": notifications})
    return router.handle(ClientMessage(key, raw))


def to_clients(out):
    return [(session, m) for kind, session, m in unpack(out) if kind == "ToClient"]


@pytest.fixture
def router(clock):
    r = make_router(clock, debounce=0.05)
    clock.now += 1
    r.handle(TimePassed())  # what the setup's listings queued
    r.handle(ClientConnected(7))
    return r


def test_the_acknowledgement_comes_first_with_the_honoured_subset(router):
    out = listen(
        router,
        7,
        "L",
        toolsListChanged=True,
        promptsListChanged=True,  # no server has prompts: not honoured
        resourcesListChanged=False,
        resourceSubscriptions=["a+demo://r/1", "nope://x"],  # unknown: not honoured
    )
    first = out[0]
    assert (first.session, first.related) == (7, "L")
    assert first.message == {
        "jsonrpc": "2.0",
        "method": ACK,
        "params": {
            "_meta": {SUBSCRIPTION_ID: "L"},
            "notifications": {"toolsListChanged": True, "resourceSubscriptions": ["a+demo://r/1"]},
        },
    }
    # The resource is subscribed upstream, under its own URI; the listen gets no answer yet.
    assert [(a["method"], a["params"]) for a in own_asks(out)] == [("resources/subscribe", {"uri": "demo://r/1"})]
    assert len(out) == 2


def test_list_changes_from_every_upstream_reach_the_listen_tagged_and_debounced(router, clock):
    listen(router, 7, 5, toolsListChanged=True)
    listen(router, 7, 6, resourcesListChanged=True)
    assert router.handle(ServerItems("a", "tools", [{"name": "new"}])) == []
    router.handle(ServerItems("b", "tools", [{"name": "other"}]))
    router.handle(ServerItems("b", "resources", [{"uri": "demo://r/2"}]))
    clock.now += 0.05
    got = sorted(
        (m["method"], m["params"]["_meta"][SUBSCRIPTION_ID]) for _, m in to_clients(router.handle(TimePassed()))
    )
    assert got == [("notifications/resources/list_changed", 6), ("notifications/tools/list_changed", 5)]


def test_a_change_before_the_listen_opened_is_not_news(router, clock):
    router.handle(ServerItems("a", "tools", [{"name": "new"}]))
    listen(router, 7, 1, toolsListChanged=True)
    clock.now += 0.05
    assert to_clients(router.handle(TimePassed())) == []


def test_resource_updates_go_to_the_listens_that_hold_them_refcounted_upstream(router):
    connect(router, 1)  # a legacy session subscribed to the same resource
    out = unpack(
        router.handle(ClientMessage(1, msg(id=1, method="resources/subscribe", params={"uri": "a+demo://r/1"})))
    )
    [(_, _, subscribe)] = out
    router.handle(ServerMessage("a", msg(id=subscribe["id"], result={})))
    out = listen(router, 7, "x", resourceSubscriptions=["a+demo://r/1"])
    assert own_asks(out) == []  # already subscribed upstream
    listen(router, 7, "y", resourceSubscriptions=["a+demo://r/1", "b+demo://r/1"])
    listen(router, 7, "z", toolsListChanged=True)
    updated = msg(method="notifications/resources/updated", params={"uri": "demo://r/1"})
    got = sorted(
        (session, m["params"]["uri"], (m["params"].get("_meta") or {}).get(SUBSCRIPTION_ID))
        for session, m in to_clients(router.handle(ServerMessage("a", updated)))
    )
    assert got == [(1, "a+demo://r/1", None), (7, "a+demo://r/1", "x"), (7, "a+demo://r/1", "y")]
    # Listen y ends (cancelled): b's resource nobody else wants is unsubscribed upstream; a's stays.
    out = router.handle(ClientMessage(7, msg(method="notifications/cancelled", params={"requestId": "y"})))
    assert [(a["method"], a["params"]) for a in own_asks(out)] == [("resources/unsubscribe", {"uri": "demo://r/1"})]
    assert [c.server for c in out if type(c).__name__ == "ToServer"] == ["b"]
    assert unpack(out)[-1] == ("RequestEnded", 7, ("y",))
    got = [
        (s, (m["params"].get("_meta") or {}).get(SUBSCRIPTION_ID))
        for s, m in to_clients(router.handle(ServerMessage("a", updated)))
    ]
    assert sorted(got, key=str) == [(1, None), (7, "x")]


def test_a_listen_id_is_in_use_until_it_ends(router):
    listen(router, 7, 3, toolsListChanged=True)
    [(_, _, refused)] = unpack(listen(router, 7, 3, toolsListChanged=True))
    assert refused["error"]["code"] == -32600 and "in use" in refused["error"]["message"]
    assert not router.client_idle(7)  # an open listen holds its client
    router.handle(ClientMessage(7, msg(method="notifications/cancelled", params={"requestId": 3})))
    assert router.client_idle(7) and not router.listens


def test_the_client_leaving_ends_its_listens_and_their_subscriptions(router):
    listen(router, 7, 1, resourceSubscriptions=["a+demo://r/1"])
    out = router.handle(ClientDisconnected(7))
    assert [(a["method"], a["params"]) for a in own_asks(out)] == [("resources/unsubscribe", {"uri": "demo://r/1"})]
    assert to_clients(out) == [] and not router.listens


def test_shutdown_ends_each_listen_with_a_plain_result(router):
    listen(router, 7, 1, toolsListChanged=True)
    listen(router, 7, "two", resourceSubscriptions=["b+demo://r/1"])
    out = router.handle(Abandoned("shutting down"))
    answers = sorted(((m["id"], m["result"]["_meta"][SUBSCRIPTION_ID]) for _, m in to_clients(out)), key=str)
    assert answers == [("two", "two"), (1, 1)]
    assert all(m["result"]["resultType"] == "complete" for _, m in to_clients(out))
    assert all(m["result"]["_meta"][SERVER_INFO]["name"] == "aggregator" for _, m in to_clients(out))
    assert not router.listens


@pytest.mark.parametrize(
    "notifications",
    [
        None,
        [],
        {"resourceSubscriptions": "a+demo://r/1"},
        {"resourceSubscriptions": [1]},
        {"toolsListChanged": "yes"},
        {"resourcesListChanged": 1},
        {"promptsListChanged": {}},
    ],
)
def test_a_bad_filter_is_invalid_params(router, notifications):
    raw = msg(id=9, method="subscriptions/listen", params={"_meta": META, "notifications": notifications})
    [(_, _, refused)] = unpack(router.handle(ClientMessage(7, raw)))
    assert refused["error"]["code"] == -32602 and not router.listens
    if type(notifications) is dict:  # the message names the key that is wrong
        assert f"notifications.{next(iter(notifications))}" in refused["error"]["message"]


def test_a_filter_flag_given_as_null_means_not_wanted(router):
    [(_, ack)] = to_clients(listen(router, 7, "L", toolsListChanged=None, resourceSubscriptions=None))
    assert ack["method"] == ACK and ack["params"]["notifications"] == {}


def test_a_client_holds_at_most_max_in_flight_listens(clock):
    r = make_router(clock, max_in_flight=3)
    r.handle(ClientConnected(7))
    for id in range(3):
        assert to_clients(listen(r, 7, id, toolsListChanged=True))[0][1]["method"] == ACK
    [(_, _, refused)] = unpack(listen(r, 7, 3, toolsListChanged=True))
    assert refused["error"]["code"] == -32600 and "too many open listens" in refused["error"]["message"]
    r.handle(ClientMessage(7, msg(method="notifications/cancelled", params={"requestId": 0})))
    assert to_clients(listen(r, 7, 3, toolsListChanged=True))[0][1]["method"] == ACK
