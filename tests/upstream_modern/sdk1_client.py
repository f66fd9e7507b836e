"""The official Python SDK 1.x (legacy only; run with ``.venv-mcp1``) through the proxy in
front of the modern test server (its prefix ``m``): ``python sdk1_client.py stdio CONFIG
PYTHON`` or ``python sdk1_client.py http URL``. Prints what it saw as JSON."""

import json
import sys

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client


def connect(transport: str, target: str):
    if transport == "stdio":
        return stdio_client(
            StdioServerParameters(
                command=sys.argv[3],
                args=["-m", "aggregator", "serve", "--stdio", "--config", target, "--log-level", "warning"],
            )
        )
    return streamablehttp_client(target)


async def main(transport: str, target: str) -> None:
    changed = anyio.Event()

    async def on_message(message) -> None:
        if isinstance(message, types.ServerNotification) and isinstance(
            message.root, types.ToolListChangedNotification
        ):
            changed.set()

    progress: list[float] = []

    async def on_progress(value: float, total: float | None, text: str | None) -> None:
        progress.append(value)

    with anyio.fail_after(60):
        async with connect(transport, target) as streams:
            async with ClientSession(streams[0], streams[1], message_handler=on_message) as session:
                init = await session.initialize()
                tools = [tool.name for tool in (await session.list_tools()).tools]
                add = await session.call_tool("m__add", {"a": 2, "b": 3})
                slow = await session.call_tool("m__slow", {"steps": 3}, progress_callback=on_progress)
                resources = await session.list_resources()
                read = await session.read_resource(resources.resources[0].uri)
                prompt = await session.get_prompt("m__greet", {"name": "ada"})
                await session.call_tool("m__grow", {})
                with anyio.fail_after(20):
                    await changed.wait()
                after = [tool.name for tool in (await session.list_tools()).tools]
    print(
        json.dumps(
            {
                "version": init.protocolVersion,
                "tools": tools,
                "add": add.structuredContent,
                "slow": slow.content[0].text,
                "progress": progress,
                "resource": str(resources.resources[0].uri),
                "read": read.contents[0].text,
                "prompt": prompt.messages[0].content.text,
                "after": after,
            }
        )
    )


anyio.run(main, sys.argv[1], sys.argv[2])
