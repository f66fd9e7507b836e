"""The upstream lifecycle, pure: handshake, listing, re-listing, a per-session listing and
the proxy's own requests, driven by a scripted server and a clock moved by hand."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from aggregator.core.commands import Answer
from aggregator.core.lifecycle.own_requests import OwnRequests
from aggregator.core.lifecycle.upstream_lifecycle import (
    CONTROL_ID_PREFIX,
    INSTANCE_KEY,
    MAX_LIST_PAGES,
    Failed,
    Items,
    Listing,
    Ready,
    Send,
    Serving,
    UpstreamLifecycle,
)
from aggregator.mcp.versions import LATEST

CAPS = {"roots": {"listChanged": True}}
INSTANCE = "this-proxy"


def init_result(**changes: Any) -> dict[str, Any]:
    result: dict[str, Any] = {
        "protocolVersion": LATEST,
        "capabilities": {"tools": {"listChanged": True}, "prompts": {}},
        "serverInfo": {"name": "fake", "version": "1"},
    }
    result.update(changes)
    return {key: value for key, value in result.items() if value is not ...}


def tool(n: int) -> dict[str, Any]:
    return {"name": f"t{n}", "inputSchema": {"type": "object"}}


class Server:
    """Answers the lifecycle's requests from a script: ``script[method]`` is a list of
    answers (a result dict, ``{"error": ...}``, or None for no answer), the n-th for the
    n-th request of that method; the last one repeats. A method missing from the script
    is left unanswered."""

    def __init__(self, script: dict[str, list[Any]]) -> None:
        self.script = script
        self.asked: list[dict[str, Any]] = []

    def __call__(self, message: dict[str, Any]) -> dict[str, Any] | None:
        self.asked.append(message)
        answers = self.script.get(message["method"])
        if answers is None and message["method"] == "server/discover":  # a legacy server
            answers = [{"error": {"code": -32601, "message": "Method not found"}}]
        if answers is None:
            return None
        count = sum(1 for m in self.asked if m["method"] == message["method"])
        answer = answers[min(count, len(answers)) - 1]
        if answer is None:
            return None
        if "error" in answer:
            return {"jsonrpc": "2.0", "id": message["id"], "error": answer["error"]}
        return {"jsonrpc": "2.0", "id": message["id"], "result": answer}

    def methods(self) -> list[str]:
        return [m["method"] for m in self.asked]


def drive(life: UpstreamLifecycle, server: Server, outcomes: list[Any], now: float = 0.0) -> list[Any]:
    """Deliver every request among ``outcomes`` to ``server`` and its answers back to the
    lifecycle, until nothing more is asked; every outcome on the way, in order."""
    seen: list[Any] = []
    queue = list(outcomes)
    for _ in range(10_000):
        if not queue:
            return seen
        outcome = queue.pop(0)
        seen.append(outcome)
        if type(outcome) is Send and "id" in outcome.message:
            answer = server(outcome.message)
            if answer is not None:
                queue += life.answer(answer, now)
    raise AssertionError("the lifecycle never stopped asking")


def lifecycle(per_session: bool = False, protocol: str = LATEST) -> UpstreamLifecycle:
    """A lifecycle pinned to the legacy era (its handshake is ``initialize``) unless told."""
    return UpstreamLifecycle(
        "srv",
        instance=INSTANCE,
        target="fake-server --stdio",
        init_timeout=10.0,
        request_timeout=5.0,
        per_session=per_session,
        protocol=protocol,
    )


def start(script: dict[str, list[dict[str, Any]]], per_session: bool = False) -> tuple[UpstreamLifecycle, Server, list]:
    life, server = lifecycle(per_session), Server(script)
    return life, server, drive(life, server, life.connected(0.0, CAPS))


def kinds_of(outcomes: list[Any]) -> list[Any]:
    """The outcomes other than sends, as (type name, detail)."""
    out = []
    for o in outcomes:
        if type(o) is Items:
            out.append(("Items", o.kind, [item["name"] for item in o.items]))
        elif type(o) is Listing:
            out.append(("Listing", {kind: [i["name"] for i in items] for kind, items in o.listing.items()}))
        elif type(o) is Failed:
            out.append(("Failed", o.reason, o.code))
        elif type(o) is not Send:
            out.append((type(o).__name__,))
    return out


SERVES = {"initialize": [init_result()], "tools/list": [{"tools": [tool(1)]}], "prompts/list": [{"prompts": []}]}


# --- the handshake ---------------------------------------------------------------------------


def test_the_handshake_initializes_lists_every_kind_it_has_then_serves():
    life, server, outcomes = start(SERVES)
    first = outcomes[0].message
    assert first["method"] == "initialize" and first["id"] == f"{CONTROL_ID_PREFIX}1"
    offered = {k: v for k, v in first["params"]["capabilities"].items() if k != "experimental"}
    assert offered == CAPS and first["params"]["protocolVersion"] == LATEST
    assert first["params"]["clientInfo"]["name"] == "aggregator"
    assert outcomes[1] == Send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert type(outcomes[2]) is Ready and outcomes[2].result["serverInfo"]["name"] == "fake"
    assert kinds_of(outcomes) == [("Ready",), ("Items", "tools", ["t1"]), ("Items", "prompts", []), ("Serving",)]
    assert server.methods() == ["initialize", "tools/list", "prompts/list"]  # no resources capability
    assert life.serving and life.next_deadline() is None


@pytest.mark.parametrize(
    ("result", "problem"),
    [
        (init_result(protocolVersion=...), "protocolVersion is missing"),
        (init_result(protocolVersion="1999-01-01"), "protocolVersion '1999-01-01' is not one"),
        (init_result(capabilities=...), "capabilities is missing"),
        (init_result(capabilities=[]), "capabilities must be an object"),
        (init_result(capabilities={"tools": "yes"}), "capabilities.tools must be an object"),
        (init_result(serverInfo="fake"), "serverInfo must be an object"),
    ],
)
def test_an_unusable_initialize_result_fails_the_connection(result, problem):
    life, server, outcomes = start({"initialize": [result]})
    (failed,) = [o for o in outcomes if type(o) is Failed]
    assert failed.reason.startswith(f"its initialize result is unusable: {problem}"), failed.reason
    assert not [o for o in outcomes if type(o) in (Ready, Serving)]
    assert server.methods() == ["initialize"]  # never initialized, never listed
    assert life.failed and life.next_deadline() is None


@pytest.mark.parametrize(
    ("data", "loops"),
    [({INSTANCE_KEY: INSTANCE}, True), ({INSTANCE_KEY: "another-proxy"}, False), (None, False)],
)
def test_a_server_that_refuses_our_own_initialize_is_this_proxy_itself(data, loops):
    life = lifecycle()
    (sent,) = life.connected(0.0, CAPS)
    # A legacy handshake looks like one: no _meta (a dual-era server takes a session-less
    # request with _meta for a modern one); the instance rides in the experimental capabilities.
    assert "_meta" not in sent.message["params"]
    assert sent.message["params"]["capabilities"]["experimental"] == {INSTANCE_KEY: {"instance": INSTANCE}}
    error = {"code": -32600, "message": "Refused", **({"data": data} if data is not None else {})}
    [failed] = life.answer({"jsonrpc": "2.0", "id": sent.message["id"], "error": error}, 0.0)
    if loops:
        assert failed.reason.startswith("it is this aggregator itself (fake-server --stdio leads back")
    else:
        assert failed.reason == "initialize failed: Refused (code -32600)"


@pytest.mark.parametrize(
    ("meta", "loops"),
    [
        ({INSTANCE_KEY: INSTANCE}, True),
        ({INSTANCE_KEY: "another-proxy"}, False),
        ({"other": INSTANCE}, False),
        ("not an object", False),
    ],
)
def test_a_server_that_is_this_proxy_itself_is_refused(meta, loops):
    _, server, outcomes = start({**SERVES, "initialize": [init_result(_meta=meta)]})
    failed = [o for o in outcomes if type(o) is Failed]
    if loops:
        assert failed[0].reason.startswith("it is this aggregator itself (fake-server --stdio leads back")
        assert server.methods() == ["initialize"]
    else:
        assert not failed and kinds_of(outcomes)[-1] == ("Serving",)


@pytest.mark.parametrize(
    ("answer", "reason", "code"),
    [
        ({"error": {"code": -32000, "message": "boom"}}, "initialize failed: boom (code -32000)", -32000),
        ({"error": {"code": "x", "message": "odd"}}, "initialize failed: odd (code x)", None),
        ({"error": "not an object"}, "initialize failed: None (code None)", None),
    ],
)
def test_an_error_answer_to_initialize_fails_with_its_code(answer, reason, code):
    _, _, outcomes = start({"initialize": [answer]})
    assert kinds_of(outcomes) == [("Failed", reason, code)]


def test_a_result_that_is_not_an_object_fails():
    life = lifecycle()
    (sent,) = life.connected(0.0, CAPS)
    outcomes = life.answer({"jsonrpc": "2.0", "id": sent.message["id"], "result": [1]}, 0.0)
    assert kinds_of(outcomes) == [("Failed", "initialize: the result is not an object", None)]


def test_no_answer_to_initialize_fails_at_its_deadline_and_a_late_answer_is_dropped():
    life = lifecycle()
    (sent,) = life.connected(100.0, CAPS)
    assert life.next_deadline() == 110.0
    assert life.expire(109.9) == []
    assert kinds_of(life.expire(110.0)) == [("Failed", "no answer to initialize within 10.0s", None)]
    late = {"jsonrpc": "2.0", "id": sent.message["id"], "result": init_result()}
    assert life.answer(late, 111.0) == [] and not life.serving


def test_the_initial_listing_shares_one_init_timeout():
    life, server = lifecycle(), Server({"initialize": [init_result()], "tools/list": [{"tools": []}]})
    outcomes = drive(life, server, life.connected(0.0, CAPS), now=4.0)  # prompts/list stays unanswered
    assert server.methods()[-1] == "prompts/list" and not life.serving
    assert life.next_deadline() == 14.0  # init_timeout from the end of the handshake, not per kind
    assert kinds_of(outcomes)[-1] == ("Items", "tools", [])
    # initialize was answered: what failed is the listing, and its reason says so
    assert kinds_of(life.expire(14.0)) == [("Failed", "no answer to prompts/list within 10.0s", None)]


def test_a_failed_initial_listing_fails_the_connection_with_its_code():
    script = {**SERVES, "prompts/list": [{"error": {"code": -32603, "message": "broken"}}]}
    _, _, outcomes = start(script)
    assert kinds_of(outcomes)[-1] == ("Failed", "prompts/list failed: broken (code -32603)", -32603)
    assert ("Serving",) not in kinds_of(outcomes)


# --- pagination --------------------------------------------------------------------------------


def paged(*pages: tuple[list[int], Any]) -> list[dict[str, Any]]:
    out = []
    for numbers, cursor in pages:
        page: dict[str, Any] = {"tools": [tool(n) for n in numbers]}
        if cursor is not ...:
            page["nextCursor"] = cursor
        out.append(page)
    return out


@pytest.mark.parametrize(
    ("pages", "names", "cursors", "warning"),
    [
        (paged(([1], ...)), ["t1"], [None], None),
        (paged(([1], "a"), ([2], "b"), ([3], ...)), ["t1", "t2", "t3"], [None, "a", "b"], None),
        (paged(([1], "a"), ([2], "")), ["t1", "t2"], [None, "a"], None),
        (paged(([1], "a"), ([2], None)), ["t1", "t2"], [None, "a"], None),
        (paged(([1], "a"), ([2], "b"), ([3], "a")), ["t1", "t2", "t3"], [None, "a", "b"], "pagination loops"),
        (paged(([1], 7)), ["t1"], [None], "pagination loops"),
        ([{"tools": "not a list", "nextCursor": "a"}, {"tools": [tool(2)]}], ["t2"], [None, "a"], None),
    ],
)
def test_pagination_follows_cursors_and_stops_at_a_loop(caplog, pages, names, cursors, warning):
    with caplog.at_level(logging.WARNING):
        _, server, outcomes = start({**SERVES, "tools/list": pages})
    assert kinds_of(outcomes)[1] == ("Items", "tools", names)
    asked = [m.get("params", {}).get("cursor") for m in server.asked if m["method"] == "tools/list"]
    assert asked == cursors
    assert not [m for m in server.asked if m["method"] == "tools/list" and m.get("params") == {"cursor": None}]
    if warning:
        assert f"server srv: tools/list {warning}; keeping {len(names)} items" in caplog.text
    else:
        assert "pagination" not in caplog.text


def test_a_listing_stops_at_the_page_cap(caplog):
    endless = [{"tools": [tool(n)], "nextCursor": f"c{n}"} for n in range(MAX_LIST_PAGES + 5)]
    with caplog.at_level(logging.WARNING):
        _, server, outcomes = start({**SERVES, "tools/list": endless})
    assert server.methods().count("tools/list") == MAX_LIST_PAGES
    assert len(kinds_of(outcomes)[1][2]) == MAX_LIST_PAGES
    assert f"tools/list has more than {MAX_LIST_PAGES} pages; keeping {MAX_LIST_PAGES} items" in caplog.text
    assert kinds_of(outcomes)[-1] == ("Serving",)


@pytest.mark.parametrize(
    ("code", "serves"),
    [(-32601, True), (-32603, False), (-326010, False)],
)
def test_only_method_not_found_means_a_server_without_templates(code, serves):
    resources = {"protocolVersion": LATEST, "capabilities": {"resources": {}}}
    script = {
        "initialize": [resources],
        "resources/list": [{"resources": [{"name": "doc", "uri": "file:///doc"}]}],
        "resources/templates/list": [{"error": {"code": code, "message": "Method not found -32601"}}],
    }
    _, _, outcomes = start(script)
    if serves:
        assert kinds_of(outcomes)[-2:] == [("Items", "resourceTemplates", []), ("Serving",)]
    else:
        assert kinds_of(outcomes)[-1] == (
            "Failed",
            f"resources/templates/list failed: Method not found -32601 (code {code})",
            code,
        )


# --- re-listing ------------------------------------------------------------------------------


def test_list_changes_while_listing_are_coalesced_into_one_relist_after_serving():
    life, server = lifecycle(), Server(SERVES)
    (init,) = life.connected(0.0, CAPS)
    first = life.answer(server(init.message), 0.0)  # initialized, Ready, tools/list asked
    # The server says its lists changed, several times, before the initial listing is done.
    assert life.list_changed("prompts", 0.0) == [] and life.list_changed("tools", 0.0) == []
    assert life.list_changed("prompts", 0.0) == []
    outcomes = drive(life, server, first[2:])
    assert server.methods() == ["initialize", "tools/list", "prompts/list", "tools/list", "prompts/list"]
    assert kinds_of(outcomes) == [
        ("Items", "tools", ["t1"]),
        ("Items", "prompts", []),
        ("Serving",),
        ("Items", "tools", ["t1"]),  # the re-list, in the table's order of kinds
        ("Items", "prompts", []),
    ]


def test_a_change_during_a_relist_is_listed_once_after_it():
    life, server, _ = start(SERVES)
    (ask,) = life.list_changed("tools", 1.0)
    assert ask.message["method"] == "tools/list" and life.next_deadline() == 6.0  # request_timeout per kind
    for _ in range(3):
        assert life.list_changed("tools", 1.0) == []
    outcomes = drive(life, server, life.answer(server(ask.message), 2.0))
    assert kinds_of(outcomes) == [("Items", "tools", ["t1"]), ("Items", "tools", ["t1"])]
    assert server.methods().count("tools/list") == 3  # initial, the re-list, one more for the changes


@pytest.mark.parametrize("failure", ["error", "timeout"])
def test_a_failing_relist_is_logged_and_the_other_kinds_go_on(caplog, failure):
    relist = {"error": {"code": -32000, "message": "busy"}} if failure == "error" else None
    script = {**SERVES, "tools/list": [{"tools": []}, relist, {"tools": [tool(9)]}]}
    life, server = lifecycle(), Server(script)
    (init,) = life.connected(0.0, CAPS)
    first = life.answer(server(init.message), 0.0)
    life.list_changed("tools", 0.0)
    life.list_changed("prompts", 0.0)  # both re-listed in one job once it serves
    with caplog.at_level(logging.WARNING):
        outcomes = drive(life, server, first[2:], now=1.0)
        if failure == "timeout":
            assert kinds_of(outcomes)[-1] == ("Serving",) and life.next_deadline() == 6.0
            assert life.expire(5.9) == []
            outcomes += drive(life, server, life.expire(6.0), now=6.0)
    assert kinds_of(outcomes)[-2:] == [("Serving",), ("Items", "prompts", [])]  # no tools Items: kept as listed
    reason = "tools/list failed: busy (code -32000)" if failure == "error" else "no answer within 5.0s"
    assert f"server srv: re-listing tools failed: {reason}" in caplog.text
    assert not life.failed and life.serving and life.next_deadline() is None
    # And it goes on re-listing what changes next.
    assert kinds_of(drive(life, server, life.list_changed("tools", 7.0), now=7.0)) == [("Items", "tools", ["t9"])]


# --- a per-session connection -----------------------------------------------------------------


def test_a_per_session_connection_serves_then_gives_its_whole_listing_at_once():
    _, server, outcomes = start(SERVES, per_session=True)
    assert kinds_of(outcomes) == [("Ready",), ("Serving",), ("Listing", {"tools": ["t1"], "prompts": []})]


def test_a_per_session_listing_with_one_failing_kind_gives_nothing_until_a_list_changes(caplog):
    script = {**SERVES, "prompts/list": [{"error": {"code": -32603, "message": "broken"}}, {"prompts": []}]}
    with caplog.at_level(logging.WARNING):
        life, server, outcomes = start(script, per_session=True)
    assert kinds_of(outcomes) == [("Ready",), ("Serving",)]  # no Listing: the session keeps the shared one
    assert (
        "server srv: listing prompts failed: prompts/list failed: broken (code -32603);"
        " its session sees the shared listing" in caplog.text
    )
    assert not life.listed and not life.failed
    # A change of any kind lists every kind again, together.
    outcomes = drive(life, server, life.list_changed("tools", 1.0), now=1.0)
    assert kinds_of(outcomes) == [("Listing", {"tools": ["t1"], "prompts": []})]
    assert life.listed
    # Once listed, a change re-lists that kind only.
    outcomes = drive(life, server, life.list_changed("prompts", 2.0), now=2.0)
    assert kinds_of(outcomes) == [("Items", "prompts", [])]


def test_a_per_session_connection_without_lists_gives_an_empty_listing():
    _, server, outcomes = start({"initialize": [init_result(capabilities={})]}, per_session=True)
    assert kinds_of(outcomes) == [("Ready",), ("Serving",), ("Listing", {})]
    assert server.methods() == ["initialize"]


# --- the proxy's own requests ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({"result": {"ok": 1}}, ({"ok": 1}, "", None, None)),
        (
            {"error": {"code": -32042, "message": "upstream says no"}},
            (None, "tools/call failed: upstream says no (code -32042)", -32042, "upstream says no"),
        ),
        ({"error": {"message": "no code"}}, (None, "tools/call failed: no code (code None)", None, "no code")),
        ({"result": "text"}, (None, "tools/call: the result is not an object", None, None)),
    ],
)
def test_an_own_request_is_answered_with_its_result_or_its_error_code(answer, expected):
    life, server, _ = start(SERVES)
    caller = object()
    sent = life.request("tools/call", {"name": "x"}, caller, 1.0)
    assert sent.message["id"].startswith(CONTROL_ID_PREFIX) and sent.message["params"] == {"name": "x"}
    (got,) = life.answer({"jsonrpc": "2.0", "id": sent.message["id"], **answer}, 1.0)
    assert type(got) is Answer and got.caller is caller
    assert (got.result, got.error, got.code, got.message) == expected
    assert life.answer({"jsonrpc": "2.0", "id": sent.message["id"], "result": {}}, 1.0) == []  # answered once


def test_an_own_request_with_a_timeout_is_answered_when_it_passes():
    life, _, _ = start(SERVES)
    sent = life.request("ping", None, "me", 1.0, timeout=2.0)
    assert "params" not in sent.message and life.next_deadline() == 3.0
    (got,) = life.expire(3.0)
    assert (got.caller, got.result, got.error) == ("me", None, "ping: no answer in time")


def test_the_own_request_table_numbers_ids_and_hands_each_waiter_back_once():
    table: OwnRequests[str] = OwnRequests("p-")
    one = table.open("a", None, "first", 5.0)
    two = table.open("b", {"x": 1}, "second", 3.0)
    assert (one["id"], two["id"], len(table), table.next_deadline()) == ("p-1", "p-2", 2, 3.0)
    for unknown in ("p-9", 1, None, ["p-1"]):
        assert table.settle(unknown) is None
    assert [w.waiter for w in table.expire(4.0)] == ["second"]
    assert table.settle("p-2") is None
    settled = table.settle("p-1")
    assert settled is not None and (settled.method, settled.waiter) == ("a", "first")
    assert table.next_deadline() is None and table.expire(100.0) == []
    table.open("c", None, "third", 1.0)
    assert [w.waiter for w in table.clear()] == ["third"] and len(table) == 0
