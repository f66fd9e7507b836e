"""Modern (2026-07-28) callers (``aggregator.core.era.modern_callers``, ``modern_results``):
admission by ``_meta``, server/discover, removed methods, the era of a stdio connection,
every answer stamped, cache hints, -32002 rewritten, per-request log levels, no unsolicited
notifications."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator import __version__
from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.era.modern_results import cache_hints, list_page_suffix, modern_error, splice_page
from aggregator.core.events import (
    ClientConnected,
    ClientMessage,
    ServerItems,
    ServerMessage,
    ServerReady,
    StartupCompleted,
)
from aggregator.core.lifecycle.upstream_era import Era
from aggregator.jsonrpc import loads
from aggregator.mcp.modern import (
    CLIENT_CAPABILITIES,
    CLIENT_INFO,
    LOG_LEVEL,
    PROTOCOL_VERSION,
    SERVER_INFO,
    unsupported_version,
)
from aggregator.mcp.versions import ALL_VERSIONS
from tests.core.helpers import connect, make_router, msg, new_router, unpack

IDENTITY = {"name": "aggregator", "version": __version__}


def meta(**extra: Any) -> dict[str, Any]:
    return {PROTOCOL_VERSION: "2026-07-28", CLIENT_CAPABILITIES: {}, **extra}


def modern(router, key, id, method, params=None, **extra):
    """Client ``key`` sends a modern request; its commands, unpacked."""
    return unpack(
        router.handle(ClientMessage(key, msg(id=id, method=method, params={**(params or {}), "_meta": meta(**extra)})))
    )


def only_answer(out, key):
    [(kind, session, answer)] = [o for o in out if o[0] == "ToClient"]
    assert (kind, session) == ("ToClient", key)
    return answer


@pytest.fixture
def router(clock):
    r = make_router(clock)
    r.handle(ClientConnected(7))  # no initialize: modern requests need none
    return r


# --- admission -------------------------------------------------------------------------

# (the request's _meta, its method, the error code, a phrase of the message)
REFUSED = [
    ({PROTOCOL_VERSION: "2099-01-01", CLIENT_CAPABILITIES: {}}, "tools/list", -32022, "Unsupported protocol version"),
    ({PROTOCOL_VERSION: "2025-11-25", CLIENT_CAPABILITIES: {}}, "tools/list", -32022, "2026-07-28"),
    ({PROTOCOL_VERSION: 20260728, CLIENT_CAPABILITIES: {}}, "tools/list", -32022, "20260728"),
    ({PROTOCOL_VERSION: "2026-07-28"}, "tools/list", -32602, "clientCapabilities"),
    ({PROTOCOL_VERSION: "2026-07-28", CLIENT_CAPABILITIES: []}, "tools/list", -32602, "clientCapabilities"),
    (meta(**{LOG_LEVEL: "loud"}), "tools/call", -32602, "logLevel"),
    (meta(**{CLIENT_INFO: 5}), "tools/list", -32602, "clientInfo"),
    (meta(**{CLIENT_INFO: "me"}), "tools/call", -32602, "clientInfo"),
    (meta(**{CLIENT_INFO: {"version": "1"}}), "tools/list", -32602, "clientInfo"),
    (meta(**{CLIENT_INFO: {"name": 5, "version": "1"}}), "tools/list", -32602, "clientInfo"),
    (meta(), "ping", -32601, "removed"),
    (meta(), "logging/setLevel", -32601, "removed"),
    (meta(), "resources/subscribe", -32601, "removed"),
    (meta(), "initialize", -32601, "removed"),
    (meta(), "tasks/list", -32601, "Method not found: tasks/list"),
    (meta(), "no/such", -32601, "Method not found: no/such"),
    (meta(), "notifications/cancelled", -32600, "a notification, sent as a request"),
]


@pytest.mark.parametrize(("request_meta", "method", "code", "phrase"), REFUSED)
def test_a_modern_request_is_refused_with_the_revisions_error(router, request_meta, method, code, phrase):
    out = unpack(router.handle(ClientMessage(7, msg(id="r", method=method, params={"_meta": request_meta}))))
    answer = only_answer(out, 7)
    assert (answer["id"], answer["error"]["code"]) == ("r", code)
    assert phrase in answer["error"]["message"]
    if code == -32022:
        assert answer["error"]["data"]["supported"] == list(ALL_VERSIONS)
        assert answer["error"]["data"]["requested"] == request_meta[PROTOCOL_VERSION]
    assert not router.clients[7].in_flight and not any(o[0] == "ToServer" for o in out)


@pytest.mark.parametrize(("request_meta", "method", "code", "phrase"), [r for r in REFUSED if r[2] != -32601])
def test_after_a_good_envelope_a_changed_one_is_checked_again(router, request_meta, method, code, phrase):
    """The envelope a client sent last and that passed is not checked again; any other is."""
    assert "result" in only_answer(modern(router, 7, "g1", "tools/list"), 7)
    out = unpack(router.handle(ClientMessage(7, msg(id="r", method=method, params={"_meta": request_meta}))))
    answer = only_answer(out, 7)
    assert (answer["error"]["code"], phrase in answer["error"]["message"]) == (code, True)
    assert "result" in only_answer(modern(router, 7, "g2", "tools/list"), 7)


def test_a_changed_envelope_is_what_the_client_is_known_by(router):
    for name in ("first", "second", "first"):
        assert "result" in only_answer(modern(router, 7, name, "tools/list", **{CLIENT_INFO: {"name": name}}), 7)
        assert router.clients[7].client_info == {"name": name}


def test_an_answered_call_leaves_nothing_it_carried_reachable_from_the_deadline_heap(router):
    """The heap keeps a finished Pending until it tidies up: its params and envelope go at
    once, so they do not linger into the collector's old generations."""
    sent = [modern(router, 7, i, "tools/call", {"name": "a__slow", "arguments": {"n": i}})[0][2] for i in range(3)]
    for request in sent:
        router.handle(ServerMessage("a", msg(id=request["id"], result={"content": []})))
    finished = [entry[2] for entry in router.requests.deadlines._heap]
    assert len(finished) == 3 and all(p.done for p in finished)
    assert all(p.params is None and p.bridge is None and p.subscription is None and p.meta is None for p in finished)


@pytest.mark.parametrize("method", ["tools/call", "prompts/get", "resources/read"])
@pytest.mark.parametrize("state", [5, {"x": 1}, ["s"], True])
def test_a_request_state_that_is_not_a_string_is_invalid_params(router, method, state):
    params = {"name": "a__fast", "uri": "a+demo://r/1", "arguments": {}, "requestState": state, "_meta": meta()}
    answer = only_answer(unpack(router.handle(ClientMessage(7, msg(id="r", method=method, params=params)))), 7)
    assert (answer["id"], answer["error"]["code"]) == ("r", -32602)
    assert "requestState must be a string" in answer["error"]["message"]
    assert not router.clients[7].in_flight


def test_a_null_request_state_or_client_info_means_absent(router):
    params = {"name": "a__fast", "arguments": {}, "requestState": None, "_meta": meta(**{CLIENT_INFO: None})}
    out = unpack(router.handle(ClientMessage(7, msg(id="r", method="tools/call", params=params))))
    [(kind, server, sent)] = out
    assert (kind, server, sent["method"]) == ("ToServer", "a", "tools/call")


@pytest.mark.parametrize(
    ("requested", "echoed"),
    [
        ("2099-01-01", "2099-01-01"),
        ("x" * 256, "x" * 256),
        ("x" * 100_000, "x" * 256),
        (["2026-07-28"], ["2026-07-28"]),
        (["y" * 1000], repr(["y" * 1000])[:256]),
        (20260728, 20260728),
        (None, None),
    ],
)
def test_the_unsupported_version_error_gives_back_a_short_value_exactly_and_a_long_one_cut(requested, echoed):
    refused = unsupported_version(1, requested)
    assert refused["error"]["data"]["requested"] == echoed
    assert len(refused["error"]["message"]) < 200


def test_initialize_on_a_modern_connection_cuts_a_long_requested_version(router):
    modern(router, 7, 1, "tools/list")
    raw = msg(id=2, method="initialize", params={"protocolVersion": "z" * 5000, "capabilities": {}})
    refused = only_answer(unpack(router.handle(ClientMessage(7, raw))), 7)
    assert refused["error"]["code"] == -32022 and refused["error"]["data"]["requested"] == "z" * 256


def test_a_modern_request_needs_no_initialize_and_makes_the_stdio_connection_modern(router):
    answer = only_answer(modern(router, 7, 1, "tools/list"), 7)
    assert [t["name"] for t in answer["result"]["tools"]] == ["a__slow", "a__fast", "b__slow", "b__fast"]
    assert router.clients[7].era is Era.MODERN and router.session_info(7).protocol_version == "2026-07-28"
    # From now on a request without its _meta is refused, and initialize names the era served.
    [(_, _, bare)] = unpack(router.handle(ClientMessage(7, msg(id=2, method="tools/list"))))
    assert bare["error"]["code"] == -32602 and "_meta" in bare["error"]["message"]
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "x"}}
    [(_, _, refused)] = unpack(router.handle(ClientMessage(7, msg(id=3, method="initialize", params=init))))
    assert refused["error"]["code"] == -32022 and "serving protocol revision 2026-07-28" in refused["error"]["message"]
    assert refused["error"]["data"] == {"supported": ["2026-07-28"], "requested": "2025-11-25"}


def test_discover_decides_no_era_and_an_initialized_session_stays_legacy(router):
    answer = only_answer(modern(router, 7, 1, "server/discover"), 7)
    assert answer["result"]["supportedVersions"] == list(ALL_VERSIONS)
    assert router.clients[7].era is Era.LEGACY  # a probe: the client may still choose initialize
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "x"}}
    [(_, _, opened)] = unpack(router.handle(ClientMessage(7, msg(id=2, method="initialize", params=init))))
    assert opened["result"]["protocolVersion"] == "2025-11-25"
    # Legacy from now on: a modern _meta is passed along as any other, the answer unstamped.
    [(kind, server, sent)] = modern(router, 7, 3, "tools/call", {"name": "a__fast"})
    assert (kind, server) == ("ToServer", "a") and sent["params"]["_meta"][PROTOCOL_VERSION] == "2026-07-28"
    [(_, _, back)] = unpack(router.handle(ServerMessage("a", msg(id=sent["id"], result={"content": []}))))
    assert back == {"jsonrpc": "2.0", "id": 3, "result": {"content": []}}
    assert router.clients[7].era is Era.LEGACY


def test_a_modern_request_waits_for_startup_like_initialize():
    servers = [ServerConfig(name="a", command="x")]
    r = new_router(Catalog(servers, "__", 5), servers)
    r.handle(ClientConnected(1))
    [waiting] = r.handle(ClientMessage(1, msg(id=1, method="tools/list", params={"_meta": meta()})))
    assert type(waiting).__name__ == "WaitForStartup"
    r.handle(StartupCompleted())
    [(_, _, answer)] = unpack(r.handle(ClientMessage(1, msg(id=1, method="tools/list", params={"_meta": meta()}))))
    assert answer["result"]["tools"] == [] and answer["result"]["resultType"] == "complete"


def test_discover_answers_what_the_proxy_serves(router):
    answer = only_answer(modern(router, 7, "d", "server/discover"), 7)
    result = answer["result"]
    assert result["resultType"] == "complete" and result["_meta"][SERVER_INFO] == IDENTITY
    # As initialize says it, but for 2025-11-25 tasks: no place in the modern era (``core.requests.tasks``).
    legacy = router.handshake.merged_capabilities()
    assert "tasks" in legacy and result["capabilities"] == {k: v for k, v in legacy.items() if k != "tasks"}
    assert result["capabilities"]["resources"]["subscribe"] is True
    assert (result["ttlMs"], result["cacheScope"]) == (0, "public")
    # A legacy client probing before initialize gets the same answer (dual-era clients do).
    router.handle(ClientConnected(8))
    [(_, _, legacy)] = unpack(router.handle(ClientMessage(8, msg(id="d", method="server/discover", params={}))))
    assert legacy == answer


# --- answers stamped -------------------------------------------------------------------


def test_the_callers_envelope_stays_with_the_request_and_the_rest_of_its_meta_goes_on(router):
    [(_, _, sent)] = modern(router, 7, 1, "tools/call", {"name": "a__slow"}, **{"x.example/trace": "t1"})
    assert sent["params"] == {"name": "slow", "_meta": {"x.example/trace": "t1"}}
    pending = router.clients[7].in_flight[1]
    assert pending.meta == meta(**{"x.example/trace": "t1"})  # what a modern upstream is given


def test_every_result_of_a_modern_caller_is_stamped(router):
    [(_, _, sent)] = modern(router, 7, 1, "tools/call", {"name": "a__slow", "arguments": {}})
    upstream = {"content": [{"type": "text", "text": "ok"}], "_meta": {"x": 1, SERVER_INFO: {"name": "a"}}}
    [(_, _, answer)] = unpack(router.handle(ServerMessage("a", msg(id=sent["id"], result=upstream))))
    assert answer["result"] == {
        "content": [{"type": "text", "text": "ok"}],
        "resultType": "complete",
        "_meta": {"x": 1, SERVER_INFO: IDENTITY},  # the proxy answers, not the server behind it
    }
    # A multi round-trip result passes through as it is (its bridging is not done here).
    [(_, _, sent)] = modern(router, 7, 2, "tools/call", {"name": "a__slow"})
    asked = {"resultType": "input_required", "inputRequests": {}, "requestState": "s"}
    [(_, _, answer)] = unpack(router.handle(ServerMessage("a", msg(id=sent["id"], result=dict(asked)))))
    assert answer["result"] == {**asked, "_meta": {SERVER_INFO: IDENTITY}}


@pytest.mark.parametrize(
    ("upstream", "expected"),
    [
        ({}, (0, "public")),  # a legacy server gives no hints
        ({"ttlMs": 5000, "cacheScope": "public"}, (5000, "public")),
        ({"ttlMs": 5000, "cacheScope": "private"}, (5000, "private")),
        ({"ttlMs": -3}, (0, "public")),  # invalid: stale at once
        ({"ttlMs": "soon", "cacheScope": "shared"}, (0, "public")),
    ],
)
def test_a_read_carries_the_upstreams_cache_hints_merged(router, upstream, expected):
    [(_, _, sent)] = modern(router, 7, 1, "resources/read", {"uri": "a+demo://r/1"})
    assert sent["params"]["uri"] == "demo://r/1"
    result = {"contents": [{"uri": "demo://r/1", "text": "x"}], **upstream}
    [(_, _, answer)] = unpack(router.handle(ServerMessage("a", msg(id=sent["id"], result=result))))
    assert (answer["result"]["ttlMs"], answer["result"]["cacheScope"]) == expected
    assert answer["result"]["contents"][0]["uri"] == "a+demo://r/1"


def test_calls_carry_no_cache_hints(router):
    [(_, _, sent)] = modern(router, 7, 1, "tools/call", {"name": "a__slow"})
    [(_, _, answer)] = unpack(router.handle(ServerMessage("a", msg(id=sent["id"], result={"content": [], "ttlMs": 9}))))
    assert "cacheScope" not in answer["result"] and answer["result"]["ttlMs"] == 9  # passed through untouched


def test_every_page_of_a_list_has_the_same_scope_and_the_proxys_identity(clock):
    servers = [ServerConfig(name="a", command="x")]
    r = new_router(Catalog(servers, "__", 2), servers, clock=clock, list_changed_debounce=0)
    r.handle(ServerReady("a", {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}}))
    r.handle(ServerItems("a", "tools", [{"name": f"t{i}"} for i in range(5)]))
    r.handle(StartupCompleted())
    r.handle(ClientConnected(1))
    cursor, pages = None, []
    for id in range(5):
        params = {} if cursor is None else {"cursor": cursor}
        result = only_answer(modern(r, 1, id, "tools/list", params), 1)["result"]
        pages.append(result)
        cursor = result.get("nextCursor")
        if cursor is None:
            break
    assert len(pages) == 3
    assert {(p["resultType"], p["ttlMs"], p["cacheScope"]) for p in pages} == {("complete", 0, "public")}
    assert all(p["_meta"] == {SERVER_INFO: IDENTITY} for p in pages)
    assert [t["name"] for p in pages for t in p["tools"]] == [f"a__t{i}" for i in range(5)]


def test_with_profiles_what_a_caller_is_answered_is_private(clock):
    servers = [ServerConfig(name="a", command="x")]
    r = new_router(
        Catalog(servers, "__", 5),
        servers,
        clock=clock,
        list_changed_debounce=0,
        profiles={"reader": Catalog(servers, "__", 5)},
    )
    r.handle(ServerReady("a", {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}, "resources": {}}}))
    r.handle(ServerItems("a", "resources", [{"uri": "demo://r"}]))
    r.handle(StartupCompleted())
    r.handle(ClientConnected(1, "reader", era=Era.MODERN))
    for method in ("tools/list", "resources/list", "server/discover"):
        assert only_answer(modern(r, 1, method, method), 1)["result"]["cacheScope"] == "private"
    [(_, _, sent)] = modern(r, 1, 9, "resources/read", {"uri": "a+demo://r"})
    assert sent["method"] == "resources/read"
    [(_, _, answer)] = unpack(
        r.handle(ServerMessage("a", msg(id=sent["id"], result={"contents": [], "cacheScope": "public"})))
    )
    assert answer["result"]["cacheScope"] == "private"


# --- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [(-32002, -32602), (-32042, -32603), (-32020, -32020), (-32022, -32022), (-32099, -32603), (-32019, -32019)],
)
def test_an_upstream_error_reaches_a_modern_caller_without_codes_it_must_not_see(router, code, expected):
    [(_, _, sent)] = modern(router, 7, 1, "resources/read", {"uri": "a+demo://r/1"})
    error = {"code": code, "message": "Resource not found", "data": {"uri": "demo://r/1"}}
    [(_, _, answer)] = unpack(router.handle(ServerMessage("a", msg(id=sent["id"], error=error))))
    assert answer["error"] == dict(error, code=expected)


def test_a_legacy_sessions_answers_are_untouched(clock):
    r = make_router(clock)
    connect(r, 1)
    [(_, _, sent)] = unpack(
        r.handle(ClientMessage(1, msg(id=1, method="resources/read", params={"uri": "a+demo://r/1"})))
    )
    raw = msg(id=sent["id"], error={"code": -32002, "message": "Resource not found"})
    [(_, _, answer)] = unpack(r.handle(ServerMessage("a", raw)))
    assert answer["error"]["code"] == -32002 and "resultType" not in answer
    [(_, _, page)] = unpack(r.handle(ClientMessage(1, msg(id=2, method="tools/list"))))
    assert set(page["result"]) == {"tools"}


def test_the_pure_rules():
    assert cache_hints([None, 10, 3], [None, "public"], depends_on_caller=False) == (0, "public")
    assert cache_hints([10, 3], ["public", "private"], depends_on_caller=False) == (3, "private")
    assert cache_hints([], [], depends_on_caller=True) == (0, "private")
    error: dict[str, Any] = {"code": -32002, "message": "gone"}
    modern_error(error)
    assert error == {"code": -32602, "message": "gone"}
    page = splice_page(b'{"tools":[]}', list_page_suffix(depends_on_caller=True))
    assert loads(page) == {
        "tools": [],
        "resultType": "complete",
        "ttlMs": 0,
        "cacheScope": "private",
        "_meta": {SERVER_INFO: IDENTITY},
    }


# --- progress, cancellation, log levels, notifications -------------------------------------


def test_progress_and_cancellation_work_as_for_a_legacy_session(router):
    [(_, _, sent)] = modern(router, 7, 1, "tools/call", {"name": "a__slow"}, progressToken="p")
    token = sent["params"]["_meta"]["progressToken"]
    assert token != "p" and set(sent["params"]["_meta"]) == {"progressToken"}  # no envelope to a legacy server
    progress = msg(method="notifications/progress", params={"progressToken": token, "progress": 1})
    [(_, session, notice)] = unpack(router.handle(ServerMessage("a", progress)))
    assert session == 7 and notice["params"]["progressToken"] == "p"
    out = unpack(router.handle(ClientMessage(7, msg(method="notifications/cancelled", params={"requestId": 1}))))
    assert out[0][:2] == ("ToServer", "a") and out[0][2]["params"]["requestId"] == sent["id"]
    assert not router.clients[7].in_flight


def log_line(level: str) -> bytes:
    return msg(method="notifications/message", params={"level": level, "logger": "db", "data": "x"})


def test_log_lines_reach_a_modern_caller_only_for_a_request_that_asked(router):
    out = modern(router, 7, 1, "tools/call", {"name": "a__slow"}, **{LOG_LEVEL: "warning"})
    # Legacy upstreams that log are told the most verbose level wanted.
    assert sorted((o[1], o[2]["params"]["level"]) for o in out if o[2].get("method") == "logging/setLevel") == [
        ("a", "warning"),
        ("b", "warning"),
    ]
    [sent] = [o[2] for o in out if o[2].get("method") == "tools/call"]
    assert unpack(router.handle(ServerMessage("a", log_line("info")))) == []  # under its level
    [(_, session, notice)] = unpack(router.handle(ServerMessage("a", log_line("error"))))
    assert session == 7 and notice["params"]["logger"] == "a/db"
    router.handle(ServerMessage("a", msg(id=sent["id"], result={"content": []})))
    # A request without a log level hears none.
    [(_, _, sent)] = modern(router, 7, 2, "tools/call", {"name": "a__slow"})
    assert unpack(router.handle(ServerMessage("a", log_line("emergency")))) == []


def test_a_modern_caller_hears_no_unsolicited_notification(clock):
    r = make_router(clock)
    connect(r, 1)  # a legacy session, beside
    r.handle(ClientConnected(7))
    modern(r, 7, 1, "tools/list")
    out = unpack(r.handle(ServerItems("a", "tools", [{"name": "new"}])))
    assert [(o[1], o[2]["method"]) for o in out] == [(1, "notifications/tools/list_changed")]
    assert unpack(r.handle(ServerMessage("b", log_line("emergency")))) == []  # no session asked for logs
    assert unpack(r.handle(ClientMessage(7, msg(method="notifications/roots/list_changed")))) == []


def test_tools_list_is_deterministic_across_calls_and_listing_orders(clock):
    def names(order):
        r = make_router(clock)
        for name in order:
            r.handle(ServerItems(name, "tools", [{"name": "z"}, {"name": "m"}, {"name": "a"}]))
        r.handle(ClientConnected(1))
        return [t["name"] for t in only_answer(modern(r, 1, 1, "tools/list"), 1)["result"]["tools"]]

    first = names(["a", "b"])
    assert first == names(["b", "a"]) == names(["a", "b"])
    assert first == ["a__z", "a__m", "a__a", "b__z", "b__m", "b__a"]  # config order, each server's own order


def test_an_answer_made_outside_the_router_is_stamped_for_a_modern_caller_only(router):
    modern(router, 7, 1, "tools/list")  # 7 is modern now
    connect(router, 8)
    made = {"content": [{"type": "text", "text": "from a plugin"}]}
    answer = router.stamped(7, "tools/call", {"jsonrpc": "2.0", "id": 2, "result": dict(made)})
    assert answer["result"] == {**made, "resultType": "complete", "_meta": {SERVER_INFO: IDENTITY}}
    answer = router.stamped(8, "tools/call", {"jsonrpc": "2.0", "id": 2, "result": dict(made)})
    assert answer["result"] == made
