"""The in-flight tables (``aggregator.core.handlers.inflight``): every way a request can end takes
it out of every table (invariant 2), and the client hears of the ones it did not answer."""

from __future__ import annotations

import pytest

from aggregator.core.events import (
    Abandoned,
    ClientDisconnected,
    ClientMessage,
    ServerLost,
    ServerMessage,
    ServerOverloaded,
    TimePassed,
)
from tests.core.helpers import msg, unpack


def _answered(r, up):
    return r.handle(ServerMessage("a", msg(id=up, result={"content": []})))


def _failed(r, up):
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


# (how it ends, what the client gets: a result, an error reason, or nothing; whether the server is told to stop)
EXITS = [
    (_answered, "result", False),
    (_failed, "error", False),
    (_cancelled, None, True),
    (_timed_out, "timeout", True),
    (_client_gone, None, True),
    (_server_lost, "unavailable", False),
    (_overloaded, "overloaded", False),
    (_abandoned, "unavailable", True),
]


@pytest.mark.parametrize(("end", "client_gets", "server_told"), EXITS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_every_exit_empties_every_table(router, end, client_gets, server_told):
    [(_, _, sent)] = unpack(
        router.handle(
            ClientMessage(
                1, msg(id="c", method="tools/call", params={"name": "a__slow", "_meta": {"progressToken": "t"}})
            )
        )
    )
    assert router.in_flight() == 1 and router.request_in_flight(1, "c") and router.requests.progress
    out = unpack(end(router, sent["id"]))
    assert router.in_flight() == 0 and not router.request_in_flight(1, "c")
    assert router.requests.progress == {} and router.links["a"].pending == {}
    to_client = [m for kind, who, m in out if kind == "ToClient" and who == 1 and "id" in m]
    if client_gets is None:
        assert to_client == []
    elif client_gets == "result":
        assert [m["result"] for m in to_client] == [{"content": []}]
    else:
        assert [m["id"] for m in to_client] == ["c"]
        assert to_client[0]["error"].get("data", {}).get("reason", "error") == client_gets
    cancels = [m for kind, who, m in out if kind == "ToServer" and m.get("method") == "notifications/cancelled"]
    assert bool(cancels) is server_told
    assert router.handle(TimePassed()) == []  # nothing left to time out
    assert router.handle(ServerMessage("a", msg(id=sent["id"], result={}))) == []  # a late answer is dropped


def test_next_deadline_is_the_earliest_request(router):
    assert router.next_deadline() is None
    router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "a__slow"})))
    assert router.next_deadline() == router.clock.now + 5.0


def test_tasks_list_gathers_from_every_server_and_answers_once(router):
    out = unpack(router.handle(ClientMessage(1, msg(id="l", method="tasks/list"))))
    assert sorted(server for _, server, _ in out) == ["a", "b"]
    first, second = out
    assert router.handle(ServerMessage(first[1], msg(id=first[2]["id"], result={"tasks": []}))) == []
    [(kind, session, answer)] = unpack(
        router.handle(ServerMessage(second[1], msg(id=second[2]["id"], result={"tasks": []})))
    )
    assert (kind, session, answer) == ("ToClient", 1, {"jsonrpc": "2.0", "id": "l", "result": {"tasks": []}})
