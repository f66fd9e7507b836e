"""Every upstream transport behind every downstream transport.

Proxy A serves the in-repo fake server over Streamable HTTP, legacy SSE and WebSocket;
server-everything serves itself over Streamable HTTP. Proxy B puts all of them, plus the
fake server over stdio, behind one endpoint, and each of B's front doors (stdio,
Streamable HTTP, WebSocket) reaches each of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio_websocket

from tests.e2e.conftest import FAKESRV, RawProxy, http_proxy, initialize, post, websocket_requester, write_config
from tests.loopback import free_port, wait_listening

pytestmark = pytest.mark.e2e
UPSTREAMS = {"s": "s__echo", "h": "h__f__echo", "l": "l__f__echo", "w": "w__f__echo", "e": "e__echo"}


@pytest.fixture
def chain(tmp_path, everything_js):
    a_http, a_ws, everything_port = free_port(), free_port(), free_port()
    a_dir = tmp_path / "a"
    a_dir.mkdir()
    a_config = write_config(a_dir, f'[servers.f]\ncommand = "{sys.executable}"\nargs = ["{FAKESRV}"]\n')
    a = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aggregator",
            "serve",
            "--http",
            f"127.0.0.1:{a_http}",
            "--ws",
            f"127.0.0.1:{a_ws}",
            "--config",
            str(a_config),
        ],
        stdin=subprocess.DEVNULL,
        stderr=open(a_dir / "a.log", "wb"),
    )
    everything = subprocess.Popen(
        ["node", str(everything_js), "streamableHttp"],
        env={**os.environ, "PORT": str(everything_port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(a_http)
        wait_listening(a_ws)
        wait_listening(everything_port)
        b_config = write_config(
            tmp_path,
            f'''
[servers.s]
command = "{sys.executable}"
args = ["{FAKESRV}"]
[servers.h]
url = "http://127.0.0.1:{a_http}/mcp"
[servers.l]
url = "http://127.0.0.1:{a_http}/sse"
transport = "sse"
[servers.w]
url = "ws://127.0.0.1:{a_ws}/mcp"
[servers.e]
url = "http://127.0.0.1:{everything_port}/mcp"
''',
            startup_timeout=20.0,
            page_size=500,
        )
        yield b_config
    finally:
        for process in (a, everything):
            process.terminate()
            process.wait(timeout=15)


def check_tools(names):
    for tool in UPSTREAMS.values():
        assert tool in names, (tool, sorted(names)[:20])


def test_stdio_front(chain):
    proxy = RawProxy(chain)
    try:
        proxy.request(
            1,
            "initialize",
            {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
        )
        check_tools({t["name"] for t in proxy.request(2, "tools/list")["result"]["tools"]})
        for index, (server, tool) in enumerate(UPSTREAMS.items()):
            args = {"message": "hi"} if server == "e" else {"via": server}
            answer = proxy.request(10 + index, "tools/call", {"name": tool, "arguments": args})
            text = answer["result"]["content"][0]["text"]
            assert ("Echo: hi" in text) if server == "e" else json.loads(text) == {"via": server}
        # Progress across two hops (B -> A -> fake has no progress; everything does).
        proxy.send(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 50,
                    "method": "tools/call",
                    "params": {
                        "name": "e__trigger-long-running-operation",
                        "arguments": {"duration": 0.5, "steps": 2},
                        "_meta": {"progressToken": "tok"},
                    },
                }
            ).encode()
            + b"\n"
        )
        assert "result" in proxy.receive()
        progress = [n for n in proxy.notifications if n.get("method") == "notifications/progress"]
        assert [p["params"]["progressToken"] for p in progress] == ["tok", "tok"]
    finally:
        code, log = proxy.close()
    assert code == 0, log


def test_http_front(chain):
    with http_proxy(chain) as (port, _):
        session = initialize(port)
        headers = {"mcp-session-id": session}
        status, _, body = post(port, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers)
        check_tools({t["name"] for t in json.loads(body)["result"]["tools"]})
        for index, (server, tool) in enumerate(UPSTREAMS.items()):
            args = {"message": "hi"} if server == "e" else {"via": server}
            status, _, body = post(
                port,
                {
                    "jsonrpc": "2.0",
                    "id": 10 + index,
                    "method": "tools/call",
                    "params": {"name": tool, "arguments": args},
                },
                headers,
            )
            text = json.loads(body)["result"]["content"][0]["text"]
            assert ("Echo: hi" in text) if server == "e" else json.loads(text) == {"via": server}
        # Progress comes back on the request's own event stream.
        status, response_headers, body = post(
            port,
            {
                "jsonrpc": "2.0",
                "id": 50,
                "method": "tools/call",
                "params": {
                    "name": "e__trigger-long-running-operation",
                    "arguments": {"duration": 0.5, "steps": 2},
                    "_meta": {"progressToken": 7},
                },
            },
            headers,
        )
        assert response_headers["content-type"] == "text/event-stream"
        events = [json.loads(line[6:]) for line in body.split(b"\n") if line.startswith(b"data: ") and line[6:].strip()]
        assert [e.get("method") for e in events] == ["notifications/progress"] * 2 + [None]
        assert events[0]["params"]["progressToken"] == 7 and events[-1]["id"] == 50


@pytest.fixture
def ws_port(chain):
    port = free_port()
    with open(Path(chain).parent / "ws.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "aggregator", "serve", "--ws", f"127.0.0.1:{port}", "--config", str(chain)],
            stdin=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            wait_listening(port, process)
            yield port
        finally:
            process.terminate()
            assert process.wait(timeout=15) == 0


async def test_websocket_front(ws_port):
    with trio.fail_after(30):
        async with trio_websocket.open_websocket_url(f"ws://127.0.0.1:{ws_port}/mcp", subprotocols=["mcp"]) as socket:
            assert socket.subprotocol == "mcp"

            request = websocket_requester(socket)

            await request(
                1,
                "initialize",
                {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "ws", "version": "0"}},
            )
            check_tools({t["name"] for t in (await request(2, "tools/list", {}))["result"]["tools"]})
            for index, (server, tool) in enumerate(UPSTREAMS.items()):
                args = {"message": "hi"} if server == "e" else {"via": server}
                answer = await request(10 + index, "tools/call", {"name": tool, "arguments": args})
                text = answer["result"]["content"][0]["text"]
                assert ("Echo: hi" in text) if server == "e" else json.loads(text) == {"via": server}
    # Same checks as HTTP at the handshake.
    with pytest.raises(trio_websocket.HandshakeError):
        async with trio_websocket.open_websocket_url(
            f"ws://127.0.0.1:{ws_port}/mcp", extra_headers=[("origin", "http://evil.example")]
        ):
            pass
