"""Streamable HTTP upstreams that abuse the event streams of the calls they answer: streams
closed forever, absurd ``retry`` values, GETs answered with errors or JSON, answers
replayed twice or sent on the wrong stream, streams held open after a call ended. Every
call must end in its answer or a clear error within its bounds, and the server's other
calls (and the proxy) go on.

The server is ``HostileStreams``: http.server in threads, on 127.0.0.1. A call's event
stream opens with a priming event whose id is ``<tool>~<request id>~<n>``, so a resuming
GET says which call's stream it asks for.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.e2e.conftest import RawProxy, write_config

pytestmark = pytest.mark.e2e
INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
REQUEST_TIMEOUT = 3

# What a resuming GET gets, per tool (the POST of each sends a priming event and closes).
ON_GET = {
    "close_forever": "a new priming event (retry: 0), then the end, every time",
    "close_same": "an event stream that ends at once, with nothing in it",
    "huge_retry": "(never asked: the POST's priming event says retry: 10^15 ms)",
    "replay_twice": "the answer, twice",
    "get_500": "HTTP 500",
    "get_409": "HTTP 409, every time",
    "get_json": "HTTP 200 with the answer as application/json",
    "clear_id": "an event that clears the event id, then the end",
    "on_standalone": "an event stream held open with nothing in it (the answer goes on the GET stream)",
}
TOOLS = [*ON_GET, "hold_open", "slow_drip", "ok"]


class HostileStreams:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gets: list[str | None] = []  # Last-Event-ID of each GET
        self.posts: list[dict] = []
        self.open: dict[str, int] = {}  # event streams open now, per tool
        self.standalone: list = []  # the wfile of each GET stream without Last-Event-ID
        state = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def reply(self, status: int, message: dict | None = None) -> None:
                body = json.dumps(message).encode() if message is not None else b""
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.send_header("mcp-session-id", "s1")
                self.end_headers()
                self.wfile.write(body)

            def stream(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.send_header("mcp-session-id", "s1")
                self.end_headers()

            def event(self, message: dict | None = None, id: str | None = None, retry: int | None = None) -> None:
                out = (f"id: {id}\n" if id is not None else "") + (f"retry: {retry}\n" if retry is not None else "")
                self.wfile.write(f"{out}data: {json.dumps(message) if message else ''}\n\n".encode())
                self.wfile.flush()

            def hold(self, tool: str, drip: bytes = b"") -> None:
                """Keep the stream open (a comment, or the next byte of ``drip``, every 0.2 s)
                until the client closes it."""
                with state.lock:
                    state.open[tool] = state.open.get(tool, 0) + 1
                try:
                    for at in range(100_000):
                        time.sleep(0.2)
                        self.wfile.write(drip[at : at + 1] if at < len(drip) else b": still here\n\n")
                        self.wfile.flush()
                except OSError:
                    pass
                finally:
                    with state.lock:
                        state.open[tool] -= 1

            def do_DELETE(self):
                self.reply(200)

            def do_GET(self):
                last = self.headers.get("last-event-id")
                with state.lock:
                    state.gets.append(last)
                if last is None:
                    self.stream()
                    with state.lock:
                        state.standalone.append(self.wfile)
                    return self.hold("(standalone)")
                tool, id, n = last.split("~")
                id, n = json.loads(id), int(n)
                answer = {
                    "jsonrpc": "2.0",
                    "id": id,
                    "result": {"content": [{"type": "text", "text": f"{tool} resumed"}]},
                }
                if tool == "close_forever":
                    self.stream()
                    self.event(id=f"{tool}~{id}~{n + 1}", retry=0)
                elif tool == "close_same":
                    self.stream()
                elif tool == "replay_twice":
                    self.stream()
                    self.event(answer, id=f"{tool}~{id}~{n + 1}")
                    self.event(answer, id=f"{tool}~{id}~{n + 2}")
                elif tool == "get_500":
                    self.reply(500, {"error": "internal"})
                elif tool == "get_409":
                    self.reply(409)
                elif tool == "get_json":
                    self.reply(200, answer)
                elif tool == "clear_id":
                    self.stream()
                    self.wfile.write(b"id\ndata: \n\n")
                elif tool == "on_standalone":
                    self.stream()
                    self.hold("on_standalone (resumed)")
                else:
                    self.reply(404)

            def do_POST(self):
                message = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with state.lock:
                    state.posts.append(message)
                id, method = message.get("id"), message.get("method")
                if id is None or method is None:
                    return self.reply(202)
                if method == "initialize":
                    return self.reply(
                        200,
                        {
                            "jsonrpc": "2.0",
                            "id": id,
                            "result": {
                                "protocolVersion": message["params"]["protocolVersion"],
                                "capabilities": {"tools": {}},
                                "serverInfo": {"name": "hostile-streams", "version": "1"},
                            },
                        },
                    )
                if method == "tools/list":
                    return self.reply(
                        200,
                        {
                            "jsonrpc": "2.0",
                            "id": id,
                            "result": {"tools": [{"name": name, "inputSchema": {"type": "object"}} for name in TOOLS]},
                        },
                    )
                tool = message["params"]["name"] if method == "tools/call" else "ok"
                answer = {
                    "jsonrpc": "2.0",
                    "id": id,
                    "result": {"content": [{"type": "text", "text": f"{tool} answered"}]},
                }
                if tool == "ok":
                    return self.reply(200, answer)
                self.stream()
                if tool == "hold_open":
                    return self.hold(tool)
                if tool == "slow_drip":
                    return self.hold(tool, drip=b"data: " + json.dumps(answer).encode() + b"\n\n")
                self.event(id=f"{tool}~{json.dumps(id)}~0", retry=10**15 if tool == "huge_retry" else 0)
                if tool == "on_standalone":
                    time.sleep(0.3)
                    with state.lock:
                        for stream in state.standalone:
                            try:
                                stream.write(f"data: {json.dumps(answer)}\n\n".encode())
                                stream.flush()
                            except OSError:
                                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def open_streams(self, tool: str) -> int:
        with self.lock:
            return self.open.get(tool, 0)

    def cancels(self) -> int:
        with self.lock:
            return sum(1 for m in self.posts if m.get("method") == "notifications/cancelled")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def connections(pid: int, port: int) -> int:
    """Established TCP connections of process ``pid`` to 127.0.0.1:port."""
    out = subprocess.run(
        ["ss", "-tnpH", "state", "established", f"dst 127.0.0.1:{port}"], capture_output=True, text=True, timeout=10
    ).stdout
    return sum(1 for line in out.splitlines() if f"pid={pid}," in line)


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.fixture
def hostile(tmp_path):
    server = HostileStreams()
    config = write_config(
        tmp_path,
        f"""
[servers.e]
url = "http://127.0.0.1:{server.port}/mcp"
request_timeout = {REQUEST_TIMEOUT}
""",
        startup_timeout=10.0,
    )
    proxy = RawProxy(config, "--log-level", "info")
    try:
        assert "result" in proxy.request(1, "initialize", INIT)
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        yield server, proxy
    finally:
        code, log = proxy.close(timeout=30)
        server.close()
    assert code == 0 and "Traceback" not in log, log
    assert "server e lost" not in log  # no case took the server for dead


def call(proxy: RawProxy, id: int, tool: str) -> tuple[dict, float]:
    started = time.monotonic()
    answer = proxy.request(id, "tools/call", {"name": f"e__{tool}", "arguments": {}})
    return answer, time.monotonic() - started


# tool: (what the client gets: the text of the answer, or the reason and part of the error message)
OUTCOMES = {
    "close_forever": ("timeout", f"did not answer tools/call within {REQUEST_TIMEOUT}s"),
    "close_same": ("unavailable", "ended the resumed response stream 5 times in a row without sending anything"),
    "huge_retry": ("timeout", f"did not answer tools/call within {REQUEST_TIMEOUT}s"),
    "replay_twice": "replay_twice resumed",
    "get_500": ("unavailable", "the server refused to resume the response stream (HTTP 500)"),
    "get_409": ("unavailable", "ended the resumed response stream 5 times in a row"),
    "get_json": (
        "unavailable",
        "the server answered the GET resuming the response stream with application/json,"
        " not an event stream (HTTP 200)",
    ),
    "clear_id": ("unavailable", "gave no event id to resume from"),
    "on_standalone": "on_standalone answered",
}


def test_each_hostile_stream_ends_in_the_answer_or_a_clear_error_in_time(hostile):
    server, proxy = hostile
    for n, (tool, expected) in enumerate(OUTCOMES.items()):
        gets_before = len(server.gets)
        answer, took = call(proxy, 10 + n, tool)
        if isinstance(expected, str):
            assert answer.get("result", {}).get("content", [{}])[0].get("text") == expected, (tool, answer)
        else:
            reason, message = expected
            assert answer.get("error", {}).get("data", {}).get("reason") == reason, (tool, answer)
            assert message in answer["error"]["message"], (tool, answer)
        assert took < REQUEST_TIMEOUT + 2, (tool, took)
        # retry: 0 is taken as the 0.1 s floor: at most one GET per 0.1 s while the call lasts.
        assert len(server.gets) - gets_before <= REQUEST_TIMEOUT * 10 + 5, (tool, len(server.gets) - gets_before)
        # The server's other calls go on, and a repeated answer reached nobody.
        again = proxy.request(100 + n, "tools/call", {"name": "e__ok", "arguments": {}})
        assert again["result"]["content"][0]["text"] == "ok answered", (tool, again)
    # Once each call has ended, nothing asks the server for its stream any more...
    time.sleep(0.5)
    gets = len(server.gets)
    time.sleep(1.0)
    assert len(server.gets) == gets, server.gets[gets:]
    # ... nor keeps it open: the answer that came on the GET stream ended the resumption.
    assert wait_for(lambda: server.open_streams("on_standalone (resumed)") == 0, 3.0)
    # The replayed answer was not passed on as something else.
    assert all(n["method"].endswith("/list_changed") for n in proxy.notifications), proxy.notifications


def test_streams_held_open_past_their_calls_are_closed_and_never_block_the_server(hostile):
    """More calls than the proxy posts at once (64) whose streams the server holds open and
    never answers: each times out, its stream is closed, the server hears every cancel,
    and a call after them is answered at once."""
    server, proxy = hostile
    count = 70
    for n in range(count):
        proxy.send(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 1000 + n,
                    "method": "tools/call",
                    "params": {"name": "e__hold_open", "arguments": {}},
                }
            ).encode()
            + b"\n"
        )
    proxy.send(
        json.dumps(
            {"jsonrpc": "2.0", "id": 999, "method": "tools/call", "params": {"name": "e__slow_drip", "arguments": {}}}
        ).encode()
        + b"\n"
    )
    answers = [proxy.receive() for _ in range(count + 1)]
    assert {a["error"]["data"]["reason"] for a in answers} == {"timeout"}, answers
    assert wait_for(lambda: server.cancels() == count + 1, 5.0), server.cancels()
    assert wait_for(lambda: server.open_streams("hold_open") + server.open_streams("slow_drip") == 0, 5.0), server.open
    # Only the GET stream and a pooled connection or two are left.
    assert wait_for(lambda: connections(proxy.process.pid, server.port) <= 3, 5.0), connections(
        proxy.process.pid, server.port
    )
    answer, took = call(proxy, 2, "ok")
    assert answer["result"]["content"][0]["text"] == "ok answered" and took < 2, (answer, took)
