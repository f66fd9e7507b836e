"""A client request on its way upstream (``aggregator.core.requests.forwarding``): a fresh id per
upstream, the proxy's own progress token, or a refusal that says why it was not sent."""

from __future__ import annotations

import pytest

from aggregator.core.events import ClientMessage, DrainingStarted, ServerCongested, ServerMessage
from tests.core.helpers import connect, make_router, msg, unpack


def call(router, id, name="a__slow", **params):
    return unpack(router.handle(ClientMessage(1, msg(id=id, method="tools/call", params={"name": name, **params}))))


def _draining(r):
    r.handle(DrainingStarted())


def _full(r):
    for id in range(4):
        call(r, f"f{id}")


def _congested(r):
    r.handle(ServerCongested("a", "its queue is full"))


# (what happens first, the reason of the refusal, a phrase of its message)
REFUSALS = [
    (_draining, "unavailable", "shutting down"),
    (_full, "overloaded", "Too many requests in flight (limit 4)"),
    (_congested, "overloaded", "its queue is full"),
]


@pytest.mark.parametrize(("before", "reason", "phrase"), REFUSALS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_a_request_that_cannot_be_sent_is_refused_with_why(clock, before, reason, phrase):
    r = make_router(clock, max_in_flight=4)
    connect(r, 1)
    before(r)
    [(kind, session, answer)] = call(r, "x")
    assert (kind, session, answer["id"]) == ("ToClient", 1, "x")
    assert answer["error"]["data"]["reason"] == reason and answer["error"]["data"]["source"] == "aggregator"
    assert phrase in answer["error"]["message"]
    assert not r.request_in_flight(1, "x")


def test_upstream_ids_are_fresh_per_upstream_whatever_the_client_ids(router):
    sent = [call(router, "same", "a__slow")[0], call(router, "other", "b__slow")[0]]
    sent += unpack(router.handle(ClientMessage(2, msg(id="same", method="tools/call", params={"name": "a__fast"}))))
    assert [(server, m["id"]) for _, server, m in sent] == [("a", 1), ("b", 1), ("a", 2)]


@pytest.mark.parametrize("token", [5, "t", 0])
def test_a_progress_token_goes_up_as_the_proxys_own(router, token):
    [(_, _, sent)] = call(router, 1, _meta={"progressToken": token})
    ours = sent["params"]["_meta"]["progressToken"]
    assert ours != token and ours.startswith("aggregator-progress-")
    [(kind, session, notice)] = unpack(
        router.handle(
            ServerMessage("a", msg(method="notifications/progress", params={"progressToken": ours, "progress": 1}))
        )
    )
    assert (kind, session, notice["params"]["progressToken"]) == ("ToClient", 1, token)


@pytest.mark.parametrize("token", [None, 1.5, [1], {"a": 1}])
def test_a_token_that_is_no_token_is_left_as_it_is(router, token):
    [(_, _, sent)] = call(router, 1, _meta={"progressToken": token})
    assert sent["params"]["_meta"] == {"progressToken": token}
