"""Deep and odd JSON from either side, through the router: every refusal answers exactly
the party that waits for it, and nothing deeper than the limit ever gets past decoding."""

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from aggregator.core.events import ClientMessage, ServerMessage, UpstreamConnected
from aggregator.core.router import ToClient, ToServer
from aggregator.jsonrpc import dumps, loads
from tests.core.helpers import JSON_DEPTH_LIMIT as LIMIT
from tests.core.helpers import make_depth_limited_router, msg, still_serves, unpack


def deep(levels: int, leaf="x"):
    """A value ``levels`` containers deep, alternating arrays and objects."""
    value = leaf
    for level in range(levels):
        value = [value] if level % 2 else {"k": value}
    return value


@pytest.fixture
def router():
    return make_depth_limited_router()


# The envelope is level 1, params 2, what params holds 3: these go one level past the limit.
@pytest.mark.parametrize(
    "params",
    [
        {"name": "a__echo", "arguments": deep(LIMIT - 1)},
        {"name": "a__echo", "arguments": {}, "_meta": deep(LIMIT - 1)},
        {"name": "a__echo", "arguments": {"doc": deep(LIMIT - 2)}},
    ],
)
def test_a_deep_client_request_gets_its_error_and_reaches_no_server(router, params):
    out = unpack(router.handle(ClientMessage(1, msg(id=41, method="tools/call", params=params))))
    [(kind, session, error)] = out
    assert (kind, session, error["id"], error["error"]["code"]) == ("ToClient", 1, 41, -32600)
    assert error["error"]["data"] == {"source": "aggregator", "reason": "too_large", "max_depth": LIMIT}
    assert router.clients[1].in_flight == {}
    still_serves(router)


def test_at_the_limit_a_request_is_forwarded_whole(router):
    arguments = deep(LIMIT - 3)  # envelope, params, arguments object
    [(kind, server, sent)] = unpack(
        router.handle(
            ClientMessage(
                1, msg(id=1, method="tools/call", params={"name": "a__echo", "arguments": {"doc": arguments}})
            )
        )
    )
    assert (kind, server, sent["params"]["arguments"]) == ("ToServer", "a", {"doc": arguments})


def test_a_deep_cancel_is_dropped_without_an_answer(router):
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(1, msg(id=5, method="tools/call", params={"name": "a__echo", "arguments": {}})))
    )
    assert (
        router.handle(
            ClientMessage(1, msg(method="notifications/cancelled", params={"requestId": 5, "reason": deep(LIMIT)}))
        )
        == []
    )
    # The request is still in flight and is answered normally.
    [(_, _, answer)] = unpack(router.handle(ServerMessage("a", msg(id=sent["id"], result={}))))
    assert answer["id"] == 5 and "result" in answer


def test_a_deep_answer_to_a_server_request_fails_that_request_upstream(router):
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(1, msg(id=5, method="tools/call", params={"name": "a__echo", "arguments": {}})))
    )
    [(kind, session, asked)] = unpack(
        router.handle(
            ServerMessage("a", msg(id=77, method="sampling/createMessage", params={"messages": [], "maxTokens": 5}))
        )
    )
    assert (kind, session) == ("ToClient", 1)
    out = unpack(router.handle(ClientMessage(1, msg(id=asked["id"], result={"content": deep(LIMIT)}))))
    [(kind, server, error)] = out  # the client hears nothing: it sent a response
    assert (kind, server, error["id"]) == ("ToServer", "a", 77)
    assert error["error"]["data"]["reason"] == "too_large" and "sampling/createMessage" in error["error"]["message"]
    assert router.reverse.requests == {} and router.reverse.ids == {}
    [(_, _, answer)] = unpack(router.handle(ServerMessage("a", msg(id=sent["id"], result={}))))
    assert answer["id"] == 5


@pytest.mark.parametrize(
    "raw_result",
    [
        lambda: dumps({"content": deep(LIMIT)}),
        lambda: b'{"n":NaN}',
        lambda: b'{"s":"\\ud800"}',
        lambda: b'{"s":"\xff"}',
    ],
)
def test_an_unreadable_server_answer_fails_its_request_at_once_and_the_server_stays(router, raw_result):
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(1, msg(id="q", method="tools/call", params={"name": "a__echo", "arguments": {}})))
    )
    raw = b'{"jsonrpc":"2.0","id":' + str(sent["id"]).encode() + b',"result":' + raw_result() + b"}"
    [(kind, session, error)] = unpack(router.handle(ServerMessage("a", raw)))
    assert (kind, session, error["id"]) == ("ToClient", 1, "q")
    data = error["error"]["data"]
    assert data["source"] == "aggregator" and data["server"] == "a"
    assert data["reason"] in ("too_large", "malformed") and "tools/call" in error["error"]["message"]
    assert router.links["a"].ready and router.links["a"].pending == {}
    still_serves(router)


def test_the_answer_to_the_proxys_own_request_fails_it_too(router):
    """A listing page too deep to read fails that listing, which fails the start."""
    out = router.handle(UpstreamConnected("a", target="x", init_timeout=5.0))
    [probe] = [c.message for c in out if type(c).__name__ == "ToServer"]
    assert probe["method"] == "server/discover"  # a legacy server does not know it
    out = router.handle(ServerMessage("a", msg(id=probe["id"], error={"code": -32601, "message": "Method not found"})))
    [init] = [c.message for c in out if type(c).__name__ == "ToServer"]
    init_result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "a"}}
    out = router.handle(ServerMessage("a", msg(id=init["id"], result=init_result)))
    [ask] = [c.message for c in out if type(c).__name__ == "ToServer" and c.message.get("id")]
    assert ask["method"] == "tools/list"
    [(kind, server, reason)] = [
        (type(c).__name__, c.server, c.reason)
        for c in router.handle(ServerMessage("a", msg(id=ask["id"], result={"tools": deep(LIMIT)})))
    ]
    assert (kind, server) == ("DropUpstream", "a") and "tools/list failed" in reason and "-32600" in reason


def test_deep_server_notifications_are_dropped_and_deep_requests_refused(router):
    assert (
        router.handle(
            ServerMessage("a", msg(method="notifications/message", params={"level": "info", "data": deep(LIMIT)}))
        )
        == []
    )
    [(kind, server, error)] = unpack(
        router.handle(ServerMessage("a", msg(id=9, method="sampling/createMessage", params={"messages": deep(LIMIT)})))
    )
    assert (kind, server, error["id"], error["error"]["code"]) == ("ToServer", "a", 9, -32600)


# --- fuzz: random nesting on both sides of the limit ----------------------------------------

leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5)
)
trees = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=12,
)


@st.composite
def client_messages(draw):
    """A message shape and how deep its payload goes: sometimes well within the limit,
    sometimes just past it, sometimes past orjson's own 1024. The deep value itself is
    built by the test (hypothesis would recurse printing it)."""
    levels = draw(st.one_of(st.integers(0, LIMIT + 4), st.sampled_from([LIMIT - 3, LIMIT - 2, 1100])))
    pattern = draw(st.lists(st.booleans(), min_size=1, max_size=6))  # arrays or objects, cycled
    shape = draw(st.sampled_from(["call", "ping", "cancel", "answer", "unknown", "meta"]))
    id = draw(st.one_of(st.integers(-5, 10**6), st.text(max_size=4)))
    return shape, id, levels, pattern, draw(trees)


def build(shape, id, levels, pattern, tree):
    payload = tree
    for level in range(levels):
        payload = [payload] if pattern[level % len(pattern)] else {"k": payload}
    if shape == "call":
        return {
            "jsonrpc": "2.0",
            "id": id,
            "method": "tools/call",
            "params": {"name": ["a__echo", "b__echo", "nope"][levels % 3], "arguments": payload},
        }
    if shape == "ping":
        return {"jsonrpc": "2.0", "id": id, "method": "ping", "params": {"x": payload}}
    if shape == "meta":
        return {"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {"_meta": payload}}
    if shape == "cancel":
        return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": id, "reason": payload}}
    if shape == "answer":
        return {"jsonrpc": "2.0", "id": id, "result": {"content": payload}}
    return {"jsonrpc": "2.0", "method": "notifications/whatever", "params": {"x": payload}}


def depth_of(raw: bytes) -> int:
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        char = chr(byte)
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(drawn=client_messages(), server_echoes=st.booleans())
def test_fuzz_deep_messages_one_answer_per_readable_request_none_to_notifications(router, drawn, server_echoes):
    message = build(*drawn)
    raw = dumps(message)
    depth = depth_of(raw)
    too_deep = depth > LIMIT
    event("past orjson's limit" if depth > 1024 else "too deep" if too_deep else "within the limit")
    out = router.handle(ClientMessage(1, raw))  # must not raise
    # Everything the router emits can be written and read back.
    written = [(c, loads(c.message if type(c.message) is bytes else dumps(c.message))) for c in out]
    answers = [message for c, message in written if type(c) is ToClient]
    upstream_requests = [c for c, message in written if type(c) is ToServer and "method" in message and "id" in message]
    if "method" not in message or "id" not in message:
        assert answers == [] and upstream_requests == []  # notifications and responses: never answered
        return
    if too_deep:
        assert upstream_requests == []
        [answer] = answers
        # Past orjson's 1024 the id is read only if the stdlib parser gets that far.
        assert answer["id"] == message["id"] or (depth > 1024 and answer["id"] is None)
        assert answer["error"]["code"] == -32600
        return
    assert len(answers) + len(upstream_requests) == 1
    if answers:
        assert answers[0]["id"] == message["id"]
        return
    # Forwarded: the server answers (echoing the payload, or too deep to forward back).
    sent = upstream_requests[0].message
    result = {"echo": sent["params"]["arguments"]} if server_echoes else {"echo": deep(LIMIT)}
    back = router.handle(ServerMessage(upstream_requests[0].server, msg(id=sent["id"], result=result)))
    [(kind, session, answer)] = unpack(back)
    assert (kind, session, answer["id"]) == ("ToClient", 1, message["id"])
    assert ("result" in answer) is server_echoes


# --- exact numbers reach plugins as Decimals, and the shipped plugins cope ----------------


def test_the_shipped_plugins_handle_exact_numbers(tmp_path):
    from aggregator.jsonrpc import JsonNumber, decode_message
    from aggregator.plugins.api import Deny, Request
    from aggregator.plugins.bundled.example import ExamplePlugin
    from aggregator.plugins.bundled.pinning import PinDefinitions

    _, listing = decode_message(
        b'{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"t","inputSchema":'
        b'{"type":"number","maximum":1.0E7,"default":1.50}}]}}'
    )
    tools = listing["result"]["tools"]
    assert type(tools[0]["inputSchema"]["maximum"]) is JsonNumber
    pins = tmp_path / "pins.json"
    first = PinDefinitions(str(pins))
    assert first.catalog("default", "tools", tools) == tools
    first.after_catalog()  # written outside the core
    assert PinDefinitions(str(pins)).catalog("default", "tools", tools) == tools  # read back: same digest
    changed = [dict(tools[0], inputSchema={"type": "number", "maximum": JsonNumber("1.0E8")})]
    assert PinDefinitions(str(pins)).catalog("default", "tools", changed) == []
    _, call = decode_message(
        b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x__t",'
        b'"arguments":{"n":1e400,"s":"drop table"}}}'
    )
    request = Request(1, "default", "tools/call", "x", "t", "x__t", call["params"])
    with pytest.raises(Deny):
        ExamplePlugin(blocked_words=["DROP"]).request(request)
