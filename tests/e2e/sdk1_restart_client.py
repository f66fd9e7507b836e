"""Call one tool of the proxy over Streamable HTTP with the official Python SDK 1.x (run
with the interpreter of a venv that has ``mcp<2``), again and again, printing each outcome
as a JSON line: {"ok": true} or the error's code, message and data. Stops once a call
succeeds after one failed, or after SECONDS. Usage: python sdk1_restart_client.py URL TOOL SECONDS"""

import json
import sys
import time

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError


async def main(url: str, tool: str, seconds: float) -> None:
    async with streamablehttp_client(url) as (read, write, _), ClientSession(read, write) as session:
        await session.initialize()
        until = time.monotonic() + seconds
        failed = False
        while time.monotonic() < until:
            try:
                result = await session.call_tool(tool, {"timezone": "UTC"})
                outcome = {"ok": not result.isError}
            except McpError as exc:
                outcome = {"code": exc.error.code, "message": exc.error.message, "data": exc.error.data}
            print(json.dumps(outcome), flush=True)
            if outcome.get("ok") and failed:
                break
            failed = failed or not outcome.get("ok")
            await anyio.sleep(0.1)


anyio.run(main, sys.argv[1], sys.argv[2], float(sys.argv[3]))
