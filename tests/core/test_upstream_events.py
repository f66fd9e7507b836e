"""What happens to an upstream (``aggregator.core.handlers.upstream_events``): ready, listed,
overloaded, lost, down between starts; and the requests held for it meanwhile."""

from __future__ import annotations

import pytest

from aggregator.core.events import (
    ClientMessage,
    ServerDown,
    ServerItems,
    ServerListed,
    ServerListing,
    ServerLost,
    ServerMessage,
    ServerOverloaded,
    ServerReady,
    TimePassed,
)
from tests.core.helpers import msg, unpack


def call(router, id, name="a__slow", key=1):
    return unpack(router.handle(ClientMessage(key, msg(id=id, method="tools/call", params={"name": name}))))


def listed_again(router, name="a"):
    router.handle(ServerReady(name, {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}))
    router.handle(ServerItems(name, "tools", [{"name": "slow"}, {"name": "fast"}]))
    return router.handle(ServerListed(name))


# (event on a while a request is in flight, the reason the client gets, whether a's tools go)
EVENTS = [
    (lambda r: r.handle(ServerLost("a", "crashed")), "unavailable", True),
    (lambda r: r.handle(ServerOverloaded("a", "reads nothing")), "overloaded", False),
]


@pytest.mark.parametrize(("event", "reason", "tools_go"), EVENTS)
def test_requests_in_flight_fail_at_once_with_why(router, event, reason, tools_go):
    call(router, "x")
    out = unpack(event(router))
    [answer] = [m for kind, who, m in out if kind == "ToClient" and m.get("id") == "x"]
    assert answer["error"]["data"] == {"source": "aggregator", "reason": reason, "server": "a"}
    names = [t["name"] for t in router.profile_catalog("default").exposed["tools"]]
    assert ("a__slow" not in names) is tools_go


def test_a_lost_server_is_announced_and_its_names_wait_for_it(router):
    router.handle(ServerListed("a"))
    out = unpack(router.handle(ServerLost("a", "crashed")))
    assert sorted({(who, m["method"]) for kind, who, m in out if kind == "ToClient"}) == [
        (1, "notifications/resources/list_changed"),
        (1, "notifications/tools/list_changed"),
        (2, "notifications/resources/list_changed"),
        (2, "notifications/tools/list_changed"),
    ]
    assert call(router, "held") == []  # a restart is coming: held, not unknown
    assert router.request_in_flight(1, "held")
    [(kind, server, sent)] = unpack(listed_again(router))
    assert (kind, server, sent["params"]["name"]) == ("ToServer", "a", "slow")


@pytest.mark.parametrize(("retry_in", "held"), [(0.5, True), (1000.0, False)])
def test_a_request_for_a_server_that_is_down_waits_only_if_it_will_be_back_in_time(router, retry_in, held):
    router.handle(ServerListed("a"))
    router.handle(ServerLost("a", "crashed"))
    router.handle(ServerDown("a", "crashed", retry_in))
    out = call(router, "q")
    if held:
        assert out == [] and router.request_in_flight(1, "q")
    else:
        [(kind, _, answer)] = out
        data = answer["error"]["data"]
        assert (data["reason"], data["state"], data["retryAfter"]) == ("unavailable", "restarting", retry_in)


def test_a_held_request_times_out_with_its_own_timeout(router):
    router.handle(ServerListed("a"))
    router.handle(ServerLost("a", "crashed"))
    router.handle(ServerDown("a", "crashed", 0.5))
    assert call(router, "w") == []
    router.clock.now += 5.01
    [(kind, who, answer)] = unpack(router.handle(TimePassed()))
    assert (kind, who, answer["id"]) == ("ToClient", 1, "w") and "5 s" in answer["error"]["message"]
    assert not router.request_in_flight(1, "w")


def test_ready_again_renews_the_subscriptions_clients_made(router):
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(1, msg(id=1, method="resources/subscribe", params={"uri": "a+demo://r/1"})))
    )
    router.handle(ServerMessage("a", msg(id=sent["id"], result={})))
    router.handle(ServerLost("a", "crashed"))
    out = unpack(router.handle(ServerReady("a", {"capabilities": {"resources": {"subscribe": True}, "logging": {}}})))
    assert [(server, m["method"], m["params"]) for _, server, m in out] == [
        ("a", "resources/subscribe", {"uri": "demo://r/1"})
    ]


def test_events_of_an_unknown_server_change_nothing(router):
    assert router.handle(ServerLost("zz", "gone")) == []
    assert router.handle(ServerItems("zz", "tools", [{"name": "t"}])) == []
    assert router.handle(ServerListing("zz", {"tools": []})) == []
    assert router.handle(ServerDown("zz", "gone", 1.0)) == []
    assert router.handle(ServerOverloaded("zz", "why")) == []
    assert router.handle(ServerMessage("zz", msg(id=1, result={}))) == []
