"""The floor for a proxy hop: a bare trio stdio pass-through that only remaps ids.

``python -m tests.bench.bare_passthrough CMD [ARGS...]``: runs CMD as a child and relays
NDJSON both ways, giving each request a fresh id upstream and restoring it on the way
back. No routing, no names, no errors: the benchmark's calibration point, not a product.
"""

import os
import subprocess
import sys

import orjson
import trio


async def main(argv: list[str]) -> None:
    process = await trio.lowlevel.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    stdin = trio.lowlevel.FdStream(os.dup(0))
    stdout_fd = os.dup(1)
    stdout = trio.lowlevel.FdStream(stdout_fd)
    ids: dict[int, object] = {}
    next_id = [1]

    async def client_to_server() -> None:
        buffer = b""
        while data := await stdin.receive_some(65536):
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            out = []
            for line in lines:
                message = orjson.loads(line)
                if "id" in message and "method" in message:
                    ids[next_id[0]] = message["id"]
                    message["id"] = next_id[0]
                    next_id[0] += 1
                out.append(orjson.dumps(message))
            await process.stdin.send_all(b"\n".join(out) + b"\n")
        await process.stdin.aclose()

    async def server_to_client() -> None:
        buffer = b""
        while data := await process.stdout.receive_some(65536):
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            out = []
            for line in lines:
                message = orjson.loads(line)
                if "id" in message and "method" not in message:
                    message["id"] = ids.pop(message["id"])
                out.append(orjson.dumps(message))
            await stdout.send_all(b"\n".join(out) + b"\n")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client_to_server)
        nursery.start_soon(server_to_client)


if __name__ == "__main__":
    trio.run(main, sys.argv[1:])
