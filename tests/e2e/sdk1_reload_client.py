"""One official Python SDK 1.x client session (Streamable HTTP) that stays open while the
test reloads the proxy's config. Run with the interpreter of a venv that has ``mcp<2``.

Usage: python sdk1_reload_client.py URL SECONDS. It reads commands from stdin, one a line,
and answers each with one JSON line on stdout:

- ``list``: {"session": its Mcp-Session-Id, "tools": [names], "changed": how many
  notifications/tools/list_changed it has received};
- ``call NAME``: {"ok": bool, "text": the first text block} or the error's code and message;
- ``quit``: ends the session.

It prints {"ready": true, ...} (as for ``list``) once initialized, and ends by itself after
SECONDS.
"""

import json
import sys

import anyio
from mcp import ClientSession, types
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError


async def main(url: str, seconds: float) -> None:
    changed = 0

    async def on_message(message) -> None:
        nonlocal changed
        if isinstance(message, types.ServerNotification) and isinstance(
            message.root, types.ToolListChangedNotification
        ):
            changed += 1

    with anyio.fail_after(seconds):
        async with (
            streamablehttp_client(url) as (read, write, session_id),
            ClientSession(read, write, message_handler=on_message) as session,
        ):
            await session.initialize()

            async def listing() -> dict:
                tools = await session.list_tools()
                return {"session": session_id(), "tools": sorted(t.name for t in tools.tools), "changed": changed}

            print(json.dumps({"ready": True, **await listing()}), flush=True)
            stdin = anyio.wrap_file(sys.stdin)
            async for line in stdin:
                command, _, argument = line.strip().partition(" ")
                if command == "quit":
                    return
                if command == "list":
                    print(json.dumps(await listing()), flush=True)
                elif command == "call":
                    try:
                        result = await session.call_tool(argument, {"text": "hi"})
                        text = next((c.text for c in result.content if c.type == "text"), "")
                        outcome = {"ok": not result.isError, "text": text}
                    except McpError as exc:
                        outcome = {"ok": False, "code": exc.error.code, "message": exc.error.message}
                    print(json.dumps(outcome), flush=True)


anyio.run(main, sys.argv[1], float(sys.argv[2]))
