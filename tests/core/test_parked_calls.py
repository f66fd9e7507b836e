"""A legacy server asks for input during a modern caller's call: the call is parked, the
caller gets ``input_required``, its retry answers the server and resumes the call."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.core.era.modern_results import IDENTITY
from aggregator.core.era.parked import EXPIRY_SPACING, GATHER_SECONDS
from aggregator.core.era.request_state import PREFIX
from aggregator.core.events import (
    ClientConnected,
    ClientDisconnected,
    ClientMessage,
    ServerMessage,
    ServerStreams,
    TimePassed,
)
from aggregator.core.lifecycle.upstream_era import Era
from aggregator.core.records.links import Phase
from aggregator.core.router import Router
from aggregator.jsonrpc.errors import INVALID_PARAMS, METHOD_NOT_FOUND
from aggregator.mcp.modern import (
    CLIENT_CAPABILITIES,
    CLIENT_INFO,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    PROTOCOL_VERSION,
    SERVER_INFO,
)
from tests.core.helpers import Clock, connect, make_router, msg, unpack

ALL_CAPS = {"sampling": {}, "elicitation": {"form": {}}, "roots": {}}
ELICIT = {"message": "Your name?", "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}}
TIMEOUT = 3.0  # shorter than the servers' request timeout (5 s)


@pytest.fixture
def router(clock: Clock) -> Router:
    return make_router(clock, input_required_timeout=TIMEOUT)


def connect_modern(router: Router, key: int, principal: Any = None) -> None:
    """A modern client (no handshake: each request carries its ``_meta``)."""
    router.handle(ClientConnected(key, era=Era.MODERN, principal=principal))


def call(id: Any, caps: dict[str, Any] = ALL_CAPS, name: str = "a__slow", **extra: Any) -> bytes:
    meta = {PROTOCOL_VERSION: "2026-07-28", CLIENT_CAPABILITIES: caps, CLIENT_INFO: {"name": "m", "version": "1"}}
    return msg(id=id, method="tools/call", params={"name": name, "arguments": {"x": 1}, "_meta": meta, **extra})


def start_call(router: Router, key: int, id: Any = 1, **kw: Any) -> int:
    """Client ``key`` calls a__slow; the upstream id it went out under."""
    [(kind, server, sent)] = unpack(router.handle(ClientMessage(key, call(id, **kw))))
    assert (kind, server, sent["method"]) == ("ToServer", "a", "tools/call")
    return sent["id"]


def server_asks(router: Router, id: Any, method: str = "elicitation/create", params: Any = None) -> list[Any]:
    """The server sends a request (alone): what the router does at once and when the window
    for requests sent with it closes."""
    out = send_request(router, id, method, params)
    return out + window_closes(router)


def send_request(router: Router, id: Any, method: str = "elicitation/create", params: Any = None) -> list[Any]:
    params = ELICIT if params is None and method == "elicitation/create" else params or {}
    return unpack(router.handle(ServerMessage("a", msg(id=id, method=method, params=params))))


def window_closes(router: Router) -> list[Any]:
    router.clock.now += GATHER_SECONDS  # type: ignore[attr-defined]
    return unpack(router.handle(TimePassed()))


def complete(content: list[Any]) -> dict[str, Any]:
    """A tools/call result as a modern caller gets it: stamped complete, with the proxy's identity."""
    return {"content": content, "resultType": "complete", "_meta": {SERVER_INFO: IDENTITY}}


def input_required(commands: list[Any], key: int, id: Any) -> dict[str, Any]:
    [(kind, session, answer)] = commands
    assert (kind, session, answer["id"]) == ("ToClient", key, id)
    result = answer["result"]
    assert result["resultType"] == "input_required" and result["requestState"].startswith(PREFIX)
    assert result["_meta"] == {SERVER_INFO: IDENTITY}
    return result


def test_a_server_request_during_a_modern_call_becomes_input_required(router):
    connect_modern(router, 7)
    start_call(router, 7, id="c1")
    result = input_required(server_asks(router, "s1"), 7, "c1")
    [(key, request)] = result["inputRequests"].items()
    # Its key is the server's own id for the request.
    assert key == "s1" and request == {"method": "elicitation/create", "params": ELICIT}
    # The call is still in flight upstream, but no longer the client's.
    assert router.in_flight() == 1 and router.clients[7].in_flight == {}
    [pending] = router.links["a"].pending.values()
    assert (pending.phase, pending.session) == (Phase.PARKED, None) and pending.parked is not None


def test_the_retry_answers_the_server_and_gets_the_final_result(router):
    connect_modern(router, 7)
    upstream = start_call(router, 7, id="c1")
    result = input_required(server_asks(router, "s1"), 7, "c1")
    [key] = result["inputRequests"]
    reply = {"resultType": "complete", "action": "accept", "content": {"name": "ada"}}
    out = unpack(
        router.handle(ClientMessage(7, call("c2", inputResponses={key: reply}, requestState=result["requestState"])))
    )
    assert out == [
        ("ToServer", "a", {"jsonrpc": "2.0", "id": "s1", "result": {"action": "accept", "content": {"name": "ada"}}})
    ]
    resumed = router.clients[7].in_flight["c2"]  # the retry's again, sent
    assert (resumed.phase, resumed.session, resumed.parked) == (Phase.SENT, 7, None)
    final = unpack(
        router.handle(ServerMessage("a", msg(id=upstream, result={"content": [{"type": "text", "text": "hi ada"}]})))
    )
    assert final == [
        ("ToClient", 7, {"jsonrpc": "2.0", "id": "c2", "result": complete([{"type": "text", "text": "hi ada"}])})
    ]
    assert router.in_flight() == 0 and router.parked.table == {}


def test_a_transient_caller_may_go_away_and_another_of_the_same_principal_resumes(router):
    connect_modern(router, 7, principal=1)
    upstream = start_call(router, 7, id=1)
    result = input_required(server_asks(router, 9), 7, 1)
    # An HTTP caller's client lasts one request: its going cancels nothing upstream.
    assert router.handle(ClientDisconnected(7)) == []
    connect_modern(router, 8, principal=1)
    [key] = result["inputRequests"]
    out = unpack(
        router.handle(
            ClientMessage(8, call(1, inputResponses={key: {"action": "decline"}}, requestState=result["requestState"]))
        )
    )
    assert out == [("ToServer", "a", {"jsonrpc": "2.0", "id": 9, "result": {"action": "decline"}})]
    [(kind, session, answer)] = unpack(router.handle(ServerMessage("a", msg(id=upstream, result={"content": []}))))
    assert (kind, session, answer["id"]) == ("ToClient", 8, 1)


def test_another_principal_cannot_resume_the_call(router):
    connect_modern(router, 7, principal=1)
    start_call(router, 7)
    result = input_required(server_asks(router, 9), 7, 1)
    connect_modern(router, 8, principal=2)
    [(kind, session, answer)] = unpack(router.handle(ClientMessage(8, call(2, requestState=result["requestState"]))))
    assert (kind, session) == ("ToClient", 8)
    assert answer["error"]["code"] == INVALID_PARAMS and "another caller" in answer["error"]["message"]
    assert len(router.parked.table) == 1  # still waiting for its own caller


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"name": "a__fast"}, "another request"),
        ({"name": "b__slow"}, "another request"),  # the same tool name upstream, another server
        ({"arguments": {"x": 2}}, "another request"),
        ({"requestState": "TAMPER"}, "altered"),
    ],
)
def test_a_state_used_for_another_request_or_edited_is_refused(router, change, words):
    connect_modern(router, 7)
    start_call(router, 7)
    result = input_required(server_asks(router, 9), 7, 1)
    params = {"name": "a__slow", "arguments": {"x": 1}, "requestState": result["requestState"]} | change
    if params["requestState"] == "TAMPER":
        params["requestState"] = result["requestState"] + "-TAMPERED"
    meta = {PROTOCOL_VERSION: "2026-07-28", CLIENT_CAPABILITIES: ALL_CAPS}
    [(_, _, answer)] = unpack(
        router.handle(ClientMessage(7, msg(id=2, method="tools/call", params=params | {"_meta": meta})))
    )
    assert answer["id"] == 2 and answer["error"]["code"] == INVALID_PARAMS and words in answer["error"]["message"]


def test_a_request_the_caller_cannot_be_asked_fails_the_call_with_missing_capability(router):
    connect_modern(router, 7)
    upstream = start_call(router, 7, caps={"sampling": {}})
    assert send_request(router, 9) == []  # gathered with whatever comes with it
    out = window_closes(router)
    assert [(kind, to) for kind, to, _ in out] == [("ToServer", "a"), ("ToServer", "a"), ("ToClient", 7)]
    refusal, cancel, answer = (message for _, _, message in out)
    assert refusal["id"] == 9 and refusal["error"]["code"] == METHOD_NOT_FOUND
    assert "did not declare elicitation" in refusal["error"]["message"]
    assert cancel["method"] == "notifications/cancelled" and cancel["params"]["requestId"] == upstream
    error = answer["error"]
    assert answer["id"] == 1 and error["code"] == MISSING_REQUIRED_CLIENT_CAPABILITY
    assert error["data"]["requiredCapabilities"] == {"elicitation": {"form": {}}}
    assert "elicitation" in error["message"]
    assert router.parked.table == {} and router.in_flight() == 0 and router.clients[7].in_flight == {}


def test_requests_sent_together_are_asked_together_and_the_undeclared_refused(router):
    connect_modern(router, 7)
    start_call(router, 7, caps={"sampling": {}, "roots": {}})
    assert send_request(router, 9) == []
    assert send_request(router, 10, "sampling/createMessage", {"messages": [], "maxTokens": 5}) == []
    assert send_request(router, "mine", "roots/list") == []
    out = window_closes(router)
    [(kind, server, refusal)] = out[:1]
    assert (kind, server, refusal["id"]) == ("ToServer", "a", 9) and refusal["error"]["code"] == METHOD_NOT_FOUND
    result = input_required(out[1:], 7, 1)
    assert {key: request["method"] for key, request in result["inputRequests"].items()} == {
        "10": "sampling/createMessage",
        "mine": "roots/list",
    }
    assert len(router.parked.table) == 1 and router.clients[7].in_flight == {}


def test_a_request_after_the_window_is_asked_in_the_next_round(router):
    connect_modern(router, 7)
    start_call(router, 7)
    send_request(router, "e")
    first = input_required(window_closes(router), 7, 1)
    assert list(first["inputRequests"]) == ["e"]
    assert send_request(router, "s", "sampling/createMessage", {"messages": [], "maxTokens": 5}) == []  # queued
    again = input_required(unpack(router.handle(ClientMessage(7, call(2, requestState=first["requestState"])))), 7, 2)
    assert sorted(again["inputRequests"]) == ["e", "s"]


def test_colliding_ids_get_distinct_keys():
    from aggregator.core.era.parked import Ask, _input_key

    asks = {"7": Ask("7", "roots/list", {})}
    assert _input_key(asks, 7) == "7-2"
    asks["7-2"] = Ask(7, "roots/list", {})
    assert _input_key(asks, "7") == "7-3" and _input_key(asks, 8) == "8" and _input_key({}, "x") == "x"


def test_url_mode_needs_url_declared(router):
    connect_modern(router, 7)
    start_call(router, 7)
    out = server_asks(router, 9, params={"mode": "url", "url": "https://x", "elicitationId": "e", "message": "m"})
    assert out[0][0] == "ToServer" and "in url mode" in out[0][2]["error"]["message"]
    error = out[-1][2]["error"]
    assert error["code"] == MISSING_REQUIRED_CLIENT_CAPABILITY
    assert error["data"]["requiredCapabilities"] == {"elicitation": {"url": {}}}


def test_requests_while_parked_are_queued_and_a_missing_input_is_asked_again(router):
    connect_modern(router, 7)
    upstream = start_call(router, 7)
    first = input_required(server_asks(router, "e"), 7, 1)
    assert server_asks(router, "s", "sampling/createMessage", {"messages": [], "maxTokens": 5}) == []  # queued
    [elicit_key] = first["inputRequests"]
    # The retry answers the elicitation only: the server hears that, the client is asked again.
    out = unpack(
        router.handle(
            ClientMessage(
                7,
                call(
                    2, inputResponses={elicit_key: {"action": "cancel"}, "junk": {}}, requestState=first["requestState"]
                ),
            )
        )
    )
    assert out[0] == ("ToServer", "a", {"jsonrpc": "2.0", "id": "e", "result": {"action": "cancel"}})
    second = input_required(out[1:], 7, 2)
    [(sample_key, request)] = second["inputRequests"].items()
    assert sample_key == "s" and request["method"] == "sampling/createMessage"
    assert second["requestState"] != first["requestState"]
    # A retry with nothing for it is asked the same again, not failed.
    third = input_required(unpack(router.handle(ClientMessage(7, call(3, requestState=second["requestState"])))), 7, 3)
    assert list(third["inputRequests"]) == [sample_key]
    # The first state was used: it resumes nothing any more.
    [(_, _, stale)] = unpack(router.handle(ClientMessage(7, call(4, requestState=first["requestState"]))))
    assert stale["error"]["code"] == INVALID_PARAMS and "no longer waiting" in stale["error"]["message"]
    sampled = {"role": "assistant", "content": {"type": "text", "text": "ok"}, "model": "m"}
    out = unpack(
        router.handle(
            ClientMessage(7, call(5, inputResponses={sample_key: sampled}, requestState=third["requestState"]))
        )
    )
    assert out == [("ToServer", "a", {"jsonrpc": "2.0", "id": "s", "result": sampled})]
    [(_, _, answer)] = unpack(router.handle(ServerMessage("a", msg(id=upstream, result={"content": []}))))
    assert answer["id"] == 5


def test_several_rounds(router):
    connect_modern(router, 7)
    upstream = start_call(router, 7)
    state, id = None, 1
    for round in range(3):
        result = input_required(server_asks(router, f"s{round}"), 7, id)
        [key] = result["inputRequests"]
        id += 1
        out = unpack(
            router.handle(
                ClientMessage(
                    7,
                    call(
                        id,
                        inputResponses={key: {"action": "accept", "content": {"n": round}}},
                        requestState=result["requestState"],
                    ),
                )
            )
        )
        assert out == [
            (
                "ToServer",
                "a",
                {"jsonrpc": "2.0", "id": f"s{round}", "result": {"action": "accept", "content": {"n": round}}},
            )
        ]
        assert result["requestState"] != state
        state = result["requestState"]
    [(_, _, answer)] = unpack(router.handle(ServerMessage("a", msg(id=upstream, result={"content": []}))))
    assert answer["id"] == 4


def test_a_shared_server_over_the_network_asks_a_declaring_caller_for_its_roots_during_its_call(router):
    connect_modern(router, 7)
    start_call(router, 7)
    result = input_required(server_asks(router, 3, "roots/list"), 7, 1)
    assert result["inputRequests"] == {"3": {"method": "roots/list", "params": {}}}


def test_a_caller_without_roots_leaves_the_server_the_proxys_roots(router):
    connect_modern(router, 7)
    start_call(router, 7, caps={"sampling": {}})
    assert server_asks(router, 3, "roots/list") == [
        ("ToServer", "a", {"jsonrpc": "2.0", "id": 3, "result": {"roots": []}})
    ]
    assert router.parked.table == {} and list(router.clients[7].in_flight) == [1]


def test_a_roots_request_outside_a_modern_call_gets_the_proxys_roots(router):
    connect_modern(router, 7)
    start_call(router, 7, id=1)
    start_call(router, 7, id=2)  # two calls: which one is unknown
    assert server_asks(router, 3, "roots/list") == [
        ("ToServer", "a", {"jsonrpc": "2.0", "id": 3, "result": {"roots": []}})
    ]


def test_roots_of_a_modern_client_on_stdio_are_asked_as_input(clock):
    router = make_router(clock, single_client=True)
    connect_modern(router, 7)
    start_call(router, 7)
    result = input_required(server_asks(router, 3, "roots/list"), 7, 1)
    assert [request["method"] for request in result["inputRequests"].values()] == ["roots/list"]


def test_a_caller_that_never_retries_has_the_call_cancelled(router, clock):
    connect_modern(router, 7)
    upstream = start_call(router, 7)
    result = input_required(server_asks(router, "s1"), 7, 1)
    assert router.next_deadline() <= clock.now + TIMEOUT
    clock.now += TIMEOUT - 1
    assert router.handle(TimePassed()) == []
    clock.now += 1.5
    out = unpack(router.handle(TimePassed()))
    assert [(kind, server) for kind, server, _ in out] == [("ToServer", "a"), ("ToServer", "a")]
    assert out[0][2]["id"] == "s1" and out[0][2]["error"]["data"]["reason"] == "timeout"
    assert out[1][2] == {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": upstream, "reason": "the client gave no input in time"},
    }
    assert router.in_flight() == 0 and router.parked.table == {}
    # A late retry hears why.
    [(_, _, late)] = unpack(router.handle(ClientMessage(7, call(2, requestState=result["requestState"]))))
    assert late["error"]["code"] == INVALID_PARAMS


def test_the_servers_answer_while_parked_is_kept_for_the_retry(router):
    connect_modern(router, 7)
    upstream = start_call(router, 7)
    result = input_required(server_asks(router, "s1"), 7, 1)
    assert (
        router.handle(ServerMessage("a", msg(id=upstream, result={"content": [{"type": "text", "text": "gave up"}]})))
        == []
    )
    out = unpack(router.handle(ClientMessage(7, call(2, requestState=result["requestState"]))))
    # The server's request is moot (it answered without it); the retry gets the answer.
    assert out[0][:2] == ("ToServer", "a") and out[0][2]["id"] == "s1" and "error" in out[0][2]
    assert out[1] == (
        "ToClient",
        7,
        {"jsonrpc": "2.0", "id": 2, "result": complete([{"type": "text", "text": "gave up"}])},
    )


def test_a_state_that_is_not_the_proxys_goes_upstream(router):
    connect_modern(router, 7)
    [(kind, server, sent)] = unpack(
        router.handle(ClientMessage(7, call(1, inputResponses={"k": {}}, requestState="v1.theirs")))
    )
    assert (kind, server) == ("ToServer", "a")
    assert sent["params"]["requestState"] == "v1.theirs" and sent["params"]["inputResponses"] == {"k": {}}


def test_a_server_request_outside_any_modern_call_is_refused(router):
    connect_modern(router, 7)
    start_call(router, 7, id=1)
    start_call(router, 7, id=2)  # two calls: which one is unknown
    [(kind, server, error)] = server_asks(router, 9)
    assert (kind, server) == ("ToServer", "a") and error["error"]["data"]["reason"] == "no_request"


def test_a_legacy_client_is_still_asked_directly(router):
    connect(router, 3)
    [(kind, server, sent)] = unpack(
        router.handle(ClientMessage(3, msg(id=1, method="tools/call", params={"name": "a__slow"})))
    )
    router.handle(ClientDisconnected(1))
    router.handle(ClientDisconnected(2))
    [(kind, session, asked)] = server_asks(router, 9)
    assert (kind, session, asked["method"]) == ("ToClient", 3, "elicitation/create") and router.parked.table == {}


def test_a_call_that_times_out_upstream_while_parked_fails_its_retry(clock):
    router = make_router(clock, input_required_timeout=60.0)
    connect_modern(router, 7)
    start_call(router, 7)
    result = input_required(server_asks(router, "s1"), 7, 1)
    clock.now += 5.5  # the server's request timeout
    [(kind, _, cancel)] = unpack(router.handle(TimePassed()))
    assert kind == "ToServer" and cancel["method"] == "notifications/cancelled"
    out = unpack(router.handle(ClientMessage(7, call(2, requestState=result["requestState"]))))
    assert out[-1][:2] == ("ToClient", 7)
    assert out[-1][2]["id"] == 2 and "while it waited for input" in out[-1][2]["error"]["message"]
    assert router.parked.table == {} and router.clients[7].in_flight == {}


def test_on_a_streaming_upstream_the_requests_stream_names_the_parked_call(router):
    router.handle(ServerStreams("a", True))
    connect_modern(router, 7)
    upstream = start_call(router, 7)
    raw = msg(id="s1", method="elicitation/create", params=ELICIT)
    assert router.handle(ServerMessage("a", raw, related=upstream)) == []
    result = input_required(window_closes(router), 7, 1)
    # The next one on the same stream belongs to the same (parked) call: queued, not refused.
    sampling = {"messages": [], "maxTokens": 5}
    assert (
        router.handle(
            ServerMessage("a", msg(id="s2", method="sampling/createMessage", params=sampling), related=upstream)
        )
        == []
    )
    out = unpack(router.handle(ClientMessage(7, call(2, requestState=result["requestState"]))))
    again = input_required(out, 7, 2)  # nothing answered: both asked again
    assert sorted(r["method"] for r in again["inputRequests"].values()) == [
        "elicitation/create",
        "sampling/createMessage",
    ]


def request(id: Any, method: str, params: dict[str, Any]) -> bytes:
    meta = {PROTOCOL_VERSION: "2026-07-28", CLIENT_CAPABILITIES: ALL_CAPS}
    return msg(id=id, method=method, params={**params, "_meta": meta})


@pytest.mark.parametrize(
    ("method", "params", "sent"),
    [("resources/read", {"uri": "a+demo://r/1"}, {"uri": "demo://r/1"})],
)
def test_a_resource_read_parks_and_resumes_the_same_way(router, method, params, sent):
    connect_modern(router, 7)
    [(_, _, out)] = unpack(router.handle(ClientMessage(7, request(1, method, params))))
    assert out["method"] == method and out["params"]["uri"] == sent["uri"]
    result = input_required(server_asks(router, "s1"), 7, 1)
    [key] = result["inputRequests"]
    # The state names this URI: another one is refused, the same one resumes.
    other = request(2, method, {"uri": "b+demo://r/1", "requestState": result["requestState"]})
    [(_, _, refused)] = unpack(router.handle(ClientMessage(7, other)))
    assert refused["error"]["code"] == INVALID_PARAMS and "another request" in refused["error"]["message"]
    retry = request(
        3, method, {**params, "inputResponses": {key: {"action": "decline"}}, "requestState": result["requestState"]}
    )
    assert unpack(router.handle(ClientMessage(7, retry))) == [
        ("ToServer", "a", {"jsonrpc": "2.0", "id": "s1", "result": {"action": "decline"}})
    ]
    [(_, _, answer)] = unpack(router.handle(ServerMessage("a", msg(id=out["id"], result={"contents": []}))))
    assert answer["id"] == 3 and answer["result"]["contents"] == [] and answer["result"]["resultType"] == "complete"


def test_a_parked_call_does_not_make_a_running_calls_requests_ambiguous(router):
    connect_modern(router, 7)
    connect_modern(router, 8)
    start_call(router, 7)
    input_required(server_asks(router, "s1"), 7, 1)  # parked; its client went on
    start_call(router, 8, id=5)
    # A stdio server's request names no call: it is for the one that runs, not the parked one.
    result = input_required(server_asks(router, "s2"), 8, 5)
    assert len(result["inputRequests"]) == 1 and len(router.parked.table) == 2


def test_a_call_answered_within_the_window_goes_to_its_caller_and_its_requests_are_refused(router):
    connect_modern(router, 7)
    upstream = start_call(router, 7)
    assert send_request(router, "s1") == []
    [(kind, session, answer)] = unpack(router.handle(ServerMessage("a", msg(id=upstream, result={"content": []}))))
    assert (kind, session, answer["result"]["resultType"]) == ("ToClient", 7, "complete")
    [(kind, server, refusal)] = window_closes(router)
    assert (kind, server, refusal["id"]) == ("ToServer", "a", "s1") and "the call ended" in refusal["error"]["message"]
    assert router.parked.table == {} and router.parked.gathering == {}


def test_parked_calls_are_bounded_per_principal_and_in_all(clock):
    router = make_router(clock, input_required_timeout=TIMEOUT, max_parked_calls=3, max_parked_per_principal=2)
    ups = {}
    for key, principal in ((1, "A"), (2, "A")):
        connect_modern(router, key, principal=principal)
        ups[key] = start_call(router, key, id=key)
        input_required(server_asks(router, f"s{key}"), key, key)
    # A third call of principal A needs input: it is refused rather than parked.
    connect_modern(router, 3, principal="A")
    upstream = start_call(router, 3, id=3)
    out = server_asks(router, "s3")
    assert [(kind, where) for kind, where, _ in out] == [("ToServer", "a"), ("ToServer", "a"), ("ToClient", 3)]
    assert out[0][2]["id"] == "s3" and out[0][2]["error"]["data"]["reason"] == "overloaded"
    assert out[1][2]["method"] == "notifications/cancelled" and out[1][2]["params"]["requestId"] == upstream
    error = out[2][2]["error"]
    assert error["data"]["reason"] == "overloaded" and "max_parked_per_principal" in error["message"]
    assert len(router.parked.table) == 2 and router.in_flight() == 2
    # Another principal may still park one, up to the total.
    connect_modern(router, 4, principal="B")
    start_call(router, 4, id=4)
    input_required(server_asks(router, "s4"), 4, 4)
    connect_modern(router, 5, principal="C")
    start_call(router, 5, id=5)
    out = server_asks(router, "s5")
    assert (
        out[-1][2]["error"]["data"]["reason"] == "overloaded" and "max_parked_calls" in out[-1][2]["error"]["message"]
    )
    assert len(router.parked.table) == 3
    # A parked call that ends frees its place: A may park again.
    clock.now += TIMEOUT + 1
    router.handle(TimePassed())
    assert router.parked.table == {} and router.parked.table.by_principal == {}
    connect_modern(router, 6, principal="A")
    start_call(router, 6, id=6)
    input_required(server_asks(router, "s6"), 6, 6)


def test_calls_parked_together_do_not_expire_together(router, clock):
    for key in range(1, 4):
        connect_modern(router, key)
        upstream = start_call(router, key, id=key)
        # A streaming upstream names the call each request is for: three at the same instant.
        router.handle(ServerMessage("a", msg(id=f"s{key}", method="elicitation/create", params=ELICIT), upstream))
    window_closes(router)
    assert len(router.parked.table) == 3
    deadlines = sorted(parked.deadline for parked in router.parked.table.values())
    assert min(deadlines[1] - deadlines[0], deadlines[2] - deadlines[1]) >= EXPIRY_SPACING * 0.99
    clock.now = deadlines[0]
    cancels = [
        sent for _, _, sent in unpack(router.handle(TimePassed())) if sent.get("method") == "notifications/cancelled"
    ]
    assert len(cancels) == 1 and len(router.parked.table) == 2
