"""A Streamable HTTP server built with the official Python SDK 1.x (run with the
interpreter of a venv that has ``mcp<2``): ``python sdk1_logging_server.py PORT``.

Its tool ``work`` {label, lines} logs ``lines`` lines naming ``label`` while it runs, a
little apart, then answers; the SDK sends each line on the POST stream of that call (it
relates them to the request), as a server that knows whom it is talking to does.
"""

import sys

import anyio
from mcp.server.fastmcp import Context, FastMCP

server = FastMCP("sdk1-logging", host="127.0.0.1", port=int(sys.argv[1]), log_level="WARNING")


@server._mcp_server.set_logging_level()
async def set_level(level) -> None:  # declares the logging capability; every line is info
    return None


@server.tool()
async def work(label: str, lines: int, ctx: Context) -> str:
    for index in range(lines):
        await ctx.info(f"{label} line {index}")
        await anyio.sleep(0.05)
    return f"{label} done"


server.run(transport="streamable-http")
