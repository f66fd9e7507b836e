"""Modern (2026-07-28) requests on the Streamable HTTP front (``aggregator.fronts.http.modern``): served
without a session as a client of their own, kept once answered for the same caller's next; the headers checked
against the body (-32020), revisions (-32022), HTTP statuses by error code, GET and DELETE
without a session 405, a closed stream cancels the request upstream at once, the caps on
requests in flight, and legacy sessions beside them unchanged.

Real sockets on 127.0.0.1, the in-memory fake server ``a`` behind the hub. Every wait is
bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import trio

from aggregator.core.events import DrainingStarted
from aggregator.core.lifecycle.upstream_era import Era
from aggregator.mcp.modern import CLIENT_CAPABILITIES, PROTOCOL_VERSION, SUBSCRIPTION_ID
from tests.rawhttp import ResponseReader, read_response_async, request_bytes
from tests.session.fronts import EventStream, running_fronts

REVISION = "2026-07-28"
META = {PROTOCOL_VERSION: REVISION, CLIENT_CAPABILITIES: {}}


def modern(id: Any, method: str, meta: dict | None = None, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": {**params, "_meta": meta or META}}


def headers_for(fronts, message: dict[str, Any], **extra: str) -> dict[str, str]:
    """The headers a conforming client sends with ``message``; ``extra`` overrides (None drops)."""
    params = message.get("params") or {}
    mirrored = {"mcp_protocol_version": REVISION, "mcp_method": message["method"]}
    name = params.get("uri" if message["method"] == "resources/read" else "name")
    if message["method"] in ("tools/call", "prompts/get", "resources/read"):
        mirrored["mcp_name"] = name
    mirrored.update(extra)
    return fronts.headers(**{k: v for k, v in mirrored.items() if v is not None})


async def post(fronts, message: dict[str, Any], headers: dict[str, str] | None = None):
    return await fronts.request("POST", headers=headers or headers_for(fronts, message), body=message)


async def wait_until(predicate, seconds: float = 5.0) -> None:
    with trio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110 - polling the proxy's own state in a test
            await trio.sleep(0.01)


def seen(fronts, method: str) -> list[dict[str, Any]]:
    return [m for m in fronts.upstreams.latest("a").seen if m.get("method") == method]


async def test_a_modern_call_is_served_without_a_session_by_a_client_kept_for_the_next_one():
    async with running_fronts() as fronts:
        clients = len(fronts.hub.clients)
        message = modern(1, "tools/call", name="a__echo", arguments={"x": 1})
        response = await post(fronts, message)
        assert response.status == 200 and response.headers["content-type"] == "application/json", response
        assert "mcp-session-id" not in response.headers
        answer = json.loads(response.body)
        assert answer["id"] == 1 and answer["result"]["content"][0]["text"] == '{"x": 1}'
        assert answer["result"]["resultType"] == "complete"
        # The upstream got the call; no session was opened or counted; the client rests,
        # holding nothing, for the same caller's next request.
        assert len(seen(fronts, "tools/call")) == 1
        assert fronts.http.sessions.by_id == {} and fronts.hub.admission.sessions == 0
        assert len(fronts.hub.clients) == clients + 1 and fronts.http.stateless.in_flight == 0
        [[kept]] = fronts.http.stateless.resting.values()
        assert kept.ended and fronts.hub.router.client_idle(kept.key)
        # The next request (the same id, as another caller would send) is served by it.
        again = await post(fronts, modern(1, "tools/call", name="a__echo", arguments={"x": 2}))
        assert json.loads(again.body)["result"]["content"][0]["text"] == '{"x": 2}', again
        assert len(fronts.hub.clients) == clients + 1 and [[kept]] == list(fronts.http.stateless.resting.values())


async def test_no_client_is_kept_past_the_bound(monkeypatch):
    monkeypatch.setattr("aggregator.fronts.http.modern.RESTING", 0)
    async with running_fronts() as fronts:
        clients = len(fronts.hub.clients)
        for id in (1, 2):
            response = await post(fronts, modern(id, "tools/call", name="a__echo", arguments={"x": id}))
            assert json.loads(response.body)["result"]["content"][0]["text"] == f'{{"x": {id}}}', response
            assert len(fronts.hub.clients) == clients and fronts.http.stateless.in_flight == 0


async def test_server_discover_is_answered_statelessly_for_a_valid_host():
    """The conformance suite's DNS-rebinding scenario posts server/discover with a valid
    Host and Origin and wants a 2xx (it got the sessionless 400 before)."""
    async with running_fronts() as fronts:
        message = modern(1, "server/discover")
        headers = headers_for(fronts, message, origin=f"http://127.0.0.1:{fronts.http_port}")
        response = await post(fronts, message, headers)
        assert response.status == 200, response
        assert REVISION in json.loads(response.body)["result"]["supportedVersions"]
        foreign = dict(headers, host="evil.example.com", origin="http://evil.example.com")
        refused = await post(fronts, message, foreign)
        assert refused.status == 421, refused  # the rebinding check applies unchanged


def _b64(text: str) -> str:
    return "=?base64?" + base64.b64encode(text.encode()).decode() + "?="


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"mcp_protocol_version": None}, "MCP-Protocol-Version header is required"),
        ({"mcp_protocol_version": "2025-11-25"}, "does not match _meta"),
        ({"mcp_method": None}, "Mcp-Method header is required"),
        ({"mcp_method": "tools/list"}, "does not match the body's method"),
        ({"mcp_method": "TOOLS/CALL"}, "does not match the body's method"),  # values are case-sensitive
        ({"mcp_name": None}, "Mcp-Name header is required"),
        ({"mcp_name": "a__add"}, "does not match the body's name"),
        ({"mcp_name": _b64("a__add")}, "does not match the body's name"),
        ({"mcp_name": "=?base64?YV9fZWNobw?="}, "malformed"),  # no padding
        ({"mcp_name": "=?base64?YV9f!!!ZWNobw==?="}, "malformed"),  # not the alphabet
    ],
)
async def test_headers_that_do_not_match_the_body_are_400_header_mismatch(extra, fragment):
    async with running_fronts() as fronts:
        message = modern(3, "tools/call", name="a__echo", arguments={})
        response = await post(fronts, message, headers_for(fronts, message, **extra))
        assert response.status == 400, response
        error = json.loads(response.body)["error"]
        assert error["code"] == -32020 and fragment in error["message"], error
        assert json.loads(response.body)["id"] == 3
        assert seen(fronts, "tools/call") == []  # nothing went upstream
        assert fronts.http.stateless.in_flight == 0


async def test_header_names_are_case_insensitive_and_a_base64_name_is_decoded():
    async with running_fronts() as fronts:
        message = modern(4, "tools/call", name="a__echo", arguments={})
        headers = fronts.headers()
        headers.update({"MCP-PROTOCOL-VERSION": REVISION, "mcp-METHOD": "tools/call", "Mcp-Name": _b64("a__echo")})
        response = await post(fronts, message, headers)
        assert response.status == 200 and "result" in json.loads(response.body), response
        read = modern(5, "resources/read", uri="a+fake://doc/1")
        response = await post(fronts, read)
        assert response.status == 200 and "result" in json.loads(response.body), response


async def test_an_unsupported_revision_is_400_naming_the_supported_ones():
    async with running_fronts() as fronts:
        pinned = {PROTOCOL_VERSION: "2099-01-01", CLIENT_CAPABILITIES: {}}
        message = modern(6, "tools/list", pinned)
        response = await post(fronts, message, headers_for(fronts, message, mcp_protocol_version="2099-01-01"))
        assert response.status == 400, response
        error = json.loads(response.body)["error"]
        assert error["code"] == -32022 and REVISION in error["data"]["supported"], error
        assert error["data"]["requested"] == "2099-01-01"
        # A client that names the revision in its header only gets the same, not a session error.
        bare = {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}}
        response = await post(fronts, bare, headers_for(fronts, bare, mcp_protocol_version="2099-01-01"))
        assert response.status == 400 and json.loads(response.body)["error"]["code"] == -32022, response
        # ... and a modern header with no _meta is an invalid request (-32602), also 400.
        response = await post(fronts, bare, headers_for(fronts, bare))
        assert response.status == 400 and json.loads(response.body)["error"]["code"] == -32602, response


@pytest.mark.parametrize(
    ("message", "status", "code"),
    [
        (modern(8, "ping"), 404, -32601),  # removed in 2026-07-28
        (modern(8, "initialize"), 404, -32601),  # ... with modern _meta: a modern request, not a session
        (modern(8, "no/such"), 404, -32601),
        (modern(8, "tools/list", {PROTOCOL_VERSION: REVISION}), 400, -32602),  # no clientCapabilities
        (modern(8, "tools/call", name="a__nope", arguments={}), 400, -32602),  # no such tool
        (modern(8, "tools/call", name="a__fail", arguments={}), 200, -32603),  # a server error: 200
    ],
)
async def test_an_error_answer_has_the_status_its_code_calls_for(message, status, code):
    async with running_fronts() as fronts:
        response = await post(fronts, message)
        assert response.status == status, response
        assert json.loads(response.body)["error"]["code"] == code


async def test_mirrored_tool_parameters_are_checked_against_the_arguments():
    async with running_fronts(["param_headers"]) as fronts:
        arguments = {"region": "Zürich", "count": 42, "opts": {"deep": True}, "list": ["x"]}
        message = modern(9, "tools/call", name="a__where", arguments=arguments)
        good = headers_for(fronts, message, mcp_param_region=_b64("Zürich"), mcp_param_count="42.0")
        good["MCP-PARAM-DEEP"] = "true"
        response = await post(fronts, message, good)
        assert response.status == 200 and "result" in json.loads(response.body), response
        cases = [
            ({"mcp-param-count": None}, "Mcp-Param-count header is required"),  # value in body, no header
            ({"mcp-param-count": "41"}, "does not match the argument 'count'"),
            ({"mcp-param-deep": "True"}, "does not match the argument 'opts.deep'"),
            ({"mcp-param-region": "Zurich"}, "does not match the argument 'region'"),
            ({"mcp-param-region": "=?base64?WsO8cmljaA?="}, "malformed"),
        ]
        for change, fragment in cases:
            headers = {key.lower(): value for key, value in good.items()}
            headers.update(change)
            headers = {k: v for k, v in headers.items() if v is not None}
            response = await post(fronts, message, headers)
            assert response.status == 400, (change, response)
            assert fragment in json.loads(response.body)["error"]["message"], (change, response.body)
        # An argument left out needs no header; a header for an argument not given is refused.
        lean = modern(10, "tools/call", name="a__where", arguments={"region": "eu"})
        response = await post(fronts, lean, headers_for(fronts, lean, mcp_param_region="eu"))
        assert response.status == 200, response
        response = await post(fronts, lean, headers_for(fronts, lean, mcp_param_region="eu", mcp_param_count="1"))
        assert response.status == 400 and "not" in json.loads(response.body)["error"]["message"], response
        assert len(seen(fronts, "tools/call")) == 2


async def test_get_and_delete_without_a_session_are_405_and_legacy_sessions_work_beside():
    async with running_fronts() as fronts:
        for method in ("GET", "DELETE"):
            response = await fronts.request(method, headers=fronts.headers(accept="text/event-stream"))
            assert response.status == 405 and response.headers["allow"] == "POST", response
        session = await fronts.initialize()
        assert (await fronts.ping(session))["result"] == {}
        message = modern(11, "tools/call", name="a__echo", arguments={"y": 2})
        assert (await post(fronts, message)).status == 200
        response = await fronts.request("DELETE", headers=fronts.headers(mcp_session_id=session))
        assert response.status == 200 and fronts.http.sessions.by_id == {}


async def test_a_client_that_closes_before_the_answer_cancels_the_call_upstream_at_once():
    async with running_fronts(stream_drop_grace=30.0) as fronts:
        clients = len(fronts.hub.clients)
        message = modern(12, "tools/call", name="a__hang", arguments={})
        stream = await fronts.connect()
        await stream.send_all(request_bytes("POST", "/mcp", headers_for(fronts, message), json.dumps(message).encode()))
        await wait_until(lambda: len(seen(fronts, "tools/call")) == 1)
        assert fronts.http.stateless.in_flight == 1 and len(fronts.hub.clients) == clients + 1
        await stream.aclose()
        # No grace period (30 s here): the server hears of it within the test's bound.
        await wait_until(lambda: len(seen(fronts, "notifications/cancelled")) == 1, 3.0)
        await wait_until(lambda: len(fronts.hub.clients) == clients and fronts.http.stateless.in_flight == 0)


async def test_a_streamed_answer_carries_its_progress_without_event_ids_and_ends_on_close():
    async with running_fronts() as fronts:
        meta = dict(META, progressToken="p1")
        message = modern(13, "tools/call", meta, name="a__progress_forever", arguments={})
        stream = await fronts.connect()
        headers = dict(headers_for(fronts, message), last_event_id="1-1")  # ignored
        await stream.send_all(request_bytes("POST", "/mcp", headers, json.dumps(message).encode()))
        with trio.fail_after(5):
            response = await read_response_async(stream, ResponseReader())
        assert response.headers["content-type"] == "text/event-stream", response
        assert response.headers["x-accel-buffering"] == "no"
        events = EventStream(stream, response)
        with trio.fail_after(5):
            first = await events.next_message()
            second = await events.next_message()
        for event_id, note in (first, second):
            assert event_id == "" and note["method"] == "notifications/progress"
            assert note["params"]["progressToken"] == "p1"
        await stream.aclose()
        await wait_until(lambda: len(seen(fronts, "notifications/cancelled")) == 1, 3.0)
        await wait_until(lambda: fronts.http.stateless.in_flight == 0)


async def test_a_listen_stream_stays_open_until_its_client_closes_it():
    async with running_fronts(["rug_pull"]) as fronts:
        message = modern("L1", "subscriptions/listen", notifications={"toolsListChanged": True})
        stream = await fronts.connect()
        await stream.send_all(request_bytes("POST", "/mcp", headers_for(fronts, message), json.dumps(message).encode()))
        with trio.fail_after(5):
            response = await read_response_async(stream, ResponseReader())
            events = EventStream(stream, response)
            _, ack = await events.next_message()
        assert ack["method"] == "notifications/subscriptions/acknowledged"
        assert ack["params"]["_meta"][SUBSCRIPTION_ID] == "L1"
        # A list change elsewhere reaches it, tagged; the stream stays open after it.
        rug = modern(14, "tools/call", name="a__rug", arguments={})
        assert (await post(fronts, rug)).status == 200
        with trio.fail_after(5):
            _, changed = await events.next_message()
        assert changed["method"] == "notifications/tools/list_changed"
        assert changed["params"]["_meta"][SUBSCRIPTION_ID] == "L1"
        assert fronts.http.stateless.in_flight == 1 and not events.ended
        await stream.aclose()
        await wait_until(lambda: fronts.http.stateless.in_flight == 0 and not fronts.hub.router.listens)


async def test_requests_in_flight_are_capped_per_token_and_overall():
    tokens = [f"token-number-{n}-0123456789" for n in (1, 2, 3)]
    t1, t2, t3 = tokens
    async with running_fronts(max_stateless_requests=2, max_stateless_per_principal=1, auth_tokens=tokens) as f:
        hang = modern(15, "tools/call", name="a__hang", arguments={})
        echo = modern(16, "tools/call", name="a__echo", arguments={})

        def as_(token: str, message: dict[str, Any]) -> dict[str, str]:
            return headers_for(f, message, authorization=f"Bearer {token}")

        held = []

        async def hold(token: str) -> None:
            stream = await f.connect()
            await stream.send_all(request_bytes("POST", "/mcp", as_(token, hang), json.dumps(hang).encode()))
            held.append(stream)
            await wait_until(lambda: f.http.stateless.in_flight == len(held))

        await hold(t1)
        response = await post(f, echo, as_(t1, echo))
        assert response.status == 503 and response.headers["retry-after"] == "1", response
        assert "for this token (limit 1)" in json.loads(response.body)["error"]["message"]
        await hold(t2)
        response = await post(f, echo, as_(t3, echo))
        assert response.status == 503 and response.headers["retry-after"] == "1", response
        assert "Too many requests in flight (limit 2)" in json.loads(response.body)["error"]["message"]
        await held[0].aclose()
        await wait_until(lambda: f.http.stateless.in_flight == 1)
        response = await post(f, echo, as_(t1, echo))
        assert response.status == 200, response
        assert f.hub.admission.sessions == 0  # none of this counted as a session
        await held[1].aclose()
        await wait_until(lambda: f.http.stateless.in_flight == 0 and f.http.stateless.by_principal == {})


async def test_sessionless_discover_without_meta_and_notifications_of_a_modern_client():
    async with running_fronts() as fronts:
        bare = {"jsonrpc": "2.0", "id": 17, "method": "server/discover", "params": {}}
        response = await fronts.request("POST", body=bare)
        assert response.status == 400 and json.loads(response.body)["error"]["code"] == -32602, response
        note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
        response = await fronts.request("POST", headers=fronts.headers(mcp_protocol_version=REVISION), body=note)
        assert response.status == 202 and response.body == b"", response
        response = await fronts.request("POST", body=note)  # a legacy client without its session: as before
        assert response.status == 400 and b"Mcp-Session-Id" in response.body, response


async def test_while_shutting_down_a_modern_request_is_refused_with_503():
    async with running_fronts() as fronts:
        fronts.hub.router.handle(DrainingStarted())
        message = modern(18, "tools/list")
        response = await post(fronts, message)
        assert response.status == 503 and response.headers["retry-after"] == "1", response
        assert json.loads(response.body)["error"]["data"]["reason"] == "unavailable"
        assert fronts.http.stateless.in_flight == 0


async def test_a_failure_while_serving_one_modern_request_ends_only_its_connection(monkeypatch):
    async with running_fronts() as fronts:
        clients = len(fronts.hub.clients)
        routed = fronts.hub.client_decoded
        failures = []

        async def fail_once(key, kind, message):
            if not failures:
                failures.append(key)
                raise RuntimeError("a bug")
            return await routed(key, kind, message)

        monkeypatch.setattr(fronts.hub, "client_decoded", fail_once)
        message = modern(19, "tools/call", name="a__echo", arguments={})
        response = await post(fronts, message)
        assert response.status == 500 and json.loads(response.body)["error"]["code"] == -32603, response
        assert len(fronts.hub.clients) == clients and fronts.http.stateless.in_flight == 0
        response = await post(fronts, message)
        assert response.status == 200 and "result" in json.loads(response.body), response


async def test_the_token_and_path_choose_a_modern_requests_profile_as_for_initialize(monkeypatch):
    token, work = "a-default-token-of-sixteen-characters", "a-work-token-of-sixteen-characters"
    profiles = {"work": {"tokens": [work]}, "other": {}}
    async with running_fronts(profiles=profiles, auth_tokens=[token]) as fronts:
        added = []
        add_client = fronts.hub.client_connected

        def recording(sink, profile="default", **kwargs):
            added.append((profile, kwargs))
            return add_client(sink, profile, **kwargs)

        monkeypatch.setattr(fronts.hub, "client_connected", recording)
        message = modern(20, "tools/list")

        async def post_as(bearer: str | None, path: str = "/mcp"):
            headers = headers_for(fronts, message, **({"authorization": f"Bearer {bearer}"} if bearer else {}))
            return await fronts.request("POST", path, headers=headers, body=message)

        assert (await post_as(None)).status == 401
        assert (await post_as(work, "/mcp/other")).status == 403
        assert added == []  # refused before any client existed
        assert (await post_as(work, "/mcp/work")).status == 200
        assert (await post_as(work)).status == 200
        assert (await post_as(token)).status == 200
        principals = [kwargs["principal"] for _, kwargs in added]
        # The second request of the work token (its profile either way) is served by the
        # client the first one left resting: no client is shared across tokens or profiles.
        assert [profile for profile, _ in added] == ["work", "default"]
        assert all(kwargs["era"] is Era.MODERN for _, kwargs in added)
        assert principals[0] != principals[1]
        assert sorted(fronts.http.stateless.resting) == sorted([(principals[0], "work"), (principals[1], "default")])
