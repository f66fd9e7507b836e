"""A small modern (2026-07-28) MCP server for the proxy's upstream tests, built with the
official Python SDK 2.x ``MCPServer`` (dual-era, as that SDK serves): ``python server.py``
serves stdio, ``python server.py http PORT`` Streamable HTTP on 127.0.0.1:PORT (``/mcp``).

Tools: ``add`` (a + b), ``slow`` (reports progress ``steps`` times, 0.2 s apart: long
enough to cancel; each step is appended to the file ``FIXTURE_STEPS_FILE`` names, if
set), ``grow`` (adds tool ``extra`` and says the tool list changed), ``region`` (an
``x-mcp-header`` argument, echoed with the header the request carried). Resource
``test://hello``; prompt ``greet``."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import anyio
from mcp.server.mcpserver import Context, MCPServer
from pydantic import Field

STEPS_FILE = os.environ.get("FIXTURE_STEPS_FILE")
app = MCPServer("modern-fixture", instructions="A modern test server.")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _note_step(step: int) -> None:
    if STEPS_FILE:  # what a test reads to see the call stop when it is cancelled
        with open(STEPS_FILE, "a") as steps_file:
            steps_file.write(f"{step}\n")


@app.tool()
async def slow(steps: int, ctx: Context) -> str:
    """Report progress ``steps`` times, 0.2 s apart."""
    for step in range(steps):
        await ctx.report_progress(step + 1, steps)
        _note_step(step + 1)
        await anyio.sleep(0.2)
    return f"done after {steps} steps"


def extra() -> str:
    """A tool that appears once ``grow`` is called."""
    return "extra"


@app.tool()
async def grow(ctx: Context) -> str:
    """Add tool ``extra`` and say the tool list changed."""
    app.add_tool(extra)
    await ctx.notify_tools_changed()
    return "grown"


@app.tool()
def region(where: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})], ctx: Context) -> str:
    """Echo ``where`` and the Mcp-Param-Region header the request carried (HTTP only)."""
    headers = ctx.headers or {}
    return f"{where} via {headers.get('mcp-param-region', 'no header')}"


@app.resource("test://hello")
def hello() -> str:
    return "hello from a modern server"


@app.prompt()
def greet(name: str) -> str:
    return f"Please greet {name}."


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run("stdio")
