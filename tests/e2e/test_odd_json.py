"""Number literals and deep JSON through the real proxy process, over stdio and HTTP, to a
real stdio server that records the bytes it receives."""

from __future__ import annotations

import http.client
import json

import pytest

from tests.core.helpers import AWKWARD_LITERALS
from tests.e2e.conftest import RawProxy, events, fake, http_proxy, post, write_config

pytestmark = pytest.mark.e2e

# The fake server parses with the stdlib, which refuses integers over 4300 digits.
LITERALS = [literal for literal in AWKWARD_LITERALS if len(literal) < 4000]
SAMPLING = {
    "protocolVersion": "2025-06-18",
    "capabilities": {"sampling": {}},
    "clientInfo": {"name": "raw", "version": "0"},
}


def deep(levels: int) -> str:
    """JSON text nested ``levels`` deep (as text: the stdlib's writer would recurse)."""
    return (
        "".join("[" if level % 2 else '{"k":' for level in range(levels))
        + "1"
        + "".join("]" if level % 2 else "}" for level in reversed(range(levels)))
    )


def message(text: str) -> bytes:
    """The message with every @ replaced by JSON nested 990 deep (under orjson's 1024)."""
    return text.replace("@", deep(990)).encode()


def request(id: int, params: str) -> str:
    return '{"jsonrpc":"2.0","id":' + str(id) + ',"method":"tools/call","params":' + params + "}"


def sampling_answer(id: int) -> str:
    return '{"jsonrpc":"2.0","id":' + str(id) + ',"result":{"role":"assistant","content":@}}'


def arguments_text(spaced: bool) -> bytes:
    separator, colon = (", ", ": ") if spaced else (",", ":")
    return ("{" + separator.join(f'"v{i}"{colon}{literal}' for i, literal in enumerate(LITERALS)) + "}").encode()


def test_number_literals_and_deep_json_over_stdio(tmp_path):
    received = tmp_path / "received.ndjson"
    config = write_config(
        tmp_path, fake("a", "odd_json", f"record:{received}") + fake("bad", "bad_init:serverInfo"), startup_timeout=10.0
    )
    proxy = RawProxy(config)
    try:
        assert "result" in proxy.request(1, "initialize", SAMPLING)
        proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        pid = proxy.request(2, "tools/call", {"name": "a__pid", "arguments": {}})["result"]["content"][0]["text"]

        # Client -> server: every literal arrives as written, compact or spaced input alike.
        for id, spaced in ((3, False), (4, True)):
            params = '{"name":"a__echo","arguments":' + arguments_text(spaced).decode() + "}"
            proxy.send(request(id, params).encode() + b"\n")
            assert proxy.receive()["id"] == id
            lines = [line for line in received.read_bytes().split(b"\n") if b'"name":"echo"' in line]
            assert len(lines) == id - 2
            assert b'"arguments":' + arguments_text(False) in lines[-1]

        # Server -> client: the literals it writes reach the client byte for byte.
        proxy.send(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 5,
                    "method": "tools/call",
                    "params": {"name": "a__literals", "arguments": {"literals": LITERALS}},
                }
            ).encode()
            + b"\n"
        )
        line = proxy.process.stdout.readline()
        assert b'"id":5' in line and b'"values":[' + ",".join(LITERALS).encode() + b"]" in line

        # Deep JSON from the client: refused with the id; nothing reaches the server.
        for id, params in ((6, '{"name":"a__echo","arguments":@}'), (7, '{"name":"a__echo","arguments":{},"_meta":@}')):
            proxy.send(message(request(id, params)) + b"\n")
            answer = proxy.receive()
            assert (answer["id"], answer["error"]["code"]) == (id, -32600)
            assert answer["error"]["data"]["reason"] == "too_large"
        proxy.send(
            message('{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":99,"reason":@}}\n')
        )
        assert proxy.request(8, "ping") == {"jsonrpc": "2.0", "id": 8, "result": {}}

        # Deep JSON from the server: its request fails, the server stays.
        answer = proxy.request(9, "tools/call", {"name": "a__deep", "arguments": {"depth": 990}})
        assert answer["error"]["data"] == {"source": "aggregator", "reason": "too_large", "server": "a"}
        answer = proxy.request(10, "tools/call", {"name": "a__deep_note", "arguments": {"depth": 990}})
        assert answer["result"]["content"][0]["text"] == "sent"

        # A deep answer to the server's sampling request: the server is told instead.
        proxy.send(b'{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"a__sample","arguments":{}}}\n')
        asked = proxy.receive()
        assert asked["method"] == "sampling/createMessage"
        proxy.send(message(sampling_answer(asked["id"])) + b"\n")
        answer = proxy.receive()
        told = json.loads(answer["result"]["content"][0]["text"])
        assert answer["id"] == 11 and told["error"]["data"]["reason"] == "too_large"

        # Same server process all along; the one with a malformed initialize is absent.
        again = proxy.request(12, "tools/call", {"name": "a__pid", "arguments": {}})
        assert again["result"]["content"][0]["text"] == pid
        tools = proxy.request(13, "tools/list")["result"]["tools"]
        assert tools and not [t for t in tools if t["name"].startswith("bad__")]
        assert proxy.process.poll() is None
    finally:
        code, log = proxy.close()
    assert code == 0, log
    assert "server bad did not start: its initialize result is unusable: serverInfo must be an object" in log
    assert "Traceback" not in log


def test_number_literals_and_deep_json_over_http(tmp_path):
    config = write_config(tmp_path, fake("a", "odd_json"), startup_timeout=10.0)
    with http_proxy(config) as (port, log):
        status, headers, body = post(port, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": SAMPLING})
        assert status == 200, body
        session = {"mcp-session-id": headers["mcp-session-id"]}
        post(port, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)

        def call(id, name, arguments):
            status, _, body = post(
                port,
                {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}},
                session,
            )
            return status, body

        status, body = call(2, "a__literals", {"literals": LITERALS})
        assert status == 200 and b'"values":[' + ",".join(LITERALS).encode() + b"]" in body
        for id, params in ((3, '{"name":"a__echo","arguments":@}'), (4, '{"name":"a__echo","arguments":{},"_meta":@}')):
            status, _, body = post(port, message(request(id, params)), session)
            answer = json.loads(body)
            assert (status, answer["id"], answer["error"]["code"]) == (400, id, -32600)
        status, _, _ = post(
            port,
            message('{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":99,"reason":@}}'),
            session,
        )
        assert status == 400
        status, body = call(5, "a__deep", {"depth": 990})
        [answer] = events(body)
        assert status == 200 and answer["error"]["data"] == {
            "source": "aggregator",
            "reason": "too_large",
            "server": "a",
        }

        # The server asks for sampling during a call; the client's answer is too deep.
        stream = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        stream.request(
            "POST",
            "/mcp",
            body=json.dumps(
                {"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "a__sample", "arguments": {}}}
            ),
            headers={
                "host": f"127.0.0.1:{port}",
                "content-type": "application/json",
                "accept": "application/json, text/event-stream",
                **session,
            },
        )
        response = stream.getresponse()
        assert response.status == 200 and response.getheader("content-type") == "text/event-stream"
        seen = []
        while not seen or seen[-1].get("id") != 6:
            line = response.fp.readline()
            assert line, "stream ended"
            if line.startswith(b"data: ") and line[6:].strip():
                seen.append(json.loads(line[6:]))
                if seen[-1].get("method") == "sampling/createMessage":
                    status, _, _ = post(port, message(sampling_answer(seen[-1]["id"])), session)
                    assert status == 400
        stream.close()
        told = json.loads(seen[-1]["result"]["content"][0]["text"])
        assert told["error"]["data"]["reason"] == "too_large"
        assert post(port, {"jsonrpc": "2.0", "id": 7, "method": "ping"}, session)[0] == 200
    assert "Traceback" not in log.read_text()
