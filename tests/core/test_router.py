"""The router as a pure function: events in, commands out, several clients, two servers."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.commands import RequestEnded
from aggregator.core.events import (
    ClientConnected,
    ClientDisconnected,
    ClientMessage,
    ServerDown,
    ServerItems,
    ServerLost,
    ServerMessage,
    ServerOversized,
    ServerReady,
    StartupCompleted,
)
from aggregator.core.router import ToClient, ToServer, WaitForStartup
from aggregator.jsonrpc import dumps
from tests.core.helpers import decoded, msg, new_router


@pytest.fixture
def router(clock):
    servers = [
        ServerConfig(name="a", command="x", request_timeout=5.0, max_request_timeout=20.0),
        ServerConfig(name="b", command="x", prefix="", timeout_resets_on_progress=False),
    ]
    catalog = Catalog(servers, "__", 3)
    r = new_router(catalog, servers, clock=clock, list_changed_debounce=0)
    for name, caps in (
        (
            "a",
            {
                "tools": {},
                "resources": {"subscribe": True},
                "prompts": {},
                "completions": {},
                "logging": {},
                "tasks": {"list": {}, "cancel": {}},
            },
        ),
        ("b", {"tools": {}, "logging": {}}),
    ):
        r.handle(
            ServerReady(
                name,
                {
                    "protocolVersion": "2025-06-18",
                    "capabilities": caps,
                    "serverInfo": {"name": "server"},
                    "instructions": f"use {name}",
                },
            )
        )
    r.handle(ServerItems("a", "tools", [{"name": "echo", "x-new": 1}, {"name": "slow"}]))
    r.handle(ServerItems("a", "prompts", [{"name": "greet"}]))
    r.handle(ServerItems("a", "resources", [{"uri": "fake://doc/1"}]))
    r.handle(ServerItems("a", "resourceTemplates", [{"uriTemplate": "fake://doc/{id}"}]))
    r.handle(ServerItems("b", "tools", [{"name": "echo"}]))
    r.handle(StartupCompleted())
    for key in (1, 2):
        r.handle(ClientConnected(key))
        out = r.handle(
            ClientMessage(
                key,
                msg(
                    id=0,
                    method="initialize",
                    params={
                        "protocolVersion": "2025-06-18",
                        "capabilities": {"sampling": {}, "roots": {}, "elicitation": {}},
                        "clientInfo": {"name": "t"},
                    },
                ),
            )
        )
        assert decoded(out[0].message)["result"]["protocolVersion"] == "2025-06-18"
        r.handle(ClientMessage(key, msg(method="notifications/initialized")))
    return r


def only(commands, kind):
    [command] = commands
    assert type(command) is kind
    return command, decoded(command.message)


def test_initialize_result():
    servers = [ServerConfig(name="a", command="x")]
    r = new_router(Catalog(servers, "__", 3), servers)
    r.handle(ClientConnected(1))
    assert r.handle(ClientMessage(1, msg(id=1, method="initialize", params={}))) == [WaitForStartup(1)]
    r.handle(ServerReady("a", {"capabilities": {"tools": {}}, "instructions": "Be nice."}))
    r.handle(StartupCompleted())
    _, answer = only(
        r.handle(ClientMessage(1, msg(id=1, method="initialize", params={"protocolVersion": "1999-01-01"}))), ToClient
    )
    result = answer["result"]
    assert result["protocolVersion"] == "2025-11-25"  # unknown proposal: our newest
    assert result["capabilities"] == {"tools": {"listChanged": True}, "logging": {}}
    assert result["serverInfo"]["name"] == "aggregator"
    assert "Be nice." in result["instructions"] and "a__" in result["instructions"]
    _, again = only(r.handle(ClientMessage(1, msg(id=2, method="initialize", params={}))), ToClient)
    assert again["error"]["code"] == -32600


def test_before_initialize_and_discover():
    servers = [ServerConfig(name="a", command="x")]
    r = new_router(Catalog(servers, "__", 3), servers)
    r.handle(ClientConnected(1))
    _, answer = only(r.handle(ClientMessage(1, msg(id=5, method="tools/list"))), ToClient)
    assert answer["id"] == 5 and answer["error"]["code"] == -32600
    _, answer = only(r.handle(ClientMessage(1, msg(id=6, method="server/discover", params={}))), ToClient)
    assert answer["result"]["supportedVersions"][-1] == "2024-11-05"  # a dual-era client's probe
    _, answer = only(r.handle(ClientMessage(1, msg(id=7, method="ping"))), ToClient)
    assert answer == {"jsonrpc": "2.0", "id": 7, "result": {}}
    assert r.handle(ClientMessage(1, msg(method="notifications/whatever"))) == []
    _, answer = only(r.handle(ClientMessage(1, b'{"jsonrpc":"2.0","method":')), ToClient)
    assert answer["id"] is None and answer["error"]["code"] == -32700


def test_two_clients_same_id_are_never_cross_wired(router):
    ((s1, m1),) = [
        (c, decoded(c.message))
        for c in router.handle(
            ClientMessage(1, msg(id=7, method="tools/call", params={"name": "a__echo", "arguments": {"n": 1}}))
        )
    ]
    ((s2, m2),) = [
        (c, decoded(c.message))
        for c in router.handle(
            ClientMessage(2, msg(id=7, method="tools/call", params={"name": "a__echo", "arguments": {"n": 2}}))
        )
    ]
    assert s1.server == s2.server == "a"
    assert m1["id"] != m2["id"] and m1["params"]["name"] == "echo"
    # Answer the second first.
    _, back2 = only(router.handle(ServerMessage("a", msg(id=m2["id"], result={"n": 2}))), ToClient)
    back1_cmd, back1 = only(router.handle(ServerMessage("a", msg(id=m1["id"], result={"n": 1}))), ToClient)
    assert back1 == {"jsonrpc": "2.0", "id": 7, "result": {"n": 1}} and back1_cmd.session == 1
    assert back2["result"] == {"n": 2}
    assert router.handle(ServerMessage("a", msg(id=m1["id"], result={}))) == []  # duplicate: dropped
    assert router.clients[1].in_flight == {} and router.links["a"].pending == {}


def test_duplicate_in_flight_id_is_refused(router):
    router.handle(ClientMessage(1, msg(id="x", method="tools/call", params={"name": "a__slow"})))
    _, answer = only(
        router.handle(ClientMessage(1, msg(id="x", method="tools/call", params={"name": "echo"}))), ToClient
    )
    assert answer["id"] == "x" and answer["error"]["code"] == -32600
    assert len(router.links["a"].pending) == 1 and router.links["b"].pending == {}


@pytest.mark.parametrize("name", ["nope", "a__nope", "A__echo", " a__echo", "a__echo\u200b", "slow", 5])
def test_unknown_names_never_reach_a_server(router, name):
    _, answer = only(router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": name}))), ToClient)
    assert answer["error"]["code"] == -32602
    assert router.links["a"].pending == {} and router.links["b"].pending == {}


def test_unprefixed_server_and_passthrough_of_everything_else(router):
    raw = msg(
        id=3,
        method="tools/call",
        params={
            "name": "echo",
            "arguments": {"big": 123456789012345678901234567890},
            "_meta": {"x": 1},
            "newField": [1],
        },
    )
    command, sent = only(router.handle(ClientMessage(1, raw)), ToServer)
    assert command.server == "b" and sent["params"]["_meta"] == {"x": 1} and sent["params"]["newField"] == [1]
    assert b"123456789012345678901234567890" in dumps(command.message)
    reply = msg(id=sent["id"], error={"code": -32042, "message": "no", "data": {"d": 1}})
    _, back = only(router.handle(ServerMessage("b", reply)), ToClient)
    assert back == {"jsonrpc": "2.0", "id": 3, "error": {"code": -32042, "message": "no", "data": {"d": 1}}}


def test_lists_are_paged_from_the_catalog(router):
    _, page = only(router.handle(ClientMessage(1, msg(id=1, method="tools/list"))), ToClient)
    assert [t["name"] for t in page["result"]["tools"]] == ["a__echo", "a__slow", "echo"]
    assert page["result"]["tools"][0]["x-new"] == 1
    assert "nextCursor" not in page["result"]
    _, forged = only(router.handle(ClientMessage(1, msg(id=2, method="tools/list", params={"cursor": "zz"}))), ToClient)
    assert forged["id"] == 2 and forged["error"]["code"] == -32602


def test_resources_and_uris_both_ways(router):
    _, page = only(router.handle(ClientMessage(1, msg(id=1, method="resources/list"))), ToClient)
    assert page["result"]["resources"] == [{"uri": "a+fake://doc/1"}]
    command, sent = only(
        router.handle(ClientMessage(1, msg(id=2, method="resources/read", params={"uri": "a+fake://doc/9"}))), ToServer
    )
    assert sent["params"]["uri"] == "fake://doc/9"
    _, back = only(
        router.handle(
            ServerMessage("a", msg(id=sent["id"], result={"contents": [{"uri": "fake://doc/9", "text": "t"}]}))
        ),
        ToClient,
    )
    assert back["result"]["contents"][0]["uri"] == "a+fake://doc/9"
    # Links in tool results and prompts.
    _, sent = only(
        router.handle(ClientMessage(1, msg(id=3, method="tools/call", params={"name": "a__echo"}))), ToServer
    )
    _, back = only(
        router.handle(
            ServerMessage(
                "a",
                msg(
                    id=sent["id"],
                    result={
                        "content": [
                            {"type": "resource_link", "uri": "fake://doc/1"},
                            {"type": "resource", "resource": {"uri": "fake://doc/2"}},
                            {"type": "text", "text": "fake://doc/3"},
                        ]
                    },
                ),
            )
        ),
        ToClient,
    )
    assert [c.get("uri") or c.get("resource", {}).get("uri") or c["text"] for c in back["result"]["content"]] == [
        "a+fake://doc/1",
        "a+fake://doc/2",
        "fake://doc/3",
    ]
    _, sent = only(
        router.handle(ClientMessage(1, msg(id=4, method="prompts/get", params={"name": "a__greet"}))), ToServer
    )
    assert sent["params"]["name"] == "greet"
    _, back = only(
        router.handle(
            ServerMessage(
                "a",
                msg(
                    id=sent["id"],
                    result={"messages": [{"role": "user", "content": {"type": "resource_link", "uri": "fake://x"}}]},
                ),
            )
        ),
        ToClient,
    )
    assert back["result"]["messages"][0]["content"]["uri"] == "a+fake://x"
    _, unknown = only(
        router.handle(ClientMessage(1, msg(id=5, method="resources/read", params={"uri": "file:///etc/passwd"}))),
        ToClient,
    )
    assert unknown["error"]["code"] == -32602


def test_completion_refs(router):
    _, sent = only(
        router.handle(
            ClientMessage(
                1,
                msg(
                    id=1,
                    method="completion/complete",
                    params={
                        "ref": {"type": "ref/prompt", "name": "a__greet"},
                        "argument": {"name": "who", "value": ""},
                    },
                ),
            )
        ),
        ToServer,
    )
    assert sent["params"]["ref"] == {"type": "ref/prompt", "name": "greet"}
    _, sent = only(
        router.handle(
            ClientMessage(
                1,
                msg(
                    id=2,
                    method="completion/complete",
                    params={
                        "ref": {"type": "ref/resource", "uri": "a+fake://doc/{id}"},
                        "argument": {"name": "id", "value": ""},
                    },
                ),
            )
        ),
        ToServer,
    )
    assert sent["params"]["ref"]["uri"] == "fake://doc/{id}"
    _, bad = only(
        router.handle(
            ClientMessage(
                1, msg(id=3, method="completion/complete", params={"ref": {"type": "ref/prompt", "name": "nope"}})
            )
        ),
        ToClient,
    )
    assert bad["error"]["code"] == -32602


def test_server_lost_fails_pending_at_once_and_hides_items(router):
    _, sent = only(
        router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "a__slow"}))), ToServer
    )
    out = router.handle(ServerLost("a", "the server exited with status 1"))
    errors = [decoded(c.message) for c in out if "id" in decoded(c.message)]
    assert errors == [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "error": {
                "code": -32603,
                "message": "Server 'a' stopped before answering: the server exited with status 1",
                "data": {"source": "aggregator", "reason": "unavailable", "server": "a"},
            },
        }
    ]
    notices = sorted((c.session, decoded(c.message)["method"]) for c in out if "id" not in decoded(c.message))
    assert (1, "notifications/tools/list_changed") in notices and (2, "notifications/prompts/list_changed") in notices
    assert "a__echo" not in router.catalog.tools
    # Its names are not unknown while it restarts (aggregator.core.catalogs.outages; more in test_outages).
    assert router.handle(ServerDown("a", "the server exited with status 1", 30.0)) == []
    _, answer = only(
        router.handle(ClientMessage(1, msg(id=2, method="tools/call", params={"name": "a__echo"}))), ToClient
    )
    assert answer["error"]["data"]["reason"] == "unavailable"
    assert router.handle(ServerMessage("a", msg(id=sent["id"], result={}))) == []  # late: dropped


def test_cancellation_is_routed_with_the_upstream_id(router):
    _, sent = only(
        router.handle(ClientMessage(2, msg(id=9, method="tools/call", params={"name": "a__slow"}))), ToServer
    )
    *forwarded, ended = router.handle(
        ClientMessage(2, msg(method="notifications/cancelled", params={"requestId": 9, "reason": "user"}))
    )
    assert ended == RequestEnded(2, 9)  # no answer: the client's front is told it ended
    command, cancel = only(forwarded, ToServer)
    assert command.server == "a" and cancel["params"] == {"requestId": sent["id"], "reason": "user"}
    assert router.handle(ServerMessage("a", msg(id=sent["id"], result={}))) == []  # late response dropped
    # Unknown, finished or malformed cancels are ignored.
    for params in ({"requestId": 9}, {"requestId": 12345}, {}, {"requestId": None}):
        assert router.handle(ClientMessage(2, msg(method="notifications/cancelled", params=params))) == []
    assert router.handle(ClientMessage(2, msg(method="notifications/cancelled"))) == []


def test_client_gone_cancels_its_work(router):
    _, sent = only(
        router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "a__slow"}))), ToServer
    )
    router.handle(ClientMessage(2, msg(id=1, method="tools/call", params={"name": "a__slow"})))
    command, cancel = only(router.handle(ClientDisconnected(1)), ToServer)
    assert cancel["method"] == "notifications/cancelled" and cancel["params"]["requestId"] == sent["id"]
    assert len(router.links["a"].pending) == 1  # client 2's call is untouched
    assert router.handle(ServerMessage("a", msg(id=sent["id"], result={}))) == []


def test_upstream_messages(router):
    assert router.handle(ServerMessage("a", b"garbage")) == []
    assert router.handle(ServerMessage("a", msg(id=99999, result={}))) == []
    _, pong = only(router.handle(ServerMessage("a", msg(id="s1", method="ping"))), ToServer)
    assert pong == {"jsonrpc": "2.0", "id": "s1", "result": {}}
    _, refused = only(router.handle(ServerMessage("a", msg(id="s2", method="foo/bar", params={}))), ToServer)
    assert refused["id"] == "s2" and refused["error"]["code"] == -32601
    assert refused["error"]["data"]["source"] == "aggregator"


def test_list_changed_only_when_visible_change(router):
    assert router.handle(ServerItems("a", "tools", [{"name": "echo", "x-new": 1}, {"name": "slow"}])) == []
    out = router.handle(ServerItems("a", "tools", [{"name": "echo"}]))
    assert sorted(c.session for c in out) == [1, 2]
    assert {decoded(c.message)["method"] for c in out} == {"notifications/tools/list_changed"}


def test_numbers_in_results_are_unchanged(router):
    _, sent = only(
        router.handle(ClientMessage(1, msg(id=1, method="tools/call", params={"name": "a__echo"}))), ToServer
    )
    raw = (
        b'{"jsonrpc":"2.0","id":'
        + str(sent["id"]).encode()
        + b',"result":{"content":[],"structuredContent":{"n":123456789012345678901234567890,"f":1.10}}}'
    )
    command, _ = only(router.handle(ServerMessage("a", raw)), ToClient)
    assert b'"n":123456789012345678901234567890' in dumps(command.message)
    assert json.loads(dumps(command.message))["id"] == 1


def test_oversized_answer_fails_its_request(router):
    _, sent = only(
        router.handle(ClientMessage(1, msg(id="big", method="tools/call", params={"name": "a__echo"}))), ToServer
    )
    head = b'{"jsonrpc":"2.0","id":' + str(sent["id"]).encode() + b',"result":{"content":[{"type":"text","text":"xx'
    _, error = only(router.handle(ServerOversized("a", head, 1000)), ToClient)
    assert error["id"] == "big" and error["error"]["data"]["reason"] == "too_large"
    assert router.clients[1].in_flight == {} and router.links["a"].pending == {}
    assert router.handle(ServerOversized("a", head, 1000)) == []  # already failed
    assert router.handle(ServerOversized("a", b'{"method":"notifications/message","params":{"id":1,', 1000)) == []


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
envelopes = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2]),
        "id": st.one_of(st.integers(), st.text(max_size=5), st.none(), st.booleans(), st.floats(allow_nan=False)),
        "method": st.one_of(
            st.sampled_from(
                [
                    "tools/call",
                    "tools/list",
                    "prompts/get",
                    "resources/read",
                    "completion/complete",
                    "ping",
                    "initialize",
                    "notifications/cancelled",
                    "x/y",
                ]
            ),
            json_values,
        ),
        "params": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "name": st.one_of(st.sampled_from(["a__echo", "echo", "a__greet"]), json_values),
                    "uri": st.one_of(st.just("a+fake://doc/1"), json_values),
                    "cursor": json_values,
                    "ref": json_values,
                    "requestId": json_values,
                    "arguments": json_values,
                },
            ),
            json_values,
        ),
        "result": json_values,
        "error": json_values,
    },
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(envelopes.map(dumps), json_values.map(dumps), st.binary(max_size=64)))
def test_fuzz_one_answer_per_request_none_to_notifications(router, raw):
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    out = router.handle(ClientMessage(1, raw))
    answers = [decoded(c.message) for c in out if type(c) is ToClient]
    for answer in answers:
        assert answer["jsonrpc"] == "2.0" and ("result" in answer) != ("error" in answer)
        if "error" in answer:
            assert type(answer["error"]["code"]) is int and answer["error"]["message"]
    is_request = (
        type(value) is dict
        and value.get("jsonrpc") == "2.0"
        and type(value.get("method")) is str
        and type(value.get("id")) in (int, str)
        and type(value.get("params", {})) is dict
    )
    # A well-formed JSON-RPC notification (params absent, an object or an array) is never
    # answered; a malformed one is an invalid request, answered with id null.
    is_notification = (
        type(value) is dict
        and value.get("jsonrpc") == "2.0"
        and type(value.get("method")) is str
        and "id" not in value
        and type(value.get("params", {})) in (dict, list)
    )
    if is_notification:
        assert answers == []
    if is_request:
        forwarded = [c for c in out if type(c) is ToServer and "id" in decoded(c.message)]
        assert len(answers) + len(forwarded) == 1
        if answers:
            assert answers[0]["id"] == value["id"]
        else:  # answer it, so in-flight tables stay small across examples
            sent = decoded(forwarded[0].message)
            router.handle(ServerMessage(forwarded[0].server, msg(id=sent["id"], result={})))


def test_an_internal_error_is_a_plain_error_and_the_session_lives(router, monkeypatch, caplog):
    def broken(client, message):
        raise ZeroDivisionError("secret detail /etc/aggregator")

    monkeypatch.setitem(router.client_requests.handlers, "tools/call", broken)
    _, answer = only(
        router.handle(ClientMessage(1, msg(id=4, method="tools/call", params={"name": "a__echo"}))), ToClient
    )
    assert answer["error"] == {
        "code": -32603,
        "message": "Internal error in the aggregator",
        "data": {"source": "aggregator", "reason": "internal"},
    }
    assert "secret detail" not in json.dumps(answer) and "ZeroDivisionError" in caplog.text
    _, pong = only(router.handle(ClientMessage(1, msg(id=5, method="ping"))), ToClient)
    assert pong["result"] == {}


def test_the_initialize_result_names_this_running_proxy():
    # An upstream that answers initialize with this name is this proxy itself (its own URL).
    from aggregator.core.router import INSTANCE_KEY

    catalog = Catalog([], "__", 100)
    one, two = new_router(catalog, []), new_router(catalog, [])
    assert one.instance != two.instance and len(one.instance) == 16
    one.handle(StartupCompleted())
    one.handle(ClientConnected(1))
    [answer] = one.handle(
        ClientMessage(
            1,
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-11-25",
                        "capabilities": {},
                        "clientInfo": {"name": "t", "version": "1"},
                    },
                }
            ).encode(),
        )
    )
    assert answer.message["result"]["_meta"] == {INSTANCE_KEY: one.instance}


@pytest.mark.parametrize(
    ("meta", "refused"),
    [("mine", True), ("another-proxy", False), (None, False)],
)
def test_an_initialize_from_this_proxy_itself_is_refused_at_once(meta, refused):
    """Refused before startup completes: startup waits for the very handshake that asks."""
    from aggregator.core.router import INSTANCE_KEY

    router = new_router(Catalog([], "__", 100), [])
    router.handle(ClientConnected(1))
    params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    if meta is not None:
        params["_meta"] = {INSTANCE_KEY: router.instance if meta == "mine" else meta}
    [out] = router.handle(
        ClientMessage(1, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}).encode())
    )
    if refused:
        error = out.message["error"]
        assert out.message["id"] == 1 and "this aggregator itself" in error["message"]
        assert error["data"] == {INSTANCE_KEY: router.instance}
    else:
        assert type(out).__name__ == "WaitForStartup"


@pytest.mark.parametrize(
    ("meta", "refused"),
    [("mine", True), ("another-proxy", False)],
)
@pytest.mark.parametrize("method", ["server/discover", "tools/list"])
def test_a_modern_request_from_this_proxy_itself_is_refused_before_startup(meta, refused, method):
    """A 2026-07-28 probe naming this proxy's own instance is refused at once, as its
    initialize is: startup waits for that very server; another proxy's waits for startup."""
    from aggregator.core.router import INSTANCE_KEY
    from aggregator.mcp import modern

    router = new_router(Catalog([], "__", 100), [])
    router.handle(ClientConnected(1))
    envelope = {
        modern.PROTOCOL_VERSION: "2026-07-28",
        modern.CLIENT_CAPABILITIES: {},
        INSTANCE_KEY: router.instance if meta == "mine" else meta,
    }
    request = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {"_meta": envelope}}
    [out] = router.handle(ClientMessage(1, json.dumps(request).encode()))
    if refused:
        error = out.message["error"]
        assert out.message["id"] == 7 and "this aggregator itself" in error["message"]
        assert error["code"] == -32600 and error["data"] == {INSTANCE_KEY: router.instance}
    else:
        assert type(out).__name__ == "WaitForStartup"
