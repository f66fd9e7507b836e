"""A dual-era MCP server (official SDK 2.x) whose one tool logs, for the era matrix.

``chatter`` logs one line at debug, info and warning, each tied to its request, then answers
``logged``. A 2026-07-28 caller hears the lines its request's ``_meta`` log level lets through,
a legacy one those its ``logging/setLevel`` does (info and above before it sets one). Run:
``python eras_logging_server.py [--undeclared]`` (stdio).
"""

from __future__ import annotations

import warnings
from typing import Any

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer

warnings.simplefilter("ignore")  # logging is deprecated in 2026-07-28; this server logs on purpose

app = MCPServer("e2e-logging", version="1.0.0")


@app.tool(description="Logs a debug, an info and a warning line, then answers.")
async def chatter(ctx: Context) -> str:
    for level in ("debug", "info", "warning"):
        await ctx.log(level, f"chatter at {level}", logger_name="chatter")
    return "logged"


async def set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
    """Legacy ``logging/setLevel``: accepted (the proxy filters by each client's level). Having it
    makes the SDK declare the ``logging`` capability, which a server that logs MUST declare."""
    return types.EmptyResult()


if __name__ == "__main__":
    import sys

    # ``--undeclared``: no logging/setLevel, so no ``logging`` capability, and it logs all the same.
    if "--undeclared" not in sys.argv[1:]:
        app._lowlevel_server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)
    app.run("stdio")
