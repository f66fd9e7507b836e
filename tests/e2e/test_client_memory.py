"""The proxy as a process: the budget of all clients together holds across every network
front. A Streamable HTTP session with a GET stream, a legacy SSE session and a WebSocket
client all stop reading while a server broadcasts log lines (lines of no request, to
every session that asked for logs); each alone stays within its own budget, together they
pass the total: they are dropped, and a session that reads gets its answer and every line."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
import time

import pytest

from tests.e2e.conftest import fake, http_proxy, initialize, post, write_config
from tests.loopback import INIT, free_port, wait_listening

pytestmark = pytest.mark.e2e
TOTAL = 8 << 20
# About 9 MB to each client: under 16 MiB, over the total for three. Sent after the answer,
# so the lines belong to no request and go to every session that sent logging/setLevel.
FLOOD = {"count": 60000, "size": 100, "after": True}
SET_LEVEL = {"jsonrpc": "2.0", "id": 90, "method": "logging/setLevel", "params": {"level": "info"}}


def _stalled_socket(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    return sock


def _head(sock: socket.socket, until: bytes) -> bytes:
    data = b""
    for _ in range(100):
        if until in data:
            return data
        chunk = sock.recv(4096)
        assert chunk, data
        data += chunk
    raise AssertionError(data)


def _ws_frame(message: dict) -> bytes:
    payload = json.dumps(message).encode()
    mask = os.urandom(4)
    head = (
        struct.pack("!BBH", 0x81, 0x80 | 126, len(payload))
        if len(payload) > 125
        else struct.pack("!BB", 0x81, 0x80 | len(payload))
    )
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _gone(sock: socket.socket, seconds: float = 10) -> bool:
    """Whether the proxy closes this connection within ``seconds`` (what it sent before is
    read and dropped)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not sock.recv(1 << 20):
                return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
    return False


def test_clients_that_stop_reading_on_every_front_are_dropped_past_the_total_budget(tmp_path):
    # A WebSocket closing handshake waits for the client's answer up to http.header_timeout.
    config = write_config(
        tmp_path,
        fake("a") + "[http]\nheader_timeout = 2.0\n",
        startup_timeout=10.0,
        client_buffer_bytes=16 << 20,
        total_client_buffer_bytes=TOTAL,
        client_write_timeout=600.0,
    )
    ws_port = free_port()
    with http_proxy(config, "--ws", f"127.0.0.1:{ws_port}") as (port, log):
        wait_listening(ws_port)
        # Streamable HTTP: a session whose GET stream is never read.
        get_session = initialize(port)
        assert post(port, SET_LEVEL, {"mcp-session-id": get_session})[0] == 200
        get_sock = _stalled_socket(port)
        get_sock.sendall(
            f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n"
            f"Mcp-Session-Id: {get_session}\r\n\r\n".encode()
        )
        _head(get_sock, b"\r\n\r\n")
        # Legacy SSE: its one stream is never read after the endpoint event.
        sse_sock = _stalled_socket(port)
        sse_sock.sendall(f"GET /sse HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n".encode())
        head = _head(sse_sock, b"session_id=")
        while b"\n\n" not in head.partition(b"session_id=")[2]:
            head += sse_sock.recv(4096)
        endpoint = head.split(b"data: ", 1)[1].split(b"\n", 1)[0].decode()
        for message in (INIT, {"jsonrpc": "2.0", "method": "notifications/initialized"}, SET_LEVEL):
            assert post(port, message, path=endpoint)[0] == 202
        # WebSocket: initialized, then nothing more is read.
        ws_sock = _stalled_socket(ws_port)
        key = base64.b64encode(os.urandom(16)).decode()
        ws_sock.sendall(
            f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{ws_port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        assert _head(ws_sock, b"\r\n\r\n").startswith(b"HTTP/1.1 101")
        ws_sock.sendall(
            _ws_frame(INIT)
            + _ws_frame({"jsonrpc": "2.0", "method": "notifications/initialized"})
            + _ws_frame(SET_LEVEL)
        )
        time.sleep(0.5)

        # The reader reads its GET stream all along, counting the lines.
        reader = initialize(port)
        assert post(port, SET_LEVEL, {"mcp-session-id": reader})[0] == 200
        read_sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        read_sock.sendall(
            f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n"
            f"Mcp-Session-Id: {reader}\r\n\r\n".encode()
        )
        got = bytearray()

        def read_lines() -> None:
            stop = time.monotonic() + 30
            while got.count(b"flood") < FLOOD["count"] and time.monotonic() < stop:
                chunk = read_sock.recv(1 << 20)
                if not chunk:
                    return
                got.extend(chunk)

        reading = threading.Thread(target=read_lines, daemon=True)
        reading.start()
        status, _, body = post(
            port,
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "a__flood", "arguments": FLOOD}},
            {"mcp-session-id": reader},
        )
        assert status == 200 and b'"text":"flooded"' in body, log.read_text()[-3000:]
        reading.join(35)
        assert got.count(b'"logger":"a/flood"') == FLOOD["count"], log.read_text()[-3000:]
        read_sock.close()

        deadline = time.monotonic() + 10
        reason = f"dropped: all clients together hold more than {TOTAL} bytes; it holds "
        fronts = ("http session", "legacy sse session", "websocket session")
        while not all(
            any(f"{front} " in line and reason in line and "ERROR" in line for line in log.read_text().splitlines())
            for front in fronts
        ):
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        assert "more than 16777216 bytes" not in log.read_text()  # none passed its own budget
        assert post(port, {"jsonrpc": "2.0", "id": 3, "method": "ping"}, {"mcp-session-id": get_session})[0] == 404
        assert post(port, {"jsonrpc": "2.0", "id": 4, "method": "ping"}, path=endpoint)[0] == 404
        assert _gone(ws_sock) and _gone(get_sock) and _gone(sse_sock)
        assert post(port, {"jsonrpc": "2.0", "id": 5, "method": "ping"}, {"mcp-session-id": reader})[0] == 200
        for sock in (get_sock, sse_sock, ws_sock):
            sock.close()
    assert "Traceback" not in log.read_text()


def test_prompt_readers_of_large_results_are_never_dropped_for_the_total(tmp_path):
    """With default limits, four sessions (one of them with two calls) each receive 15 MB
    results at once, more than the total budget together, and read them slowly but
    steadily: all of them read, so nobody is dropped and every result arrives whole."""
    import http.client
    import threading

    config = write_config(tmp_path, fake("b", "big:15000000"), startup_timeout=10.0)
    with http_proxy(config) as (port, log):
        results: list[object] = []

        def call(session: str, id: int) -> None:
            """One call whose answer is read slowly but steadily (64 KiB, then a pause)."""
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                connection.request(
                    "POST",
                    "/mcp",
                    body=json.dumps(
                        {
                            "jsonrpc": "2.0",
                            "id": id,
                            "method": "tools/call",
                            "params": {"name": "b__big", "arguments": {}},
                        }
                    ).encode(),
                    headers={
                        "content-type": "application/json",
                        "accept": "application/json, text/event-stream",
                        "mcp-session-id": session,
                        "mcp-protocol-version": "2025-11-25",
                    },
                )
                response = connection.getresponse()
                body = b""
                for _ in range(1000):  # bounded: 64 MB at most
                    chunk = response.read(65536)
                    if not chunk:
                        break
                    body += chunk
                    time.sleep(0.002)
                connection.close()
                if response.status != 200:
                    results.append((response.status, body[:300]))
                    return
                if body.startswith(b"{"):
                    message = json.loads(body)
                else:  # an event stream: its last data line carries the answer
                    data = [line[5:] for line in body.split(b"\n") if line.startswith(b"data:") and line[5:].strip()]
                    message = json.loads(data[-1])
                results.append(len(message["result"]["content"][0]["text"]) if "result" in message else message)
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                results.append(repr(exc))

        for _ in range(2):  # bounded: two rounds
            sessions = [initialize(port) for _ in range(4)]
            threads = [threading.Thread(target=call, args=(session, 2)) for session in sessions]
            threads.append(threading.Thread(target=call, args=(sessions[0], 3)))  # a second call of one session
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
        assert results == [15_000_000] * 10, results
        text = log.read_text()
        assert "dropped:" not in text, text[-2000:]
        assert "every one of them is reading; nobody is dropped" in text  # the total was passed
