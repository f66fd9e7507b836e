"""The network benchmarks' load generator: raw keep-alive sockets, no client library.

Streamable HTTP (one POST per call, JSON answers), WebSocket (wsproto framing) and the
legacy HTTP+SSE transport (POST to /messages, answers on the GET /sse stream). Each call
is ``tools/call`` with a small argument. ``latencies`` runs one call at a time and returns
every sample; ``throughput`` keeps ``in_flight`` calls outstanding, one per connection,
and returns (calls per second, calls done). Every loop is bounded in count and time.
"""

from __future__ import annotations

import itertools
import selectors
import socket
import time
from collections.abc import Callable

import orjson
import wsproto
import wsproto.events

TIME_LIMIT = 20.0  # seconds, per measurement
_IDS = itertools.count(1)  # request ids, distinct across the connections that share a session

INIT = orjson.dumps(
    {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"},
        },
    }
)
# In place of a session id: the call is a modern (2026-07-28) stateless one, a POST with no
# session whose body carries the `_meta` envelope and whose headers mirror the body.
MODERN = "modern"
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
}
MODERN_HEADERS = "MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: s0__tool0\r\n"


def call_body(tool: str, id: int, session: str | None = None) -> bytes:
    params: dict = {"name": tool, "arguments": {"x": "hello"}}
    if session == MODERN:
        params["_meta"] = MODERN_META
    return orjson.dumps({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _split_response(buffer: bytes) -> tuple[dict[str, str], bytes, bytes] | None:
    """(headers, body, rest) of the first whole Content-Length response in ``buffer``."""
    end = buffer.find(b"\r\n\r\n")
    if end == -1:
        return None
    lines = buffer[:end].decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    if len(buffer) < end + 4 + length:
        return None
    return headers, buffer[end + 4 : end + 4 + length], buffer[end + 4 + length :]


class HttpClient:
    """One keep-alive connection speaking Streamable HTTP (or POSTing to a legacy session)."""

    def __init__(self, port: int, session: str | None, tool: str, path: str = "/mcp") -> None:
        self.port, self.session, self.tool, self.path = port, session, tool, path
        self.sock = _connect(port)
        self.buffer = b""
        self.next_id = 1

    def request_bytes(self, body: bytes) -> bytes:
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nContent-Length: {len(body)}\r\n"
        )
        if self.session == MODERN:
            head += MODERN_HEADERS
        elif self.session:
            head += f"Mcp-Session-Id: {self.session}\r\nMCP-Protocol-Version: 2025-11-25\r\n"
        return head.encode() + b"\r\n" + body

    def send_call(self) -> int:
        id = next(_IDS)
        self.sock.sendall(self.request_bytes(call_body(self.tool, id, self.session)))
        return id

    def take(self) -> tuple[dict[str, str], bytes] | None:
        split = _split_response(self.buffer)
        if split is None:
            return None
        headers, body, self.buffer = split
        return headers, body

    def post(self, body: bytes) -> tuple[dict[str, str], bytes]:
        self.sock.sendall(self.request_bytes(body))
        while (response := self.take()) is None:
            data = self.sock.recv(65536)
            if not data:
                raise RuntimeError("connection closed")
            self.buffer += data
        return response

    def close(self) -> None:
        self.sock.close()


def open_session(port: int) -> str:
    client = HttpClient(port, None, "")
    headers, _ = client.post(INIT)
    client.close()
    return headers["mcp-session-id"]


class WsClient:
    """One WebSocket connection, its own MCP session (initialized)."""

    def __init__(self, port: int, tool: str, path: str = "/mcp") -> None:
        self.tool = tool
        self.sock = _connect(port)
        self.ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        self.sock.sendall(self.ws.send(wsproto.events.Request(host=f"127.0.0.1:{port}", target=path)))
        self.next_id = 1
        self.pending: list[bytes] = []
        self.text = ""
        self._until(lambda: self.accepted)
        self.send_bytes(INIT)
        self.receive_one()
        self.send_bytes(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

    accepted = False

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(self.ws.send(wsproto.events.Message(data=data.decode())))

    def send_call(self) -> int:
        id = self.next_id
        self.next_id += 1
        self.send_bytes(call_body(self.tool, id))
        return id

    def feed(self, data: bytes) -> None:
        self.ws.receive_data(data or None)
        for event in self.ws.events():
            if isinstance(event, wsproto.events.AcceptConnection):
                self.accepted = True
            elif isinstance(event, wsproto.events.TextMessage):
                self.text += event.data
                if event.message_finished:
                    self.pending.append(self.text.encode())
                    self.text = ""
            elif isinstance(event, wsproto.events.Ping):
                self.sock.sendall(self.ws.send(event.response()))

    def take(self) -> bytes | None:
        return self.pending.pop(0) if self.pending else None

    def _until(self, done: Callable[[], bool]) -> None:
        while not done():
            data = self.sock.recv(65536)
            if not data:
                raise RuntimeError("connection closed")
            self.feed(data)

    def receive_one(self) -> bytes:
        self._until(lambda: bool(self.pending))
        return self.pending.pop(0)

    def close(self) -> None:
        self.sock.close()


class SseSession:
    """A legacy HTTP+SSE session: its event stream, and one POST connection per call slot."""

    def __init__(self, port: int, tool: str, slots: int) -> None:
        self.sock = _connect(port)
        self.sock.sendall(f"GET /sse HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n".encode())
        self.buffer = b""
        self.events: list[bytes] = []
        while not self.events:
            self.feed(self.sock.recv(65536))
        endpoint = self.events.pop(0).decode()
        self.posters = [HttpClient(port, None, tool, path=endpoint) for _ in range(slots)]
        poster = self.posters[0]
        poster.post(INIT)
        self.receive_one()
        poster.post(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

    def feed(self, data: bytes) -> None:
        if not data:
            raise RuntimeError("the event stream ended")
        self.buffer += data
        # Chunked framing around SSE events: take each event's data line (JSON has no raw newline).
        while (end := self.buffer.find(b"\n\n")) != -1:
            block, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
            for line in block.split(b"\n"):
                if line.startswith(b"data: ") and len(line) > 6:
                    self.events.append(line[6:])

    def receive_one(self) -> bytes:
        while not self.events:
            self.feed(self.sock.recv(65536))
        return self.events.pop(0)

    def close(self) -> None:
        for poster in self.posters:
            poster.close()
        self.sock.close()


def http_latencies(port: int, session: str | None, tool: str, count: int) -> list[float]:
    client = HttpClient(port, session, tool)
    samples = []
    deadline = time.monotonic() + TIME_LIMIT
    for _ in range(count):
        start = time.perf_counter()
        _, body = client.post(call_body(tool, 1, session))
        samples.append(time.perf_counter() - start)
        assert b'"result"' in body, body
        if time.monotonic() > deadline:
            break
    client.close()
    return samples


def http_throughput(port: int, session: str | None, tool: str, count: int, in_flight: int = 16) -> tuple[float, int]:
    clients = [HttpClient(port, session, tool) for _ in range(in_flight)]

    def answered(client: HttpClient) -> int:
        done = 0
        while (response := client.take()) is not None:
            assert b'"result"' in response[1], response
            done += 1
        return done

    return _drive(clients, lambda client: client.sock, answered, count)


def ws_throughput(port: int, tool: str, count: int, in_flight: int = 16) -> tuple[float, int]:
    clients = [WsClient(port, tool) for _ in range(in_flight)]

    def answered(client: WsClient) -> int:
        done = 0
        while (message := client.take()) is not None:
            assert b'"result"' in message, message
            done += 1
        return done

    return _drive(clients, lambda client: client.sock, answered, count, feed=lambda c, d: c.feed(d))


def sse_throughput(port: int, tool: str, count: int, in_flight: int = 16) -> tuple[float, int]:
    """Calls POSTed on ``in_flight`` connections (each answered 202), answered on one stream."""
    session = SseSession(port, tool, in_flight)
    selector = selectors.DefaultSelector()
    sent = done = 0
    deadline = time.monotonic() + TIME_LIMIT
    start = time.perf_counter()
    try:
        for poster in session.posters:
            poster.send_call()
            sent += 1
        session.sock.setblocking(False)
        selector.register(session.sock, selectors.EVENT_READ)
        for poster in session.posters:
            poster.sock.setblocking(False)
            selector.register(poster.sock, selectors.EVENT_READ, poster)
        while done < sent:
            for key, _ in selector.select(timeout=5):
                if key.data is None:
                    session.feed(session.sock.recv(65536))
                    continue
                poster = key.data
                poster.buffer += poster.sock.recv(65536)
                while (response := poster.take()) is not None:
                    assert response[0] is not None  # 202 Accepted
            while session.events:
                answer = orjson.loads(session.events.pop(0))
                assert "result" in answer, answer
                done += 1
                poster = session.posters[done % len(session.posters)]
                if sent < count and time.monotonic() < deadline:
                    poster.sock.setblocking(True)
                    poster.send_call()
                    poster.sock.setblocking(False)
                    sent += 1
        return done / (time.perf_counter() - start), done
    finally:
        selector.close()
        session.close()


def _drive(clients: list, sock_of, answered, count: int, feed=None) -> tuple[float, int]:
    selector = selectors.DefaultSelector()
    sent = done = 0
    deadline = time.monotonic() + TIME_LIMIT
    start = time.perf_counter()
    try:
        for client in clients:
            client.send_call()
            sent += 1
            sock_of(client).setblocking(False)
            selector.register(sock_of(client), selectors.EVENT_READ, client)
        while done < sent:
            for key, _ in selector.select(timeout=5):
                client = key.data
                data = sock_of(client).recv(65536)
                if feed is not None:
                    feed(client, data)
                else:
                    client.buffer += data
                got = answered(client)
                done += got
                for _ in range(got):
                    if sent < count and time.monotonic() < deadline:
                        sock_of(client).setblocking(True)
                        client.send_call()
                        sock_of(client).setblocking(False)
                        sent += 1
        return done / (time.perf_counter() - start), done
    finally:
        selector.close()
        for client in clients:
            client.close()
