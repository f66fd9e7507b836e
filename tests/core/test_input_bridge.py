"""A modern server's ``input_required`` result for a legacy client (``core.era.input_bridge``):
its questions go to the client as server-to-client requests, the answers come back in a
retry under a new id with ``inputResponses`` and the ``requestState``, and the client sees
one ordinary result; every way the exchange can end leaves the tables empty."""

from __future__ import annotations

import pytest

from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.era.input_bridge import MAX_INPUT_ROUNDS
from aggregator.core.era.modern_results import IDENTITY
from aggregator.core.era.request_state import WRAPPED
from aggregator.core.events import (
    Abandoned,
    ClientConnected,
    ClientDisconnected,
    ClientMessage,
    ServerItems,
    ServerLost,
    ServerMessage,
    ServerReady,
    StartupCompleted,
    TimePassed,
)
from aggregator.core.lifecycle.upstream_era import Era
from aggregator.core.records.links import Phase
from aggregator.jsonrpc import dumps
from tests.core.helpers import CLIENT_CAPS, Clock, connect, decoded, msg, new_router, unpack

MODERN_META = "io.modelcontextprotocol/protocolVersion"
ELICIT = {"method": "elicitation/create", "params": {"mode": "form", "message": "Name?", "requestedSchema": {}}}
SAMPLE = {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}}
ROOTS = {"method": "roots/list", "params": {}}


def bridged(caps=CLIENT_CAPS, **settings):
    """Server ``a`` (modern, timeout 5 s, at most 20 s) with tool ``t``; legacy client 1
    connected with ``caps``."""
    clock = Clock()
    servers = [ServerConfig(name="a", command="x", request_timeout=5.0, max_request_timeout=20.0)]
    r = new_router(Catalog(servers, "__", 50), servers, clock=clock, list_changed_debounce=0, **settings)
    r.handle(ServerReady("a", {"protocolVersion": "2026-07-28", "capabilities": {"tools": {}, "logging": {}}}))
    r.links["a"].speaks = Era.MODERN
    r.handle(ServerItems("a", "tools", [{"name": "t"}]))
    r.handle(ServerItems("a", "prompts", [{"name": "p", "arguments": [{"name": "x"}]}]))
    r.handle(StartupCompleted())
    connect(r, 1, caps)
    return r, clock


def call(r, id="call", token=None):
    """Client 1 calls ``a__t``; returns what went upstream."""
    params = {"name": "a__t", "arguments": {"x": 1}}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    [(kind, server, sent)] = unpack(r.handle(ClientMessage(1, msg(id=id, method="tools/call", params=params))))
    assert (kind, server) == ("ToServer", "a")
    return sent


def input_required(r, sent, requests=None, state="opaque-state-1"):
    result = {"resultType": "input_required"}
    if requests is not None:
        result["inputRequests"] = requests
    if state is not None:
        result["requestState"] = state
    return unpack(r.handle(ServerMessage("a", msg(id=sent["id"], result=result))))


def empty(r):
    """Nothing of the exchange is left in any table."""
    assert r.reverse.requests == {} and r.reverse.asked == {} and r.requests.progress == {}
    assert r.links["a"].pending == {}
    assert 1 not in r.clients or r.clients[1].in_flight == {}
    assert r.next_deadline() is None


def test_an_elicitation_goes_to_the_client_and_its_answer_is_retried_upstream_once():
    r, _ = bridged()
    sent = call(r, token="tok")
    assert MODERN_META in sent["params"]["_meta"]
    [(kind, session, asked)] = input_required(r, sent, {"who": ELICIT})
    assert (kind, session, asked["method"], asked["params"]) == ("ToClient", 1, ELICIT["method"], ELICIT["params"])
    assert r.clients[1].in_flight["call"].phase is Phase.ASKING and r.links["a"].pending == {}
    answer = {"action": "accept", "content": {"name": "ada"}}
    [(kind, server, retry)] = unpack(r.handle(ClientMessage(1, msg(id=asked["id"], result=answer))))
    assert (kind, server) == ("ToServer", "a")
    assert r.clients[1].in_flight["call"].phase is Phase.SENT  # the retry, in flight upstream
    assert retry["id"] != sent["id"] and retry["method"] == "tools/call"
    assert retry["params"]["inputResponses"] == {"who": answer}
    assert retry["params"]["requestState"] == "opaque-state-1"
    assert retry["params"]["name"] == "t" and retry["params"]["arguments"] == {"x": 1}
    assert retry["params"]["_meta"] == sent["params"]["_meta"]  # the same progress token and _meta
    done = {"content": [{"type": "text", "text": "hello ada"}], "resultType": "complete"}
    out = unpack(r.handle(ServerMessage("a", msg(id=retry["id"], result=done))))
    assert out == [("ToClient", 1, {"jsonrpc": "2.0", "id": "call", "result": done})]
    empty(r)


def test_the_question_travels_on_the_calls_stream():
    r, _ = bridged()
    sent = call(r)
    [command] = r.handle(
        ServerMessage("a", msg(id=sent["id"], result={"resultType": "input_required", "inputRequests": {"k": SAMPLE}}))
    )
    assert command.related == "call"


def test_several_questions_are_asked_at_once_and_retried_when_the_last_is_answered():
    r, _ = bridged(single_client=True)
    sent = call(r)
    out = input_required(r, sent, {"e": ELICIT, "s": SAMPLE, "r": ROOTS})
    asked = {m["method"]: m for _, _, m in out}
    assert sorted(asked) == ["elicitation/create", "roots/list", "sampling/createMessage"]
    assert len({m["id"] for m in asked.values()}) == 3
    answers = {
        "elicitation/create": {"action": "decline"},
        "sampling/createMessage": {"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "m"},
        "roots/list": {"roots": [{"uri": "file:///client"}]},
    }
    assert r.handle(ClientMessage(1, msg(id=asked["roots/list"]["id"], result=answers["roots/list"]))) == []
    assert (
        r.handle(ClientMessage(1, msg(id=asked["elicitation/create"]["id"], result=answers["elicitation/create"])))
        == []
    )
    [(_, _, retry)] = unpack(
        r.handle(
            ClientMessage(1, msg(id=asked["sampling/createMessage"]["id"], result=answers["sampling/createMessage"]))
        )
    )
    assert retry["params"]["inputResponses"] == {
        "e": answers["elicitation/create"],
        "s": answers["sampling/createMessage"],
        "r": answers["roots/list"],
    }


@pytest.mark.parametrize(
    ("settings", "caps", "expected"),
    [
        ({"roots": ("file:///proxy",)}, {"sampling": {}}, [{"uri": "file:///proxy"}]),  # no roots declared
        ({}, {"sampling": {}}, []),  # ... and none configured: no roots
        ({"single_client": True, "roots": ("file:///proxy",)}, {"sampling": {}}, [{"uri": "file:///proxy"}]),
    ],
)
def test_roots_the_client_is_not_asked_for_are_answered_by_the_proxy(settings, caps, expected):
    r, _ = bridged(caps, **settings)
    sent = call(r)
    [(kind, server, retry)] = input_required(r, sent, {"r": ROOTS})
    assert (kind, server) == ("ToServer", "a")
    assert retry["params"]["inputResponses"] == {"r": {"roots": expected}}


@pytest.mark.parametrize("settings", [{}, {"roots": ("file:///proxy",)}], ids=["no-proxy-roots", "proxy-roots"])
def test_a_shared_servers_roots_question_is_the_calls_own_and_goes_to_its_caller(settings):
    # The answer serves this call only, so the caller's roots are not shown to another
    # client: a shared server is asked like a per-session one, and like a legacy server
    # asking during a modern caller's call.
    r, _ = bridged(CLIENT_CAPS, **settings)
    sent = call(r)
    [(kind, target, asked)] = input_required(r, sent, {"r": ROOTS})
    assert (kind, target, asked["method"]) == ("ToClient", 1, "roots/list")
    [(kind, server, retry)] = unpack(
        r.handle(ClientMessage(1, msg(id=asked["id"], result={"roots": [{"uri": "file:///mine"}]})))
    )
    assert (kind, server) == ("ToServer", "a")
    assert retry["params"]["inputResponses"] == {"r": {"roots": [{"uri": "file:///mine"}]}}


def test_a_state_only_answer_is_retried_at_once_without_input_responses():
    r, _ = bridged()
    sent = call(r)
    [(kind, _, retry)] = input_required(r, sent, None, state="later")
    assert kind == "ToServer" and retry["params"]["requestState"] == "later"
    assert "inputResponses" not in retry["params"]


def test_no_request_state_means_none_on_the_retry():
    r, _ = bridged()
    sent = call(r)
    [(_, _, asked)] = input_required(r, sent, {"k": SAMPLE}, state=None)
    [(_, _, retry)] = unpack(
        r.handle(ClientMessage(1, msg(id=asked["id"], result={"role": "assistant", "content": {}})))
    )
    assert "requestState" not in retry["params"] and retry["params"]["inputResponses"]["k"]["role"] == "assistant"


def test_progress_and_log_lines_of_the_retry_reach_the_caller_under_its_own_token():
    r, _ = bridged()
    r.handle(ClientMessage(1, msg(id="lv", method="logging/setLevel", params={"level": "debug"})))
    sent = call(r, token=77)
    [(_, _, asked)] = input_required(r, sent, {"k": SAMPLE})
    [(_, _, retry)] = unpack(
        r.handle(ClientMessage(1, msg(id=asked["id"], result={"role": "assistant", "content": {}})))
    )
    token = retry["params"]["_meta"]["progressToken"]
    [(_, session, progress)] = unpack(
        r.handle(
            ServerMessage("a", msg(method="notifications/progress", params={"progressToken": token, "progress": 1}))
        )
    )
    assert session == 1 and progress["params"]["progressToken"] == 77
    [(_, session, line)] = unpack(
        r.handle(ServerMessage("a", msg(method="notifications/message", params={"level": "info", "data": "x"})))
    )
    assert session == 1 and line["params"]["logger"] == "a"


@pytest.mark.parametrize("rounds", [MAX_INPUT_ROUNDS, MAX_INPUT_ROUNDS + 1])
def test_rounds_are_bounded(rounds):
    r, _ = bridged()
    sent = call(r)
    for round in range(rounds):
        out = input_required(r, sent, {"k": SAMPLE}, state=f"s{round}")
        if round == MAX_INPUT_ROUNDS:
            [(_, _, failed)] = out
            assert failed["id"] == "call" and failed["error"]["data"]["reason"] == "too_many_rounds"
            empty(r)
            return
        [(_, _, asked)] = out
        [(_, _, sent)] = unpack(
            r.handle(ClientMessage(1, msg(id=asked["id"], result={"role": "assistant", "content": {}})))
        )
        assert sent["params"]["requestState"] == f"s{round}"
    out = unpack(r.handle(ServerMessage("a", msg(id=sent["id"], result={"content": []}))))
    assert out == [("ToClient", 1, {"jsonrpc": "2.0", "id": "call", "result": {"content": []}})]
    empty(r)


@pytest.mark.parametrize(
    ("caps", "settings", "requests", "reason"),
    [
        ({"sampling": {}}, {}, {"k": ELICIT}, "unsupported"),
        ({"elicitation": {}}, {}, {"k": SAMPLE}, "unsupported"),
        ({"sampling": {}}, {}, {"k": {"method": "sampling/createMessage", "params": {"tools": []}}}, "unsupported"),
        (CLIENT_CAPS, {"server_requests": ("elicitation",)}, {"k": SAMPLE}, "unroutable"),
        (
            CLIENT_CAPS,
            {"server_request_policy": lambda s, m, p: m != "sampling/createMessage"},
            {"e": ELICIT, "k": SAMPLE},
            "denied",
        ),
        (CLIENT_CAPS, {}, {"k": {"method": "tools/call", "params": {}}}, "malformed"),
        (CLIENT_CAPS, {}, {"k": "elicitation/create"}, "malformed"),
        (CLIENT_CAPS, {}, {"k": {"method": "roots/list", "params": 3}}, "malformed"),
        (CLIENT_CAPS, {}, [ELICIT], "malformed"),
        (CLIENT_CAPS, {"max_in_flight": 1}, {"a": ELICIT, "b": SAMPLE}, "overloaded"),
    ],
)
def test_a_question_the_client_cannot_be_asked_fails_the_call_and_asks_nothing(caps, settings, requests, reason):
    r, _ = bridged(caps, **settings)
    sent = call(r)
    [(kind, session, failed)] = input_required(r, sent, requests)
    assert (kind, session, failed["id"]) == ("ToClient", 1, "call")
    assert failed["error"]["data"] == {"source": "aggregator", "reason": reason, "server": "a"}
    empty(r)


@pytest.mark.parametrize(
    "result", [{"resultType": "input_required"}, {"resultType": "input_required", "requestState": 5}]
)
def test_an_invalid_input_required_result_fails_the_call(result):
    r, _ = bridged()
    sent = call(r)
    [(_, _, failed)] = unpack(r.handle(ServerMessage("a", msg(id=sent["id"], result=result))))
    assert failed["error"]["data"]["reason"] == "malformed"
    empty(r)


def test_input_required_on_a_request_that_cannot_have_it_fails_it():
    r, _ = bridged()
    params = {"ref": {"type": "ref/prompt", "name": "a__p"}, "argument": {"name": "x", "value": ""}}
    [(_, _, sent)] = unpack(r.handle(ClientMessage(1, msg(id="c", method="completion/complete", params=params))))
    assert sent["method"] == "completion/complete"
    [(_, _, failed)] = unpack(
        r.handle(ServerMessage("a", msg(id=sent["id"], result={"resultType": "input_required", "requestState": "s"})))
    )
    assert failed["error"]["data"]["reason"] == "malformed"


def test_a_client_error_answer_fails_the_call_and_withdraws_the_other_questions():
    r, _ = bridged()
    sent = call(r)
    out = input_required(r, sent, {"e": ELICIT, "s": SAMPLE})
    ids = {m["method"]: m["id"] for _, _, m in out}
    out = unpack(
        r.handle(
            ClientMessage(1, msg(id=ids["sampling/createMessage"], error={"code": -1, "message": "User rejected"}))
        )
    )
    assert [kind for kind, _, _ in out] == ["ToClient", "ToClient"]  # nothing upstream
    cancel, failed = (m for _, _, m in out)
    assert cancel["method"] == "notifications/cancelled" and cancel["params"]["requestId"] == ids["elicitation/create"]
    assert failed["id"] == "call" and failed["error"]["data"]["reason"] == "input_failed"
    assert "User rejected" in failed["error"]["message"]
    assert r.handle(ClientMessage(1, msg(id=ids["elicitation/create"], result={"action": "accept"}))) == []  # too late
    empty(r)


def test_an_answer_the_proxy_refuses_fails_the_call():
    r, _ = bridged(max_json_depth=16)
    sent = call(r)
    [(_, _, asked)] = input_required(r, sent, {"k": SAMPLE})
    deep = {"content": 1}
    for _ in range(20):
        deep = {"x": deep}
    [(_, _, failed)] = unpack(r.handle(ClientMessage(1, msg(id=asked["id"], result=deep))))
    assert failed["id"] == "call" and failed["error"]["data"]["reason"] == "too_large"
    empty(r)


def test_a_cancel_while_the_client_is_asked_withdraws_its_questions_and_sends_nothing_upstream():
    r, _ = bridged()
    sent = call(r)
    [(_, _, asked)] = input_required(r, sent, {"k": ELICIT})
    out = unpack(r.handle(ClientMessage(1, msg(method="notifications/cancelled", params={"requestId": "call"}))))
    assert [(kind, target) for kind, target, _ in out] == [("ToClient", 1), ("RequestEnded", 1)]
    assert out[0][2]["params"]["requestId"] == asked["id"]
    assert r.handle(ClientMessage(1, msg(id=asked["id"], result={"action": "accept"}))) == []
    empty(r)


def test_a_cancel_during_the_retry_cancels_the_retry_upstream():
    r, _ = bridged()
    sent = call(r)
    [(_, _, asked)] = input_required(r, sent, {"k": ELICIT})
    [(_, _, retry)] = unpack(r.handle(ClientMessage(1, msg(id=asked["id"], result={"action": "cancel"}))))
    out = unpack(r.handle(ClientMessage(1, msg(method="notifications/cancelled", params={"requestId": "call"}))))
    assert out[0][:2] == ("ToServer", "a") and out[0][2]["params"]["requestId"] == retry["id"]
    assert r.handle(ServerMessage("a", msg(id=retry["id"], result={"content": []}))) == []  # late: dropped
    empty(r)


def test_the_exchange_stays_within_the_calls_timeout():
    r, clock = bridged()
    sent = call(r)
    clock.now += 3  # the server took 3 of the call's 5 seconds
    [(_, _, asked)] = input_required(r, sent, {"k": ELICIT})
    assert r.next_deadline() == pytest.approx(clock.now + 2)
    clock.now += 2
    out = unpack(r.handle(TimePassed()))
    assert [kind for kind, _, _ in out] == ["ToClient", "ToClient"]  # nothing upstream: nothing in flight there
    cancel, failed = (m for _, _, m in out)
    assert cancel["params"]["requestId"] == asked["id"]
    assert failed["id"] == "call" and failed["error"]["data"]["reason"] == "timeout"
    empty(r)


def test_a_retry_keeps_the_calls_deadline():
    r, clock = bridged()
    sent = call(r)
    [(_, _, asked)] = input_required(r, sent, {"k": ELICIT})
    clock.now += 4
    [(_, _, retry)] = unpack(r.handle(ClientMessage(1, msg(id=asked["id"], result={"action": "decline"}))))
    clock.now += 1
    out = unpack(r.handle(TimePassed()))
    assert out[0] == (
        "ToServer",
        "a",
        {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": retry["id"], "reason": "timed out"},
        },
    )
    assert out[1][2]["error"]["data"]["reason"] == "timeout"
    empty(r)


def test_the_upstream_lost_while_the_client_is_asked_fails_the_call():
    r, _ = bridged()
    sent = call(r)
    [(_, _, asked)] = input_required(r, sent, {"k": ELICIT})
    out = unpack(r.handle(ServerLost("a", "crashed")))
    to_client = [m for kind, session, m in out if kind == "ToClient" and session == 1]
    assert any(
        m.get("method") == "notifications/cancelled" and m["params"]["requestId"] == asked["id"] for m in to_client
    )
    [failed] = [m for m in to_client if m.get("id") == "call"]
    assert failed["error"]["data"]["reason"] == "unavailable"
    empty(r)


def test_a_client_that_leaves_while_asked_leaves_nothing_and_tells_no_server():
    r, _ = bridged()
    sent = call(r)
    input_required(r, sent, {"e": ELICIT, "s": SAMPLE})
    assert [c for c in r.handle(ClientDisconnected(1)) if type(c).__name__ == "ToServer"] == []
    empty(r)


def test_shutdown_answers_a_call_whose_client_is_asked():
    r, _ = bridged()
    sent = call(r)
    input_required(r, sent, {"e": ELICIT})
    failed = [
        m for kind, _, m in unpack(r.handle(Abandoned("stopping"))) if kind == "ToClient" and m.get("id") == "call"
    ]
    assert [m["error"]["data"]["reason"] for m in failed] == ["unavailable"]
    empty(r)


def test_a_legacy_servers_result_is_never_bridged():
    r, _ = bridged()
    r.links["a"].speaks = Era.LEGACY
    sent = call(r)
    result = {"resultType": "input_required", "requestState": "s"}
    assert unpack(r.handle(ServerMessage("a", msg(id=sent["id"], result=result)))) == [
        ("ToClient", 1, {"jsonrpc": "2.0", "id": "call", "result": result})
    ]


def test_a_modern_callers_input_required_result_passes_through_unchanged():
    r, _ = bridged()
    r.handle(ClientConnected(2, era=Era.MODERN))
    r.clients[2].initialize_seen = r.clients[2].initialized = True  # served without a handshake
    meta = {MODERN_META: "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
    params = {"name": "a__t", "arguments": {}, "_meta": meta}
    [(_, _, sent)] = unpack(r.handle(ClientMessage(2, msg(id=5, method="tools/call", params=params))))
    result = {"resultType": "input_required", "inputRequests": {"k": ELICIT}, "requestState": "s"}
    [(kind, session, passed)] = unpack(r.handle(ServerMessage("a", msg(id=sent["id"], result=result))))
    assert (kind, session, passed["id"]) == ("ToClient", 2, 5)
    # Unchanged but for the proxy's identity, which every result to a modern caller carries,
    # and the server's state, wrapped in one bound to the caller (``core.era.modern_input``).
    state = passed["result"].pop("requestState")
    assert state.startswith(WRAPPED)
    del result["requestState"]
    assert passed["result"] == dict(result, _meta={"io.modelcontextprotocol/serverInfo": IDENTITY})
    assert r.reverse.requests == {}


@pytest.mark.parametrize("literal", ["123456789012345678901234567890", "1e400", "0.10000000000000001", "-0"])
def test_the_retry_resends_the_arguments_and_state_as_they_were(literal):
    r, _ = bridged()
    raw = '{"jsonrpc":"2.0","id":"call","method":"tools/call","params":{"name":"a__t","arguments":{"n":@}}}'
    [sent] = r.handle(ClientMessage(1, raw.replace("@", literal).encode()))
    state = 'v1.\u00e9\u2028"\\/+=='
    [(_, _, asked)] = input_required(r, decoded(sent.message), {"k": SAMPLE}, state=state)
    [retry] = r.handle(ClientMessage(1, msg(id=asked["id"], result={"role": "assistant", "content": {}})))
    assert f'"arguments":{{"n":{literal}}}'.encode() in dumps(retry.message)
    assert decoded(retry.message)["params"]["requestState"] == state


@pytest.mark.parametrize(
    ("caps", "asked"), [(CLIENT_CAPS, True), ({"sampling": {}}, False)], ids=["declares-roots", "no-roots"]
)
def test_a_per_session_servers_roots_question_goes_to_its_client_if_it_has_roots(caps, asked):
    servers = [ServerConfig(name="p", command="x", isolation="per-session")]
    r = new_router(Catalog(servers, "__", 50), servers, clock=Clock(), list_changed_debounce=0, roots=("file:///px",))
    r.handle(ServerReady("p", {"capabilities": {"tools": {}}}))
    r.handle(ServerItems("p", "tools", [{"name": "t"}]))
    r.handle(StartupCompleted())
    connect(r, 1, caps)
    [start] = r.handle(ClientMessage(1, msg(id="call", method="tools/call", params={"name": "p__t"})))
    r.links[start.name].speaks = Era.MODERN  # its connection found a modern server
    [(_, _, sent)] = unpack(r.handle(ServerReady(start.name, {"capabilities": {"tools": {}}})))
    result = {"resultType": "input_required", "inputRequests": {"r": ROOTS}}
    [(kind, target, out)] = unpack(r.handle(ServerMessage(start.name, msg(id=sent["id"], result=result))))
    if asked:
        assert (kind, target, out["method"]) == ("ToClient", 1, "roots/list")
        out = decoded(
            r.handle(ClientMessage(1, msg(id=out["id"], result={"roots": [{"uri": "file:///mine"}]})))[0].message
        )
        assert out["params"]["inputResponses"] == {"r": {"roots": [{"uri": "file:///mine"}]}}
    else:
        assert (kind, target) == ("ToServer", start.name)
        assert out["params"]["inputResponses"] == {"r": {"roots": [{"uri": "file:///px"}]}}
