"""What a hostile or careless server or client sends about other parties' requests, ids,
tasks and tokens: never a crash, never a request left unanswered, never a message routed
to a client it does not belong to. Pure: a fake clock, no I/O."""

import logging

import pytest

from aggregator.core.events import ClientDisconnected, ClientMessage, ServerLost, ServerMessage, ServerReady
from tests.core.helpers import Clock, connect, make_router, msg, unpack

ODD_IDS = [[1], {"x": 1}, 1.5, None, True]
RELATED = "io.modelcontextprotocol/related-task"


def in_flight(router, session, id, server="a"):
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(session, msg(id=id, method="tools/call", params={"name": f"{server}__slow"})))
    )
    return sent


def no_errors_logged(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("odd", ODD_IDS)
@pytest.mark.parametrize(
    "request_params",
    [
        lambda odd: (
            "elicitation/create",
            {"mode": "url", "elicitationId": odd, "url": "https://x.example", "message": "m"},
        ),
        lambda odd: ("sampling/createMessage", {"messages": [], "_meta": {RELATED: {"taskId": odd}}}),
        lambda odd: ("elicitation/create", {"message": "m", "_meta": {RELATED: {"taskId": odd}}}),
    ],
)
def test_a_server_request_with_odd_ids_inside_is_routed_or_answered(router, caplog, odd, request_params):
    in_flight(router, 1, 1)
    method, params = request_params(odd)
    out = unpack(router.handle(ServerMessage("a", msg(id=77, method=method, params=params))))
    assert no_errors_logged(caplog)
    # Session 1 is the one with a call in flight there: it is asked, and only it.
    assert [(kind, party, m.get("method")) for kind, party, m in out] == [("ToClient", 1, method)]
    [(_, _, answer)] = unpack(router.handle(ClientMessage(1, msg(id=out[0][2]["id"], result={"action": "decline"}))))
    assert answer["id"] == 77


@pytest.mark.parametrize("odd", ODD_IDS)
@pytest.mark.parametrize(
    "notification",
    [
        lambda odd: ("notifications/cancelled", {"requestId": odd}),
        lambda odd: ("notifications/elicitation/complete", {"elicitationId": odd}),
        lambda odd: ("notifications/tasks/status", {"taskId": odd, "status": "working"}),
        lambda odd: ("notifications/message", {"level": "error", "data": "x", "_meta": {RELATED: {"taskId": odd}}}),
        lambda odd: ("notifications/progress", {"progressToken": odd, "progress": 1}),
        lambda odd: ("notifications/resources/updated", {"uri": odd}),
    ],
)
def test_a_server_notification_with_odd_ids_inside_is_dropped_quietly(router, caplog, odd, notification):
    in_flight(router, 1, 1)
    method, params = notification(odd)
    out = unpack(router.handle(ServerMessage("a", msg(method=method, params=params))))
    assert no_errors_logged(caplog)
    assert all(party == 1 for _, party, _ in out)  # a log line of session 1's call, at most


def test_a_log_line_never_carries_another_clients_progress_token(router):
    # Session 1 asked for progress with its own token; a line on session 2's request stream
    # that names 1's upstream token goes to 2 (the stream decides) without 1's token.
    sent_one = router.handle(
        ClientMessage(
            1, msg(id=1, method="tools/call", params={"name": "a__slow", "_meta": {"progressToken": "secret-of-one"}})
        )
    )
    token = sent_one[0].message["params"]["_meta"]["progressToken"]
    two = in_flight(router, 2, 2)
    note = msg(
        method="notifications/message", params={"level": "error", "data": "x", "_meta": {"progressToken": token}}
    )
    [command] = router.handle(ServerMessage("a", note, related=two["id"]))
    assert command.session == 2
    assert "secret-of-one" not in str(command.message) and token not in str(command.message)
    # Where the token does decide, its own client gets its own token back.
    [command] = router.handle(ServerMessage("a", note))
    assert command.session == 1 and command.message["params"]["_meta"]["progressToken"] == "secret-of-one"
    # Another server naming it names nothing of session 1.
    in_flight(router, 2, 3, server="b")
    [command] = router.handle(ServerMessage("b", note))
    assert command.session == 2 and token not in str(command.message)


def test_a_flood_of_roots_changes_reaches_a_server_once_until_it_asks_again(clock=None):
    single = make_router(Clock(), single_client=True)
    connect(single, 1)
    change = msg(method="notifications/roots/list_changed")
    assert sorted(server for _, server, _ in unpack(single.handle(ClientMessage(1, change)))) == ["a", "b"]
    for _ in range(1000):  # nothing more until a server asks for the roots
        assert single.handle(ClientMessage(1, change)) == []
    # a asks (and is answered by its client): its next change reaches it again; b's does not.
    [(_, _, asked)] = unpack(single.handle(ServerMessage("a", msg(id=1, method="roots/list"))))
    single.handle(ClientMessage(1, msg(id=asked["id"], result={"roots": []})))
    assert [server for _, server, _ in unpack(single.handle(ClientMessage(1, change)))] == ["a"]
    assert single.handle(ClientMessage(1, change)) == []
    # A restarted server is told again.
    single.handle(ServerLost("b", "crashed"))
    single.handle(ServerReady("b", {"capabilities": {}}))
    assert [server for _, server, _ in unpack(single.handle(ClientMessage(1, change)))] == ["b"]


def test_a_client_holds_a_bounded_number_of_unanswered_server_requests(clock=None):
    r = make_router(Clock(), max_in_flight=4)
    connect(r, 1)
    in_flight(r, 1, 1)
    asked = []
    for id in range(4):
        [(kind, party, m)] = unpack(
            r.handle(ServerMessage("a", msg(id=100 + id, method="sampling/createMessage", params={"messages": []})))
        )
        assert (kind, party) == ("ToClient", 1)
        asked.append(m["id"])
    # The client answers none of them: more are refused at once, the server is not left waiting.
    [(kind, party, refused)] = unpack(
        r.handle(ServerMessage("a", msg(id=200, method="sampling/createMessage", params={"messages": []})))
    )
    assert (kind, party, refused["id"]) == ("ToServer", "a", 200)
    assert refused["error"]["data"]["reason"] == "overloaded"
    # One answered: one more may be asked.
    r.handle(ClientMessage(1, msg(id=asked[0], result={})))
    [(kind, party, _)] = unpack(
        r.handle(ServerMessage("a", msg(id=201, method="sampling/createMessage", params={"messages": []})))
    )
    assert (kind, party) == ("ToClient", 1)
    # Leaving clears the count with the requests.
    r.handle(ClientDisconnected(1))
    assert r.reverse.requests == {} and r.reverse.ids == {} and r.reverse.asked == {}


def test_a_url_elicitation_required_error_routes_its_completion_to_that_client(router):
    in_flight(router, 1, 1)
    two = in_flight(router, 2, 1)
    # Session 2's call needs a browser flow first (-32042 carries the URL elicitations).
    error = {
        "code": -32042,
        "message": "This request requires browser-based authorization.",
        "data": {
            "elicitations": [{"mode": "url", "url": "https://auth.example/x", "message": "open", "elicitationId": "E2"}]
        },
    }
    [(_, session, answer)] = unpack(router.handle(ServerMessage("a", msg(id=two["id"], error=error))))
    assert (session, answer["error"]) == (2, error)
    done = msg(method="notifications/elicitation/complete", params={"elicitationId": "E2"})
    assert [(kind, party) for kind, party, _ in unpack(router.handle(ServerMessage("a", done)))] == [("ToClient", 2)]
    assert router.handle(ServerMessage("a", done)) == []  # once
    # Another server cannot complete it.
    router.handle(ServerMessage("a", msg(id=in_flight(router, 2, 2)["id"], error=error)))
    assert router.handle(ServerMessage("b", done)) == []


def test_elicitations_a_server_never_completes_are_bounded_per_client():
    r = make_router(Clock(), max_in_flight=4)
    connect(r, 1)
    connect(r, 2)
    in_flight(r, 2, 1)
    r.handle(
        ServerMessage(
            "a",
            msg(
                id=5,
                method="elicitation/create",
                params={"mode": "url", "url": "https://x.example", "message": "m", "elicitationId": "of-two"},
            ),
        )
    )
    in_flight(r, 1, 1)
    r.handle(ClientMessage(2, msg(method="notifications/cancelled", params={"requestId": 1})))
    for n in range(100):  # session 1 accepts each at once; the server never completes any
        [(_, _, asked)] = unpack(
            r.handle(
                ServerMessage(
                    "a",
                    msg(
                        id=10 + n,
                        method="elicitation/create",
                        params={"mode": "url", "url": "https://x.example", "message": "m", "elicitationId": f"E{n}"},
                    ),
                )
            )
        )
        r.handle(ClientMessage(1, msg(id=asked["id"], result={"action": "accept"})))
    assert len(r.reverse.elicitations) <= 4 + 1
    # The newest still complete; another session's is untouched by session 1's excess.
    done = msg(method="notifications/elicitation/complete", params={"elicitationId": "E99"})
    assert [party for _, party, _ in unpack(r.handle(ServerMessage("a", done)))] == [1]
    done = msg(method="notifications/elicitation/complete", params={"elicitationId": "of-two"})
    assert [party for _, party, _ in unpack(r.handle(ServerMessage("a", done)))] == [2]
