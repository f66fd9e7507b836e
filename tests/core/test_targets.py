"""What a client request names (``aggregator.core.catalogs.targets``): one ``Targets.resolve`` serves
the request handlers and ``describe``, so what ``describe`` tells a plugin is where the
request goes, and what it cannot tell is refused with -32602 before anything is sent."""

from __future__ import annotations

import pytest

from aggregator.core.catalogs.targets import ServerDown
from aggregator.core.events import ClientMessage, ServerItems, ServerListed, ServerLost, ServerReady
from tests.core.helpers import connect, make_router, msg, unpack

PROMPT_CAPS = {"prompts": {}, "completions": {}, "resources": {}}

# (method, params, where it goes: (server, its own name or URI, the exposed one), or None)
CASES = [
    ("tools/call", {"name": "a__slow"}, ("a", "slow", "a__slow")),
    ("tools/call", {"name": "b__fast"}, ("b", "fast", "b__fast")),
    ("tools/call", {"name": "slow"}, None),
    ("tools/call", {"name": 7}, None),
    ("tools/call", {}, None),
    ("prompts/get", {"name": "a__greet"}, ("a", "greet", "a__greet")),
    ("prompts/get", {"name": "a__slow"}, None),
    ("resources/read", {"uri": "a+demo://r/1"}, ("a", "demo://r/1", "a+demo://r/1")),
    ("resources/read", {"uri": "A+DEMO://r/1"}, ("a", "demo://r/1", "A+DEMO://r/1")),
    ("resources/read", {"uri": "c+demo://r/1"}, None),
    ("resources/read", {"uri": 5}, None),
    ("resources/subscribe", {"uri": "b+demo://r/1"}, ("b", "demo://r/1", "b+demo://r/1")),
    ("completion/complete", {"ref": {"type": "ref/prompt", "name": "a__greet"}}, ("a", "greet", "a__greet")),
    ("completion/complete", {"ref": {"type": "ref/prompt", "name": "nope"}}, None),
    (
        "completion/complete",
        {"ref": {"type": "ref/resource", "uri": "a+file:///{path}"}},
        ("a", "file:///{path}", "a+file:///{path}"),
    ),
    ("completion/complete", {"ref": {"type": "ref/resource", "uri": "z+file:///{path}"}}, None),
    ("completion/complete", {"ref": {"type": "ref/other"}}, None),
    ("completion/complete", {"ref": "a__greet"}, None),
]


@pytest.fixture
def router(clock):
    r = make_router(clock)
    r.handle(ServerReady("a", {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}, **PROMPT_CAPS}}))
    r.handle(ServerItems("a", "prompts", [{"name": "greet"}]))
    r.handle(ServerItems("a", "resourceTemplates", [{"uriTemplate": "file:///{path}"}]))
    connect(r, 1)
    return r


def _params(method, params):
    if method == "completion/complete":
        return {**params, "argument": {"name": "x", "value": ""}}
    return params


@pytest.mark.parametrize(("method", "params", "target"), CASES, ids=lambda v: str(v)[:40])
def test_describe_tells_where_the_request_goes(router, method, params, target):
    message = {"jsonrpc": "2.0", "id": 9, "method": method, "params": _params(method, params)}
    assert router.describe(1, message) == target
    out = unpack(router.handle(ClientMessage(1, msg(id=9, method=method, params=_params(method, params)))))
    if target is None:
        [(kind, session, answer)] = out
        assert (kind, session, answer["error"]["code"]) == ("ToClient", 1, -32602)
    else:
        [(kind, server, sent)] = out
        assert (kind, server, sent["method"]) == ("ToServer", target[0], method)
        sent_params = sent["params"]
        own = sent_params["ref"] if method == "completion/complete" else sent_params
        assert target[1] in (own.get("name"), own.get("uri"))


@pytest.mark.parametrize(
    "message",
    [
        {"method": "tools/call", "params": "a__slow"},
        {"method": "tools/list", "params": {}},
        {"method": "resources/unsubscribe", "params": {"uri": "a+demo://r/1"}},
    ],
)
def test_describe_tells_nothing_of_what_names_no_target(router, message):
    assert router.describe(1, {"jsonrpc": "2.0", "id": 1, **message}) is None


def test_describe_of_an_unknown_session_is_none(router):
    assert (
        router.describe(99, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "a__slow"}}) is None
    )


@pytest.mark.parametrize(
    ("method", "params", "server_out"),
    [
        ("tools/call", {"name": "a__slow"}, True),
        ("resources/read", {"uri": "a+demo://r/1"}, True),
        ("tools/call", {"name": "b__slow"}, False),
    ],
)
def test_a_target_of_a_server_between_starts_is_known_and_out(router, method, params, server_out):
    router.handle(ServerListed("a"))
    router.handle(ServerLost("a", "crashed"))
    if server_out:
        with pytest.raises(ServerDown) as down:
            router.targets.resolve(router.clients[1], method, params)
        route = down.value.route
    else:
        route = router.targets.resolve(router.clients[1], method, params)
    assert route.server == ("a" if server_out else "b")
    assert router.describe(1, {"jsonrpc": "2.0", "id": 1, "method": method, "params": params})[0] == route.server
