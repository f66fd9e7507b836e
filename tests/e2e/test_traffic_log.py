"""``--log-level debug`` logs the message traffic: a line per message in and out (direction,
peer, kind, method, id, size in bytes), on stdio and over HTTP, never a message's params or
result; with ``--log-format json`` the same as fields."""

from __future__ import annotations

import json
import re

from tests.e2e.conftest import RawProxy, fake, http_proxy, initialize, post, write_config

SECRET_ARGUMENT = "do-not-log-this-argument-7f3a"
INIT_PARAMS = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}


def stdio_traffic(tmp_path, *extra: str) -> tuple[bytes, str]:
    config = write_config(tmp_path, fake("a", "echo", env=f'{{ API_KEY = "{SECRET_ARGUMENT}-env" }}'))
    proxy = RawProxy(config, "--log-level", "debug", *extra)
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "a__echo", "arguments": {"text": SECRET_ARGUMENT}},
    }
    line = json.dumps(call).encode()
    try:
        assert "result" in proxy.request(1, "initialize", INIT_PARAMS)
        proxy.send(line + b"\n")
        answer = proxy.receive()
        assert SECRET_ARGUMENT in json.dumps(answer)  # the message went through whole
    finally:
        code, log = proxy.close()
    assert code == 0, log
    return line, log


def test_debug_shows_each_message_but_never_its_payload(tmp_path):
    line, log = stdio_traffic(tmp_path)
    assert f"DEBUG aggregator.traffic: from client 1: request tools/call id=7 ({len(line)} bytes)" in log, log
    assert "DEBUG aggregator.traffic: to client 1: response id=7 (" in log, log
    assert re.search(r"to server a: request tools/call id=\d+ \(\d+ bytes\)", log), log
    assert re.search(r"from server a: response id=\d+ \(\d+ bytes\)", log), log
    assert "to server a: request initialize id=" in log and "to client 1: response id=1 (" in log, log
    assert SECRET_ARGUMENT not in log, log


def test_debug_traffic_as_json_fields(tmp_path):
    line, log = stdio_traffic(tmp_path, "--log-format", "json")
    records = [json.loads(text) for text in log.splitlines() if text.strip()]
    traffic = [r for r in records if r["logger"] == "aggregator.traffic"]
    call = next(r for r in traffic if r.get("method") == "tools/call" and r["direction"] == "in")
    assert call["peer"] == "client 1" and call["kind"] == "request" and call["id"] == 7, call
    assert call["bytes"] == len(line) and call["level"] == "debug", call
    assert {r["direction"] for r in traffic} == {"in", "out"}
    assert any(r["peer"] == "server a" and r["direction"] == "out" for r in traffic), traffic
    assert SECRET_ARGUMENT not in log


def test_info_logs_no_traffic(tmp_path):
    config = write_config(tmp_path, fake("a", "echo"))
    proxy = RawProxy(config, "--log-level", "info")
    try:
        assert "result" in proxy.request(1, "initialize", INIT_PARAMS)
    finally:
        code, log = proxy.close()
    assert code == 0 and "server a: initialized" in log and "aggregator.traffic" not in log, log


def test_debug_traffic_over_http(tmp_path):
    config = write_config(tmp_path, fake("a", "echo"))
    with http_proxy(config, "--log-level", "debug") as (port, log):
        session = initialize(port)
        body = {
            "jsonrpc": "2.0",
            "id": 9,
            "method": "tools/call",
            "params": {"name": "a__echo", "arguments": {"x": SECRET_ARGUMENT}},
        }
        status, _, answer = post(port, body, {"mcp-session-id": session, "mcp-protocol-version": "2025-11-25"})
        assert status == 200 and SECRET_ARGUMENT.encode() in answer
    text = log.read_text()
    assert re.search(r"from client \d+: request tools/call id=9 \(\d+ bytes\)", text), text
    assert re.search(r"to client \d+: response id=9 \(\d+ bytes\)", text), text
    assert SECRET_ARGUMENT not in text


def test_a_peers_control_characters_cannot_forge_a_log_line(tmp_path):
    """An id with a newline and a terminal escape, as a hostile client sends it: the debug
    line shows them escaped, so no line of the log starts with the forged record."""
    config = write_config(tmp_path, fake("a", "echo"))
    proxy = RawProxy(config, "--log-level", "debug")
    forged = "a\n2026-12-02 01:02:03,456 ERROR aggregator.server.a: FORGED\x1b]0;TITLE\x07"
    try:
        assert "result" in proxy.request(1, "initialize", INIT_PARAMS)
        assert proxy.request(forged, "ping") == {"jsonrpc": "2.0", "id": forged, "result": {}}
    finally:
        code, log = proxy.close()
    assert code == 0, log
    assert not any(line.startswith("2026-12-02 01:02:03,456") for line in log.splitlines()), log
    assert "\x1b" not in log and "\x07" not in log
    assert "request ping id=a\\x0a2026-12-02 01:02:03,456 ERROR aggregator.server.a: FORGED\\x1b]0;TITLE\\x07" in log
