"""The benchmark's echo server with an HTTP front of its own: Streamable HTTP (JSON
answers) on the proxy's own HTTP/1.1 connection code and trio, answering what ``echo_server`` answers over stdio.

``python -m tests.bench.http_echo_server PORT`` serves http://127.0.0.1:PORT/mcp.
"""

import sys
import uuid

import orjson
import trio

from aggregator.transports.http_server import HttpConnection, HttpLimits, Request
from tests.bench.echo_server import answer

TOOLS = [{"name": f"tool{i}", "inputSchema": {"type": "object"}} for i in range(10)]
LIMITS = HttpLimits(4 * 1024 * 1024, 16 * 1024, 10.0)


async def handle(stream: trio.SocketStream) -> None:
    connection = HttpConnection(stream, LIMITS)

    async def answer_one(request: Request) -> None:
        message = orjson.loads(request.body)
        body = answer(message, TOOLS)
        headers = [("content-type", "application/json")]
        if message.get("method") == "initialize":
            headers.append(("mcp-session-id", uuid.uuid4().hex))
        if body is None:
            await connection.respond(202, [])
        else:
            await connection.respond(200, headers, body)

    try:
        await connection.serve(answer_one)
    finally:
        await connection.aclose()


async def main(port: int) -> None:
    await trio.serve_tcp(handle, port, host="127.0.0.1")


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]))
