"""What the router counts of forwarded requests (``Tallies`` in ``aggregator.core.requests.request_table``):
each exit counted once, with its outcome and reason, and answered ones timed by the router's clock."""

from __future__ import annotations

import pytest

from aggregator.core.events import (
    Abandoned,
    ClientDisconnected,
    ClientMessage,
    DrainingStarted,
    ServerCongested,
    ServerDown,
    ServerItems,
    ServerListed,
    ServerLost,
    ServerMessage,
    ServerOverloaded,
    ServerReady,
    TimePassed,
)
from aggregator.core.requests.request_table import UPSTREAM_BUCKETS, Histogram
from tests.core.helpers import msg, unpack


def _send(router, id="c", name="a__slow"):
    [(_, _, sent)] = unpack(router.handle(ClientMessage(1, msg(id=id, method="tools/call", params={"name": name}))))
    return sent["id"]


def _answered(r, up):
    r.clock.now += 0.3
    return r.handle(ServerMessage("a", msg(id=up, result={"content": []})))


def _failed(r, up):
    r.clock.now += 0.3
    return r.handle(ServerMessage("a", msg(id=up, error={"code": -1, "message": "no"})))


def _cancelled(r, up):
    return r.handle(ClientMessage(1, msg(method="notifications/cancelled", params={"requestId": "c"})))


def _timed_out(r, up):
    r.clock.now += 5.01
    return r.handle(TimePassed())


def _client_gone(r, up):
    return r.handle(ClientDisconnected(1))


def _server_lost(r, up):
    return r.handle(ServerLost("a", "crashed"))


def _overloaded(r, up):
    return r.handle(ServerOverloaded("a", "reads nothing"))


def _abandoned(r, up):
    return r.handle(Abandoned("stopping"))


EXITS = [
    (_answered, ("ok", "")),
    (_failed, ("error", "server_error")),
    (_cancelled, ("cancelled", "cancelled")),
    (_timed_out, ("error", "timeout")),
    (_client_gone, ("cancelled", "disconnected")),
    (_server_lost, ("error", "unavailable")),
    (_overloaded, ("error", "overloaded")),
    (_abandoned, ("error", "unavailable")),
]


@pytest.mark.parametrize(("end", "counted"), EXITS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_every_exit_is_counted_once_with_its_outcome(router, end, counted):
    up = _send(router)
    assert router.tallies.requests == {}  # counted when it ends, not before
    end(router, up)
    outcome, reason = counted
    assert router.tallies.requests == {("tools/call", "a", outcome, reason): 1}
    router.handle(ServerMessage("a", msg(id=up, result={})))  # a late answer counts nothing more
    router.handle(TimePassed())
    assert router.tallies.requests == {("tools/call", "a", outcome, reason): 1}
    timed = router.tallies.upstream
    if outcome in ("ok",) or reason == "server_error":
        histogram = timed[("tools/call", "a")]
        assert sum(histogram.counts) == 1
        assert histogram.total == pytest.approx(0.3)
        assert histogram.counts[UPSTREAM_BUCKETS.index(0.5)] == 1  # 0.25 < 0.3 <= 0.5
    else:
        assert timed == {}  # only answered requests have an upstream duration


def test_counts_add_up_per_method_and_server(router):
    for n in range(3):
        router.handle(ServerMessage("a", msg(id=_send(router, id=n), result={})))
    router.handle(ServerMessage("b", msg(id=_send(router, id="x", name="b__fast"), result={})))
    assert router.tallies.requests == {("tools/call", "a", "ok", ""): 3, ("tools/call", "b", "ok", ""): 1}


def test_what_never_reached_a_server_is_not_a_forwarded_request(router):
    out = unpack(router.handle(ClientMessage(1, msg(id=9, method="tools/call", params={"name": "a__nope"}))))
    assert [m["error"]["code"] for kind, _, m in out if kind == "ToClient"] == [-32602]
    assert router.tallies.requests == {}


def test_histogram_buckets_hold_each_value_under_its_upper_bound():
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 1.0, 7.0):
        histogram.observe(value)
    assert histogram.counts == [2, 2, 1]  # an upper bound is inclusive, as in Prometheus ("le")
    assert histogram.total == pytest.approx(8.65)


def _draining(r):
    r.handle(DrainingStarted())


def _congested(r):
    r.handle(ServerCongested("a", "its queue is full"))


def _lost_for_long(r):
    r.handle(ServerLost("a", "crashed"))
    r.handle(ServerDown("a", "crashed", 600.0))  # back long after the call's own timeout: not held


@pytest.mark.parametrize(
    ("before", "reason"),
    [(_draining, "unavailable"), (_congested, "overloaded"), (_lost_for_long, "unavailable")],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_a_request_refused_before_sending_is_counted_with_its_reason(router, before, reason):
    before(router)
    out = unpack(router.handle(ClientMessage(1, msg(id="c", method="tools/call", params={"name": "a__slow"}))))
    assert [kind for kind, _, _ in out] == ["ToClient"]  # nothing was sent
    assert router.tallies.requests == {("tools/call", "a", "error", reason): 1}
    assert router.tallies.upstream == {}


def test_a_held_request_is_counted_once_when_it_is_finally_answered(router, clock):
    router.handle(ServerLost("a", "crashed"))
    router.handle(ServerDown("a", "crashed", 0.5))  # back soon: the call waits for it
    assert unpack(router.handle(ClientMessage(1, msg(id="c", method="tools/call", params={"name": "a__slow"})))) == []
    clock.now += 0.5
    router.handle(ServerReady("a", {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}))
    router.handle(ServerItems("a", "tools", [{"name": "slow"}]))
    out = unpack(router.handle(ServerListed("a")))
    [up] = [m["id"] for kind, _, m in out if kind == "ToServer" and m.get("method") == "tools/call"]
    assert router.tallies.requests == {}
    router.handle(ServerMessage("a", msg(id=up, result={"content": []})))
    assert router.tallies.requests == {("tools/call", "a", "ok", ""): 1}
