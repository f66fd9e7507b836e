"""The official Python SDK 1.x (legacy only; run with ``.venv-mcp1``) through the proxy in
front of ``modern_asking_server.py`` (prefix ``m``): ``python sdk1_bridge_client.py stdio
CONFIG PYTHON`` or ``python sdk1_bridge_client.py http URL``. Its elicitation, sampling
and roots callbacks answer what the modern server asks; prints JSON: what each tool
returned and what each callback was asked."""

import json
import sys

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client
from pydantic import FileUrl

asked: list[str] = []
names = iter(["ada", "grace", "alan", "edsger", "barbara"])


async def on_elicit(context, params: types.ElicitRequestParams) -> types.ElicitResult:
    asked.append(f"elicit: {params.message}")
    return types.ElicitResult(action="accept", content={"name": next(names)})


async def on_sample(context, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    asked.append(f"sample: {params.messages[0].content.text}")
    text = types.TextContent(type="text", text=params.messages[0].content.text.upper())
    return types.CreateMessageResult(role="assistant", content=text, model="test-model")


async def on_roots(context) -> types.ListRootsResult:
    asked.append("roots")
    return types.ListRootsResult(
        roots=[types.Root(uri=FileUrl("file:///work/one")), types.Root(uri=FileUrl("file:///work/two"))]
    )


progress: list[float] = []


async def on_progress(value: float, total: float | None, text: str | None) -> None:
    progress.append(value)


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
    results = {}
    with anyio.fail_after(60):
        async with connect(transport, target) as streams:
            async with ClientSession(
                streams[0],
                streams[1],
                sampling_callback=on_sample,
                elicitation_callback=on_elicit,
                list_roots_callback=on_roots,
            ) as session:
                init = await session.initialize()
                calls = [
                    ("name", {}),
                    ("summarize", {"text": "make it loud"}),
                    ("roots", {}),
                    ("both", {"text": "two at once"}),
                    ("twice", {}),
                ]
                for tool, arguments in calls:
                    result = await session.call_tool(f"m__{tool}", arguments)
                    results[tool] = [result.isError, result.content[0].text]
                result = await session.call_tool("m__steps", {}, progress_callback=on_progress)
                results["steps"] = [result.isError, result.content[0].text]
    seen = {"results": results, "asked": asked, "progress": progress}
    print(json.dumps({"version": init.protocolVersion, **seen}))


anyio.run(main, sys.argv[1], sys.argv[2])
