"""The official Python SDK 2.x client pinned to 2026-07-28, through the proxy, for the era matrix.

``python eras_modern_client.py FRONT TARGET SERVERS``: FRONT is ``stdio`` (TARGET: a config
path, the proxy started with this interpreter) or ``http`` (TARGET: the proxy's URL); SERVERS
is a JSON object of prefix -> kind (``modern_server``, ``everything``, ``time``, ``git``; git as
``["git", REPO]``). Runs every feature each server offers (``eras_steps.py``) and prints one JSON
object ``{"<prefix>.<feature>": what was seen}``; a step that failed is ``{"error": ...}``. Every
wait is bounded.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import mcp_types as types
from eras_steps import ANSWER_NAME, ROOTS, sample_text, steps_for
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters


async def on_elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"name": ANSWER_NAME})


async def on_sample(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    said = getattr(params.messages[0].content, "text", "")
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text=sample_text(said)), model="stub-model"
    )


async def on_roots(ctx: Any) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[types.Root(uri=uri) for uri in ROOTS])


def text(found: Any) -> str:
    return " ".join(str(getattr(c, "text", "")) for c in found.content)


class Modern:
    """The client operations the steps use, spoken with the 2.x ``Client``."""

    era = "modern"

    def __init__(self, client: Client, logs: list[Any]) -> None:
        self.client = client
        self.logs = logs

    async def tools(self) -> list[str]:
        return sorted(tool.name for tool in (await self.client.list_tools()).tools)

    async def call(self, name: str, arguments: dict[str, Any], progress: Any = None) -> str:
        found = await self.client.call_tool(name, arguments, progress_callback=progress)
        return ("ERROR " if found.is_error else "") + text(found)

    async def resources(self) -> list[str]:
        return [str(r.uri) for r in (await self.client.list_resources()).resources]

    async def read(self, uri: str) -> str:
        found = (await self.client.read_resource(uri)).contents[0]
        return str(getattr(found, "text", None) or getattr(found, "blob", ""))

    async def prompts(self) -> list[str]:
        return sorted(p.name for p in (await self.client.list_prompts()).prompts)

    async def prompt(self, name: str, arguments: dict[str, str]) -> str:
        found = await self.client.get_prompt(name, arguments)
        return str(getattr(found.messages[0].content, "text", ""))

    async def complete(self, prompt: str, argument: str, value: str) -> list[str]:
        done = await self.client.complete(
            types.PromptReference(type="ref/prompt", name=prompt), {"name": argument, "value": value}
        )
        return list(done.completion.values)

    async def cancel_call(self, name: str, arguments: dict[str, Any]) -> None:
        """Start a call, cancel it once it reported progress (the SDK tells the server)."""
        started = anyio.Event()

        async def progress(value: float, total: float | None, message: str | None) -> None:
            started.set()

        async with anyio.create_task_group() as group:

            async def call() -> None:
                await self.client.call_tool(name, arguments, progress_callback=progress)

            group.start_soon(call)
            with anyio.fail_after(10):
                await started.wait()
            group.cancel_scope.cancel()

    async def chatter(self, tool: str) -> dict[str, Any]:
        """Call ``tool`` (every request carries log level info): the levels of its log lines."""
        said = await self.call(tool, {})
        return {"result": said, "levels": [str(p.level) for p in self.logs if str(p.logger).endswith("chatter")]}

    async def list_changes(self, prefix: str, grow: str, bump: str, uri: str) -> dict[str, Any]:
        """A tools list change and a resource update, each seen on a ``subscriptions/listen``."""
        async with self.client.listen(tools_list_changed=True) as sub:
            grown = await self.call(grow, {})
            with anyio.fail_after(10):
                async for event in sub:
                    tools_event = type(event).__name__
                    break
        async with self.client.listen(resource_subscriptions=[uri]) as sub:
            await self.call(bump, {})
            with anyio.fail_after(10):
                async for event in sub:
                    resource_event = [type(event).__name__, str(getattr(event, "uri", None))]
                    break
        return {"grown": grown, "tools_event": tools_event, "resource_event": resource_event}


async def main(front: str, target: str, servers: dict[str, Any]) -> None:
    if front == "http":
        server: Any = target
    else:
        argv = ["-m", "aggregator", "serve", "--stdio", "--config", target, "--log-level", "info"]
        server = StdioServerParameters(command=sys.executable, args=argv)
    out: dict[str, Any] = {}
    logs: list[Any] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    with anyio.fail_after(80):
        async with Client(
            server,
            mode="2026-07-28",
            elicitation_callback=on_elicit,
            sampling_callback=on_sample,
            list_roots_callback=on_roots,
            logging_callback=on_log,
            log_level="info",  # stamped on every request: its own log lines at info and above
            cache=None,
        ) as client:
            out["version"] = client.protocol_version
            peer = Modern(client, logs)
            for prefix, kind in servers.items():
                for feature, step in steps_for(kind, prefix, "modern"):
                    try:
                        with anyio.fail_after(20):
                            out[f"{prefix}.{feature}"] = await step(peer)
                    except Exception as exc:  # noqa: BLE001 - recorded; the test says which step failed
                        out[f"{prefix}.{feature}"] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
