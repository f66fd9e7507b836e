"""Use the proxy in front of modern_server.py (prefix ``modern``) over Streamable HTTP with the
official Python SDK, 2.x (legacy mode: ``initialize``) or 1.x, whichever the interpreter has:
``python cluster_client.py URL ROUNDS``. Each round lists and calls tools, gets a prompt, lists
and reads a resource (with a small page size, each list in several pages); prints one JSON
object with what each round saw. Every wait is bounded."""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from typing import Any

import anyio

SDK = int(version("mcp").split(".")[0])


async def all_tools(session: Any) -> list[str]:
    """Every page of tools/list: with a small page size, each cursor may go to another proxy."""
    names: list[str] = []
    cursor = None
    for _ in range(50):
        page = await session.list_tools(cursor=cursor)
        names += [tool.name for tool in page.tools]
        cursor = getattr(page, "next_cursor", None) if SDK >= 2 else page.nextCursor
        if cursor is None:
            return names
    raise AssertionError("tools/list never ended")


async def rounds(session: Any, count: int) -> list[dict[str, Any]]:
    seen = []
    for _ in range(count):
        tools = await all_tools(session)
        added = await session.call_tool("modern__add", {"a": 2, "b": 3})
        echoed = await session.call_tool("modern__echo", {"text": "héllo"})
        prompts = await session.list_prompts()
        prompt = await session.get_prompt("modern__greeting", {"name": "ada", "style": "pirate"})
        resources = await session.list_resources()
        read = await session.read_resource(resources.resources[0].uri)
        seen.append(
            {
                "tools": tools,
                "add": added.content[0].text,
                "echo": echoed.content[0].text,
                "prompts": sorted(p.name for p in prompts.prompts),
                "prompt": prompt.messages[0].content.text,
                "resource": str(resources.resources[0].uri),
                "read": read.contents[0].text,
            }
        )
    return seen


async def main(url: str, count: int) -> None:
    with anyio.fail_after(60):
        if SDK >= 2:
            from mcp.client import Client

            async with Client(url, mode="legacy", cache=None) as client:  # type: ignore[call-arg]
                out = {"sdk": SDK, "version": client.protocol_version, "rounds": await rounds(client, count)}
        else:
            from mcp import ClientSession
            from mcp.client.streamable_http import streamablehttp_client

            async with streamablehttp_client(url) as (read, write, session_id), ClientSession(read, write) as session:
                initialized = await session.initialize()
                out = {"sdk": SDK, "version": initialized.protocolVersion, "rounds": await rounds(session, count)}
                out["session"] = session_id()
    print(json.dumps(out))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]))
