"""What an upstream sends (``aggregator.core.handlers.server_messages``): responses to the client of
their request, answers to the proxy's own requests to its table, and notifications by a
method table."""

from __future__ import annotations

import pytest

from aggregator.core.events import ClientMessage, ServerMessage
from aggregator.mcp.constants import LIST_CHANGED
from tests.core.helpers import lifecycle_serves, msg, own_asks, unpack


def test_the_table_has_a_handler_for_each_list_change(router):
    assert set(LIST_CHANGED.values()) <= set(router.server_messages._notifications)


# (notification from a, what its lifecycle asks a for: one kind at a time)
LIST_CHANGES = [
    ("notifications/tools/list_changed", ["tools/list"]),
    ("notifications/prompts/list_changed", ["prompts/list"]),
    ("notifications/resources/list_changed", ["resources/list"]),
    ("notifications/unknown", []),
    ("notifications/initialized", []),
]


@pytest.mark.parametrize(("method", "asked"), LIST_CHANGES)
def test_a_list_change_relists_what_changed(router, method, asked):
    lifecycle_serves(router, "a", {"tools": {}, "prompts": {}, "resources": {}})
    assert [m["method"] for m in own_asks(router.handle(ServerMessage("a", msg(method=method))))] == asked


def test_a_list_change_between_connections_asks_nothing(router):
    """No lifecycle (the next connection lists every kind anyway)."""
    assert router.handle(ServerMessage("a", msg(method="notifications/tools/list_changed"))) == []


# Notifications that name nothing the proxy has in flight are dropped.
@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("notifications/progress", {"progressToken": "aggregator-progress-99", "progress": 1}),
        ("notifications/progress", {"progressToken": 1}),
        ("notifications/resources/updated", {"uri": "demo://r/1"}),
        ("notifications/cancelled", {"requestId": 5}),
        ("notifications/elicitation/complete", {"elicitationId": "e"}),
        ("notifications/tasks/status", {"taskId": "t", "status": "working"}),
        ("notifications/progress", None),
    ],
)
def test_a_notification_that_names_nothing_in_flight_is_dropped(router, method, params):
    fields = {"params": params} if params is not None else {}
    assert router.handle(ServerMessage("a", msg(method=method, **fields))) == []


def test_progress_of_another_server_is_not_its_to_report(router):
    [(_, _, sent)] = unpack(
        router.handle(
            ClientMessage(1, msg(id=1, method="tools/call", params={"name": "a__slow", "_meta": {"progressToken": 1}}))
        )
    )
    token = sent["params"]["_meta"]["progressToken"]
    assert (
        router.handle(ServerMessage("b", msg(method="notifications/progress", params={"progressToken": token}))) == []
    )
    [(kind, session, notice)] = unpack(
        router.handle(ServerMessage("a", msg(method="notifications/progress", params={"progressToken": token})))
    )
    assert (kind, session, notice["params"]["progressToken"]) == ("ToClient", 1, 1)


def test_an_update_goes_to_the_subscribers_under_the_exposed_uri(router):
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(2, msg(id=1, method="resources/subscribe", params={"uri": "a+demo://r/1"})))
    )
    router.handle(ServerMessage("a", msg(id=sent["id"], result={})))
    out = unpack(
        router.handle(ServerMessage("a", msg(method="notifications/resources/updated", params={"uri": "demo://r/1"})))
    )
    assert out == [
        (
            "ToClient",
            2,
            {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "a+demo://r/1"}},
        )
    ]


# What a sends that answers no request of a client nor of the proxy's own: dropped.
RESPONSES = [
    {"id": "aggregator-3", "result": {}},
    {"id": 999, "result": {}},
    {"id": "other", "result": {}},
    {"id": None, "error": {"code": -1, "message": "x"}},
]


@pytest.mark.parametrize("response", RESPONSES)
def test_a_response_to_no_request_of_a_client(router, response):
    assert router.handle(ServerMessage("a", msg(**response))) == []


def test_a_response_goes_back_under_the_clients_id(router):
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(2, msg(id="mine", method="tools/call", params={"name": "b__fast"})))
    )
    out = unpack(router.handle(ServerMessage("b", msg(id=sent["id"], result={"content": []}))))
    assert out == [("ToClient", 2, {"jsonrpc": "2.0", "id": "mine", "result": {"content": []}})]


def test_an_unreadable_answer_fails_its_request_at_once(router):
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(1, msg(id="r", method="tools/call", params={"name": "a__slow"})))
    )
    raw = b'{"jsonrpc":"2.0","id":' + str(sent["id"]).encode() + b',"result":' + b"[" * 200 + b"]" * 200 + b"}"
    [(kind, session, answer)] = unpack(router.handle(ServerMessage("a", raw)))
    assert (kind, session, answer["id"]) == ("ToClient", 1, "r")
    assert answer["error"]["data"]["reason"] in ("too_large", "malformed")
    assert router.in_flight() == 0
