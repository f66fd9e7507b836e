"""Per-session servers in the router: a session's own connection lists, is announced and
is subscribed to for that session only. Pure: a fake clock, no I/O."""

import pytest

from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.commands import RequestEnded, ToServer
from aggregator.core.events import (
    ClientConnected,
    ClientDisconnected,
    ClientMessage,
    LinkEnded,
    ServerDown,
    ServerItems,
    ServerListing,
    ServerLost,
    ServerMessage,
    ServerReady,
    StartupCompleted,
    TimePassed,
)
from aggregator.core.router import StartUpstream, StopUpstream
from tests.core.helpers import TracedHub, connect, decoded, lifecycle_serves, msg, new_router, own_asks, unpack

SHARED_P = {
    "tools": [{"name": "echo"}, {"name": "trigger-sampling"}],
    "resources": [{"uri": "demo://static/1"}],
    "prompts": [{"name": "hello"}],
}
OWN_P = {
    "tools": [{"name": "echo"}, {"name": "gzip"}],
    "resources": [{"uri": "demo://static/1"}, {"uri": "demo://session/a.gz"}],
    "prompts": [{"name": "hello"}],
}
CAPS = {"capabilities": {"tools": {"listChanged": True}, "prompts": {}, "resources": {"subscribe": True}}}


def make_router(clock, debounce=0.0, **settings):
    servers = [ServerConfig(name="a", command="x"), ServerConfig(name="p", command="x", isolation="per-session")]
    router = new_router(Catalog(servers, "__", 50), servers, clock=clock, list_changed_debounce=debounce, **settings)
    router.handle(ServerReady("a", CAPS))
    router.handle(ServerItems("a", "tools", [{"name": "time"}]))
    router.handle(ServerReady("p", CAPS))
    for kind, items in SHARED_P.items():
        router.handle(ServerItems("p", kind, items))
    router.handle(StartupCompleted())
    connect(router, 1)
    connect(router, 2)
    return router


@pytest.fixture
def router(clock):
    return make_router(clock)


def request(router, session, id, method, **params):
    return unpack(router.handle(ClientMessage(session, msg(id=id, method=method, params=params))))


def names(router, session, method="tools/list", kind="tools", key="name"):
    [(_, _, page)] = request(router, session, 99, method)
    return [item[key] for item in page["result"][kind]]


def own_connection(router, session, listing=OWN_P):
    """The session's first request to p starts its connection, which then lists."""
    out = router.handle(ClientMessage(session, msg(id=50, method="tools/call", params={"name": "p__echo"})))
    assert [type(c) for c in out] == [StartUpstream] and out[0].name == f"p@{session}"
    sent = unpack(router.handle(ServerReady(f"p@{session}", CAPS)))
    assert [(kind, server, m["method"]) for kind, server, m in sent] == [("ToServer", f"p@{session}", "tools/call")]
    router.handle(ServerMessage(f"p@{session}", msg(id=sent[0][2]["id"], result={"content": []})))
    return unpack(router.handle(ServerListing(f"p@{session}", listing)))


def notices(out):
    return sorted(
        (session, message["method"]) for kind, session, message in out if kind == "ToClient" and "id" not in message
    )


def test_sessions_without_own_servers_use_their_profiles_catalog(router):
    assert router.clients[1].catalog is router.catalogs["default"] and not router.views
    # The own connection's first answer is no listing: nothing changes until it lists.
    router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "p__echo"})))
    router.handle(ServerReady("p@1", CAPS))
    assert router.handle(ServerItems("p@1", "tools", [{"name": "other"}])) == []
    assert router.clients[1].catalog is router.catalogs["default"]


def test_a_session_sees_its_own_listing_once_its_connection_has_listed(router):
    assert "p__trigger-sampling" in names(router, 1)
    out = own_connection(router, 1)
    # Announced to that session only, for the kinds that changed for it.
    assert notices(out) == [(1, "notifications/resources/list_changed"), (1, "notifications/tools/list_changed")]
    assert names(router, 1) == ["a__time", "p__echo", "p__gzip"]
    assert names(router, 2) == ["a__time", "p__echo", "p__trigger-sampling"]
    assert "p+demo://session/a.gz" in names(router, 1, "resources/list", "resources", "uri")
    assert "p+demo://session/a.gz" not in names(router, 2, "resources/list", "resources", "uri")
    # Routing by name and URI follows the same view.
    [(_, server, sent)] = request(router, 1, 1, "tools/call", name="p__gzip")
    assert (server, sent["params"]["name"]) == ("p@1", "gzip")
    [(_, _, refused)] = request(router, 2, 1, "tools/call", name="p__gzip")
    assert refused["error"]["code"] == -32602 and "Unknown tool: p__gzip" in refused["error"]["message"]
    [(_, server, sent)] = request(router, 1, 2, "resources/read", uri="p+demo://session/a.gz")
    assert (server, sent["params"]["uri"]) == ("p@1", "demo://session/a.gz")
    [(_, server, sent)] = request(
        router,
        1,
        3,
        "completion/complete",
        ref={"type": "ref/prompt", "name": "p__hello"},
        argument={"name": "x", "value": ""},
    )
    assert (server, sent["params"]["ref"]["name"]) == ("p@1", "hello")
    [(_, _, refused)] = request(router, 1, 4, "tools/call", name="p__trigger-sampling")
    assert "Unknown tool" in refused["error"]["message"]  # its own server does not offer it


def test_list_changed_from_an_own_connection_relists_it_and_tells_its_session_only(clock):
    router = make_router(clock, debounce=0.05)
    own_connection(router, 1)
    clock.now += 1
    router.handle(TimePassed())
    lifecycle_serves(router, "p@1", CAPS["capabilities"], OWN_P)  # its connection, through its lifecycle
    relist = router.handle(ServerMessage("p@1", msg(method="notifications/tools/list_changed")))
    assert [(c.server, m["method"]) for c, m in zip(relist, own_asks(relist), strict=True)] == [("p@1", "tools/list")]
    more = [*OWN_P["resources"], {"uri": "demo://session/b.gz"}]
    assert router.handle(ServerItems("p@1", "resources", more)) == []  # debounced
    assert router.handle(ServerItems("p@1", "resources", more)) == []
    assert router.handle(ServerItems("p@1", "tools", OWN_P["tools"])) == []  # unchanged: nothing due
    clock.now += 0.05
    assert notices(unpack(router.handle(TimePassed()))) == [(1, "notifications/resources/list_changed")]
    assert "p+demo://session/b.gz" in names(router, 1, "resources/list", "resources", "uri")


def test_a_change_of_a_shared_server_reaches_every_session_that_sees_it(router):
    own_connection(router, 1)
    assert notices(unpack(router.handle(ServerItems("a", "tools", [{"name": "time"}, {"name": "zone"}])))) == [
        (1, "notifications/tools/list_changed"),
        (2, "notifications/tools/list_changed"),
    ]
    assert "a__zone" in names(router, 1) and "a__zone" in names(router, 2)
    # The shared listing of p is what session 2 sees; session 1 sees its own.
    assert notices(unpack(router.handle(ServerItems("p", "tools", [{"name": "echo"}])))) == [
        (2, "notifications/tools/list_changed")
    ]
    assert names(router, 1) == ["a__time", "a__zone", "p__echo", "p__gzip"]
    assert notices(unpack(router.handle(ServerLost("a", "crashed")))) == [
        (1, "notifications/tools/list_changed"),
        (2, "notifications/tools/list_changed"),
    ]
    assert names(router, 1) == ["p__echo", "p__gzip"]


def test_a_notice_due_to_a_profile_still_reaches_a_session_that_gets_its_own_view(clock):
    router = make_router(clock, debounce=0.05)
    clock.now += 1
    router.handle(TimePassed())
    router.handle(ServerItems("a", "tools", [{"name": "zone"}]))  # due to every session in 50 ms
    out = own_connection(router, 1)
    assert out == []
    clock.now += 0.05
    assert notices(unpack(router.handle(TimePassed()))) == [
        (1, "notifications/resources/list_changed"),
        (1, "notifications/tools/list_changed"),
        (2, "notifications/tools/list_changed"),
    ]


def test_subscriptions_are_per_connection_and_updates_go_to_their_session(router):
    uri = "p+demo://static/1"
    # Session 1's first request to p is a subscribe: held while its connection starts.
    [start] = router.handle(ClientMessage(1, msg(id=1, method="resources/subscribe", params={"uri": uri})))
    assert type(start) is StartUpstream
    [(_, server, sent)] = unpack(router.handle(ServerReady("p@1", CAPS)))
    assert (server, sent["method"], sent["params"]["uri"]) == ("p@1", "resources/subscribe", "demo://static/1")
    [(_, session, answer)] = unpack(router.handle(ServerMessage("p@1", msg(id=sent["id"], result={}))))
    assert (session, answer) == (1, {"jsonrpc": "2.0", "id": 1, "result": {}})
    # Session 2 subscribes to the same URI: on its own connection, not counted as done.
    [start] = router.handle(ClientMessage(2, msg(id=1, method="resources/subscribe", params={"uri": uri})))
    [(_, server, sent)] = unpack(router.handle(ServerReady("p@2", CAPS)))
    assert (server, sent["method"]) == ("p@2", "resources/subscribe")
    router.handle(ServerMessage("p@2", msg(id=sent["id"], result={})))
    update = msg(method="notifications/resources/updated", params={"uri": "demo://static/1"})
    assert unpack(router.handle(ServerMessage("p@1", update))) == [
        ("ToClient", 1, {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri}})
    ]
    assert [s for _, s, _ in unpack(router.handle(ServerMessage("p@2", update)))] == [2]
    # Unsubscribing goes to the session's own connection; its updates stop.
    [(_, server, sent)] = request(router, 1, 2, "resources/unsubscribe", uri=uri)
    assert (server, sent["method"]) == ("p@1", "resources/unsubscribe")
    assert router.handle(ServerMessage("p@1", update)) == []
    # The shared listing connection never hears of them.
    assert router.subscriptions.of_server("p") == []


def test_a_subscribe_that_never_reached_its_connection_is_not_kept(router):
    uri = "p+demo://static/1"
    router.handle(ClientMessage(1, msg(id=1, method="resources/subscribe", params={"uri": uri})))
    [(_, session, error)] = unpack(router.handle(ServerLost("p@1", "cannot start 'x'")))
    assert (session, error["error"]["data"]["reason"]) == (1, "unavailable")
    router.handle(LinkEnded("p@1"))  # as the hub does for a connection that ended before it was ready
    assert "p@1" not in router.links
    # Asked again, it is really made (not answered "already subscribed").
    [start] = router.handle(ClientMessage(1, msg(id=2, method="resources/subscribe", params={"uri": uri})))
    assert type(start) is StartUpstream
    [(_, server, sent)] = unpack(router.handle(ServerReady("p@1", CAPS)))
    assert (server, sent["method"]) == ("p@1", "resources/subscribe")


def test_a_restarted_own_connection_renews_its_sessions_subscriptions(router):
    own_connection(router, 1)
    [(_, _, sent)] = request(router, 1, 1, "resources/subscribe", uri="p+demo://static/1")
    router.handle(ServerMessage("p@1", msg(id=sent["id"], result={})))
    out = unpack(router.handle(ServerLost("p@1", "crashed")))
    # It sees the shared listing again, and is told so.
    assert notices(out) == [(1, "notifications/resources/list_changed"), (1, "notifications/tools/list_changed")]
    assert 1 not in router.views and router.clients[1].catalog is router.catalogs["default"]
    assert names(router, 1) == names(router, 2)
    router.handle(LinkEnded("p@1"))
    assert "p@1" not in router.links
    router.handle(ClientMessage(1, msg(id=2, method="tools/call", params={"name": "p__echo"})))
    sent = unpack(router.handle(ServerReady("p@1", CAPS)))
    assert [(m["method"], m["params"].get("uri")) for _, _, m in sent] == [
        ("resources/subscribe", "demo://static/1"),
        ("tools/call", None),
    ]


def test_a_session_that_leaves_takes_its_view_and_connection_with_it(router):
    own_connection(router, 1)
    own_connection(router, 2, {"tools": [{"name": "only-two"}]})
    request(router, 1, 1, "resources/subscribe", uri="p+demo://static/1")
    out = router.handle(ClientDisconnected(1))
    assert StopUpstream("p@1") in out and "p@1" not in router.links
    assert not any(type(c).__name__ == "ToClient" for c in out)  # nobody else is told anything
    assert 1 not in router.views and 2 in router.views and router.subscriptions.of_server("p@1") == []
    assert names(router, 2) == ["a__time", "p__only-two"]
    assert router.handle(ServerListing("p@1", OWN_P)) == [] and router.handle(ServerItems("p@1", "tools", [])) == []


def test_instructions_name_each_configured_server_once_never_a_sessions_connection(clock):
    router = make_router(clock)
    router.handle(ServerReady("p", dict(CAPS, instructions="Use p for demos.")))
    own_connection(router, 1)
    router.links["p@1"].instructions = "Use p for demos."  # its own connection says the same
    router.handle(ClientConnected(3))
    [(_, _, answer)] = unpack(
        router.handle(
            ClientMessage(
                3, msg(id=0, method="initialize", params={"protocolVersion": "2025-11-25", "capabilities": {}})
            )
        )
    )
    instructions = answer["result"]["instructions"]
    assert instructions.count("## Server p ") == 1 and "p@" not in instructions


def test_tasks_list_asks_the_shared_servers_and_the_sessions_own_connections_only(clock):
    router = make_router(clock)
    tasks = dict(CAPS["capabilities"], tasks={"list": {}})
    router.handle(ServerReady("a", {"capabilities": tasks}))
    router.handle(ServerReady("p", {"capabilities": tasks}))
    for session in (1, 2):
        own_connection(router, session)
        router.handle(ServerReady(f"p@{session}", {"capabilities": tasks}))
    asked = sorted(server for kind, server, _ in request(router, 1, 7, "tasks/list") if kind == "ToServer")
    # Not session 2's connection (its tasks are never session 1's), nor p's shared listing
    # connection (no client's request ever runs there).
    assert asked == ["a", "p@1"]


def test_a_request_held_while_its_sessions_connection_starts_is_in_flight(router):
    [start] = router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "p__echo"})))
    assert type(start) is StartUpstream
    # Its id is taken: a second request with it is refused, not dropped unanswered later.
    [(_, _, refused)] = request(router, 1, 1, "tools/call", name="p__echo")
    assert refused["error"]["code"] == -32600 and "already in use" in refused["error"]["message"]
    # Cancelled while it waits: it never reaches the server.
    router.handle(ClientMessage(1, msg(id=2, method="tools/call", params={"name": "p__echo", "arguments": {"n": 2}})))
    assert router.handle(ClientMessage(1, msg(method="notifications/cancelled", params={"requestId": 2}))) == [
        RequestEnded(1, 2)
    ]
    sent = unpack(router.handle(ServerReady("p@1", CAPS)))
    assert [(server, m["method"], m["params"].get("arguments")) for _, server, m in sent] == [
        ("p@1", "tools/call", None)
    ]
    [(_, session, answer)] = unpack(
        router.handle(ServerMessage("p@1", msg(id=sent[0][2]["id"], result={"content": []})))
    )
    assert (session, answer["id"]) == (1, 1)
    # The id is free again once answered.
    [(_, server, _)] = request(router, 1, 2, "tools/call", name="p__echo")
    assert server == "p@1"


def test_a_new_session_uses_its_own_connection_while_the_listing_connection_restarts(router):
    # The shared connection that lists p is lost: p's items leave the catalog, but p is a
    # per-session server, so a new session's call by name still starts its own connection
    # (not "restarting, next attempt in ..."), under the server's own name.
    router.handle(ServerLost("p", "the server exited with status 1"))
    router.handle(ServerDown("p", "the server exited with status 1", 28.0))
    out = router.handle(ClientMessage(2, msg(id=7, method="tools/call", params={"name": "p__echo"})))
    assert [type(c) for c in out] == [StartUpstream] and out[0].name == "p@2"
    sent = unpack(router.handle(ServerReady("p@2", CAPS)))
    assert [(server, m["method"], m["params"]["name"]) for _, server, m in sent] == [("p@2", "tools/call", "echo")]
    # Its resources and prompt completions too.
    out = router.handle(ClientMessage(2, msg(id=8, method="resources/read", params={"uri": "p+demo://static/1"})))
    out += router.handle(
        ClientMessage(
            2,
            msg(
                id=9,
                method="completion/complete",
                params={"ref": {"type": "ref/prompt", "name": "p__hello"}, "argument": {"name": "x", "value": ""}},
            ),
        )
    )
    assert [(c.server, c.message["method"]) for c in out] == [("p@2", "resources/read"), ("p@2", "completion/complete")]
    # A shared server that is out (for longer than a request may wait) still answers unavailable.
    router.handle(ServerLost("a", "gone"))
    router.handle(ServerDown("a", "gone", 600.0))
    [(_, _, refused)] = request(router, 2, 10, "tools/call", name="a__time")
    assert refused["error"]["data"]["reason"] == "unavailable"


def test_find_tools_searches_a_sessions_own_listing(clock):
    """In search mode, a session with its own per-session connection finds its own tools
    (gzip), and the other session does not."""
    from aggregator.core.settings import Discovery

    router = make_router(clock, discovery={"default": Discovery(mode="search")})
    assert names(router, 1) == ["find_tools", "call_tool"]

    def found(session, query):
        [(_, _, answer)] = request(router, session, 7, "tools/call", name="find_tools", arguments={"query": query})
        return [tool["name"] for tool in answer["result"]["structuredContent"]["tools"]]

    assert "p__gzip" not in found(1, "gzip")
    own_connection(router, 1)
    assert found(1, "gzip") == ["p__gzip"]
    assert found(2, "gzip") == []


def test_a_request_held_for_its_own_connection_is_traced_when_sent(router):
    """The first request to a per-session server waits for its session's connection and
    leaves with that connection's ready event, not with its client's message: it gets its
    client span and carries its trace context all the same (``Router.watch_held``)."""
    hub = TracedHub(router)
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    call = {"jsonrpc": "2.0", "id": 50, "method": "tools/call", "params": {"name": "p__echo"}}
    call["params"]["_meta"] = {"traceparent": parent}
    assert [type(c) for c in hub.request(1, call)] == [StartUpstream]
    [sent] = [c for c in router.handle(ServerReady("p@1", CAPS)) if type(c) is ToServer]
    assert sent.server == "p@1"
    meta = decoded(sent.message)["params"]["_meta"]
    assert meta["traceparent"].startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-") and meta["traceparent"] != parent
    hub.answered(router.handle(ServerMessage("p@1", msg(id=decoded(sent.message)["id"], result={"content": []}))))
    server, client = hub.spans("tools/call")
    assert format(server.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert client.name == "tools/call p@1" and client.parent.span_id == server.context.span_id
    assert meta["traceparent"] == f"00-4bf92f3577b34da6a3ce929d0e0e4736-{client.context.span_id:016x}-01"
    # Sent at once now: traced by its own routing, once (the held path does not see it).
    hub.request(1, {"jsonrpc": "2.0", "id": 51, "method": "tools/call", "params": {"name": "p__echo"}})
    assert len(hub.tracing._open[1][51].upstream) == 1
