"""Drive a server with the official Python SDK 2.x client: ``python sdk2_client.py MODE TARGET``.

MODE is ``2026-07-28`` (stateless, pinned) or ``legacy`` (``initialize``); TARGET is a URL
(Streamable HTTP) or a command line to run over stdio (split on spaces). The server must be
``modern_server.py`` or the proxy in front of it with an empty prefix. Prints one JSON object
with what each step saw; every wait is bounded.
"""

from __future__ import annotations

import json
import shlex
import sys
import warnings
from typing import Any

import anyio
import mcp_types as types
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

warnings.simplefilter("ignore")  # resources/subscribe is deprecated in 2026-07-28: the legacy run uses it on purpose


async def on_elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"name": "ada"})


async def on_sample(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    asked = params.messages[0].content
    said = getattr(asked, "text", "")
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text=f"short {said}"), model="stub-model"
    )


async def on_roots(ctx: Any) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[types.Root(uri="file:///tmp/b"), types.Root(uri="file:///tmp/a")])


def text(found: types.CallToolResult) -> str:
    return str(getattr(found.content[0], "text", ""))


class Notifications:
    """Legacy notifications as they arrive, and a bounded wait for one of a kind."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.arrived = anyio.Event()

    async def __call__(self, message: Any) -> None:
        self.seen.append(message)
        self.arrived.set()
        self.arrived = anyio.Event()

    async def wait_for(self, kind: type) -> bool:
        with anyio.move_on_after(5):
            while not any(isinstance(getattr(m, "root", m), kind) for m in self.seen):
                await self.arrived.wait()
            return True
        return False


async def cancel_slow(client: Client) -> int:
    """Cancel a ``slow`` call once it has reported progress; how many cancellations the server counted."""
    started = anyio.Event()

    async def progress(value: float, total: float | None, message: str | None) -> None:
        started.set()

    async with anyio.create_task_group() as group:

        async def call() -> None:
            await client.call_tool("slow", {"steps": 100, "delay": 0.1}, progress_callback=progress)

        group.start_soon(call)
        with anyio.fail_after(10):
            await started.wait()
        group.cancel_scope.cancel()
    for _ in range(50):  # the server notices the cancellation asynchronously
        count = int(text(await client.call_tool("cancellations", {})))
        if count:
            return count
        await anyio.sleep(0.1)
    return 0


async def changes_modern(client: Client) -> dict[str, Any]:
    async with client.listen(tools_list_changed=True) as sub:
        grown = text(await client.call_tool("grow", {}))
        with anyio.fail_after(10):
            async for event in sub:
                tools_event = type(event).__name__
                break
    async with client.listen(resource_subscriptions=["test://counter"]) as sub:
        await client.call_tool("bump", {})
        with anyio.fail_after(10):
            async for event in sub:
                resource_event = [type(event).__name__, getattr(event, "uri", None)]
                break
    return {"grown": grown, "tools_event": tools_event, "resource_event": resource_event}


async def changes_legacy(client: Client, seen: Notifications) -> dict[str, Any]:
    grown = text(await client.call_tool("grow", {}))
    tools_event = "ToolListChangedNotification" if await seen.wait_for(types.ToolListChangedNotification) else None
    await client.subscribe_resource("test://counter")
    await client.call_tool("bump", {})
    updated = await seen.wait_for(types.ResourceUpdatedNotification)
    uris = [str(m.params.uri) for m in seen.seen if isinstance(m, types.ResourceUpdatedNotification)]
    return {
        "grown": grown,
        "tools_event": tools_event,
        "resource_event": ["ResourceUpdated", uris[0] if updated else None],
    }


async def main(mode: str, target: str) -> None:
    if target.startswith("http"):
        server: Any = target
    else:
        command, *args = shlex.split(target)
        server = StdioServerParameters(command=command, args=args)
    seen = Notifications()
    out: dict[str, Any] = {}
    with anyio.fail_after(60):
        async with Client(
            server,
            mode=mode,  # type: ignore[arg-type]
            elicitation_callback=on_elicit,
            sampling_callback=on_sample,
            list_roots_callback=on_roots,
            message_handler=seen,
            cache=None,
        ) as client:
            out["version"] = client.protocol_version
            out["tools"] = sorted(tool.name for tool in (await client.list_tools()).tools)
            out["add"] = text(await client.call_tool("add", {"a": 2, "b": 3}))
            out["echo"] = text(await client.call_tool("echo", {"text": "héllo"}))
            steps: list[float] = []

            async def progress(value: float, total: float | None, message: str | None) -> None:
                steps.append(value)

            out["slow"] = text(await client.call_tool("slow", {"steps": 3, "delay": 0.05}, progress_callback=progress))
            out["progress"] = steps
            out["cancelled"] = await cancel_slow(client)
            out["ask_name"] = text(await client.call_tool("ask_name", {}))
            out["summarize"] = text(await client.call_tool("summarize", {"text": "a long story"}))
            out["roots"] = text(await client.call_tool("roots", {}))
            read = await client.read_resource("test://counter")
            out["counter"] = getattr(read.contents[0], "text", None)
            prompt = await client.get_prompt("greeting", {"name": "ada", "style": "pirate"})
            out["prompt"] = getattr(prompt.messages[0].content, "text", None)
            done = await client.complete(
                types.PromptReference(type="ref/prompt", name="greeting"), {"name": "style", "value": "p"}
            )
            out["completion"] = done.completion.values
            out.update(await (changes_legacy(client, seen) if mode == "legacy" else changes_modern(client)))
            out["tools_after"] = sorted(tool.name for tool in (await client.list_tools()).tools)
    print(json.dumps(out))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
