"""The handlers of client requests (``aggregator.core.handlers.client_requests``): one per method,
each either answered from the proxy's own state or forwarded to the server it names."""

from __future__ import annotations

import pytest

from aggregator.core.events import ClientMessage, ServerMessage, ServerOversized
from aggregator.mcp.constants import LIST_METHODS
from tests.core.helpers import msg, unpack

# Methods the proxy answers itself: (method, params, the result)
ANSWERED = [
    ("ping", None, {}),
    ("tools/list", {}, {"tools": [{"name": "a__slow"}, {"name": "a__fast"}, {"name": "b__slow"}, {"name": "b__fast"}]}),
    ("resources/list", {}, {"resources": [{"uri": "a+demo://r/1"}, {"uri": "b+demo://r/1"}]}),
    ("prompts/list", {}, {"prompts": []}),
    ("resources/templates/list", {}, {"resourceTemplates": []}),
    ("logging/setLevel", {"level": "info"}, {}),
]

# Methods forwarded: (method, params, the server, the params it gets)
FORWARDED = [
    ("tools/call", {"name": "a__slow", "arguments": {}}, "a", {"name": "slow", "arguments": {}}),
    ("tools/call", {"name": "a__slow"}, "a", {"name": "slow"}),
    ("tools/call", {"name": "a__slow", "arguments": None}, "a", {"name": "slow", "arguments": None}),
    ("resources/read", {"uri": "b+demo://r/1"}, "b", {"uri": "demo://r/1"}),
    ("resources/subscribe", {"uri": "a+demo://r/1"}, "a", {"uri": "demo://r/1"}),
]

# Refused with -32602 before anything is sent: (method, params, a phrase of the message)
INVALID = [
    ("tools/call", {"name": "zzz"}, "Unknown tool: zzz"),
    ("tools/call", {"name": "a__slow", "arguments": [1, 2]}, "arguments must be an object"),
    ("tools/call", {"name": "a__slow", "arguments": "x=1"}, "arguments must be an object"),
    ("prompts/get", {"name": 3}, "prompt name must be a string"),
    ("resources/read", {"uri": "q+demo://r/2"}, "Unknown resource"),
    ("completion/complete", {"ref": {"type": "ref/x"}}, "ref must be ref/prompt or ref/resource"),
    ("tasks/get", {"taskId": "a/none"}, "Unknown task"),
    ("tasks/result", {}, "Unknown task"),
]


def test_every_method_has_one_handler(router):
    assert set(LIST_METHODS) <= set(router.client_requests.handlers)
    assert {"initialize", "ping", "tools/call", "prompts/get", "completion/complete", "tasks/list"} <= set(
        router.client_requests.handlers
    )


@pytest.mark.parametrize(("method", "params", "result"), ANSWERED)
def test_what_the_proxy_answers_itself(router, method, params, result):
    fields = {"params": params} if params is not None else {}
    out = unpack(router.handle(ClientMessage(1, msg(id="q", method=method, **fields))))
    assert out[0] == ("ToClient", 1, {"jsonrpc": "2.0", "id": "q", "result": result})


@pytest.mark.parametrize(("method", "params", "server", "sent"), FORWARDED)
def test_what_goes_to_the_server_it_names(router, method, params, server, sent):
    [(kind, to, message)] = unpack(router.handle(ClientMessage(1, msg(id="q", method=method, params=params))))
    assert (kind, to, message["method"], message["params"]) == ("ToServer", server, method, sent)


@pytest.mark.parametrize(("method", "params", "phrase"), INVALID)
def test_what_names_nothing_is_refused_before_anything_is_sent(router, method, params, phrase):
    [(kind, to, message)] = unpack(router.handle(ClientMessage(1, msg(id="q", method=method, params=params))))
    assert (kind, to, message["error"]["code"]) == ("ToClient", 1, -32602)
    assert phrase in message["error"]["message"]


def test_a_second_subscription_to_one_resource_is_answered_by_the_proxy(router):
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(1, msg(id=1, method="resources/subscribe", params={"uri": "a+demo://r/1"})))
    )
    router.handle(ServerMessage("a", msg(id=sent["id"], result={})))
    out = unpack(
        router.handle(ClientMessage(2, msg(id=1, method="resources/subscribe", params={"uri": "a+demo://r/1"})))
    )
    assert out == [("ToClient", 2, {"jsonrpc": "2.0", "id": 1, "result": {}})]
    assert unpack(
        router.handle(ClientMessage(2, msg(id=2, method="resources/unsubscribe", params={"uri": "a+demo://r/1"})))
    ) == [("ToClient", 2, {"jsonrpc": "2.0", "id": 2, "result": {}})]


def test_a_task_is_only_its_sessions(router):
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "a__slow", "task": {}})))
    )
    [(_, _, answer)] = unpack(router.handle(ServerMessage("a", msg(id=sent["id"], result={"task": {"taskId": "t1"}}))))
    task_id = answer["result"]["task"]["taskId"]
    [(kind, server, _)] = unpack(
        router.handle(ClientMessage(1, msg(id=2, method="tasks/get", params={"taskId": task_id})))
    )
    assert (kind, server) == ("ToServer", "a")
    [(kind, _, refused)] = unpack(
        router.handle(ClientMessage(2, msg(id=2, method="tasks/get", params={"taskId": task_id})))
    )
    assert refused["error"]["code"] == -32602


@pytest.mark.parametrize("fails", ["error answer", "oversized answer", "unreadable answer"])
def test_a_subscription_whose_answer_fails_is_undone(router, fails):
    """However the server's answer to resources/subscribe fails, the subscription is not
    counted: the next subscribe to that URI goes to the server again."""
    subscribe = msg(id=1, method="resources/subscribe", params={"uri": "a+demo://r/1"})
    [(_, _, sent)] = unpack(router.handle(ClientMessage(1, subscribe)))
    head = b'{"jsonrpc":"2.0","id":' + str(sent["id"]).encode() + b',"result":'
    if fails == "error answer":
        out = router.handle(ServerMessage("a", msg(id=sent["id"], error={"code": -32603, "message": "no"})))
    elif fails == "oversized answer":
        out = router.handle(ServerOversized("a", head + b'{"x":"xxxx', 1000))
    else:
        out = router.handle(ServerMessage("a", head + b'{"x":NaN}}'))
    [(kind, to, answer)] = unpack(out)
    assert (kind, to) == ("ToClient", 1) and "error" in answer
    [(kind, server, again)] = unpack(
        router.handle(ClientMessage(1, msg(id=2, method="resources/subscribe", params={"uri": "a+demo://r/1"})))
    )
    assert (kind, server, again["method"]) == ("ToServer", "a", "resources/subscribe")
