"""The network fronts under hostile and careless clients, in-process over loopback.

Hostile header values, a fault injected into one connection of each transport, total
deadlines against byte-drip clients, the connection cap, one session cap across
Streamable HTTP, legacy SSE and WebSocket, nothing admitted while draining, and DELETE
with calls in flight. Every wait is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import json
import logging

import pytest
import trio
import trio_websocket

from tests.rawhttp import ResponseReader, read_response_async, request_bytes
from tests.session.fronts import INIT, EventStream, running_fronts
from tests.session.harness import running_proxy

PING = {"jsonrpc": "2.0", "id": 2, "method": "ping"}


def utf8(text: str) -> str:
    """Text whose UTF-8 bytes go on the wire as they are (headers are sent as latin-1)."""
    return text.encode("utf-8").decode("latin-1")


def call(id, name, arguments=None, meta=None):
    params = {"name": name, "arguments": arguments or {}}
    if meta:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}


async def wait_until(predicate, seconds: float = 5.0) -> None:
    with trio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110 - polling the proxy's own state in a test
            await trio.sleep(0.01)


def internal_errors(caplog, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and r.levelno == logging.ERROR and r.exc_info]


# --- hostile header values ------------------------------------------------------------------

# (what, method, headers to set or, as a list, to add, expected status)
HOSTILE = [
    ("Last-Event-ID with a superscript digit", "GET", {"last-event-id": "\xb2-1"}, 400),
    ("Last-Event-ID with Arabic-Indic digits", "GET", {"last-event-id": utf8("\u0661-\u0662")}, 400),
    ("Last-Event-ID empty", "GET", {"last-event-id": ""}, 400),
    ("Last-Event-ID huge", "GET", {"last-event-id": "1" * 8000 + "-1"}, 400),
    ("Last-Event-ID not ours", "GET", {"last-event-id": "abc"}, 400),
    ("Last-Event-ID twice", "GET", [("last-event-id", "1-1"), ("last-event-id", "1-1")], 400),
    ("Mcp-Session-Id latin-1", "POST", {"mcp-session-id": "s\xe9ssion"}, 400),
    ("Mcp-Session-Id UTF-8", "POST", {"mcp-session-id": utf8("s\u00e9ssion\u0661")}, 400),
    ("Mcp-Session-Id empty", "POST", {"mcp-session-id": ""}, 400),
    ("Mcp-Session-Id huge", "POST", {"mcp-session-id": "x" * 8000}, 400),
    ("Mcp-Session-Id twice", "POST", "session-twice", 400),
    ("Mcp-Session-Id unknown", "POST", {"mcp-session-id": "no-such-session"}, 404),
    ("MCP-Protocol-Version with a superscript digit", "POST", {"mcp-protocol-version": "2025-11-2\xb2"}, 400),
    ("MCP-Protocol-Version UTF-8", "POST", {"mcp-protocol-version": utf8("\u0662\u0660\u0662\u0665-11-25")}, 400),
    ("MCP-Protocol-Version empty", "POST", {"mcp-protocol-version": ""}, 400),
    ("MCP-Protocol-Version huge", "POST", {"mcp-protocol-version": "9" * 8000}, 400),
    ("MCP-Protocol-Version twice", "POST", [("mcp-protocol-version", "2025-11-25")] * 2, 400),
    ("Host latin-1", "POST", {"host": "\xb2"}, 421),
    ("Host UTF-8", "POST", {"host": utf8("l\u00f3calhost")}, 421),
    ("Host empty", "POST", {"host": ""}, 421),
    ("Host huge", "POST", {"host": "h" * 8000}, 421),
    ("Host with a superscript port", "POST", {"host": "127.0.0.1:\xb2"}, 421),
    ("Host with a huge port", "POST", {"host": "127.0.0.1:" + "9" * 5000}, 421),
    ("Host with an empty port", "POST", {"host": "127.0.0.1:"}, 421),
    ("Origin with a bad port", "POST", {"origin": "http://localhost:8x"}, 403),
    ("Host twice", "POST", [("host", "127.0.0.1")], 400),
    ("Origin latin-1", "POST", {"origin": "http://\xb2"}, 403),
    ("Origin UTF-8", "POST", {"origin": utf8("http://l\u00f3calhost")}, 403),
    ("Origin empty", "POST", {"origin": ""}, 403),
    ("Origin huge", "POST", {"origin": "http://" + "o" * 8000}, 403),
    ("Origin twice", "POST", [("origin", "http://localhost"), ("origin", "http://localhost")], 400),
    # Controls: what is well-formed still works.
    ("Last-Event-ID well-formed but unknown", "GET", {"last-event-id": "99-99"}, 200),
    ("MCP-Protocol-Version supported", "POST", {"mcp-protocol-version": "2025-11-25"}, 200),
]


async def test_hostile_header_values_get_a_4xx_and_the_proxy_lives_on():
    async with running_fronts() as fronts:
        session = await fronts.initialize()
        for what, method, change, expected in HOSTILE:
            headers = list(fronts.headers(mcp_session_id=session).items())
            if change == "session-twice":
                headers.append(("mcp-session-id", session))
            elif isinstance(change, list):
                headers += change
            else:
                headers = [(k, v) for k, v in headers if k not in change] + list(change.items())
            response = await fronts.request(method, headers=headers, body=PING if method == "POST" else b"")
            assert response.status == expected, (what, response)
            assert b"Traceback" not in response.body
            if 400 <= expected < 500 and response.headers.get("content-type") == "application/json":
                error = json.loads(response.body)["error"]
                assert error["message"] and error["code"] == -32600, (what, error)
        assert await fronts.ping(session, 3) == {"jsonrpc": "2.0", "id": 3, "result": {}}
        assert await fronts.initialize()


async def test_a_request_the_parser_refuses_gets_the_right_status_and_says_why():
    async with running_fronts(max_header_bytes=4096) as fronts:
        head = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        cases = [  # (what, raw request, status, words its body must hold)
            (
                "a transfer coding the proxy does not implement",
                head + b"Transfer-Encoding: gzip\r\n\r\n",
                501,
                "Transfer-Encoding",
            ),
            (
                "Transfer-Encoding twice",
                head + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                501,
                "Transfer-Encoding",
            ),
            ("headers that never end within the limit", head + b"X-Big: " + b"y" * 8000, 431, "headers too large"),
            ("not HTTP", b"NOT HTTP AT ALL\r\n\r\n", 400, "malformed"),
        ]
        for what, raw, status, words in cases:
            stream = await fronts.connect()
            await stream.send_all(raw)
            with trio.fail_after(5):
                response = await read_response_async(stream, ResponseReader())
            await stream.aclose()
            assert response.status == status, (what, response)
            assert words in response.body.decode(), (what, response)
        assert await fronts.initialize()


async def test_server_discover_is_answered_in_a_session_and_on_every_front():
    discover = {"jsonrpc": "2.0", "id": 4, "method": "server/discover", "params": {}}
    async with running_fronts() as fronts:
        answers = []
        no_session = await fronts.request("POST", body=discover)
        assert no_session.status == 400
        answers.append(json.loads(no_session.body))
        session = await fronts.initialize()
        in_session = await fronts.request("POST", headers=fronts.headers(mcp_session_id=session), body=discover)
        assert in_session.status == 200
        answers.append(json.loads(in_session.body))
        async with fronts.websocket() as socket_:
            with trio.fail_after(5):
                await socket_.send_message(json.dumps(discover))
                answers.append(json.loads(await socket_.get_message()))
    assert answers[0]["id"] == 4 and "error" in answers[0]  # no session: the front's own answer
    assert answers[1]["id"] == 4 and "2026-07-28" in answers[1]["result"]["supportedVersions"]
    assert answers[2] == answers[1]


async def test_a_bad_last_event_id_says_what_is_wrong():
    async with running_fronts() as fronts:
        session = await fronts.initialize()
        response = await fronts.request("GET", headers=fronts.headers(mcp_session_id=session, last_event_id="\xb2-1"))
        assert response.status == 400
        assert "Last-Event-ID" in json.loads(response.body)["error"]["message"]


async def test_a_non_ascii_bearer_token_is_a_401(tmp_path):
    token = "a-token-of-sixteen-or-more-characters"
    async with running_fronts(auth_tokens=[token]) as fronts:
        for value in (f"Bearer {token}\xb2", utf8(f"Bearer {token}\u0661"), "Bearer", "\xb2", ""):
            response = await fronts.request("POST", headers=fronts.headers(authorization=value), body=INIT)
            assert response.status == 401, value
        response = await fronts.request("POST", headers=fronts.headers(authorization=f"Bearer {token}"), body=INIT)
        assert response.status == 200


# --- one fault, one connection ---------------------------------------------------------------


async def test_a_fault_in_one_http_request_ends_only_its_connection(monkeypatch, caplog):
    async with running_fronts() as fronts:
        session = await fronts.initialize()
        with_session = fronts.headers(mcp_session_id=session)
        keep = await fronts.connect()
        assert (await fronts.send(keep, "POST", headers=with_session, body=PING)).status == 200

        original = fronts.hub.client_decoded

        async def faulty(key, kind, message):
            if (message.get("params") or {}).get("arguments", {}).get("fault"):
                raise RuntimeError("injected fault")
            return await original(key, kind, message)

        monkeypatch.setattr(fronts.hub, "client_decoded", faulty)
        bad = await fronts.connect()
        response = await fronts.send(bad, "POST", headers=with_session, body=call(4, "a__echo", {"fault": True}))
        assert response.status == 500
        answer = json.loads(response.body)
        assert answer["id"] == 4 and answer["error"]["code"] == -32603
        assert "Traceback" not in response.body.decode() and "injected" not in response.body.decode()
        with trio.fail_after(5):
            assert await bad.receive_some(100) == b""  # that connection, and only it, closed
        # The other connection, the session, the upstream and new clients are fine.
        response = await fronts.send(keep, "POST", headers=with_session, body=call(5, "a__echo", {"x": 1}))
        assert response.status == 200 and json.loads(response.body)["result"]["content"][0]["text"] == '{"x": 1}'
        assert await fronts.ping(session, 6) == {"jsonrpc": "2.0", "id": 6, "result": {}}
        assert await fronts.initialize()
        assert 4 not in fronts.http.sessions.by_id[session].requests  # the failed request is not left behind
        await keep.aclose()
    assert len(internal_errors(caplog, "aggregator.fronts.http.endpoint")) == 1


async def test_a_fault_in_one_legacy_sse_stream_ends_only_that_session(monkeypatch, caplog):
    async with running_fronts() as fronts:

        async def open_legacy():
            stream = await fronts.connect()
            response = await fronts.send(stream, "GET", "/sse", headers=fronts.headers(accept="text/event-stream"))
            events = EventStream(stream, response)
            name, endpoint = await events.next()
            assert name == "endpoint"
            return stream, events, endpoint.decode()

        async def post(endpoint, message):
            response = await fronts.request("POST", endpoint, body=message)
            assert response.status == 202, response

        one_stream, one_events, one_endpoint = await open_legacy()
        two_stream, two_events, two_endpoint = await open_legacy()
        assert fronts.hub.admission.sessions == 2
        one = fronts.http.legacy.by_id[one_endpoint.split("session_id=")[1]]

        async def faulty_send_events(connection):
            raise RuntimeError("injected fault")

        monkeypatch.setattr(one.queue, "send_events", faulty_send_events)
        await post(one_endpoint, INIT)
        with trio.fail_after(5):
            await one_events.wait_closed()
        await wait_until(lambda: one.id not in fronts.http.legacy.by_id)
        assert fronts.hub.admission.sessions == 1
        # The other legacy session is untouched.
        await post(two_endpoint, INIT)
        with trio.fail_after(5):
            _, data = await two_events.next()
        assert json.loads(data)["result"]["serverInfo"]["name"] == "aggregator"
        await post(two_endpoint, PING)
        with trio.fail_after(5):
            _, data = await two_events.next()
        assert json.loads(data) == {"jsonrpc": "2.0", "id": 2, "result": {}}
        await one_stream.aclose()
        await two_stream.aclose()
    assert len(internal_errors(caplog, "aggregator.fronts.http.endpoint")) == 1


# (what, body) of requests refused for what they hold, whose id can be read
REFUSED_WITH_ID = [
    (
        "nested 200 deep",
        b'{"jsonrpc":"2.0","id":"c5","method":"tools/call","params":{"name":"a__echo",'
        b'"arguments":{"x":' + b"[" * 200 + b"]" * 200 + b"}}}",
        -32600,
    ),
    (
        "NaN",
        b'{"jsonrpc":"2.0","id":"c5","method":"tools/call","params":{"name":"a__echo","arguments":{"x":NaN}}}',
        -32700,
    ),
    ("a lone surrogate", b'{"jsonrpc":"2.0","id":"c5","method":"tools/call","params":{"name":"\\ud800"}}', -32700),
    ("params not an object", b'{"jsonrpc":"2.0","id":"c5","method":"tools/list","params":7}', -32600),
]


async def test_a_refused_legacy_sse_request_is_answered_on_its_stream():
    """What its client reads: the error, with the request's id, on the session's stream
    (the POST is accepted); a message with no id to read keeps its 400."""
    async with running_fronts() as fronts:
        stream = await fronts.connect()
        response = await fronts.send(stream, "GET", "/sse", headers=fronts.headers(accept="text/event-stream"))
        events = EventStream(stream, response)
        with trio.fail_after(5):
            _, endpoint = await events.next()
        for what, body, code in REFUSED_WITH_ID:
            response = await fronts.request("POST", endpoint.decode(), body=body)
            assert (response.status, response.body) == (202, b"Accepted"), what
            with trio.fail_after(5):
                _, data = await events.next()
            answer = json.loads(data)
            assert (answer["id"], answer["error"]["code"]) == ("c5", code), (what, answer)
        for body in (b'{"jsonrpc":"2.0","id":', b'{"jsonrpc":"2.0","id":[1],"method":"ping"}'):
            response = await fronts.request("POST", endpoint.decode(), body=body)
            assert response.status == 400 and json.loads(response.body)["id"] is None, response
        await fronts.request("POST", endpoint.decode(), body=PING)
        with trio.fail_after(5):
            _, data = await events.next()
        assert json.loads(data) == {"jsonrpc": "2.0", "id": 2, "result": {}}  # nothing else was sent
        await stream.aclose()


def inject_fault(monkeypatch, hub) -> None:
    """Make the hub fail on any client message that holds the word "fault"."""
    original = hub.client_message

    async def faulty(key, raw):
        if b'"fault"' in raw:
            raise RuntimeError("injected fault")
        return await original(key, raw)

    monkeypatch.setattr(hub, "client_message", faulty)


async def test_a_fault_in_one_websocket_session_ends_only_its_connection(monkeypatch, caplog):
    async with running_fronts() as fronts:
        inject_fault(monkeypatch, fronts.hub)
        async with fronts.websocket() as good, fronts.websocket() as bad:
            with trio.fail_after(5):
                for socket_ in (good, bad):
                    await socket_.send_message(json.dumps(INIT))
                    assert "result" in json.loads(await socket_.get_message())
                await bad.send_message(json.dumps(call(7, "a__echo", {"fault": True})))
                answer = json.loads(await bad.get_message())
                assert answer["id"] == 7 and answer["error"]["code"] == -32603
                with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                    await bad.get_message()
                assert closed.value.reason.code == 1011
                await good.send_message(json.dumps(call(8, "a__echo", {"y": 2})))
                answer = json.loads(await good.get_message())
                assert answer["result"]["content"][0]["text"] == '{"y": 2}'
        async with fronts.websocket() as again:
            with trio.fail_after(5):
                await again.send_message(json.dumps(PING))
                assert json.loads(await again.get_message()) == {"jsonrpc": "2.0", "id": 2, "result": {}}
        assert fronts.hub.admission.sessions == 0
    assert len(internal_errors(caplog, "aggregator.fronts.websocket.endpoint")) == 1


async def test_a_hostile_websocket_handshake_is_a_400_not_a_crash(caplog):
    async with running_fronts() as fronts:
        from tests.rawhttp import ResponseReader as Reader

        for host in (b"\xb2", b"\xff\xfe", "l\u00f3calhost".encode()):
            stream = await trio.open_tcp_stream("127.0.0.1", fronts.ws_port)
            await stream.send_all(
                b"GET /mcp HTTP/1.1\r\nHost: " + host + b"\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                b"Sec-WebSocket-Version: 13\r\n\r\n"
            )
            with trio.fail_after(5):
                response = await read_response_async(stream, Reader())
            assert 400 <= response.status < 500, (host, response)
            await stream.aclose()
        async with fronts.websocket() as socket_:
            with trio.fail_after(5):
                await socket_.send_message(json.dumps(PING))
                assert json.loads(await socket_.get_message())["id"] == 2
        assert fronts.hub.admission.connections == 0 or fronts.hub.admission.connections == 1
    assert not [r for r in caplog.records if r.exc_info]


async def test_a_websocket_handshake_passes_the_host_check_with_the_host_it_sent(caplog):
    async with running_fronts() as fronts:
        key = b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        port = str(fronts.ws_port).encode()
        cases = [  # (what, Host lines, the status of the answer)
            ("an attacker's name", b"Host: evil.example:" + port + b"\r\n", 421),
            ("a served name", b"Host: localhost:" + port + b"\r\n", 101),
            ("a name in capitals, under a name in capitals", b"HOST:  LOCALHOST:" + port + b" \r\n", 101),
            ("an IDNA name that is not served", b"Host: xn--bcher-kva.example\r\n", 421),
            ("two (refused, not joined)", b"Host: localhost\r\nHost: evil.example\r\n", 400),
            ("none", b"", 400),
        ]
        for what, host, status in cases:
            stream = await trio.open_tcp_stream("127.0.0.1", fronts.ws_port)
            await stream.send_all(
                b"GET /mcp HTTP/1.1\r\n"
                + host
                + b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                + key
                + b"Sec-WebSocket-Version: 13\r\n\r\n"
            )
            with trio.fail_after(5):
                response = await read_response_async(stream, ResponseReader())
            await stream.aclose()
            assert response.status == status, (what, response)
        assert "this Host is not served here: 'evil.example:" in caplog.text
        assert "this Host is not served here: 'b\u00fccher.example'" in caplog.text


async def test_a_fault_in_one_stdio_session_ends_only_that_session(monkeypatch, caplog):
    async with running_proxy({"a": []}) as proxy:
        good, bad = await proxy.connect(), await proxy.connect()
        with trio.fail_after(5):
            await good.initialize()
            await bad.initialize()
        inject_fault(monkeypatch, proxy.hub)
        with trio.fail_after(5):
            await bad.send(call(9, "a__echo", {"fault": True}))
            answer = await bad.response(9)
            assert answer["error"]["code"] == -32603 and "injected" not in json.dumps(answer)
            assert await bad.stream.receive_some(100) == b""  # its session ended
            answer = await good.request("tools/call", {"name": "a__echo", "arguments": {"z": 3}})
            assert answer["result"]["content"][0]["text"] == '{"z": 3}'
    assert len(internal_errors(caplog, "aggregator.fronts.session")) == 1


# --- total deadlines -----------------------------------------------------------------------------


async def drip_until_closed(stream, seconds: float, interval: float = 0.05) -> tuple[float, bytes]:
    """Send a byte every ``interval`` until the server closes; (seconds it took, what it sent)."""
    started = trio.current_time()
    received = b""
    with trio.fail_after(seconds):
        while True:
            try:
                await stream.send_all(b"a")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            with trio.move_on_after(interval):
                try:
                    data = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    data = b""
                if not data:
                    return trio.current_time() - started, received
                received += data


async def test_headers_that_drip_are_cut_at_the_total_header_timeout():
    async with running_fronts(header_timeout=0.5) as fronts:
        stream = await fronts.connect()
        await stream.send_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Drip: ")
        took, received = await drip_until_closed(stream, 5)
        assert 0.4 < took < 1.2, took  # a byte every 50 ms would keep a per-read timeout waiting for ever
        assert received == b""
        assert await fronts.initialize()


async def test_a_body_that_drips_gets_408_at_the_total_body_timeout():
    async with running_fronts(body_timeout=0.5) as fronts:
        session = await fronts.initialize()
        stream = await fronts.connect()
        await stream.send_all(
            request_bytes("POST", "/mcp", fronts.headers(mcp_session_id=session), b"").replace(
                b"content-length: 0", b"content-length: 1000"
            )
        )
        took, received = await drip_until_closed(stream, 5)
        assert 0.4 < took < 3.0, took
        reader = ResponseReader()
        reader.feed(received)
        reader.feed(b"")
        assert reader.next().status == 408
        assert await fronts.ping(session) == {"jsonrpc": "2.0", "id": 2, "result": {}}


async def test_an_idle_keep_alive_connection_is_closed():
    async with running_fronts(keepalive_timeout=0.5) as fronts:
        session = await fronts.initialize()
        stream = await fronts.connect()
        with_session = fronts.headers(mcp_session_id=session)
        assert (await fronts.send(stream, "POST", headers=with_session, body=PING)).status == 200
        await trio.sleep(0.2)  # idle, but less than the limit: still usable
        assert (await fronts.send(stream, "POST", headers=with_session, body=PING)).status == 200
        started = trio.current_time()
        with trio.fail_after(5):
            assert await stream.receive_some(100) == b""
        assert 0.4 < trio.current_time() - started < 1.5


# --- caps ------------------------------------------------------------------------------------------


async def test_the_connection_cap_holds_across_http_and_websocket():
    async with running_fronts(max_connections=3) as fronts:
        admission = fronts.hub.admission
        held = [await fronts.connect(), await fronts.connect()]
        await wait_until(lambda: admission.connections == 2)
        async with fronts.websocket() as socket_:
            await wait_until(lambda: admission.connections == 3)
            # Over the cap: a 503 at once, then the connection closes; nothing is read from it.
            extra = await fronts.connect()
            with trio.fail_after(5):
                response = await read_response_async(extra, ResponseReader())
            assert response.status == 503 and response.headers["retry-after"]
            with pytest.raises(trio_websocket.HandshakeError):
                async with fronts.websocket():
                    pass
            assert admission.connections == 3
            # The connections already in are fine, the WebSocket session too.
            response = await fronts.send(held[0], "POST", body=INIT)
            assert response.status == 200
            with trio.fail_after(5):
                await socket_.send_message(json.dumps(PING))
                assert json.loads(await socket_.get_message())["id"] == 2
        await wait_until(lambda: admission.connections == 2)
        assert await fronts.initialize()  # room again
        for stream in held:
            await stream.aclose()
        await wait_until(lambda: admission.connections == 0)


async def test_one_session_cap_across_http_websocket_and_legacy_sse():
    async with running_fronts(max_sessions=2) as fronts:
        admission = fronts.hub.admission
        session = await fronts.initialize()
        async with fronts.websocket() as socket_:
            with trio.fail_after(5):
                await socket_.send_message(json.dumps(PING))
                await socket_.get_message()
            assert admission.sessions == 2
            response = await fronts.request("GET", "/sse", headers=fronts.headers(accept="text/event-stream"))
            assert response.status == 503 and response.headers["retry-after"] == "5"
            error = json.loads(response.body)["error"]
            assert "Too many sessions" in error["message"] and error["data"]["reason"] == "overloaded"
            response = await fronts.request("POST", body=INIT)
            assert response.status == 503 and json.loads(response.body)["id"] == 1
            with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
                async with fronts.websocket():
                    pass
            assert rejected.value.status_code == 503
            assert admission.sessions == 2
        await wait_until(lambda: admission.sessions == 1)
        stream = await fronts.connect()
        response = await fronts.send(stream, "GET", "/sse", headers=fronts.headers(accept="text/event-stream"))
        assert response.status == 200
        await stream.aclose()
        await wait_until(lambda: admission.sessions == 1)
        assert (await fronts.request("DELETE", headers=fronts.headers(mcp_session_id=session))).status == 200
        assert admission.sessions == 0


async def test_nothing_new_is_admitted_while_draining():
    async with running_fronts() as fronts:
        session = await fronts.initialize()
        with trio.fail_after(5):
            await fronts.hub.drain(1.0)
        response = await fronts.request("POST", body=INIT)
        assert response.status == 503 and response.headers["retry-after"] == "1"
        error = json.loads(response.body)["error"]
        assert "shutting down" in error["message"] and error["data"]["reason"] == "unavailable"
        response = await fronts.request("GET", "/sse", headers=fronts.headers(accept="text/event-stream"))
        assert response.status == 503
        with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
            async with fronts.websocket():
                pass
        assert rejected.value.status_code == 503
        assert dict(rejected.value.headers or [])[b"retry-after"] == b"1"
        assert fronts.hub.admission.sessions == 1
        # The session already open is still served.
        assert await fronts.ping(session) == {"jsonrpc": "2.0", "id": 2, "result": {}}


async def test_while_draining_with_shared_keys_the_listener_closes_and_what_still_arrives_is_served():
    """Behind a balancer that never sends a POST twice (nginx), a 503 for a new session
    would reach its client: with sealed sessions the listener closes instead (the
    balancer's connection is refused; it tries another replica), and what arrives on a
    connection already open is served, a new session too, each response closing it."""
    async with running_fronts(cluster={"keys": ["k" * 32]}) as fronts:
        hub = fronts.hub
        session = await fronts.initialize()
        with_session = fronts.headers(mcp_session_id=session)
        hang = await fronts.connect()
        await hang.send_all(request_bytes("POST", "/mcp", with_session, json.dumps(call(11, "a__hang")).encode()))
        server = fronts.upstreams.latest("a")
        await wait_until(lambda: any(m.get("method") == "tools/call" for m in server.seen))
        # A balancer's pooled connections, open (accepted) before the drain.
        pooled = [await fronts.connect() for _ in range(5)]
        await wait_until(lambda: hub.admission.connections == 6)
        async with trio.open_nursery() as nursery:
            drained = trio.Event()

            async def drain() -> None:
                await hub.drain(2.0)
                drained.set()

            nursery.start_soon(drain)
            await wait_until(lambda: hub.draining)
            # A new connection is refused (nothing was sent: a balancer tries another replica).
            with trio.fail_after(5):
                while True:
                    try:
                        stream = await fronts.connect()
                    except OSError:
                        break
                    await stream.aclose()
                    await trio.sleep(0.01)
            # On the connections already open: not ready, saying why.
            ready = await fronts.send(pooled[0], "GET", "/readyz")
            assert ready.status == 503 and json.loads(ready.body)["status"] == "draining"
            assert ready.headers["connection"] == "close"
            # A new session is served, its id sealed (any replica serves what follows).
            opened = await fronts.send(pooled[1], "POST", body=INIT)
            assert opened.status == 200 and opened.headers["connection"] == "close", opened
            assert opened.headers["mcp-session-id"].startswith("ag1.")
            # A stateless request is served.
            meta = {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
            }
            stateless = call(3, "a__echo", {"x": 1}, meta=meta)
            modern = fronts.headers(mcp_protocol_version="2026-07-28", mcp_method="tools/call", mcp_name="a__echo")
            served = await fronts.send(pooled[2], "POST", headers=modern, body=stateless)
            assert served.status == 200 and "result" in json.loads(served.body), served
            # The session open is served too.
            again = await fronts.send(pooled[3], "POST", headers=with_session, body=call(12, "a__echo", {"x": 1}))
            assert again.status == 200 and "result" in json.loads(again.body), again
            # A legacy stream (a GET, which a balancer does send elsewhere) lives here: refused.
            sse = await fronts.send(pooled[4], "GET", "/sse", headers=fronts.headers(accept="text/event-stream"))
            assert sse.status == 503 and sse.headers["retry-after"] == "1"
            assert not drained.is_set()
            # At the deadline the call still in flight gets an error, and the drain ends.
            with trio.fail_after(5):
                answer = await read_response_async(hang, ResponseReader())
                await drained.wait()
            assert json.loads(answer.body)["error"]["data"]["reason"] == "unavailable"
        for stream in [hang, *pooled]:
            await stream.aclose()


async def test_while_draining_the_sessions_open_are_served_and_nothing_new_is_let_in():
    async with running_fronts() as fronts:
        session = await fronts.initialize()
        with_session = fronts.headers(mcp_session_id=session)
        hang = await fronts.connect()
        await hang.send_all(request_bytes("POST", "/mcp", with_session, json.dumps(call(11, "a__hang")).encode()))
        server = fronts.upstreams.latest("a")
        await wait_until(lambda: any(m.get("method") == "tools/call" for m in server.seen))
        hub = fronts.hub
        async with trio.open_nursery() as nursery:
            drained = trio.Event()

            async def drain() -> None:
                await hub.drain(2.0)
                drained.set()

            nursery.start_soon(drain)
            await wait_until(lambda: hub.draining)
            # Not ready, at once, and saying why.
            ready = await fronts.request("GET", "/readyz")
            assert ready.status == 503 and json.loads(ready.body)["status"] == "draining"
            # A new session and a new stateless request are sent elsewhere.
            refused = await fronts.request("POST", body=INIT)
            assert refused.status == 503 and refused.headers["retry-after"] == "1"
            stateless = call(3, "a__echo", meta={"io.modelcontextprotocol/protocolVersion": "2026-07-28"})
            modern = fronts.headers(mcp_protocol_version="2026-07-28", mcp_method="tools/call", mcp_name="a__echo")
            refused = await fronts.request("POST", headers=modern, body=stateless)
            assert refused.status == 503 and refused.headers["retry-after"] == "1"
            assert json.loads(refused.body)["error"]["data"]["reason"] == "unavailable"
            # The session open is served, a new call of its too; each response closes its
            # connection, so that a balancer's pool moves on.
            served = await fronts.request("POST", headers=with_session, body=call(12, "a__echo", {"x": 1}))
            assert served.status == 200 and served.headers["connection"] == "close"
            assert "result" in json.loads(served.body), served
            assert not drained.is_set()
            # At the deadline the call still in flight gets an error, and the drain ends.
            with trio.fail_after(5):
                answer = await read_response_async(hang, ResponseReader())
                await drained.wait()
            error = json.loads(answer.body)["error"]
            assert error["data"]["reason"] == "unavailable", error
            # Closed: nothing new is taken, not even from a session open.
            late = json.loads((await fronts.request("POST", headers=with_session, body=call(13, "a__echo"))).body)
            assert late["error"]["message"] == "The aggregator is shutting down"
        await hang.aclose()


# --- DELETE with calls in flight -------------------------------------------------------------


async def test_delete_finishes_every_open_post_of_the_session_at_once():
    async with running_fronts() as fronts:
        session = await fronts.initialize()
        with_session = fronts.headers(mcp_session_id=session)
        # One call that never answers (its POST waits as JSON), one that streams progress.
        hang = await fronts.connect()
        await hang.send_all(request_bytes("POST", "/mcp", with_session, json.dumps(call(11, "a__hang")).encode()))
        progress = await fronts.connect()
        response = await fronts.send(
            progress, "POST", headers=with_session, body=call(12, "a__progress_forever", meta={"progressToken": "t"})
        )
        events = EventStream(progress, response)
        with trio.fail_after(5):
            _, data = await events.next()
        assert json.loads(data)["method"] == "notifications/progress"
        server = fronts.upstreams.latest("a")
        calls = {m["params"]["name"]: m["id"] for m in server.seen if m.get("method") == "tools/call"}
        assert set(calls) == {"hang", "progress_forever"}

        response = await fronts.request("DELETE", headers=with_session)
        assert response.status == 200
        with trio.fail_after(1):
            answer = await read_response_async(hang, ResponseReader())
            assert answer.status == 200
            error = json.loads(answer.body)
            assert error["id"] == 11 and "session ended" in error["error"]["message"]
            while True:
                _, data = await events.next()
                message = json.loads(data)
                if "id" in message:
                    break
            assert message["id"] == 12 and "session ended" in message["error"]["message"]
            await events.wait_closed()
            assert events.ended
        # Both calls are cancelled upstream under the ids the server knows them by.
        await wait_until(
            lambda: (
                {m["params"]["requestId"] for m in server.seen if m.get("method") == "notifications/cancelled"}
                == set(calls.values())
            )
        )
        assert fronts.hub.admission.sessions == 0
        await hang.aclose()
        await progress.aclose()
