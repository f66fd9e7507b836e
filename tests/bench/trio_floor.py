"""The floor under any trio proxy: the least a trio HTTP server can do, measured like the proxy.

``python -m tests.bench.trio_floor PORT [--forward]`` serves http://127.0.0.1:PORT/mcp with
trio and httptools and nothing else: no limits, no deadlines, no sessions checked, no
routing. Without ``--forward`` it answers each call itself (what ``fast_http_echo`` does on
asyncio). With ``--forward`` it does the least a proxy in front of a stdio server must do:
give each request an id of its own, write it to the batched echo server's stdin, read the
answer line, put the client's id back and answer the POST. ``http_bench --floor`` drives
both with the same load generator as the proxy, so the figures say what trio itself costs
before the proxy does anything of its own.
"""

from __future__ import annotations

import itertools
import sys
import uuid
from functools import partial
from subprocess import PIPE

import httptools
import orjson
import trio

from tests.bench.echo_server import answer
from tests.bench.fast_http_echo import TOOLS

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n%scontent-length: %d\r\n\r\n%s"


class Upstream:
    """One stdio child, answers matched to waiters by an id of our own."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.ids = itertools.count(1)
        self.waiting: dict[int, tuple[trio.Event, list]] = {}
        self.pending: list[bytes] = []
        self.writing = False

    async def call(self, message: dict) -> bytes:
        own = next(self.ids)
        client_id = message["id"]
        message["id"] = own
        done, box = trio.Event(), []
        self.waiting[own] = (done, box)
        self.pending.append(orjson.dumps(message) + b"\n")
        if not self.writing:  # one writer at a time; it takes whatever queued meanwhile too
            self.writing = True
            try:
                while self.pending:
                    data = b"".join(self.pending)
                    self.pending.clear()
                    assert self.process.stdin is not None
                    await self.process.stdin.send_all(data)
            finally:
                self.writing = False
        await done.wait()
        reply = box[0]
        reply["id"] = client_id
        return orjson.dumps(reply)

    async def read(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for data in self.process.stdout:
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                reply = orjson.loads(line)
                done, box = self.waiting.pop(reply["id"])
                box.append(reply)
                done.set()


class Connection:
    def __init__(self, stream: trio.SocketStream, upstream: Upstream | None) -> None:
        self.stream = stream
        self.upstream = upstream
        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []
        self.ready: list[bytes] = []

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.ready.append(b"".join(self.body))
        self.body.clear()

    async def serve(self) -> None:
        async with self.stream:
            while data := await self.stream.receive_some(65536):
                self.parser.feed_data(data)
                while self.ready:
                    await self.respond(orjson.loads(self.ready.pop(0)))

    async def respond(self, message: dict) -> None:
        extra = b""
        if message.get("method") == "initialize":
            extra = b"mcp-session-id: " + uuid.uuid4().hex.encode() + b"\r\n"
        if "id" not in message:
            await self.stream.send_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
            return
        if self.upstream is not None and message.get("method") == "tools/call":
            out = await self.upstream.call(message)
        else:
            out = answer(message, TOOLS) or b"{}"
        await self.stream.send_all(OK % (extra, len(out), out))


async def main(port: int, forward: bool) -> None:
    async with trio.open_nursery() as nursery:
        upstream = None
        if forward:
            argv = [sys.executable, "-m", "tests.bench.echo_server", "--batched"]
            process = await nursery.start(partial(trio.run_process, argv, stdin=PIPE, stdout=PIPE, check=False))
            upstream = Upstream(process)
            nursery.start_soon(upstream.read)

        async def handler(stream: trio.SocketStream) -> None:
            await Connection(stream, upstream).serve()

        await trio.serve_tcp(handler, port, host="127.0.0.1")


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]), "--forward" in sys.argv[2:])
