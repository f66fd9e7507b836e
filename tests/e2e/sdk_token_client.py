"""Call the proxy with the official Python SDK sending an access token:
``python sdk_token_client.py URL TOKEN [MODE]``. With SDK 2.x (MODE ``legacy`` or
``2026-07-28``) through ``mcp.Client``, with 1.x (no MODE) through ``ClientSession``. Prints
one JSON object: the tools listed and what calling ``up__whoami`` said, or the error."""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio


async def with_sdk2(url: str, token: str, mode: str) -> dict[str, Any]:
    from mcp.client import Client
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    transport = streamable_http_client(
        url, http_client=create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    )
    async with Client(transport, mode=mode, cache=None) as client:  # type: ignore[arg-type]
        tools = sorted(tool.name for tool in (await client.list_tools()).tools)
        called = await client.call_tool("up__whoami", {})
        return {"tools": tools, "called": getattr(called.content[0], "text", "")}


async def with_sdk1(url: str, token: str) -> dict[str, Any]:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async with streamablehttp_client(url, headers={"Authorization": f"Bearer {token}"}) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            tools = sorted(tool.name for tool in (await session.list_tools()).tools)
            called = await session.call_tool("up__whoami", {})
            return {"tools": tools, "called": getattr(called.content[0], "text", "")}


async def main(url: str, token: str, mode: str | None) -> None:
    try:
        with anyio.fail_after(30):
            out = await (with_sdk2(url, token, mode) if mode else with_sdk1(url, token))
    except Exception as exc:  # noqa: BLE001 - what failed is the output
        out = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    print(json.dumps(out))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
