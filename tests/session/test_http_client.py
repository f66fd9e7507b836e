"""The upstream HTTP client's own path (plain-HTTP POSTs): connections kept and reused,
a connection the server closed while idle not used, a request never sent twice, and
failures raised as httpx's errors. Against a real server on 127.0.0.1 that counts what it
gets."""

from __future__ import annotations

import contextlib
import json
from functools import partial

import httpx
import pytest
import trio

from aggregator.config import structure_config
from aggregator.fronts.session import serve_stream_session
from aggregator.hub.hub import Hub
from aggregator.upstreams.http_client import BadResponse, UpstreamClient
from tests.session.harness import Client

BODY = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
JSON = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"


class Server:
    """Answers each POST as ``behaviour`` says; counts connections and requests."""

    def __init__(self, behaviour: str = "json") -> None:
        self.behaviour = behaviour
        self.connections = 0
        self.requests = 0
        self.streams: list[trio.SocketStream] = []
        self.first_read = trio.Event()  # ("stream") the client read the first event

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        self.streams.append(stream)
        buffer = b""
        while True:
            try:
                data = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return  # (the test closed this connection itself)
            if not data:
                return
            buffer += data
            while b"\r\n\r\n" in buffer:
                head, _, rest = buffer.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                if len(rest) < length:
                    break
                buffer = rest[length:]
                self.requests += 1
                if self.behaviour == "hang up":
                    await stream.aclose()
                    return
                if self.behaviour == "stream":
                    await stream.send_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                    )
                    await stream.send_all(b"9\r\ndata: 1\n\n\r\n")
                    await self.first_read.wait()  # the second only once the first was read
                    await stream.send_all(b"9\r\ndata: 2\n\n\r\n0\r\n\r\n")
                    continue
                answer = b'{"jsonrpc":"2.0","id":1,"result":{}}'
                if self.behaviour == "interim":
                    await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await trio.sleep(0.05)
                    await stream.send_all(
                        b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n" + JSON % (len(answer), answer)
                    )
                    continue
                if self.behaviour == "until close":
                    await stream.send_all(b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n" + answer)
                    await stream.aclose()
                    return
                if self.behaviour == "switch":
                    await stream.send_all(
                        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n"
                    )
                    continue
                if self.behaviour == "extra":
                    extra = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstale"
                    await stream.send_all(JSON % (len(answer), answer) + extra)
                    continue
                if self.behaviour == "huge head":
                    with contextlib.suppress(trio.BrokenResourceError):  # the client gives up reading it
                        await stream.send_all(b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * 300_000 + b"\r\n")
                    continue
                await stream.send_all(JSON % (len(answer), answer))


@pytest.fixture
async def served(nursery):
    async def start(behaviour: str = "json") -> tuple[Server, str]:
        server = Server(behaviour)
        listeners = await nursery.start(partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        return server, f"http://127.0.0.1:{port}/mcp"

    return start


async def post(client: UpstreamClient, url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with client.stream("POST", url, content=BODY, headers=headers or {"content-type": "application/json"}) as r:
        return r.status_code, await r.aread()


async def test_posts_share_one_kept_alive_connection(served):
    server, url = await served()
    async with httpx.AsyncClient() as theirs, UpstreamClient(theirs, url, {"x-token": "t"}, 5.0) as client:
        assert client.fast
        for _ in range(5):
            assert await post(client, url) == (200, b'{"jsonrpc":"2.0","id":1,"result":{}}')
    assert server.connections == 1 and server.requests == 5


async def test_a_connection_the_server_closed_while_idle_is_not_used(served):
    server, url = await served()
    async with httpx.AsyncClient() as theirs, UpstreamClient(theirs, url, {}, 5.0) as client:
        assert (await post(client, url))[0] == 200
        await server.streams[0].aclose()  # the server drops the idle connection
        await trio.sleep(0.05)
        assert (await post(client, url))[0] == 200
    assert server.connections == 2 and server.requests == 2


async def test_a_request_is_never_sent_twice_when_the_server_hangs_up_without_answering(served):
    server, url = await served("hang up")
    async with httpx.AsyncClient() as theirs, UpstreamClient(theirs, url, {}, 5.0) as client:
        with pytest.raises(httpx.HTTPError):
            await post(client, url)
    assert server.requests == 1


async def test_an_event_stream_arrives_as_it_is_sent(served):
    server, url = await served("stream")
    async with httpx.AsyncClient() as theirs, UpstreamClient(theirs, url, {}, 5.0) as client:
        async with client.stream("POST", url, content=BODY, headers={}) as response:
            assert response.headers["content-type"] == "text/event-stream"
            chunks = []
            async for chunk in response.aiter_bytes():
                chunks.append(chunk)
                server.first_read.set()
        assert chunks[0] == b"data: 1\n\n" and b"".join(chunks) == b"data: 1\n\ndata: 2\n\n"
        assert (await post(client, url))[0] == 200  # and the connection is reused after it
    assert server.connections == 1


async def test_a_header_with_a_line_break_fails_that_request_without_showing_its_value(served):
    server, url = await served()
    async with httpx.AsyncClient() as theirs, UpstreamClient(theirs, url, {}, 5.0) as client:
        with pytest.raises(httpx.LocalProtocolError) as caught:
            await post(client, url, {"authorization": "Bearer secret\r\nx: y"})
        assert "secret" not in str(caught.value)
        assert (await post(client, url))[0] == 200
    assert server.requests == 1


async def test_nothing_listening_is_a_connect_error():
    async with httpx.AsyncClient() as theirs, UpstreamClient(theirs, "http://127.0.0.1:1/mcp", {}, 5.0) as client:
        with pytest.raises(httpx.ConnectError):
            await post(client, "http://127.0.0.1:1/mcp")


def test_tls_and_proxied_urls_are_left_to_httpx(monkeypatch):
    client = httpx.AsyncClient()
    assert not UpstreamClient(client, "https://127.0.0.1:8443/mcp", {}, 5.0).fast
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:3128")
    assert not UpstreamClient(client, "http://127.0.0.1:8000/mcp", {}, 5.0).fast


async def test_interim_responses_are_skipped_and_the_connection_stays_in_step(served):
    server, url = await served("interim")
    async with httpx.AsyncClient() as theirs, UpstreamClient(theirs, url, {}, 5.0) as client:
        for _ in range(3):
            async with client.stream("POST", url, content=BODY, headers={}) as response:
                assert response.status_code == 200 and response.headers["content-type"] == "application/json"
                assert "link" not in response.headers
                assert await response.aread() == b'{"jsonrpc":"2.0","id":1,"result":{}}'
    assert server.connections == 1 and server.requests == 3


async def test_a_body_that_ends_when_the_server_closes_is_whole(served):
    server, url = await served("until close")
    async with httpx.AsyncClient() as theirs, UpstreamClient(theirs, url, {}, 5.0) as client:
        for _ in range(2):  # and the closed connection is not used again
            assert await post(client, url) == (200, b'{"jsonrpc":"2.0","id":1,"result":{}}')
    assert server.connections == 2


async def test_headers_past_the_limit_fail_the_request(served):
    server, url = await served("huge head")
    async with httpx.AsyncClient() as theirs, UpstreamClient(theirs, url, {}, 5.0) as client:
        with pytest.raises(BadResponse, match="headers are larger"):  # this request's failure alone
            await post(client, url)


async def test_a_101_fails_its_request_alone(served):
    server, url = await served("switch")
    async with httpx.AsyncClient() as theirs, UpstreamClient(theirs, url, {}, 5.0) as client:
        with pytest.raises(BadResponse, match="101"):
            await post(client, url)


async def test_bytes_after_a_whole_response_are_not_read_into_it_nor_into_the_next(served):
    server, url = await served("extra")
    async with httpx.AsyncClient() as theirs, UpstreamClient(theirs, url, {}, 5.0) as client:
        for _ in range(2):
            assert await post(client, url) == (200, b'{"jsonrpc":"2.0","id":1,"result":{}}')
    assert server.connections == 2  # the first connection was not used again


# --- through the proxy: a bad answer fails its call, and the server stays up ---------------


class McpServer:
    """A minimal Streamable HTTP MCP server whose tool ``bad`` answers with ``answer``."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer

    async def handle(self, stream: trio.SocketStream) -> None:
        buffer = b""
        while True:
            try:
                data = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            buffer += data
            while b"\r\n\r\n" in buffer:
                head, _, rest = buffer.partition(b"\r\n\r\n")
                if not head.startswith(b"POST"):  # the GET stream, the DELETE: not served
                    buffer = rest
                    await stream.send_all(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
                    continue
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                if len(rest) < length:
                    break
                body, buffer = rest[:length], rest[length:]
                try:
                    await stream.send_all(self.reply(json.loads(body)))
                except trio.BrokenResourceError:
                    return  # the proxy stopped reading a bad answer: as it should

    def reply(self, message: dict) -> bytes:
        if "id" not in message:
            return b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n"
        method = message["method"]
        if method == "tools/call" and message["params"]["name"] == "bad":
            return self.answer
        result: dict = {}
        if method == "initialize":
            result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "m"}}
        elif method == "tools/list":
            result = {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in ("bad", "good")]}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": "fine"}]}
        elif method == "server/discover":  # a legacy server: the proxy then initializes
            error = {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "no"}}
            answer = json.dumps(error).encode()
            return JSON % (len(answer), answer)
        answer = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode()
        return JSON % (len(answer), answer)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * 300_000 + b"\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
    ],
    ids=["101", "a huge head", "malformed"],
)
async def test_a_bad_answer_fails_its_call_alone_and_the_server_stays_up(nursery, answer):
    server = McpServer(answer)
    listeners = await nursery.start(partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    config = structure_config(
        {"proxy": {"startup_timeout": 5.0}, "servers": {"m": {"url": f"http://127.0.0.1:{port}/mcp"}}}, environ={}
    )
    hub = Hub(config)
    await nursery.start(hub.run)
    await hub.startup_done.wait()
    ours, theirs = trio.testing.memory_stream_pair()
    nursery.start_soon(serve_stream_session, hub, theirs, theirs)
    client = Client(ours)
    with trio.fail_after(10):
        await client.initialize()
        bad = await client.request("tools/call", {"name": "m__bad", "arguments": {}})
        good = await client.request("tools/call", {"name": "m__good", "arguments": {}})
    assert "error" in bad and "Traceback" not in json.dumps(bad), bad
    assert good["result"]["content"][0]["text"] == "fine", good
    upstream = hub.upstreams["m"]
    assert upstream.state == "ready" and upstream.restarts == 0, upstream.last_error  # never lost
    nursery.cancel_scope.cancel()
