"""Messages no parser can read, through the real proxy process: each still answers the
party waiting for it, at once. A client's request past 1,024 levels gets its error with
its id (stdio, Streamable HTTP, WebSocket); a server's unreadable answer fails the call
it answers with ``too_large`` or ``malformed`` long before ``request_timeout`` (a stdio
server by the id in its text, an HTTP server by the POST it answers), and the server
serves on."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import trio
import trio_websocket

from tests.e2e.conftest import RawProxy, fake, http_proxy, initialize, post, websocket_requester, write_config
from tests.e2e.unreadable_server import Hostile, deep
from tests.loopback import free_port, wait_listening

pytestmark = pytest.mark.e2e

REQUEST_TIMEOUT = 30  # an answer that comes at once comes within PROMPT seconds
PROMPT = 10
INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}


# (id, the request's text): past orjson's 1,024 levels and Python's stack; the id before
# the deep part, after it, and before a part never closed.
DEEP_REQUESTS = [
    (7, '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a__echo","arguments":' + deep(1030) + "}}"),
    (8, '{"jsonrpc":"2.0","params":{"x":' + deep(1100) + '},"id":8,"method":"ping"}'),
    (
        "nine",
        '{"jsonrpc":"2.0","id":"nine","method":"tools/call","params":{"name":"a__echo","arguments":{"x":'
        + "[" * 5000
        + "]" * 5000
        + "}}}",
    ),
    (10, '{"jsonrpc":"2.0","id":10,"method":"ping","params":' + "[" * 100_000),
]


def check_refusal(answer: dict, id) -> None:
    assert answer["id"] == id, answer
    assert answer["error"]["code"] == -32600 and answer["error"]["data"]["reason"] == "too_large"


def test_a_stdio_client_request_past_every_parser_gets_its_id(tmp_path):
    proxy = RawProxy(write_config(tmp_path, fake("a"), startup_timeout=10.0))
    try:
        assert "result" in proxy.request(1, "initialize", INIT)
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        for id, text in DEEP_REQUESTS:
            proxy.send(text.encode() + b"\n")
            check_refusal(proxy.receive(), id)
        assert proxy.request(11, "ping") == {"jsonrpc": "2.0", "id": 11, "result": {}}
    finally:
        code, log = proxy.close()
    assert code == 0 and "Traceback" not in log, log


def test_over_http_and_websocket_too(tmp_path):
    ws_port = free_port()
    config = write_config(tmp_path, fake("a"), startup_timeout=10.0)
    with http_proxy(config, "--ws", f"127.0.0.1:{ws_port}") as (port, log):
        wait_listening(ws_port)
        session = initialize(port)
        for id, text in DEEP_REQUESTS:
            status, _, body = post(port, text.encode(), {"mcp-session-id": session})
            assert status == 400
            check_refusal(json.loads(body), id)

        async def over_websocket() -> None:
            with trio.fail_after(30):
                async with trio_websocket.open_websocket_url(
                    f"ws://127.0.0.1:{ws_port}/mcp", subprotocols=["mcp"]
                ) as socket:
                    request = websocket_requester(socket)
                    assert "result" in await request(1, "initialize", INIT)
                    for id, text in DEEP_REQUESTS:
                        await socket.send_message(text)
                        answer = json.loads(await socket.get_message())
                        while "id" not in answer:  # a notification (list_changed) may come first
                            answer = json.loads(await socket.get_message())
                        check_refusal(answer, id)
                    assert "result" in await request(11, "ping", {})

        trio.run(over_websocket)
        assert post(port, {"jsonrpc": "2.0", "id": 12, "method": "ping"}, {"mcp-session-id": session})[0] == 200
    assert "Traceback" not in log.read_text()


def timed_call(proxy: RawProxy, id, tool: str, arguments: dict) -> tuple[dict, float]:
    started = time.monotonic()
    answer = proxy.request(id, "tools/call", {"name": tool, "arguments": arguments})
    return answer, time.monotonic() - started


def check_failed_at_once(answer: dict, took: float, id, reason: str, server: str) -> None:
    assert answer["id"] == id, answer
    assert answer["error"]["data"] == {"source": "aggregator", "reason": reason, "server": server}, answer
    assert "cannot forward" in answer["error"]["message"]
    assert took < PROMPT, f"answered after {took:.1f}s"


def test_a_stdio_server_answer_past_every_parser_fails_its_call_at_once(tmp_path):
    config = write_config(tmp_path, fake("a", "odd_json", request_timeout=REQUEST_TIMEOUT), startup_timeout=10.0)
    proxy = RawProxy(config)
    try:
        assert "result" in proxy.request(1, "initialize", INIT)
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        pid = proxy.request(2, "tools/call", {"name": "a__pid", "arguments": {}})["result"]["content"][0]["text"]
        for id, depth in ((3, 1023), (4, 1030), (5, 5000)):
            answer, took = timed_call(proxy, id, "a__deep", {"depth": depth})
            check_failed_at_once(answer, took, id, "too_large", "a")
        # The same process serves on.
        again = proxy.request(6, "tools/call", {"name": "a__pid", "arguments": {}})
        assert again["result"]["content"][0]["text"] == pid
    finally:
        code, log = proxy.close()
    assert code == 0 and "Traceback" not in log, log
    assert log.count("server a: refused its answer to tools/call") == 3


def call_hostile(tmp_path, tool: str, *, modern: bool = False, **proxy_settings) -> tuple[dict, float, str]:
    """Call one tool of a ``Hostile`` server through the proxy over stdio; then check that
    the server still answers and the proxy exits cleanly. The answer, its time, the log."""
    hostile = Hostile(modern=modern)
    config = write_config(
        tmp_path,
        f"""
[servers.e]
url = "http://127.0.0.1:{hostile.port}/mcp"
request_timeout = {REQUEST_TIMEOUT}
""",
        startup_timeout=10.0,
        **proxy_settings,
    )
    proxy = RawProxy(config)
    try:
        assert "result" in proxy.request(1, "initialize", INIT)
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        answer, took = timed_call(proxy, 2, f"e__{tool}", {})
        again = proxy.request(3, "tools/call", {"name": "e__ok", "arguments": {}})
        assert again["result"]["content"][0]["text"] == "ok"
    finally:
        code, log = proxy.close()
        hostile.close()
    assert code == 0 and "Traceback" not in log, log
    assert "starting it again" not in log  # the server was not taken for dead
    return answer, took, log


@pytest.mark.parametrize(
    ("tool", "reason"),
    [
        ("garbage", "malformed"),
        ("array", "malformed"),
        ("deep_json", "too_large"),
        ("late_id", "too_large"),
        ("open_sse", "too_large"),
        ("garbage_sse", "malformed"),
    ],
)
def test_an_http_server_answer_no_parser_reads_fails_its_call_at_once(tmp_path, tool, reason):
    answer, took, log = call_hostile(tmp_path, tool)
    check_failed_at_once(answer, took, 2, reason, "e")
    assert "server e: refused its answer to tools/call" in log


@pytest.mark.parametrize("modern", [False, True], ids=["legacy", "modern"])
@pytest.mark.parametrize(
    "tool",
    [
        "two_answers",
        "note_then_answer",
        "note_only",
        "bad_note_sse",
        "other_id",
        "other_id_sse",
        "empty_body",
        "accepted",
    ],
)
def test_an_http_server_body_that_is_not_one_answer_fails_its_call_at_once(tmp_path, tool, modern):
    answer, took, log = call_hostile(tmp_path, tool, modern=modern)
    check_failed_at_once(answer, took, 2, "malformed", "e")
    assert ("protocol 2026-07-28; modern" in log) is modern, log
    assert "server e: refused its answer to tools/call" in log


def test_an_http_server_error_without_an_id_answers_the_request_its_post_carried(tmp_path):
    answer, took, _ = call_hostile(tmp_path, "null_id")
    assert took < PROMPT, f"answered after {took:.1f}s"
    assert answer["id"] == 2 and answer["error"] == {"code": -32700, "message": "Parse error"}


@pytest.mark.parametrize("tool", ["huge", "huge_sse"])
def test_an_http_server_answer_over_the_size_limit_fails_its_call_at_once(tmp_path, tool):
    answer, took, _ = call_hostile(tmp_path, tool, max_message_bytes=65536)
    check_failed_at_once(answer, took, 2, "too_large", "e")


def test_a_pinned_legacy_handshake_carries_nothing_private(tmp_path):
    """A dual-era server takes a session-less POST with ``_meta`` for a 2026-07-28 request and
    refuses it when it is not one: the proxy's legacy initialize must look like one."""
    hostile = Hostile(dual=True)
    config = write_config(
        tmp_path,
        f'[servers.e]\nurl = "http://127.0.0.1:{hostile.port}/mcp"\nprotocol = "2025-11-25"\n',
        startup_timeout=10.0,
    )
    proxy = RawProxy(config)
    try:
        assert "result" in proxy.request(1, "initialize", INIT)
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        answer = proxy.request(2, "tools/call", {"name": "e__ok", "arguments": {}})
        assert answer["result"]["content"][0]["text"] == "ok", answer
    finally:
        code, log = proxy.close()
        hostile.close()
    assert code == 0 and "Traceback" not in log, log
    assert "server e: initialized (hostile 1, protocol 2025-11-25" in log, log
    assert "refused" not in log and "-32020" not in log, log


def test_a_refused_initialize_is_named_in_the_log_and_by_check(tmp_path):
    hostile = Hostile(refuse_initialize=True)
    config = write_config(
        tmp_path,
        f'[servers.e]\nurl = "http://127.0.0.1:{hostile.port}/mcp"\nprotocol = "2025-11-25"\n' + fake("a"),
        startup_timeout=10.0,
    )
    said = "initialize failed: Bad Request: no MCP-Protocol-Version header for a modern request (code -32020)"
    try:
        proxy = RawProxy(config)
        try:
            assert "result" in proxy.request(1, "initialize", INIT)
        finally:
            code, log = proxy.close()
        assert code == 0 and "Traceback" not in log, log
        assert said in log, log
        check = subprocess.run(
            [sys.executable, "-m", "aggregator", "check", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        hostile.close()
    assert said in check.stdout + check.stderr, check.stdout + check.stderr
    assert "Traceback" not in check.stderr
