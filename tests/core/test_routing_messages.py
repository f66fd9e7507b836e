"""Progress, cancellation, timeouts, subscriptions, logging, reverse requests and tasks,
with two clients sharing one upstream. Pure: a fake clock, no I/O."""

import pytest

from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.events import (
    Abandoned,
    ClientConnected,
    ClientDisconnected,
    ClientMessage,
    DrainingStarted,
    ServerItems,
    ServerLost,
    ServerMessage,
    ServerReady,
    StartupCompleted,
    TimePassed,
)
from tests.core.helpers import CLIENT_CAPS, connect, make_router, msg, new_router, unpack


def call(router, key, id, tool="a__slow", token=None):
    params = {"name": tool, "arguments": {}}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    [(kind, server, sent)] = unpack(router.handle(ClientMessage(key, msg(id=id, method="tools/call", params=params))))
    assert kind == "ToServer"
    return server, sent


# --- progress ---------------------------------------------------------------------------


def test_same_token_from_two_sessions_never_crosses(router):
    _, one = call(router, 1, 1, token="tok")
    _, two = call(router, 2, 1, token="tok")
    t1, t2 = one["params"]["_meta"]["progressToken"], two["params"]["_meta"]["progressToken"]
    assert t1 != t2
    progress = unpack(
        router.handle(
            ServerMessage(
                "a",
                msg(
                    method="notifications/progress",
                    params={"progressToken": t2, "progress": 3, "total": 10, "message": "m"},
                ),
            )
        )
    )
    assert progress == [
        (
            "ToClient",
            2,
            {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": "tok", "progress": 3, "total": 10, "message": "m"},
            },
        )
    ]
    # Another server cannot report progress on a's request.
    assert (
        router.handle(
            ServerMessage("b", msg(method="notifications/progress", params={"progressToken": t1, "progress": 1}))
        )
        == []
    )
    # After the response, progress for that token is dropped.
    router.handle(ServerMessage("a", msg(id=two["id"], result={})))
    assert (
        router.handle(
            ServerMessage("a", msg(method="notifications/progress", params={"progressToken": t2, "progress": 4}))
        )
        == []
    )
    assert router.requests.progress.keys() == {t1}


def test_integer_tokens_and_meta_kept(router):
    _, sent = call(router, 1, 9, token=0)
    assert sent["params"]["_meta"]["progressToken"] != 0
    [(_, _, note)] = unpack(
        router.handle(
            ServerMessage(
                "a",
                msg(
                    method="notifications/progress",
                    params={"progressToken": sent["params"]["_meta"]["progressToken"], "progress": 1},
                ),
            )
        )
    )
    assert note["params"]["progressToken"] == 0


# --- cancellation -----------------------------------------------------------------------


def test_cancel_races(router):
    _, sent = call(router, 1, 5)
    # Twice: the second is ignored.
    first = unpack(router.handle(ClientMessage(1, msg(method="notifications/cancelled", params={"requestId": 5}))))
    assert first == [
        ("ToServer", "a", {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": sent["id"]}}),
        ("RequestEnded", 1, (5,)),
    ]
    assert router.handle(ClientMessage(1, msg(method="notifications/cancelled", params={"requestId": 5}))) == []
    # The upstream answers anyway: dropped.
    assert router.handle(ServerMessage("a", msg(id=sent["id"], result={}))) == []
    # Cancel after the answer: ignored.
    _, sent = call(router, 1, 6)
    router.handle(ServerMessage("a", msg(id=sent["id"], result={})))
    assert router.handle(ClientMessage(1, msg(method="notifications/cancelled", params={"requestId": 6}))) == []
    # Cancelling another session's id is ignored: ids are per session.
    _, sent = call(router, 2, 7)
    assert router.handle(ClientMessage(1, msg(method="notifications/cancelled", params={"requestId": 7}))) == []
    assert sent["id"] in router.links["a"].pending
    # initialize can never be cancelled (it is not in flight upstream).
    assert router.handle(ClientMessage(1, msg(method="notifications/cancelled", params={"requestId": 0}))) == []


# --- timeouts ---------------------------------------------------------------------------


def test_timeout_answers_the_client_and_cancels_upstream(router, clock):
    _, sent = call(router, 1, "t", tool="b__slow")
    assert router.next_deadline() == clock.now + 5.0
    clock.now += 4.9
    assert router.handle(TimePassed()) == []
    clock.now += 0.2
    out = unpack(router.handle(TimePassed()))
    assert (
        "ToServer",
        "b",
        {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": sent["id"], "reason": "timed out"},
        },
    ) in out
    [(_, session, error)] = [o for o in out if o[0] == "ToClient"]
    assert session == 1 and error["id"] == "t"
    assert error["error"]["data"] == {"source": "aggregator", "reason": "timeout", "server": "b"}
    assert "within 5s" in error["error"]["message"]
    assert router.handle(ServerMessage("b", msg(id=sent["id"], result={}))) == []  # late: dropped
    assert router.next_deadline() is None


def test_progress_extends_up_to_the_hard_maximum(router, clock):
    start = clock.now
    _, sent = call(router, 1, 1, token="p")
    token = sent["params"]["_meta"]["progressToken"]
    progress = msg(method="notifications/progress", params={"progressToken": token, "progress": 1})
    for _ in range(30):  # progress every 4 s: never idle for 5 s
        clock.now += 4
        out = router.handle(TimePassed())
        if out:
            break
        router.handle(ServerMessage("a", progress))
    assert clock.now - start == pytest.approx(20, abs=4.01)
    errors = [o for o in unpack(out) if o[0] == "ToClient"]
    assert errors and "within 20s" in errors[0][2]["error"]["message"]
    assert router.handle(ServerMessage("a", progress)) == []  # no progress after the end


def test_many_finished_requests_do_not_pile_up(router, clock):
    for i in range(5000):
        _, sent = call(router, 1, i, tool="a__fast")
        router.handle(ServerMessage("a", msg(id=sent["id"], result={})))
    assert len(router.requests.deadlines) < 3000
    assert router.next_deadline() is None


# --- upstream lost ----------------------------------------------------------------------


def test_lost_upstream_fails_everything_pending_once(router):
    call(router, 1, 1)
    call(router, 2, 1)
    call(router, 2, 2, tool="b__slow")
    out = unpack(router.handle(ServerLost("a", "gone")))
    errors = sorted((o[1], o[2]["id"]) for o in out if o[0] == "ToClient" and "error" in o[2])
    assert errors == [(1, 1), (2, 1)]
    assert router.links["a"].pending == {} and len(router.links["b"].pending) == 1
    again = unpack(router.handle(ServerLost("a", "gone")))
    assert not [o for o in again if "error" in o[2]]  # nothing is failed twice


# --- subscriptions ----------------------------------------------------------------------


def test_subscriptions_are_refcounted(router):
    out = unpack(
        router.handle(ClientMessage(1, msg(id=1, method="resources/subscribe", params={"uri": "a+demo://r/1"})))
    )
    [(_, _, sub)] = out
    assert sub["method"] == "resources/subscribe" and sub["params"] == {"uri": "demo://r/1"}
    router.handle(ServerMessage("a", msg(id=sub["id"], result={})))
    # The second session subscribes: answered here, nothing upstream.
    assert unpack(
        router.handle(ClientMessage(2, msg(id=1, method="resources/subscribe", params={"uri": "a+demo://r/1"})))
    ) == [("ToClient", 2, {"jsonrpc": "2.0", "id": 1, "result": {}})]
    updated = unpack(
        router.handle(ServerMessage("a", msg(method="notifications/resources/updated", params={"uri": "demo://r/1"})))
    )
    assert sorted(o[1] for o in updated) == [1, 2]
    assert updated[0][2]["params"]["uri"] == "a+demo://r/1"
    # b's resource with the same URI is another subscription: nobody gets a's updates for it.
    assert (
        router.handle(ServerMessage("b", msg(method="notifications/resources/updated", params={"uri": "demo://r/1"})))
        == []
    )
    # One leaves: no upstream unsubscribe yet. The last leaves: unsubscribe upstream.
    assert (
        unpack(
            router.handle(ClientMessage(1, msg(id=2, method="resources/unsubscribe", params={"uri": "a+demo://r/1"})))
        )[0][0]
        == "ToClient"
    )
    assert [
        o[1]
        for o in unpack(
            router.handle(
                ServerMessage("a", msg(method="notifications/resources/updated", params={"uri": "demo://r/1"}))
            )
        )
    ] == [2]
    out = unpack(router.handle(ClientDisconnected(2)))
    assert ("ToServer", "a") == out[0][:2] and out[0][2]["method"] == "resources/unsubscribe"
    assert router.handle(ServerMessage("a", msg(id=out[0][2]["id"], result={}))) == []


def test_subscriptions_are_renewed_after_a_restart(router):
    [(_, _, sub)] = unpack(
        router.handle(ClientMessage(1, msg(id=1, method="resources/subscribe", params={"uri": "a+demo://r/1"})))
    )
    router.handle(ServerMessage("a", msg(id=sub["id"], result={})))
    router.handle(ServerLost("a", "crash"))
    out = unpack(router.handle(ServerReady("a", {"capabilities": {"resources": {"subscribe": True}, "logging": {}}})))
    assert [o[2]["method"] for o in out] == ["resources/subscribe"]
    assert out[0][2]["params"] == {"uri": "demo://r/1"}


def test_a_failed_subscribe_does_not_count(router):
    [(_, _, sub)] = unpack(
        router.handle(ClientMessage(1, msg(id=1, method="resources/subscribe", params={"uri": "a+demo://r/1"})))
    )
    router.handle(ServerMessage("a", msg(id=sub["id"], error={"code": -32602, "message": "no"})))
    assert router.subscriptions.subscribers(("a", "demo://r/1")) == set()


# --- logging ----------------------------------------------------------------------------


def test_log_levels(router):
    out = unpack(router.handle(ClientMessage(1, msg(id=1, method="logging/setLevel", params={"level": "warning"}))))
    assert out[0] == ("ToClient", 1, {"jsonrpc": "2.0", "id": 1, "result": {}})
    assert sorted((o[1], o[2]["params"]["level"]) for o in out[1:]) == [("a", "warning"), ("b", "warning")]
    out = unpack(router.handle(ClientMessage(2, msg(id=1, method="logging/setLevel", params={"level": "debug"}))))
    assert sorted((o[1], o[2]["params"]["level"]) for o in out[1:]) == [("a", "debug"), ("b", "debug")]
    note = msg(method="notifications/message", params={"level": "info", "logger": "db", "data": {"x": 1}})
    out = unpack(router.handle(ServerMessage("a", note)))
    assert [(o[1], o[2]["params"]["logger"]) for o in out] == [(2, "a/db")]  # 1 wants warning+
    out = unpack(
        router.handle(
            ServerMessage("b", msg(method="notifications/message", params={"level": "error", "data": "boom"}))
        )
    )
    assert sorted((o[1], o[2]["params"]["logger"]) for o in out) == [(1, "b"), (2, "b")]
    # The debug session leaves: upstreams go back to warning.
    out = unpack(router.handle(ClientDisconnected(2)))
    assert sorted((o[1], o[2]["params"]["level"]) for o in out if o[2].get("method") == "logging/setLevel") == [
        ("a", "warning"),
        ("b", "warning"),
    ]
    [(_, _, bad)] = unpack(
        router.handle(ClientMessage(1, msg(id=3, method="logging/setLevel", params={"level": "loud"})))
    )
    assert bad["error"]["code"] == -32602


# --- server-to-client requests ----------------------------------------------------------


def test_reverse_request_goes_to_the_session_with_a_call_in_flight(router):
    _, call_one = call(router, 1, 1)
    sampling = {"messages": [], "maxTokens": 10}
    [(kind, session, forwarded)] = unpack(
        router.handle(ServerMessage("a", msg(id=1, method="sampling/createMessage", params=sampling)))
    )
    assert (kind, session) == ("ToClient", 1) and forwarded["params"] == sampling
    # b asks with the same id at the same time; with nobody in flight on b and two sessions
    # connected, no signal names a client: b gets an error at once that says why and what to do.
    [(kind, server, refused)] = unpack(
        router.handle(ServerMessage("b", msg(id=1, method="sampling/createMessage", params=sampling)))
    )
    assert (kind, server, refused["id"]) == ("ToServer", "b", 1)
    assert refused["error"]["data"]["reason"] == "ambiguous"
    assert "several clients" in refused["error"]["message"] and "per-session" in refused["error"]["message"]
    # The client answers under the proxy's id; a gets it under its own.
    back = unpack(router.handle(ClientMessage(1, msg(id=forwarded["id"], result={"role": "assistant"}))))
    assert back == [("ToServer", "a", {"jsonrpc": "2.0", "id": 1, "result": {"role": "assistant"}})]
    assert router.handle(ClientMessage(1, msg(id=forwarded["id"], result={}))) == []  # answered already
    assert router.reverse.requests == {} and router.reverse.ids == {}


def test_two_servers_same_reverse_id_get_distinct_proxy_ids(clock):
    router = make_router(clock)
    connect(router, 1)
    call(router, 1, 1, tool="a__slow")
    call(router, 1, 2, tool="b__slow")
    [(_, _, from_a)] = unpack(router.handle(ServerMessage("a", msg(id=1, method="sampling/createMessage", params={}))))
    [(_, _, from_b)] = unpack(router.handle(ServerMessage("b", msg(id=1, method="sampling/createMessage", params={}))))
    assert from_a["id"] != from_b["id"]
    assert unpack(router.handle(ClientMessage(1, msg(id=from_b["id"], result={"role": "b"}))))[0][1] == "b"
    assert unpack(router.handle(ClientMessage(1, msg(id=from_a["id"], error={"code": 1, "message": "x"}))))[0][:2] == (
        "ToServer",
        "a",
    )


def test_reverse_request_errors(clock):
    deny_b = []  # the policy, given at construction, denies server b's requests once this is set
    router = make_router(
        clock,
        roots=("file:///work",),
        server_request_policy=lambda server, method, params: not (deny_b and server == "b"),
    )
    # Nobody connected: roots from the config; sampling refused at once.
    [(_, _, roots)] = unpack(router.handle(ServerMessage("a", msg(id=7, method="roots/list"))))
    assert roots["result"] == {"roots": [{"uri": "file:///work"}]}
    [(_, _, refused)] = unpack(router.handle(ServerMessage("a", msg(id=8, method="sampling/createMessage", params={}))))
    assert "error" in refused
    # A client without sampling: -32601, nothing reaches it.
    connect(router, 1, caps={"elicitation": {}})
    [(kind, _, refused)] = unpack(
        router.handle(ServerMessage("a", msg(id=9, method="sampling/createMessage", params={})))
    )
    assert kind == "ToServer" and refused["error"]["code"] == -32601
    # Form-only elicitation client: url mode refused, form mode delivered.
    [(kind, _, refused)] = unpack(
        router.handle(
            ServerMessage(
                "a",
                msg(
                    id=10,
                    method="elicitation/create",
                    params={"mode": "url", "url": "https://example.invalid", "elicitationId": "e1", "message": "go"},
                ),
            )
        )
    )
    assert kind == "ToServer" and "url mode" in refused["error"]["message"]
    [(kind, session, _)] = unpack(
        router.handle(
            ServerMessage(
                "a",
                msg(
                    id=11,
                    method="elicitation/create",
                    params={"message": "name?", "requestedSchema": {"type": "object"}},
                ),
            )
        )
    )
    assert (kind, session) == ("ToClient", 1)
    # Policy can deny.
    deny_b.append(True)
    [(kind, _, denied)] = unpack(router.handle(ServerMessage("b", msg(id=12, method="elicitation/create", params={}))))
    assert denied["error"]["data"]["reason"] == "denied"


def test_url_elicitation_complete_and_upstream_cancel(router):
    call(router, 2, 1)
    [(_, session, forwarded)] = unpack(
        router.handle(
            ServerMessage(
                "a",
                msg(
                    id=3,
                    method="elicitation/create",
                    params={"mode": "url", "url": "https://example.invalid/x", "elicitationId": "E", "message": "open"},
                ),
            )
        )
    )
    assert session == 2
    router.handle(ClientMessage(2, msg(id=forwarded["id"], result={"action": "accept"})))
    done = unpack(
        router.handle(
            ServerMessage("a", msg(method="notifications/elicitation/complete", params={"elicitationId": "E"}))
        )
    )
    assert done == [
        (
            "ToClient",
            2,
            {"jsonrpc": "2.0", "method": "notifications/elicitation/complete", "params": {"elicitationId": "E"}},
        )
    ]
    # The upstream cancels its own request: the client hears of it under the proxy id.
    [(_, _, forwarded)] = unpack(
        router.handle(ServerMessage("a", msg(id=4, method="sampling/createMessage", params={})))
    )
    out = unpack(router.handle(ServerMessage("a", msg(method="notifications/cancelled", params={"requestId": 4}))))
    assert out == [
        (
            "ToClient",
            2,
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": forwarded["id"]}},
        )
    ]
    assert router.handle(ClientMessage(2, msg(id=forwarded["id"], result={"role": "assistant"}))) == []


def test_client_leaving_answers_pending_reverse_requests(router):
    call(router, 1, 1)
    router.handle(ServerMessage("a", msg(id=5, method="sampling/createMessage", params={})))
    out = unpack(router.handle(ClientDisconnected(1)))
    answers = [o for o in out if o[2].get("id") == 5]
    assert answers and answers[0][1] == "a" and answers[0][2]["error"]["data"]["reason"] == "unavailable"


def test_roots_list_changed_reaches_only_servers_that_see_that_clients_roots(router, clock):
    # Shared servers of a proxy that may have many clients see proxy.roots, not a client's:
    # a client's roots changing is nothing to them.
    assert router.handle(ClientMessage(1, msg(method="notifications/roots/list_changed"))) == []
    # Serving one client only, the shared servers see its roots and are told.
    single = make_router(clock, single_client=True)
    connect(single, 1)
    out = unpack(single.handle(ClientMessage(1, msg(method="notifications/roots/list_changed"))))
    assert sorted(o[1] for o in out) == ["a", "b"]
    # A client without the roots capability has no roots to change.
    single.handle(ClientDisconnected(1))
    connect(single, 2, caps={"sampling": {}})
    assert single.handle(ClientMessage(2, msg(method="notifications/roots/list_changed"))) == []


def test_the_stream_a_request_came_on_names_its_client(router):
    # Both sessions have calls in flight on a: the stdio rule could not choose, but a
    # message on the POST stream of upstream request N belongs to N's client.
    _, one = call(router, 1, "one")
    _, two = call(router, 2, "two")
    sampling = {"messages": [], "maxTokens": 5}
    [(kind, session, forwarded)] = unpack(
        [
            c
            for c in router.handle(
                ServerMessage("a", msg(id=40, method="sampling/createMessage", params=sampling), related=two["id"])
            )
        ]
    )
    assert (kind, session) == ("ToClient", 2)
    [command] = router.handle(
        ServerMessage(
            "a",
            msg(id=41, method="elicitation/create", params={"message": "?", "requestedSchema": {"type": "object"}}),
            related=one["id"],
        )
    )
    assert (command.session, command.related) == (1, "one")  # on the POST stream of client 1's call
    # Without the stream: ambiguous, answered at once.
    [(kind, server, refused)] = unpack(
        router.handle(ServerMessage("a", msg(id=42, method="sampling/createMessage", params=sampling)))
    )
    assert (kind, refused["error"]["data"]["reason"]) == ("ToServer", "ambiguous")
    # On the stream of a request no longer in flight, it belongs to nobody: the one session
    # still in flight there is not asked in its place, and a log line there reaches no one.
    router.handle(ServerMessage("a", msg(id=two["id"], result={})))
    [(kind, _, refused)] = unpack(
        router.handle(
            ServerMessage("a", msg(id=43, method="sampling/createMessage", params=sampling), related=two["id"])
        )
    )
    assert (kind, refused["error"]["data"]["reason"]) == ("ToServer", "ended")
    assert "has ended" in refused["error"]["message"]
    line = {"level": "error", "data": "late"}
    assert router.handle(ServerMessage("a", msg(method="notifications/message", params=line), related=two["id"])) == []
    [to_one] = router.handle(
        ServerMessage("a", msg(method="notifications/message", params=line))
    )  # untagged: stdio rule
    assert to_one.session == 1


def test_related_task_and_progress_token_name_the_client(router):
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(2, msg(id=1, method="tools/call", params={"name": "a__slow", "task": {}})))
    )
    router.handle(ServerMessage("a", msg(id=sent["id"], result={"task": {"taskId": "T1", "status": "working"}})))
    call(router, 1, 1)
    _, two = call(router, 2, 2, token="mine")
    token = two["params"]["_meta"]["progressToken"]
    assert type(token) is str and token.startswith("aggregator-progress-")  # never a server's own by chance
    related = {"_meta": {"io.modelcontextprotocol/related-task": {"taskId": "T1"}}}
    [(_, session, forwarded)] = unpack(
        router.handle(ServerMessage("a", msg(id=1, method="sampling/createMessage", params=related)))
    )
    assert session == 2 and forwarded["params"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"] == "a/T1"
    [command] = router.handle(
        ServerMessage("a", msg(id=2, method="sampling/createMessage", params={"_meta": {"progressToken": token}}))
    )
    assert (command.session, command.related) == (2, 2)
    # Another server naming a's task or token names nothing: b has no calls, two clients.
    [(_, _, refused)] = unpack(
        router.handle(
            ServerMessage(
                "b",
                msg(
                    id=3,
                    method="sampling/createMessage",
                    params={
                        "_meta": {"progressToken": token, "io.modelcontextprotocol/related-task": {"taskId": "T1"}}
                    },
                ),
            )
        )
    )
    assert refused["error"]["data"]["reason"] == "ambiguous"


def test_no_client_connected_is_unavailable(clock):
    router = make_router(clock)
    [(_, _, refused)] = unpack(router.handle(ServerMessage("a", msg(id=1, method="elicitation/create", params={}))))
    assert refused["error"]["data"]["reason"] == "unavailable"
    assert "no client is connected" in refused["error"]["message"]
    assert "outside any one client" not in refused["error"]["message"]


def log_line(router, server, data, level="info", related=None):
    note = msg(method="notifications/message", params={"level": level, "data": data})
    return sorted((c.session, c.related) for c in router.handle(ServerMessage(server, note, related=related)))


def test_log_lines_go_to_their_requests_client_only(router):
    _, one = call(router, 1, "one")
    _, two = call(router, 2, "two")
    assert log_line(router, "a", "x", related=one["id"]) == [(1, "one")]
    assert log_line(router, "a", "y", related=two["id"]) == [(2, "two")]
    # A shared stdio server with both sessions' calls in flight: the line may be either's,
    # so it goes to neither.
    assert log_line(router, "a", "z") == []
    router.handle(ServerMessage("a", msg(id=two["id"], result={})))
    assert log_line(router, "a", "z") == [(1, "one")]  # the one session in flight there
    # Still subject to that client's level.
    router.handle(ClientMessage(1, msg(id=9, method="logging/setLevel", params={"level": "error"})))
    assert log_line(router, "a", "z") == []
    assert log_line(router, "a", "z", level="critical") == [(1, "one")]


def test_log_lines_of_no_request_go_to_sessions_that_asked(router):
    # Nothing in flight: only sessions that sent logging/setLevel, each at its level.
    assert log_line(router, "a", "idle") == []
    router.handle(ClientMessage(2, msg(id=9, method="logging/setLevel", params={"level": "warning"})))
    assert log_line(router, "a", "idle") == []
    assert log_line(router, "a", "idle", level="error") == [(2, None)]
    # An HTTP upstream: a line not on a request's stream belongs to no request, even while
    # one client has calls in flight.
    router.links["a"].streams = True
    call(router, 1, 1)
    assert log_line(router, "a", "get stream", level="error") == [(2, None)]


def test_shared_servers_see_proxy_roots_not_a_clients(clock):
    router = make_router(clock, roots=("file:///srv",))
    connect(router, 1)
    call(router, 1, 1)  # a call in flight: still not this client's roots
    [(kind, server, answer)] = unpack(router.handle(ServerMessage("a", msg(id=7, method="roots/list"))))
    assert (kind, server, answer["result"]) == ("ToServer", "a", {"roots": [{"uri": "file:///srv"}]})
    bare = make_router(clock)
    connect(bare, 1)
    [(_, _, answer)] = unpack(bare.handle(ServerMessage("a", msg(id=7, method="roots/list"), related=None)))
    assert answer["result"] == {"roots": []}
    assert bare.next_deadline() is None  # nothing held


def test_one_client_proxy_holds_roots_until_its_client_is_initialized(clock):
    router = make_router(clock, single_client=True)
    # Asked at startup, before any client: held, not refused.
    assert router.handle(ServerMessage("a", msg(id=1, method="roots/list"))) == []
    router.handle(ClientConnected(1))
    router.handle(
        ClientMessage(
            1,
            msg(
                id=0,
                method="initialize",
                params={"protocolVersion": "2025-11-25", "capabilities": CLIENT_CAPS, "clientInfo": {"name": "c"}},
            ),
        )
    )
    assert router.handle(ServerMessage("b", msg(id=2, method="roots/list"))) == []  # initialize is not enough
    assert router.next_deadline() == pytest.approx(clock.now + 10.0)
    out = unpack(router.handle(ClientMessage(1, msg(method="notifications/initialized"))))
    assert sorted((o[0], o[1], o[2]["method"]) for o in out) == [
        ("ToClient", 1, "roots/list"),
        ("ToClient", 1, "roots/list"),
    ]
    back = {}
    for _, _, forwarded in out:
        [(_, server, answer)] = unpack(
            router.handle(ClientMessage(1, msg(id=forwarded["id"], result={"roots": [{"uri": "file:///mine"}]})))
        )
        back[server] = answer["id"]
    assert back == {"a": 1, "b": 2}
    assert router.roots.held == []


def test_held_roots_fall_back_after_the_bound_and_the_late_client_is_announced(clock):
    router = make_router(clock, single_client=True, roots=("file:///srv",))
    assert router.handle(ServerMessage("a", msg(id=1, method="roots/list"))) == []
    clock.now += 9.9
    assert router.handle(TimePassed()) == []
    clock.now += 0.2
    [(kind, server, answer)] = unpack(router.handle(TimePassed()))
    assert (kind, server, answer) == (
        "ToServer",
        "a",
        {"jsonrpc": "2.0", "id": 1, "result": {"roots": [{"uri": "file:///srv"}]}},
    )
    assert router.next_deadline() is None
    # The client arrives with roots of its own: a (answered in its place) is told to ask again.
    connect_out = []
    router.handle(ClientConnected(1))
    router.handle(
        ClientMessage(
            1,
            msg(
                id=0,
                method="initialize",
                params={"protocolVersion": "2025-11-25", "capabilities": CLIENT_CAPS, "clientInfo": {"name": "c"}},
            ),
        )
    )
    connect_out = unpack(router.handle(ClientMessage(1, msg(method="notifications/initialized"))))
    assert connect_out == [("ToServer", "a", {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})]
    [(_, session, _)] = unpack(router.handle(ServerMessage("a", msg(id=2, method="roots/list"))))
    assert session == 1


def test_held_roots_for_a_client_without_roots_or_one_that_leaves(clock):
    router = make_router(clock, single_client=True)
    router.handle(ServerMessage("a", msg(id=1, method="roots/list")))
    connect(router, 1, caps={"sampling": {}})  # no roots capability: the proxy answers, nothing to announce
    assert router.roots.held == []
    [(kind, _, answer)] = unpack(router.handle(ServerMessage("b", msg(id=2, method="roots/list"))))
    assert (kind, answer["result"]) == ("ToServer", {"roots": []})
    # A client that leaves before it initializes: what was held for it is answered (error).
    router = make_router(clock, single_client=True)
    router.handle(ClientConnected(1))
    router.handle(ServerMessage("a", msg(id=3, method="roots/list")))
    out = unpack(router.handle(ClientDisconnected(1)))
    assert [(o[1], o[2]["id"], o[2]["error"]["data"]["reason"]) for o in out] == [("a", 3, "unavailable")]
    assert router.next_deadline() is None


# --- list changes -----------------------------------------------------------------------


def test_list_changes_are_debounced_into_one_notice(clock):
    router = make_router(clock, debounce=0.1)
    connect(router, 1)
    assert router.handle(ServerItems("a", "tools", [{"name": "x"}])) == []
    assert router.handle(ServerItems("b", "tools", [{"name": "y"}])) == []
    assert router.handle(ServerItems("a", "resources", [])) == []
    assert router.next_deadline() == pytest.approx(clock.now + 0.1)
    clock.now += 0.1
    out = unpack(router.handle(TimePassed()))
    assert sorted(o[2]["method"] for o in out) == [
        "notifications/resources/list_changed",
        "notifications/tools/list_changed",
    ]
    assert router.handle(TimePassed()) == [] and router.next_deadline() is None
    assert router.handle(ServerItems("a", "tools", [{"name": "x"}])) == []  # no visible change
    assert router.next_deadline() is None


# --- tasks ------------------------------------------------------------------------------


def test_task_ids_are_mapped_and_owned(router):
    [(_, _, sent)] = unpack(
        router.handle(
            ClientMessage(
                1, msg(id=1, method="tools/call", params={"name": "a__slow", "arguments": {}, "task": {"ttl": 60000}})
            )
        )
    )
    assert sent["params"]["task"] == {"ttl": 60000}
    [(_, _, created)] = unpack(
        router.handle(
            ServerMessage(
                "a",
                msg(
                    id=sent["id"],
                    result={
                        "task": {
                            "taskId": "T1",
                            "status": "working",
                            "ttl": 60000,
                            "createdAt": "x",
                            "lastUpdatedAt": "x",
                        }
                    },
                ),
            )
        )
    )
    assert created["result"]["task"]["taskId"] == "a/T1"
    [(_, _, get)] = unpack(router.handle(ClientMessage(1, msg(id=2, method="tasks/get", params={"taskId": "a/T1"}))))
    assert get["params"] == {"taskId": "T1"}
    [(_, _, status)] = unpack(
        router.handle(ServerMessage("a", msg(id=get["id"], result={"taskId": "T1", "status": "completed"})))
    )
    assert status["result"]["taskId"] == "a/T1"
    # Status notifications reach the owner only.
    out = unpack(
        router.handle(
            ServerMessage("a", msg(method="notifications/tasks/status", params={"taskId": "T1", "status": "completed"}))
        )
    )
    assert [(o[1], o[2]["params"]["taskId"]) for o in out] == [(1, "a/T1")]
    # Another session cannot touch it, nor can anyone name a task that never existed.
    for key, task in ((2, "a/T1"), (1, "a/T9"), (1, "T1"), (1, "zz/T1")):
        [(_, _, refused)] = unpack(
            router.handle(ClientMessage(key, msg(id=3, method="tasks/cancel", params={"taskId": task})))
        )
        assert refused["error"]["code"] == -32602
    [(_, _, result)] = unpack(
        router.handle(ClientMessage(1, msg(id=4, method="tasks/result", params={"taskId": "a/T1"})))
    )
    out = unpack(
        router.handle(
            ServerMessage(
                "a",
                msg(
                    id=result["id"],
                    result={"content": [], "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "T1"}}},
                ),
            )
        )
    )
    assert out[0][2]["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"] == "a/T1"


def test_tasks_list_gathers_only_the_sessions_own(router):
    [(_, _, sent)] = unpack(
        router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "a__slow", "task": {}})))
    )
    router.handle(ServerMessage("a", msg(id=sent["id"], result={"task": {"taskId": "T1", "status": "working"}})))
    out = unpack(router.handle(ClientMessage(1, msg(id=2, method="tasks/list", params={}))))
    assert sorted(o[1] for o in out) == ["a", "b"]
    ids = {o[1]: o[2]["id"] for o in out}
    assert (
        router.handle(
            ServerMessage(
                "a",
                msg(
                    id=ids["a"],
                    result={"tasks": [{"taskId": "T1", "status": "working"}, {"taskId": "OTHER", "status": "working"}]},
                ),
            )
        )
        == []
    )
    failed = msg(id=ids["b"], error={"code": -32601, "message": "x"})
    [(_, session, answer)] = unpack(router.handle(ServerMessage("b", failed)))
    assert session == 1 and answer == {
        "jsonrpc": "2.0",
        "id": 2,
        "result": {"tasks": [{"taskId": "a/T1", "status": "working"}]},
    }


def test_capabilities_merge(router):
    caps = router.clients[1].advertised
    assert caps["resources"]["subscribe"] is True and "logging" in caps
    assert caps["tasks"] == {"list": {}, "cancel": {}}
    assert router.handshake.upstream_client_capabilities() == {
        "sampling": {},
        "elicitation": {"form": {}, "url": {}},
        "roots": {"listChanged": True},
    }


# --- per-session isolation --------------------------------------------------------------


def per_session_router(clock):
    servers = [ServerConfig(name="p", command="x", isolation="per-session")]
    router = new_router(Catalog(servers, "__", 50), servers, clock=clock, list_changed_debounce=0)
    router.handle(ServerReady("p", {"capabilities": {"tools": {}}}))
    router.handle(ServerItems("p", "tools", [{"name": "t"}]))
    router.handle(StartupCompleted())
    return router


def test_per_session_servers_get_a_connection_per_client(clock):
    router = per_session_router(clock)
    connect(router, 1)
    connect(router, 2, caps={"roots": {}})
    # First use starts the session's own connection and holds the request.
    out = router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "p__t", "arguments": {}})))
    [start] = out
    assert type(start).__name__ == "StartUpstream" and (start.server, start.name, start.session) == ("p", "p@1", 1)
    assert start.capabilities == {
        "sampling": {},
        "roots": {"listChanged": True},
        "elicitation": {"form": {}, "url": {}},
    }
    assert router.handle(ClientMessage(1, msg(id=2, method="tools/call", params={"name": "p__t"}))) == []
    # Ready: the held requests go out on that connection, in order.
    sent = unpack(router.handle(ServerReady("p@1", {"capabilities": {"tools": {}}})))
    assert [(o[1], o[2]["params"]["name"]) for o in sent] == [("p@1", "t"), ("p@1", "t")]
    # Its listing does not touch what clients see; its requests go only to its client.
    assert router.handle(ServerItems("p@1", "tools", [{"name": "other"}])) == []
    [(_, session, forwarded)] = unpack(router.handle(ServerMessage("p@1", msg(id=9, method="roots/list"))))
    assert session == 1
    # The other client gets its own connection, with its own capabilities.
    [start2] = router.handle(ClientMessage(2, msg(id=1, method="tools/call", params={"name": "p__t"})))
    assert start2.name == "p@2" and start2.capabilities == {"roots": {"listChanged": True}}
    # The client leaves: its connection is stopped, what it had in flight is cancelled.
    out = router.handle(ClientDisconnected(1))
    kinds = [type(o).__name__ for o in out]
    assert kinds[-1] == "StopUpstream" and out[-1].name == "p@1" and "p@1" not in router.links
    assert router.handle(ServerMessage("p@1", msg(id=1, result={}))) == []


def test_per_session_start_failure_answers_the_held_requests(clock):
    router = per_session_router(clock)
    connect(router, 1)
    router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "p__t"})))
    out = unpack(router.handle(ServerLost("p@1", "cannot start 'x'")))
    assert [(o[1], o[2]["id"], o[2]["error"]["data"]["reason"]) for o in out] == [(1, 1, "unavailable")]
    assert "p__t" in router.catalog.tools  # the shared listing is untouched


def test_shutting_down_answers_the_requests_waiting_for_a_per_session_start(clock):
    router = per_session_router(clock)
    connect(router, 1)
    router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "p__t"})))
    router.handle(DrainingStarted())
    out = unpack(router.handle(Abandoned("stopping")))
    assert [
        (o[0], o[1], o[2]["id"], o[2]["error"]["data"]["reason"], o[2]["error"]["data"]["server"]) for o in out
    ] == [("ToClient", 1, 1, "unavailable", "p")]
    assert not router.clients[1].in_flight


def test_in_flight_requests_per_session_are_capped(clock):
    router = make_router(clock, max_in_flight=8)
    connect(router, 1)
    connect(router, 2)
    for id in range(8):
        call(router, 1, id)
    [(kind, _, refused)] = unpack(
        router.handle(ClientMessage(1, msg(id=99, method="tools/call", params={"name": "a__slow"})))
    )
    assert kind == "ToClient" and refused["error"]["data"]["reason"] == "overloaded"
    call(router, 2, 0)  # another session is not affected


def test_draining_takes_nothing_new_and_abandon_answers_everyone(router):
    call(router, 1, 1)
    call(router, 2, 1, tool="b__slow")
    router.handle(DrainingStarted())
    [(kind, _, refused)] = unpack(
        router.handle(ClientMessage(1, msg(id=2, method="tools/call", params={"name": "a__fast"})))
    )
    assert kind == "ToClient" and refused["error"]["message"] == "The aggregator is shutting down"
    assert router.in_flight() == 2
    out = unpack(router.handle(Abandoned("stopping")))
    assert sorted((o[1], o[2].get("id")) for o in out if o[0] == "ToClient") == [(1, 1), (2, 1)]
    assert sorted(o[1] for o in out if o[0] == "ToServer") == ["a", "b"]
    assert router.in_flight() == 0
