"""Drive the proxy with the official Python SDK 1.x (run with the interpreter of a venv
that has ``mcp<2``): ``python sdk1_client.py TRANSPORT TARGET``, TRANSPORT one of
stdio (TARGET: a config path), http, sse, websocket (TARGET: a URL). Prints JSON."""

import json
import sys

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client
from mcp.client.websocket import websocket_client


def connect(transport: str, target: str):
    if transport == "stdio":
        return stdio_client(
            StdioServerParameters(
                command=sys.argv[3],
                args=["-m", "aggregator", "serve", "--stdio", "--config", target, "--log-level", "warning"],
            )
        )
    if transport == "http":
        return streamablehttp_client(target)
    if transport == "sse":
        return sse_client(target)
    return websocket_client(target)


async def main(transport: str, target: str) -> None:
    async with connect(transport, target) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            names, cursor = [], None
            while True:
                page = await session.list_tools(cursor=cursor)
                names += [tool.name for tool in page.tools]
                cursor = page.nextCursor
                if not cursor:
                    break
            echo = await session.call_tool("a__echo", {"n": 123456789012345678901234567890})
            add = await session.call_tool("a__add", {"a": 2, "b": 3})
            resources = await session.list_resources()
            read_back = await session.read_resource(resources.resources[0].uri)
            try:
                await session.call_tool("a__nope", {})
                unknown = None
            except Exception as exc:  # noqa: BLE001 - the SDK raises McpError
                unknown = str(exc)
            print(
                json.dumps(
                    {
                        "server": init.serverInfo.name,
                        "version": init.protocolVersion,
                        "tools": names,
                        "echo": echo.content[0].text,
                        "sum": add.structuredContent,
                        "resource": str(resources.resources[0].uri),
                        "read": str(read_back.contents[0].uri),
                        "unknown": unknown,
                        "is_text": isinstance(echo.content[0], types.TextContent),
                    }
                )
            )


anyio.run(main, sys.argv[1], sys.argv[2])
