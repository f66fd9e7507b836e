"""The WebSocket listener checks Host, Origin and the bearer token before anything else: a
request that fails them gets 421, 403 or 401 whether or not it asks for an upgrade (the
WebSocket library would answer a request that is no upgrade with 400 first). One that
passes them goes on to the handshake as before.

Real sockets on 127.0.0.1; every wait is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import json

import pytest
import trio
import trio_websocket

from tests.rawhttp import read_response_async, request_bytes
from tests.session.fronts import running_fronts

TOKEN = "gate-token-0123456789abcdef0123456789"
UPGRADE = {
    "upgrade": "websocket",
    "connection": "Upgrade",
    "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
    "sec-websocket-version": "13",
}


async def status_of(port: int, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await stream.send_all(request_bytes(method, path, headers))
        with trio.fail_after(5):
            response = await read_response_async(stream)
        return response.status, response.body
    finally:
        await stream.aclose()


@pytest.mark.parametrize("upgrade", [False, True], ids=["plain", "upgrade"])
@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_the_access_check_comes_before_the_upgrade(upgrade, method):
    async with running_fronts(auth_tokens=[TOKEN]) as fronts:
        port = fronts.ws_port
        good = {"host": f"127.0.0.1:{port}", "authorization": f"Bearer {TOKEN}", **(UPGRADE if upgrade else {})}
        for path in ("/mcp", "/nope"):
            assert (await status_of(port, method, path, {**good, "host": "evil.example"}))[0] == 421
            status, body = await status_of(port, method, path, {**good, "origin": "http://evil.example"})
            assert status == 403 and b"Origin" in body
            assert (await status_of(port, method, path, {**good, "authorization": "Bearer nope"}))[0] == 401
            without = {name: value for name, value in good.items() if name != "authorization"}
            assert (await status_of(port, method, path, without))[0] == 401
        if not upgrade:  # past the access check, what is no upgrade is still refused
            assert (await status_of(port, method, "/mcp", good))[0] == 400


async def test_a_handshake_that_passes_the_check_still_opens_a_session():
    async with running_fronts(auth_tokens=[TOKEN]) as fronts:
        with trio.fail_after(10):
            async with trio_websocket.open_websocket_url(
                f"ws://127.0.0.1:{fronts.ws_port}/mcp", extra_headers=[("authorization", f"Bearer {TOKEN}")]
            ) as socket:
                await socket.send_message(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
                assert json.loads(await socket.get_message()) == {"jsonrpc": "2.0", "id": 1, "result": {}}
            status, _ = await status_of(
                fronts.ws_port, "GET", "/nope", {"host": "127.0.0.1", "authorization": f"Bearer {TOKEN}", **UPGRADE}
            )
            assert status == 404  # the path is checked after the access check, as before


async def _status_then_end(port: int, raw: bytes) -> tuple[int, bytes, bool]:
    """Send ``raw``; the answer's status and body, and whether the server closed the connection within 3 s."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await stream.send_all(raw)
        with trio.fail_after(5):
            response = await read_response_async(stream)
        closed = False
        with trio.move_on_after(3):
            while await stream.receive_some(65536):
                pass
            closed = True
        return response.status, response.body, closed
    finally:
        await stream.aclose()


async def test_a_handshake_refused_by_path_or_admission_is_closed_at_once():
    async with running_fronts(max_connections=3, max_sessions=1, header_timeout=10.0) as fronts:
        port = fronts.ws_port
        upgrade = {"host": f"127.0.0.1:{port}", **UPGRADE}
        for _ in range(4):  # more than max_connections: each slot is given back
            status, _, closed = await _status_then_end(port, request_bytes("GET", "/nope", upgrade))
            assert status == 404 and closed
        with trio.fail_after(10):
            async with fronts.websocket():  # the one session max_sessions allows
                status, body, closed = await _status_then_end(port, request_bytes("GET", "/mcp", upgrade))
                assert status == 503 and closed, body


@pytest.mark.parametrize(
    "change",
    [
        (b"GET /", b"POST /"),
        (b"sec-websocket-key:", b"x-key:"),
        (b"host:", b"x-host:"),
        (b"sec-websocket-version: 13", b"sec-websocket-version: 99"),
    ],
    ids=["post", "no-key", "no-host", "version-99"],
)
async def test_a_handshake_the_library_refuses_gives_its_slot_back_at_once(change):
    async with running_fronts(max_connections=2, header_timeout=10.0) as fronts:
        port = fronts.ws_port
        raw = request_bytes("GET", "/mcp", {"host": f"127.0.0.1:{port}", **UPGRADE}).replace(*change, 1)
        with trio.fail_after(8):
            for _ in range(4):  # more than max_connections: each slot is given back
                status, _, closed = await _status_then_end(port, raw)
                assert status in (400, 426) and closed, status
            # A head the client stops sending halfway is closed, and its slot given back, too.
            for _ in range(3):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(raw[:30])
                await stream.send_eof()
                assert await stream.receive_some(100) == b""
                await stream.aclose()
            async with fronts.websocket():
                pass


async def test_the_websocket_head_limit_is_exact_however_the_head_is_split():
    """The head, from its first byte through the blank line, may hold max_header_bytes."""
    limit = 4096
    async with running_fronts(max_header_bytes=limit) as fronts:
        port = fronts.ws_port
        base = request_bytes("GET", "/mcp", {"host": f"127.0.0.1:{port}", **UPGRADE})
        assert base.endswith(b"\r\n\r\n")
        for size in (limit - 1, limit, limit + 1):
            head = base[:-2] + b"x-pad: " + b"a" * (size - len(base) - 9) + b"\r\n\r\n"
            assert len(head) == size
            for parts in ([head], [head[:-1], head[-1:]], [head[:-3], head[-3:]]):
                with trio.fail_after(5):
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                    try:
                        for i, part in enumerate(parts):
                            if i:
                                await trio.sleep(0.05)
                            await stream.send_all(part)
                        answer = await stream.receive_some(100)
                    finally:
                        await stream.aclose()
                expected = b"HTTP/1.1 101 " if size <= limit else b"HTTP/1.1 431 "
                assert answer.startswith(expected), (size, len(parts), answer)


async def test_the_websocket_head_limit_is_max_header_bytes_with_431():
    async with running_fronts(max_header_bytes=4096) as fronts:
        port = fronts.ws_port
        base = {"host": f"127.0.0.1:{port}", **UPGRADE}
        status, body, closed = await _status_then_end(port, request_bytes("GET", "/mcp", {**base, "x-pad": "a" * 4200}))
        assert status == 431 and b"too large" in body and closed
        with trio.fail_after(10):  # a head just under the limit still gets its upgrade
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(request_bytes("GET", "/mcp", {**base, "x-pad": "a" * 3800}))
            assert (await stream.receive_some(100)).startswith(b"HTTP/1.1 101 ")
            await stream.aclose()


async def test_an_obs_fold_in_the_websocket_head_is_refused_with_400():
    async with running_fronts() as fronts:
        port = fronts.ws_port
        raw = request_bytes("GET", "/mcp", {"host": f"127.0.0.1:{port}", **UPGRADE}).replace(
            b"\r\nupgrade:", b"\r\n x-folded\r\nupgrade:", 1
        )
        status, body, closed = await _status_then_end(port, raw)
        assert status == 400 and b"obs-fold" in body and closed


async def test_a_first_frame_sent_with_the_handshake_is_read_after_it():
    payload = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
    mask = b"\x01\x02\x03\x04"
    frame = bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    async with running_fronts() as fronts:
        port = fronts.ws_port
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        try:
            await stream.send_all(request_bytes("GET", "/mcp", {"host": f"127.0.0.1:{port}", **UPGRADE}) + frame)
            received = b""
            with trio.fail_after(5):
                while True:
                    data = await stream.receive_some(65536)
                    assert data, received
                    received += data
                    head, _, frames = received.partition(b"\r\n\r\n")
                    if len(frames) >= 2 and len(frames) >= 2 + frames[1]:
                        break
            assert head.startswith(b"HTTP/1.1 101 ")
            assert frames[0] == 0x81 and json.loads(frames[2 : 2 + frames[1]]) == {
                "jsonrpc": "2.0",
                "id": 1,
                "result": {},
            }
        finally:
            await stream.aclose()
