"""A modern server's input_required result for a modern caller: checked as the legacy
bridge checks it, and its requestState wrapped in one bound to the caller."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.era.request_state import MAX_UPSTREAM_STATE, WRAPPED
from aggregator.core.events import (
    ClientConnected,
    ClientMessage,
    ServerItems,
    ServerMessage,
    ServerReady,
    StartupCompleted,
)
from aggregator.core.lifecycle.upstream_era import Era
from aggregator.core.router import Router
from aggregator.jsonrpc.errors import INTERNAL_ERROR, INVALID_PARAMS
from aggregator.mcp.modern import CLIENT_CAPABILITIES, MISSING_REQUIRED_CLIENT_CAPABILITY, PROTOCOL_VERSION
from tests.core.helpers import Clock, msg, new_router, unpack

ELICIT = {"method": "elicitation/create", "params": {"mode": "form", "message": "Name?", "requestedSchema": {}}}
CAPS = {"elicitation": {"form": {}}, "sampling": {}, "roots": {}}
TTL = 10.0


def modern_router(**settings: Any) -> tuple[Router, Clock]:
    """Modern server ``a`` with tool ``t``; no client yet."""
    clock = Clock()
    servers = [ServerConfig(name="a", command="x", request_timeout=5.0)]
    r = new_router(
        Catalog(servers, "__", 50),
        servers,
        clock=clock,
        list_changed_debounce=0,
        input_required_timeout=TTL,
        **settings,
    )
    r.handle(ServerReady("a", {"protocolVersion": "2026-07-28", "capabilities": {"tools": {}}}))
    r.links["a"].speaks = Era.MODERN
    r.handle(ServerItems("a", "tools", [{"name": "t"}]))
    r.handle(StartupCompleted())
    return r, clock


def modern_call(r: Router, key: int, id: Any, caps: dict[str, Any] = CAPS, **extra: Any) -> list[Any]:
    if key not in r.clients:
        r.handle(ClientConnected(key, era=Era.MODERN, principal=f"p{key % 10}"))
    meta = {PROTOCOL_VERSION: "2026-07-28", CLIENT_CAPABILITIES: caps}
    params = {"name": "a__t", "arguments": {"x": 1}, "_meta": meta, **extra}
    return unpack(r.handle(ClientMessage(key, msg(id=id, method="tools/call", params=params))))


def upstream_answers(r: Router, caps: dict[str, Any], result: dict[str, Any], key: int = 2) -> dict[str, Any]:
    """Client ``key`` calls a__t, the server answers ``result``: what the client gets."""
    [(_, _, sent)] = modern_call(r, key, 5, caps)
    [(kind, session, answer)] = unpack(r.handle(ServerMessage("a", msg(id=sent["id"], result=result))))
    assert (kind, session, answer["id"]) == ("ToClient", key, 5)
    return answer


@pytest.mark.parametrize(
    "result",
    [
        {"resultType": "input_required", "inputRequests": [1, 2]},
        {"resultType": "input_required", "inputRequests": {"k": 5}},
        {"resultType": "input_required", "inputRequests": {"k": {"method": "foo/bar", "params": {}}}},
        {"resultType": "input_required", "inputRequests": {"k": {"method": "elicitation/create", "params": 3}}},
        {"resultType": "input_required", "inputRequests": {"k": ELICIT}, "requestState": {"x": 1}},
        {"resultType": "input_required"},
    ],
    ids=["list", "not-a-request", "unknown-method", "params-not-object", "state-not-string", "empty"],
)
def test_a_malformed_input_required_fails_the_call(result):
    r, _ = modern_router()
    answer = upstream_answers(r, CAPS, result)
    error = answer["error"]
    assert error["code"] == INTERNAL_ERROR and error["data"]["reason"] == "malformed"
    assert error["data"]["server"] == "a" and "'a'" in error["message"]
    assert r.in_flight() == 0 and r.clients[2].in_flight == {}


def test_a_request_for_an_undeclared_capability_fails_the_call_32021():
    r, _ = modern_router()
    result = {"resultType": "input_required", "inputRequests": {"k": ELICIT}, "requestState": "s"}
    error = upstream_answers(r, {"sampling": {}}, result)["error"]
    assert error["code"] == MISSING_REQUIRED_CLIENT_CAPABILITY
    assert error["data"]["requiredCapabilities"] == {"elicitation": {"form": {}}}
    assert r.in_flight() == 0


def test_a_request_the_proxy_does_not_route_fails_the_call():
    r, _ = modern_router(server_requests=("elicitation", "roots"))
    result = {
        "resultType": "input_required",
        "inputRequests": {"k": {"method": "sampling/createMessage", "params": {}}},
    }
    error = upstream_answers(r, CAPS, result)["error"]
    assert error["data"]["reason"] == "unroutable"


def test_the_upstream_state_is_wrapped_for_its_caller_and_unwrapped_exactly_on_the_retry():
    r, clock = modern_router()
    upstream_state = 'v1.\u00e9\u2028"\\/+==' + "x" * 500
    result = {"resultType": "input_required", "inputRequests": {"k": ELICIT}, "requestState": upstream_state}
    answer = upstream_answers(r, CAPS, result)
    state = answer["result"]["requestState"]
    assert state.startswith(WRAPPED) and upstream_state not in state
    assert answer["result"]["inputRequests"] == {"k": ELICIT}
    # Another caller (another principal) cannot use it.
    [(kind, session, refused)] = modern_call(r, 3, 6, requestState=state, inputResponses={"k": {"action": "decline"}})
    assert (kind, session) == ("ToClient", 3)
    assert refused["error"]["code"] == INVALID_PARAMS and "another caller" in refused["error"]["message"]
    # Nor for other arguments.
    r.handle(ClientConnected(12, era=Era.MODERN, principal="p2"))
    meta = {PROTOCOL_VERSION: "2026-07-28", CLIENT_CAPABILITIES: CAPS}
    other = {"name": "a__t", "arguments": {"x": 2}, "_meta": meta, "requestState": state}
    [(_, _, refused)] = unpack(r.handle(ClientMessage(12, msg(id=7, method="tools/call", params=other))))
    assert refused["error"]["code"] == INVALID_PARAMS and "another request" in refused["error"]["message"]
    # Its own principal's retry reaches the server with the server's state, byte for byte.
    [(kind, server, sent)] = modern_call(r, 22, 8, requestState=state, inputResponses={"k": {"action": "decline"}})
    assert (kind, server) == ("ToServer", "a")
    assert sent["params"]["requestState"] == upstream_state
    assert sent["params"]["inputResponses"] == {"k": {"action": "decline"}}
    # Past the timeout it is refused.
    clock.now += TTL + 1
    [(_, _, late)] = modern_call(r, 32, 9, requestState=state)
    assert late["error"]["code"] == INVALID_PARAMS and "expired" in late["error"]["message"]


def test_an_upstream_state_past_the_cap_fails_the_call():
    r, _ = modern_router()
    result = {
        "resultType": "input_required",
        "inputRequests": {"k": ELICIT},
        "requestState": "x" * (MAX_UPSTREAM_STATE + 1),
    }
    error = upstream_answers(r, CAPS, result)["error"]
    assert error["data"]["reason"] == "malformed" and str(MAX_UPSTREAM_STATE) in error["message"]
    # At the cap it is wrapped.
    result["requestState"] = "x" * MAX_UPSTREAM_STATE
    assert upstream_answers(r, CAPS, result, key=4)["result"]["requestState"].startswith(WRAPPED)


def test_a_state_only_result_is_wrapped_too():
    r, _ = modern_router()
    answer = upstream_answers(r, {}, {"resultType": "input_required", "requestState": "load-shed"})
    assert answer["result"]["requestState"].startswith(WRAPPED)
