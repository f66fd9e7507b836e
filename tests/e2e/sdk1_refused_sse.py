"""A call the proxy refuses, over the legacy HTTP+SSE transport, with the official Python
SDK 1.x (run with the interpreter of a venv that has ``mcp<2``): ``python
sdk1_refused_sse.py URL``. Calls ``a__echo`` with arguments nested 200 deep (past the
proxy's depth limit), then once more with plain arguments on the same session. Prints
JSON: the refusal's code and message, how long it took, and the second call's text."""

import json
import sys
import time

import anyio
from mcp import ClientSession, McpError
from mcp.client.sse import sse_client


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


async def main(url: str) -> None:
    seen: dict = {}
    with anyio.fail_after(60):
        async with sse_client(url) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            started = time.monotonic()
            try:
                with anyio.fail_after(15):
                    await session.call_tool("a__echo", {"x": nested(200)})
            except McpError as exc:
                seen["code"], seen["message"] = exc.error.code, exc.error.message
            except TimeoutError:
                seen["timed_out"] = True
            seen["seconds"] = time.monotonic() - started
            with anyio.fail_after(15):
                after = await session.call_tool("a__echo", {"n": 7})
            seen["after"] = after.content[0].text
    print(json.dumps(seen))


anyio.run(main, sys.argv[1])
