"""`aggregator serve --http` end to end: the SDK client over Streamable HTTP, and the
security and HTTP checks a browser-reachable local server must pass."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time

import anyio
import pytest
from mcp import Client, ClientSession
from mcp import types as t
from mcp.client.streamable_http import streamable_http_client

from tests.e2e.conftest import TOKEN, fake, http_proxy, initialize, post, stateless, write_config
from tests.loopback import INIT, free_port, wait_listening

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*2026-07-28")]


@pytest.fixture
def fake_config(tmp_path):
    return write_config(tmp_path, fake("a"), startup_timeout=10.0)


def test_sdk_client_over_http_with_two_sessions(tmp_path, everything_js):
    config = write_config(
        tmp_path,
        f'''
[servers.everything]
command = "node"
args = ["{everything_js}", "stdio"]
''',
        startup_timeout=20.0,
        page_size=7,
    )

    async def one_client(port, label, results, both_done_progress, my_turn, done):
        sampled = []

        async def sample(context, params):
            sampled.append(params.messages[0].content.text)
            return t.CreateMessageResult(
                role="assistant", model=label, content=t.TextContent(type="text", text=f"answer for {label}")
            )

        # Two legacy sessions (a 2026-07-28 client has none): the SDK is told the era.
        async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy", sampling_callback=sample) as client:
            assert client.server_info.name == "aggregator"
            names, cursor = [], None
            while True:
                page = await client.list_tools(cursor=cursor)
                names += [tool.name for tool in page.tools]
                cursor = page.next_cursor
                if not cursor:
                    break
            assert "everything__echo" in names and len(names) == len(set(names))
            progress = []

            async def on_progress(value, total, message):
                progress.append(value)

            # Both sessions at once, same request ids and progress tokens (each SDK client
            # numbers from the same start): each sees only its own progress and result.
            result = await client.session.call_tool(
                "everything__trigger-long-running-operation", {"duration": 1, "steps": 4}, progress_callback=on_progress
            )
            assert "completed" in result.content[0].text
            both_done_progress[label].set()
            for event in both_done_progress.values():
                await event.wait()
            # A sampling request from the shared server can only be routed while one
            # session has calls in flight there, so the two take turns.
            await my_turn.wait()
            result = await client.call_tool(
                "everything__trigger-sampling-request", {"prompt": f"question from {label}", "maxTokens": 5}
            )
            results[label] = (progress, sampled, result.content[0].text)
            done.set()

    with http_proxy(config) as (port, _):
        results = {}

        async def main():
            progress_done = {"first": anyio.Event(), "second": anyio.Event()}
            first_turn, second_turn, finished = anyio.Event(), anyio.Event(), anyio.Event()
            first_turn.set()
            async with anyio.create_task_group() as group:
                group.start_soon(one_client, port, "first", results, progress_done, first_turn, second_turn)
                group.start_soon(one_client, port, "second", results, progress_done, second_turn, finished)

        anyio.run(main)
    for label in ("first", "second"):
        progress, sampled, text = results[label]
        assert progress == [1, 2, 3, 4]  # its own progress, none of the other's
        assert len(sampled) == 1 and sampled[0].endswith(f"question from {label}")
        assert f"answer for {label}" in text


def test_sdk_1x_style_session_over_http(fake_config):
    """The ClientSession + streamable_http_client pair (the shape 1.x code uses)."""
    with http_proxy(fake_config) as (port, _):

        async def main():
            async with streamable_http_client(f"http://127.0.0.1:{port}/mcp") as streams:
                read, write = streams[0], streams[1]
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    result = await session.call_tool("a__echo", {"n": 123456789012345678901234567890})
                    assert "123456789012345678901234567890" in result.content[0].text

        anyio.run(main)


def test_origin_host_and_headers(fake_config):
    with http_proxy(fake_config) as (port, log):
        # DNS rebinding: an attacker's name in Host (and Origin) is refused before anything runs.
        status, _, _ = post(port, INIT, {"host": f"evil.example:{port}", "origin": f"http://evil.example:{port}"})
        assert status == 421
        for origin in ("http://evil.example", "null", "http://localhost.evil.example"):
            for method in ("POST", "GET", "DELETE"):
                status, _, _ = post(port, INIT if method == "POST" else None, {"origin": origin}, method=method)
                assert status == 403, (origin, method)
        for host in ("localhost", "127.0.0.1", "[::1]"):
            status, headers, _ = post(port, INIT, {"host": f"{host}:{port}", "origin": f"http://{host}:{port}"})
            assert status == 200 and headers["mcp-session-id"]
        session = initialize(port)
        with_session = {"mcp-session-id": session}
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        assert post(port, ping, {**with_session, "mcp-protocol-version": "1999-01-01"})[0] == 400
        assert post(port, ping, {**with_session, "content-type": "text/plain"})[0] == 415
        assert post(port, ping, {**with_session, "accept": "text/html"})[0] == 406
        assert post(port, None, {**with_session, "accept": "application/json"}, method="GET")[0] == 406
        assert post(port, ping, with_session, path="/other")[0] == 404
        assert post(port, ping, with_session, method="PUT")[0] == 405
        status, _, body = post(port, ping, {**with_session, "mcp-protocol-version": "2025-11-25"})
        assert status == 200 and json.loads(body) == {"jsonrpc": "2.0", "id": 2, "result": {}}
        # Notifications and responses: 202, no body.
        status, _, body = post(port, {"jsonrpc": "2.0", "method": "notifications/initialized"}, with_session)
        assert (status, body) == (202, b"")
    assert "evil.example" in log.read_text()


# (Accept header, or None for none, whether a POST with it is served)
ACCEPTS = [
    (None, False),
    ("application/json", False),
    ("text/event-stream", False),
    ("text/html", False),
    ("application/*", False),
    ("application/json, text/*; q=0.5", True),
    ("text/event-stream, application/*", True),
    ("APPLICATION/JSON ; q=0.9 , Text/Event-Stream", True),
    ("*/*", True),
    ("text/html, */*;q=0.1", True),
]


def test_a_post_must_accept_json_and_event_streams(fake_config):
    """Its answer may come as either: an Accept header that does not list both (by name
    or wildcard) is 406, with a JSON-RPC error saying what it must hold; sessions and
    requests without one alike."""
    modern, modern_headers = stateless(3, "tools/list")
    with http_proxy(fake_config) as (port, log):
        session = initialize(port)
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        for accept, served in ACCEPTS:
            for body, headers in ((ping, {"mcp-session-id": session}), (modern, modern_headers)):
                status, response_headers, answer = post(port, body, {**headers, "accept": accept})
                if served:
                    assert status == 200 and "result" in json.loads(answer), (accept, body, answer)
                    continue
                error = json.loads(answer)
                assert status == 406 and response_headers["content-type"] == "application/json", (accept, answer)
                assert error["id"] is None and error["error"]["code"] == -32600, error
                assert "must list both application/json and text/event-stream" in error["error"]["message"]
        status, _, answer = post(port, INIT, {"accept": None})
        assert (
            status == 406
            and "(missing: application/json and text/event-stream)" in json.loads(answer)["error"]["message"]
        )
        assert post(port, ping, {"mcp-session-id": session})[0] == 200  # the session was not harmed
    assert "Traceback" not in log.read_text()


def test_sessions_lifecycle(fake_config):
    with http_proxy(fake_config) as (port, _):
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        status, _, body = post(port, ping)
        assert status == 400 and json.loads(body)["error"]["code"] == -32600  # no session id
        # server/discover is a 2026-07-28 request: without its _meta it is malformed (-32602).
        status, _, body = post(port, {"jsonrpc": "2.0", "id": 3, "method": "server/discover", "params": {}})
        assert status == 400 and json.loads(body)["error"]["code"] == -32602
        assert post(port, ping, {"mcp-session-id": "not-a-session"})[0] == 404
        ids = {initialize(port) for _ in range(100)}
        assert len(ids) == 100
        assert all(len(i) >= 22 and all(0x21 <= ord(c) <= 0x7E for c in i) for i in ids)
        session = ids.pop()
        assert post(port, ping, {"mcp-session-id": session})[0] == 200
        assert post(port, None, {"mcp-session-id": session}, method="DELETE")[0] == 200
        assert post(port, ping, {"mcp-session-id": session})[0] == 404
        assert post(port, None, {"mcp-session-id": session}, method="DELETE")[0] == 404
        # A second initialize on a session is refused; an initialize naming a session too.
        status, _, _ = post(port, INIT, {"mcp-session-id": ids.pop()})
        assert status == 400


def test_limits(tmp_path):
    config = write_config(
        tmp_path, fake("a") + "\n[http]\nmax_sessions = 3\nheader_timeout = 1.0\n", startup_timeout=10.0
    )
    with http_proxy(config) as (port, log):
        session = initialize(port)
        big = b'{"jsonrpc":"2.0","id":5,"method":"ping","params":{"x":"' + b"x" * (5 * 1024 * 1024) + b'"}}'
        assert post(port, big, {"mcp-session-id": session})[0] == 413
        said = [line for line in log.read_text().splitlines() if "refused a request (413)" in line]
        assert len(said) == 1 and "WARNING" in said[0] and "xxxx" not in said[0], said
        status, _, body = post(port, [{"jsonrpc": "2.0", "id": 1, "method": "ping"}], {"mcp-session-id": session})
        assert status == 400 and json.loads(body)["error"]["code"] == -32600
        status, _, body = post(port, b'{"jsonrpc": "2.0", "id": 1, "method":', {"mcp-session-id": session})
        assert status == 400 and json.loads(body)["error"]["code"] == -32700
        status, _, body = post(port, b'{"jsonrpc":"2.0","id":"a\xffb","method":"ping"}', {"mcp-session-id": session})
        assert status == 400 and json.loads(body)["id"] is None and json.loads(body)["error"]["code"] == -32700
        status, _, _ = post(
            port, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"mcp-session-id": session, "x-padding": "y" * 40000}
        )
        assert status == 431
        initialize(port)
        initialize(port)
        status, headers, _ = post(port, INIT)
        assert status == 503 and "retry-after" in headers
        # Slow headers (slowloris): the connection is closed after the header timeout.
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            sock.settimeout(10)
            started = time.monotonic()
            assert sock.recv(100) == b""
            assert 0.9 < time.monotonic() - started < 5


def test_bearer_tokens(tmp_path):
    config = write_config(
        tmp_path, fake("a") + f'\n[http]\nauth_tokens = ["{TOKEN}", "{TOKEN}-other"]\n', startup_timeout=10.0
    )
    with http_proxy(config) as (port, log):
        for headers in ({}, {"authorization": "Bearer wrong-token-wrong-token"}, {"authorization": TOKEN}):
            status, response_headers, _ = post(port, INIT, headers)
            assert status == 401 and response_headers["www-authenticate"].startswith("Bearer")
        assert post(port, INIT, path=f"/mcp?token={TOKEN}")[0] == 401
        good = {"authorization": f"Bearer {TOKEN}"}
        session = initialize(port, good)
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        assert post(port, ping, {**good, "mcp-session-id": session})[0] == 200
        assert post(port, ping, {"mcp-session-id": session})[0] == 401
        # A session belongs to the token that made it.
        other = {"authorization": f"Bearer {TOKEN}-other"}
        assert post(port, ping, {**other, "mcp-session-id": session})[0] == 404
    assert TOKEN not in log.read_text()


def test_refuses_to_expose_itself_without_tokens(fake_config):
    out = subprocess.run(
        [sys.executable, "-m", "aggregator", "serve", "--http", "0.0.0.0:9", "--config", str(fake_config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "without authentication" in out.stderr


def test_get_stream_carries_what_belongs_to_no_request(tmp_path):
    config = write_config(
        tmp_path, fake("a", "crash_on_call"), startup_timeout=10.0, restart_backoff_initial=0.1, restart_backoff_max=0.2
    )
    with http_proxy(config) as (port, _):
        session = initialize(port)
        headers = {"mcp-session-id": session}
        stream = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        stream.request(
            "GET",
            "/mcp",
            headers={"host": f"127.0.0.1:{port}", "accept": "text/event-stream", "mcp-session-id": session},
        )
        response = stream.getresponse()
        assert response.status == 200 and response.getheader("content-type") == "text/event-stream"
        # A second GET stream for the same session is refused.
        assert post(port, None, {**headers, "accept": "text/event-stream"}, method="GET")[0] == 409
        # The server crashes and comes back: the list changes belong to no request.
        status, _, body = post(
            port,
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "a__crash", "arguments": {}}},
            headers,
        )
        assert status == 200 and json.loads(body)["error"]["data"]["reason"] == "unavailable"
        event = None
        while event is None:
            line = response.fp.readline()
            assert line, "stream ended"
            if line.startswith(b"data: ") and line[6:].strip():  # skip the priming event
                event = json.loads(line[6:])
        assert event == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
        stream.close()


def test_logs_during_a_call_travel_with_it(fake_config):
    with http_proxy(fake_config) as (port, _):
        session = initialize(port)
        status, headers, body = post(
            port,
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "a__flood", "arguments": {"count": 3}},
            },
            {"mcp-session-id": session},
        )
        assert status == 200 and headers["content-type"] == "text/event-stream"
        events = [json.loads(line[6:]) for line in body.split(b"\n") if line.startswith(b"data: ") and line[6:].strip()]
        assert [e.get("params", {}).get("logger") for e in events[:3]] == ["a/flood"] * 3
        assert events[-1]["id"] == 2 and events[-1]["result"]["content"][0]["text"] == "flooded"


def test_dropped_stream_cancels_its_request(tmp_path):
    config = write_config(tmp_path, fake("a") + "\n[http]\nstream_drop_grace = 0.3\n", startup_timeout=10.0)
    with http_proxy(config, "--log-level", "info") as (port, log):
        session = initialize(port)
        body = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "a__hang"}})
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(
                f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                f"Accept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
            )
            time.sleep(0.3)
        deadline = time.monotonic() + 5
        while "dropped; cancelling it" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "stream for request 9 dropped; cancelling it" in log.read_text()
        # The session is still good.
        assert post(port, {"jsonrpc": "2.0", "id": 10, "method": "ping"}, {"mcp-session-id": session})[0] == 200


def test_per_session_isolation(tmp_path):
    config = write_config(tmp_path, fake("shared") + fake("own", isolation='"per-session"'), startup_timeout=10.0)

    def pid(port, session, tool):
        status, _, body = post(
            port,
            {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": tool, "arguments": {}}},
            {"mcp-session-id": session},
        )
        assert status == 200, body
        return int(json.loads(body)["result"]["content"][0]["text"])

    def alive(pid_: int) -> bool:
        try:
            os.kill(pid_, 0)
            return True
        except ProcessLookupError:
            return False

    with http_proxy(config) as (port, _):
        one, two = initialize(port), initialize(port)
        assert pid(port, one, "shared__pid") == pid(port, two, "shared__pid")
        own_one, own_two = pid(port, one, "own__pid"), pid(port, two, "own__pid")
        assert own_one != own_two and pid(port, one, "own__pid") == own_one
        assert post(port, None, {"mcp-session-id": one}, method="DELETE")[0] == 200
        deadline = time.monotonic() + 10
        while alive(own_one) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(own_one) and alive(own_two)
        assert pid(port, two, "own__pid") == own_two


def test_resume_a_dropped_stream_with_last_event_id(tmp_path, everything_js):
    config = write_config(
        tmp_path,
        f'''
[servers.everything]
command = "node"
args = ["{everything_js}", "stdio"]
''',
        startup_timeout=20.0,
    )
    with http_proxy(config) as (port, _):
        session = initialize(port)
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 77,
                "method": "tools/call",
                "params": {
                    "name": "everything__trigger-long-running-operation",
                    "arguments": {"duration": 2, "steps": 4},
                    "_meta": {"progressToken": "p"},
                },
            }
        )
        seen_ids = []
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(
                f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                f"Accept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\n"
                f"MCP-Protocol-Version: 2025-11-25\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()
            )
            received = b""
            while b'"progress":1' not in received:
                chunk = sock.recv(65536)
                assert chunk, received
                received += chunk
            seen_ids = [line[4:].decode() for line in received.split(b"\n") if line.startswith(b"id: ")]
        assert seen_ids[0].endswith("-0")  # the priming event comes first
        assert b"\nretry: 1000\n" in received  # half the default grace period: come back in time
        last = seen_ids[-1]
        # Reconnect at once (within the grace period) and pick up where the stream broke.
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        connection.request(
            "GET",
            "/mcp",
            headers={
                "host": f"127.0.0.1:{port}",
                "accept": "text/event-stream",
                "mcp-session-id": session,
                "last-event-id": last,
            },
        )
        response = connection.getresponse()
        assert response.status == 200
        events = [
            json.loads(line[6:])
            for line in response.read().split(b"\n")
            if line.startswith(b"data: ") and line[6:].strip()
        ]
        progress = [e["params"]["progress"] for e in events if e.get("method") == "notifications/progress"]
        assert progress == [2, 3, 4] and events[-1]["id"] == 77 and "completed" in str(events[-1]["result"])


def test_a_client_that_does_not_read_is_cut_off_and_others_go_on(tmp_path):
    config = write_config(
        tmp_path, fake("a") + "\n[http]\nmax_stream_buffer_bytes = 65536\nwrite_timeout = 1.0\n", startup_timeout=10.0
    )
    with http_proxy(config) as (port, log):
        slow = initialize(port)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(
                f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n"
                f"Mcp-Session-Id: {slow}\r\n\r\n".encode()
            )
            time.sleep(0.3)
            # Two calls in flight make the flood's log lines belong to no single request,
            # so they all head for the GET stream that nobody reads.
            hold = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(2)]
            for index, connection in enumerate(hold):
                connection.request(
                    "POST",
                    "/mcp",
                    body=json.dumps(
                        {"jsonrpc": "2.0", "id": 100 + index, "method": "tools/call", "params": {"name": "a__hang"}}
                    ),
                    headers={
                        "content-type": "application/json",
                        "host": f"127.0.0.1:{port}",
                        "accept": "application/json, text/event-stream",
                        "mcp-session-id": slow,
                    },
                )
            time.sleep(0.3)
            status, _, body = post(
                port,
                {
                    "jsonrpc": "2.0",
                    "id": 3,
                    "method": "tools/call",
                    "params": {"name": "a__flood", "arguments": {"count": 50000}},
                },
                {"mcp-session-id": slow},
            )
            # More than the client budget (64 KiB here) waits on the unread GET stream: the
            # session is dropped, even while this call is answered on its own stream.
            assert status == 404 and b"Session ended" in body, (status, body)
            # Another session is unaffected.
            other = initialize(port)
            assert post(port, {"jsonrpc": "2.0", "id": 4, "method": "ping"}, {"mcp-session-id": other})[0] == 200
            deadline = time.monotonic() + 10
            while "dropped: more than 65536 bytes" not in log.read_text():
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.1)
            assert post(port, {"jsonrpc": "2.0", "id": 5, "method": "ping"}, {"mcp-session-id": slow})[0] == 404
            # Its calls in flight were answered (the session ended), not left hanging.
            for connection in hold:
                connection.sock.settimeout(10)
                response = connection.getresponse()
                assert response.status in (200, 404), response.status
                response.read()
                connection.close()


def test_idle_sessions_expire(tmp_path):
    config = write_config(tmp_path, fake("a") + "\n[http]\nsession_idle_timeout = 0.5\n", startup_timeout=10.0)
    with http_proxy(config) as (port, _):
        session = initialize(port)
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        assert post(port, ping, {"mcp-session-id": session})[0] == 200
        time.sleep(1.5)  # idle for three times the limit (each request counts as activity)
        assert post(port, ping, {"mcp-session-id": session})[0] == 404
        assert initialize(port)  # and a new one works


def test_hostile_header_bytes_get_4xx_and_the_process_lives_on(tmp_path):
    """Bytes that str.isdigit() accepts and int() refuses, and a Host that is not IDNA,
    each used to end the whole process."""
    from tests.rawhttp import exchange, request_bytes, websocket_handshake

    ws_port = free_port()
    config = write_config(tmp_path, fake("a"), startup_timeout=10.0)
    with http_proxy(config, "--ws", f"127.0.0.1:{ws_port}") as (port, log):
        wait_listening(ws_port)
        session = initialize(port)
        headers = {"host": f"127.0.0.1:{port}", "accept": "text/event-stream", "mcp-session-id": session}
        for value in ("\xb2-1", "1-\xb2", "\u0661-\u0662".encode().decode("latin-1"), ""):
            response = exchange(port, request_bytes("GET", "/mcp", {**headers, "last-event-id": value}))
            assert response.status == 400, (value, response)
        for value in ("\xb2", "2025-11-2\xb2"):
            response = exchange(
                port,
                request_bytes(
                    "POST",
                    "/mcp",
                    {
                        **headers,
                        "mcp-protocol-version": value,
                        "accept": "application/json, text/event-stream",
                        "content-type": "application/json",
                    },
                    b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
                ),
            )
            assert response.status == 400, (value, response)
        handshake = websocket_handshake(ws_port).replace(f"Host: 127.0.0.1:{ws_port}".encode(), b"Host: \xb2")
        assert 400 <= exchange(ws_port, handshake).status < 500
        assert post(port, {"jsonrpc": "2.0", "id": 2, "method": "ping"}, {"mcp-session-id": session})[0] == 200
    assert "Traceback" not in log.read_text()


def test_drip_feeding_connections_are_capped_and_cut_at_the_deadline(tmp_path):
    config = write_config(
        tmp_path, fake("a") + "\n[http]\nmax_connections = 20\nheader_timeout = 1.0\n", startup_timeout=10.0
    )
    with http_proxy(config) as (port, _):
        socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(30)]
        started = time.monotonic()
        for sock in socks:
            sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        refused = closed = 0
        # Drip a byte into every connection each 0.2 s until the server has closed all of them.
        for _ in range(25):
            for sock in list(socks):
                try:
                    sock.sendall(b"x")
                    sock.setblocking(False)
                    data = sock.recv(4096)
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    data = b""
                finally:
                    sock.setblocking(True)
                if data.startswith(b"HTTP/1.1 503"):
                    refused += 1
                else:
                    assert data == b"", data
                    closed += 1
                socks.remove(sock)
                sock.close()
            if not socks:
                break
            time.sleep(0.2)
        assert not socks, "some dripping connections stayed open"
        assert time.monotonic() - started < 3.5
        assert refused >= 10 and closed >= 1
        assert initialize(port)  # room again for a real client


def test_a_websocket_message_over_the_limit_closes_with_1009_and_a_warning(tmp_path):
    import trio
    import trio_websocket

    from tests.e2e.conftest import websocket_requester

    ws_port = free_port()
    config = write_config(tmp_path, fake("a"), startup_timeout=10.0)

    async def oversized() -> int | None:
        with trio.fail_after(30):
            async with trio_websocket.open_websocket_url(f"ws://127.0.0.1:{ws_port}/mcp") as socket:
                request = websocket_requester(socket)
                params = {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "t", "version": "0"},
                }
                assert "result" in await request(1, "initialize", params)
                with pytest.raises(trio_websocket.ConnectionClosed) as closed:  # while sending, or after
                    await socket.send_message(
                        '{"jsonrpc":"2.0","id":2,"method":"ping","params":{"x":"' + "x" * (5 << 20) + '"}}'
                    )
                    await socket.get_message()
                return closed.value.reason.code

    with http_proxy(config, "--ws", f"127.0.0.1:{ws_port}") as (_, log):
        wait_listening(ws_port)
        assert trio.run(oversized) == 1009
    said = [line for line in log.read_text().splitlines() if "closed (1009)" in line]
    assert len(said) == 1 and "WARNING" in said[0] and "4194304 bytes" in said[0] and "xxxx" not in said[0], said
