"""The tasks extension (``io.modelcontextprotocol/tasks``) for modern callers of modern
servers (``core.requests.tasks``): declared in server/discover where a server declares it, forwarded in
``_meta`` where both sides declare it, a task handle exposed under the server's name and bound
to the caller's principal, ``tasks/get|update|cancel`` routed back un-namespaced, -32021 where
the extension was not negotiated."""

from __future__ import annotations

from typing import Any

import pytest

from aggregator.config import ServerConfig
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.events import (
    ClientConnected,
    ClientMessage,
    ServerItems,
    ServerMessage,
    ServerReady,
    StartupCompleted,
)
from aggregator.core.lifecycle.upstream_era import Era
from aggregator.core.requests.tasks import TaskOwners
from aggregator.fronts.http.headers import check_headers
from aggregator.mcp.modern import CLIENT_CAPABILITIES, PROTOCOL_VERSION, TASKS_EXTENSION
from aggregator.upstreams.modern_headers import ToolHeaders, request_headers
from tests.core.helpers import Clock, connect, msg, new_router, unpack

EXTENSION = {"extensions": {TASKS_EXTENSION: {}}}
HANDLE = {
    "resultType": "task",
    "taskId": "t-1",
    "status": "working",
    "createdAt": "2026-12-01T00:00:00Z",
    "lastUpdatedAt": "2026-12-01T00:00:00Z",
    "ttlMs": 60000,
    "pollIntervalMs": 200,
}


def proxy(m_declares: bool = True) -> Any:
    """Modern servers ``m`` (declares the extension unless told not to) and ``n`` (does not),
    legacy server ``l`` (2025-11-25 tasks); each with tool ``job``."""
    servers = [ServerConfig(name=name, command="x", request_timeout=5.0) for name in ("m", "n", "l")]
    r = new_router(Catalog(servers, "__", 50), servers, clock=Clock(), list_changed_debounce=0)
    for name, caps in (
        ("m", {"tools": {}, **(EXTENSION if m_declares else {})}),
        ("n", {"tools": {}}),
        ("l", {"tools": {}, "tasks": {"list": {}, "cancel": {}}}),
    ):
        modern = name != "l"
        r.handle(ServerReady(name, {"protocolVersion": "2026-07-28" if modern else "2025-11-25", "capabilities": caps}))
        r.links[name].speaks = Era.MODERN if modern else Era.LEGACY
        r.handle(ServerItems(name, "tools", [{"name": "job"}]))
    r.handle(StartupCompleted())
    return r


_keys = iter(range(100, 10_000))


def ask(r: Any, method: str, params: dict[str, Any], *, caps: Any = EXTENSION, principal: Any = "alice") -> list:
    """One modern request, as Streamable HTTP makes it: a caller of its own for ``principal``."""
    key = next(_keys)
    r.handle(ClientConnected(key, era=Era.MODERN, principal=principal))
    meta = {PROTOCOL_VERSION: "2026-07-28", CLIENT_CAPABILITIES: caps}
    return [
        (key, *o)
        for o in unpack(r.handle(ClientMessage(key, msg(id=7, method=method, params={**params, "_meta": meta}))))
    ]


def upstream(out: list) -> tuple[int, str, dict[str, Any]]:
    [(key, kind, server, sent)] = out
    assert kind == "ToServer"
    return key, server, sent


def answered(out: list) -> dict[str, Any]:
    [(key, kind, session, answer)] = out
    assert (kind, session, answer["id"]) == ("ToClient", key, 7)
    return answer


def created(r: Any, principal: Any = "alice") -> str:
    """A task ``m`` creates for ``principal``'s call of ``m__job``; its exposed id."""
    key, _, sent = upstream(ask(r, "tools/call", {"name": "m__job", "arguments": {}}, principal=principal))
    [(kind, session, handle)] = unpack(r.handle(ServerMessage("m", msg(id=sent["id"], result=dict(HANDLE)))))
    assert (kind, session) == ("ToClient", key)
    return handle["result"]["taskId"]


@pytest.mark.parametrize(("m_declares", "declared"), [(True, True), (False, False)])
def test_discover_declares_the_extension_when_a_modern_server_does_and_never_the_2025_slot(m_declares, declared):
    result = answered(ask(proxy(m_declares), "server/discover", {}))["result"]
    assert (TASKS_EXTENSION in result["capabilities"].get("extensions", {})) is declared
    assert "tasks" not in result["capabilities"]  # the legacy server's 2025-11-25 tasks stay legacy


# (method, what the caller declares, error code, a phrase of the message)
REFUSED = [
    ("tasks/get", {}, -32021, TASKS_EXTENSION),
    ("tasks/update", {"elicitation": {}}, -32021, TASKS_EXTENSION),
    ("tasks/cancel", {"extensions": {"other/ext": {}}}, -32021, TASKS_EXTENSION),
    ("tasks/result", EXTENSION, -32601, "tasks/result"),
    ("tasks/list", EXTENSION, -32601, "tasks/list"),
    ("tasks/get", EXTENSION, -32602, "Unknown task"),  # declared, but no such task
]


@pytest.mark.parametrize(("method", "caps", "code", "phrase"), REFUSED)
def test_a_tasks_request_the_extension_was_not_negotiated_for_is_refused(method, caps, code, phrase):
    r = proxy()
    out = ask(r, method, {"taskId": "m/t-1", "inputResponses": {}}, caps=caps)
    error = answered(out)["error"]
    assert (error["code"], phrase in error["message"]) == (code, True)
    if code == -32021:
        assert error["data"] == {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}
    assert not r.links["m"].pending


# (the server, what the caller declares, whether the call upstream declares the extension)
FORWARDED = [
    ("m", EXTENSION, True),
    ("m", {"elicitation": {}}, False),
    ("n", EXTENSION, False),  # the server did not declare it: core behaviour
]


@pytest.mark.parametrize(("server", "caps", "forwarded"), FORWARDED)
def test_the_callers_declaration_goes_upstream_where_both_sides_declare_it(server, caps, forwarded):
    r = proxy()
    _, _, sent = upstream(ask(r, "tools/call", {"name": f"{server}__job", "arguments": {}}, caps=caps))
    declared = sent["params"]["_meta"][CLIENT_CAPABILITIES].get("extensions", {})
    assert (TASKS_EXTENSION in declared) is forwarded


def test_a_task_handle_passes_through_under_an_exposed_id_and_polls_route_back_un_namespaced():
    r = proxy()
    task_id = created(r)
    assert task_id == "m/t-1"
    for method, extra in (("tasks/get", {}), ("tasks/update", {"inputResponses": {"k": {"action": "accept"}}})):
        key, server, sent = upstream(ask(r, method, {"taskId": task_id, **extra}))
        assert (server, sent["method"], sent["params"]["taskId"]) == ("m", method, "t-1")
        assert sent["params"].get("inputResponses") == extra.get("inputResponses")
        result = {"resultType": "complete"}
        if method == "tasks/get":
            result = {**HANDLE, "resultType": "complete", "status": "completed", "result": {"content": []}}
        answer = answered([(key, *o) for o in unpack(r.handle(ServerMessage("m", msg(id=sent["id"], result=result))))])
        if method == "tasks/get":
            assert (answer["result"]["taskId"], answer["result"]["status"]) == ("m/t-1", "completed")
    key, server, sent = upstream(ask(r, "tasks/cancel", {"taskId": task_id}))
    assert (server, sent["params"]["taskId"]) == ("m", "t-1")


def test_the_handle_keeps_its_result_type_and_is_stamped():
    r = proxy()
    key, _, sent = upstream(ask(r, "tools/call", {"name": "m__job", "arguments": {}}))
    [(_, _, handle)] = unpack(r.handle(ServerMessage("m", msg(id=sent["id"], result=dict(HANDLE)))))
    assert (
        handle["result"]["resultType"] == "task" and "io.modelcontextprotocol/serverInfo" in handle["result"]["_meta"]
    )
    assert {k: v for k, v in handle["result"].items() if k not in ("taskId", "_meta")} == {
        k: v for k, v in HANDLE.items() if k != "taskId"
    }


@pytest.mark.parametrize("principal", ["bob", None])
def test_a_task_is_its_principals_only(principal):
    r = proxy()
    task_id = created(r, principal="alice")
    for method in ("tasks/get", "tasks/cancel", "tasks/update"):
        error = answered(ask(r, method, {"taskId": task_id, "inputResponses": {}}, principal=principal))["error"]
        assert (error["code"], error["message"]) == (-32602, f"Unknown task: {task_id}")
    assert not r.links["m"].pending
    upstream(ask(r, "tasks/get", {"taskId": task_id}, principal="alice"))  # its own principal's request goes on


def test_a_task_handle_for_a_caller_that_did_not_declare_the_extension_fails_the_call():
    r = proxy()
    key, _, sent = upstream(ask(r, "tools/call", {"name": "m__job", "arguments": {}}, caps={}))
    [(kind, session, answer)] = unpack(r.handle(ServerMessage("m", msg(id=sent["id"], result=dict(HANDLE)))))
    assert (kind, session) == ("ToClient", key)
    assert "resultType" in answer["error"]["message"] and len(r.task_owners) == 0


def test_a_server_that_no_longer_declares_the_extension_has_no_tasks_to_route_to():
    r = proxy()
    task_id = created(r)
    r.links["m"].capabilities = {"tools": {}}  # restarted without it
    error = answered(ask(r, "tasks/get", {"taskId": task_id}))["error"]
    assert error["code"] == -32021 and "'m' no longer declares" in error["message"]
    assert not r.links["m"].pending


@pytest.mark.parametrize(("server", "kept"), [("l", False), ("m", True)])
def test_a_modern_callers_2025_task_hint_reaches_a_modern_server_only(server, kept):
    r = proxy()
    hint = {"ttl": 1000}
    _, _, sent = upstream(ask(r, "tools/call", {"name": f"{server}__job", "arguments": {}, "task": hint}))
    assert (sent["params"].get("task") == hint) is kept  # a legacy server runs it at once


def test_a_legacy_session_has_no_tasks_update():
    r = proxy()
    connect(r, 1)
    [(kind, session, answer)] = unpack(
        r.handle(ClientMessage(1, msg(id=3, method="tasks/update", params={"taskId": "l/x"})))
    )
    assert (kind, session, answer["error"]["code"]) == ("ToClient", 1, -32601)


def test_the_owners_of_modern_tasks_are_bounded_and_the_oldest_forgotten():
    owners = TaskOwners(limit=3)
    for n in range(5):
        owners.add(f"m/{n}", "alice")
    assert len(owners) == 3
    assert not owners.owned_by("m/0", "alice") and not owners.owned_by("m/1", "alice")
    assert owners.owned_by("m/4", "alice") and not owners.owned_by("m/4", "bob") and not owners.owned_by(4, "alice")


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
def test_a_tasks_request_names_its_task_in_mcp_name_both_ways(method):
    meta = {PROTOCOL_VERSION: "2026-07-28", CLIENT_CAPABILITIES: EXTENSION}
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"taskId": "t-1", "_meta": meta}}
    # Towards a modern server over HTTP: its own id.
    assert request_headers(message, ToolHeaders("m"))["mcp-name"] == "t-1"
    # From a caller: a missing or different Mcp-Name is -32020.
    base = {"mcp-protocol-version": "2026-07-28", "mcp-method": method}
    assert check_headers({**base, "mcp-name": "t-1"}, message, ()) is None
    for headers in (base, {**base, "mcp-name": "t-2"}):
        assert check_headers(headers, message, ())["error"]["code"] == -32020
