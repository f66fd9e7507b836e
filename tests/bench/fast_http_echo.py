"""A fast direct baseline: the benchmark's echo server behind a plain asyncio HTTP/1.1 front
parsed by httptools (llhttp, the parser uvicorn uses), with no framework above it.

``python -m tests.bench.fast_http_echo PORT [--streams]`` serves http://127.0.0.1:PORT/mcp:
Streamable HTTP with JSON answers (what ``echo_server`` answers over stdio; ``initialize``
gets an ``Mcp-Session-Id``). This is the kind of server the proxy's HTTP front is measured
against: a baseline that is itself slow would make any proxy look cheap. ``--streams`` is
the plainer kind: asyncio streams, each request's head read up to its blank line and split
by hand (no parser library), as a small hand-written server would.
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import httptools
import orjson

from tests.bench.echo_server import answer

TOOLS = [
    {
        "name": f"tool{i}",
        "description": f"Tool number {i}.",
        "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}},
    }
    for i in range(10)
]


class EchoProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            self.transport.close()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        message = orjson.loads(b"".join(self.body))
        self.body.clear()
        out = answer(message, TOOLS)
        assert self.transport is not None
        if out is None:
            self.transport.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
            return
        extra = b""
        if message.get("method") == "initialize":
            extra = b"mcp-session-id: " + uuid.uuid4().hex.encode() + b"\r\n"
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n%scontent-length: %d\r\n\r\n%s"
            % (extra, len(out), out)
        )


async def handle_streams(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            message = orjson.loads(await reader.readexactly(length))
            out = answer(message, TOOLS)
            if out is None:
                writer.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
                continue
            extra = b""
            if message.get("method") == "initialize":
                extra = b"mcp-session-id: " + uuid.uuid4().hex.encode() + b"\r\n"
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n%scontent-length: %d\r\n\r\n%s"
                % (extra, len(out), out)
            )
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def main(port: int, streams: bool) -> None:
    if streams:
        server = await asyncio.start_server(handle_streams, "127.0.0.1", port)
    else:
        server = await asyncio.get_running_loop().create_server(EchoProtocol, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), "--streams" in sys.argv))
