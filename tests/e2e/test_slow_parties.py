"""The proxy as a process, with parties that read slowly or not at all: a client that reads
promptly gets any burst, one that stops is dropped within its memory budget, and a server
that stops reading its stdin holds up nobody but its own callers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
import trio_websocket

from tests.e2e.conftest import RawProxy, fake, http_proxy, initialize, post, write_config
from tests.loopback import INIT, free_port, wait_listening

pytestmark = pytest.mark.e2e
BURST = {"count": 2000, "size": 10000}  # about 20 MB of log lines: more than the 16 MiB budget


def memory_of(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak) of a process, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0]) * 1024
    return out


def proxy_pid(listen: str) -> int:
    """The pid of the proxy serving ``listen`` (started by this test)."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"aggregator" in argv and listen.encode() in argv:
            return int(entry.name)
    raise AssertionError(f"no proxy serving {listen}")


def flood_call(id, **arguments):
    return {
        "jsonrpc": "2.0",
        "id": id,
        "method": "tools/call",
        "params": {"name": "a__flood", "arguments": {**BURST, **arguments}},
    }


def test_a_prompt_http_reader_gets_a_burst_larger_than_its_budget(tmp_path):
    config = write_config(tmp_path, fake("a"), startup_timeout=10.0)
    with http_proxy(config) as (port, log):
        session = initialize(port)
        status, headers, body = post(port, flood_call(2), {"mcp-session-id": session})
        assert status == 200 and headers["content-type"] == "text/event-stream", log.read_text()[-2000:]
        events = [json.loads(line[6:]) for line in body.split(b"\n") if line.startswith(b"data: {")]
        assert len(events) == BURST["count"] + 1, log.read_text()[-2000:]
        assert events[-1]["id"] == 2 and events[-1]["result"]["content"][0]["text"] == "flooded"
        assert "dropped" not in log.read_text()


def test_a_prompt_stdio_reader_gets_a_burst_larger_than_its_budget(tmp_path):
    proxy = RawProxy(write_config(tmp_path, fake("a"), startup_timeout=10.0))
    try:
        assert "result" in proxy.request(
            1,
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
        )
        proxy.send(json.dumps(flood_call(2)).encode() + b"\n")
        answer = proxy.receive()
        assert answer["result"]["content"][0]["text"] == "flooded"
        assert sum(n["method"] == "notifications/message" for n in proxy.notifications) == BURST["count"]
    finally:
        code, log = proxy.close()
    assert code == 0 and "dropped" not in log


def test_a_prompt_websocket_reader_gets_a_burst_larger_than_its_budget(tmp_path):
    config = write_config(tmp_path, fake("a"), startup_timeout=10.0)
    port = free_port()

    async def client() -> tuple[dict, int]:
        with trio.fail_after(60):
            async with trio_websocket.open_websocket_url(f"ws://127.0.0.1:{port}/mcp") as websocket:
                await websocket.send_message(json.dumps(INIT))
                assert json.loads(await websocket.get_message())["id"] == 1
                await websocket.send_message(json.dumps(flood_call(2)))
                logs = 0
                while True:
                    message = json.loads(await websocket.get_message())
                    if "id" in message:
                        return message, logs
                    logs += message["method"] == "notifications/message"

    with open(tmp_path / "proxy.log", "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "aggregator", "serve", "--ws", f"127.0.0.1:{port}", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            wait_listening(port, process)
            try:
                message, logs = trio.run(client)
            except trio_websocket.ConnectionClosed as exc:
                raise AssertionError(f"{exc}: {(tmp_path / 'proxy.log').read_text()[-3000:]}") from None
        finally:
            process.terminate()
            process.wait(timeout=15)
    assert message["result"]["content"][0]["text"] == "flooded" and logs == BURST["count"]
    assert "dropped" not in (tmp_path / "proxy.log").read_text()


def test_a_stopped_reader_is_dropped_within_its_memory_budget(tmp_path):
    """A GET stream nobody reads while a server floods log lines of no request (100,000
    of 100 bytes) to the sessions that asked for logs: the session is dropped past its
    budget, and the proxy's peak RSS grows by at most 48 MB; another session reading
    promptly gets the whole flood of its own call and its answer."""
    config = write_config(tmp_path, fake("a"), startup_timeout=10.0)
    with http_proxy(config) as (port, log):
        pid = proxy_pid(f"127.0.0.1:{port}")
        stopped = initialize(port)
        assert (
            post(
                port,
                {"jsonrpc": "2.0", "id": 9, "method": "logging/setLevel", "params": {"level": "info"}},
                {"mcp-session-id": stopped},
            )[0]
            == 200
        )
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(
                f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n"
                f"Mcp-Session-Id: {stopped}\r\n\r\n".encode()
            )
            prompt = initialize(port)
            time.sleep(0.3)
            before = memory_of(pid)["VmRSS"]
            status, _, body = post(port, flood_call(2, count=100000, size=100), {"mcp-session-id": prompt})
            assert status == 200 and body.count(b"data: {") == 100001, log.read_text()[-2000:]
            # Lines after the answer belong to no request: only the stopped session asked.
            status, _, body = post(port, flood_call(5, count=100000, size=100, after=True), {"mcp-session-id": prompt})
            assert status == 200 and b"flood" not in body.replace(b'"flooded"', b""), log.read_text()[-2000:]
            deadline = time.monotonic() + 10
            # Past its own budget, or (first, at the default) as the one not reading past
            # the total of all clients: either way it is dropped.
            while (
                "dropped: more than 16777216 bytes" not in log.read_text()
                and "dropped: all clients together hold more than" not in log.read_text()
            ):
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.1)
            growth = memory_of(pid)["VmHWM"] - before
            assert growth < 48 * 1024 * 1024, growth
            assert post(port, {"jsonrpc": "2.0", "id": 3, "method": "ping"}, {"mcp-session-id": stopped})[0] == 404
            assert post(port, {"jsonrpc": "2.0", "id": 4, "method": "ping"}, {"mcp-session-id": prompt})[0] == 200


def test_a_server_that_stops_reading_its_stdin_holds_up_only_its_own_calls(tmp_path):
    config = write_config(tmp_path, fake("a") + "\n" + fake("b"), startup_timeout=10.0, server_write_timeout=1.0)
    proxy = RawProxy(config)
    answers: dict = {}

    def answer(id, seconds=5.0):
        deadline = time.monotonic() + seconds
        while id not in answers:
            assert time.monotonic() < deadline, f"no answer to {id!r} within {seconds}s"
            message = proxy.receive()
            answers[message["id"]] = message
        return answers.pop(id)

    def send(id, method, params=None):
        proxy.send(json.dumps({"jsonrpc": "2.0", "id": id, "method": method, "params": params or {}}).encode() + b"\n")

    try:
        send(
            1,
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
        )
        assert "result" in answer(1, 20)
        # a blocks for 8 s and reads nothing; what we send it fills its stdin pipe.
        send("slow", "tools/call", {"name": "a__slow", "arguments": {"seconds": 8}})
        for index in range(4):
            send(f"e{index}", "tools/call", {"name": "a__echo", "arguments": {"text": "x" * 100000}})
        started = time.monotonic()
        send("ping", "ping")
        send("b", "tools/call", {"name": "b__echo", "arguments": {"n": 1}})
        assert answer("ping")["result"] == {}
        assert answer("b")["result"]["content"][0]["text"] == '{"n": 1}'
        assert time.monotonic() - started < 5
        # One second without a read fails everything in flight to a: overloaded.
        for id in ("slow", "e0", "e1", "e2", "e3"):
            error = answer(id)["error"]
            assert error["data"] == {"source": "aggregator", "reason": "overloaded", "server": "a"}, error
        # New calls are refused at once while it reads nothing...
        send("refused", "tools/call", {"name": "a__echo", "arguments": {}})
        assert answer("refused", 1)["error"]["data"]["reason"] == "overloaded"
        # ...and served again once it reads.
        deadline = time.monotonic() + 20
        for attempt in range(100):
            send(f"again{attempt}", "tools/call", {"name": "a__echo", "arguments": {"n": 2}})
            again = answer(f"again{attempt}", 15)
            if "result" in again:
                break
            assert again["error"]["data"]["reason"] == "overloaded" and time.monotonic() < deadline, again
            time.sleep(0.2)
        assert again["result"]["content"][0]["text"] == '{"n": 2}'
    finally:
        code, log = proxy.close()
    assert code == 0, log
    assert "server a: not reading its input (it has read nothing for 1s)" in log


def test_a_legacy_sse_client_that_stops_reading_is_dropped(tmp_path):
    config = write_config(tmp_path, fake("a"), startup_timeout=10.0, client_buffer_bytes=65536)
    with http_proxy(config) as (port, log):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(10)
            sock.sendall(f"GET /sse HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n".encode())
            head = b""
            for _ in range(100):
                if b"\n\n" in head.partition(b"session_id=")[2]:
                    break
                data = sock.recv(4096)
                assert data, head
                head += data
            endpoint = head.split(b"data: ", 1)[1].split(b"\n", 1)[0].decode()
            for message in (
                INIT,
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                flood_call(2, count=20000, size=100),
            ):
                assert post(port, message, path=endpoint)[0] == 202
            # It reads nothing more: more than its budget waits, and it is dropped.
            deadline = time.monotonic() + 10
            while "legacy sse session 1 dropped: more than 65536 bytes" not in log.read_text():
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.1)
            assert post(port, {"jsonrpc": "2.0", "id": 3, "method": "ping"}, path=endpoint)[0] == 404
            # Others are served meanwhile.
            assert (
                post(port, {"jsonrpc": "2.0", "id": 4, "method": "ping"}, {"mcp-session-id": initialize(port)})[0]
                == 200
            )
