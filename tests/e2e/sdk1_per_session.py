"""Two concurrent clients of the official Python SDK 1.x against a proxy whose server is
per-session (run with the interpreter of a venv that has ``mcp<2``):
``python sdk1_per_session.py URL PROXY_LOG``. Client B starts its own connection first,
then client A makes a resource on its own server, subscribes and asks for updates, and
leaves. Prints what each client saw, as JSON, for the test to judge."""

import base64
import gzip
import inspect
import json
import os
import re
import sys
from contextlib import AsyncExitStack

import anyio
from mcp import ClientSession, types
from mcp.client.streamable_http import streamablehttp_client

TEXT = "notes that only client A made\n" * 20


async def wait_for(what, seconds: float = 15.0) -> bool:
    """Poll ``what()`` (sync or async; bounded in time) until it is true."""
    with anyio.move_on_after(seconds):
        while True:
            result = what()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return True
            await anyio.sleep(0.05)
    return False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def main(url: str, log_path: str) -> None:
    seen: dict[str, list[dict]] = {"A": [], "B": []}

    def recorder(who: str):
        async def handle(message) -> None:
            if isinstance(message, types.ServerNotification):
                params = message.root.params
                seen[who].append(
                    {
                        "method": message.root.method,
                        "params": params.model_dump(mode="json") if params is not None else None,
                    }
                )

        return handle

    def methods(who: str) -> list[str]:
        return [note["method"] for note in seen[who]]

    async def open_client(stack: AsyncExitStack, who: str) -> ClientSession:
        read, write, _ = await stack.enter_async_context(streamablehttp_client(url))
        session = await stack.enter_async_context(ClientSession(read, write, message_handler=recorder(who)))
        await session.initialize()
        return session

    out: dict = {}
    async with AsyncExitStack() as stack_b, AsyncExitStack() as stack_a:  # A can leave first
        b = await open_client(stack_b, "B")
        a = await open_client(stack_a, "A")

        async def tools(session: ClientSession) -> list[str]:
            return [tool.name for tool in (await session.list_tools()).tools]

        async def resources(session: ClientSession) -> list[str]:
            return [str(resource.uri) for resource in (await session.list_resources()).resources]

        # Before its own connection exists a session sees the shared listing, which was made
        # by a connection that declared sampling: so it lists trigger-sampling-request.
        out["b_tools_before"] = await tools(b)
        await b.call_tool("everything__echo", {"message": "b"})

        # B's own server (B declared no sampling) has no such tool: B switches to its listing.
        async def b_switched() -> bool:
            return "everything__trigger-sampling-request" not in await tools(b)

        out["b_switched"] = await wait_for(b_switched)
        out["b_told_tools_changed"] = await wait_for(lambda: "notifications/tools/list_changed" in methods("B"))
        out["b_notes_from_its_switch"] = methods("B")
        seen["B"].clear()

        # A makes a resource on its own server.
        out["a_resources_before"] = await resources(a)
        data = "data:text/plain;base64," + base64.b64encode(TEXT.encode()).decode()
        made = await a.call_tool(
            "everything__gzip-file-as-resource", {"name": "a-notes.txt.gz", "data": data, "outputType": "resourceLink"}
        )
        out["a_made"] = made.model_dump(mode="json")["content"]
        link = str(made.content[0].uri)
        out["a_told_resources_changed"] = await wait_for(lambda: "notifications/resources/list_changed" in methods("A"))
        out["a_resources_after"] = await resources(a)
        read = await a.read_resource(link)
        out["a_read_back"] = gzip.decompress(base64.b64decode(read.contents[0].blob)).decode()
        out["b_resources"] = await resources(b)
        try:
            await b.read_resource(link)
            out["b_read"] = "read"
        except Exception as exc:  # noqa: BLE001 - the SDK raises McpError
            out["b_read"] = f"error: {exc}"

        # Both subscribe to one document, each on its own connection; only A's server is
        # asked to send updates.
        document = next(uri for uri in out["a_resources_after"] if "/static/document/" in uri)
        out["document"] = document
        await b.subscribe_resource(document)
        await a.subscribe_resource(document)
        await a.call_tool("everything__toggle-subscriber-updates", {})

        def updates(who: str) -> list[str]:
            return [note["params"]["uri"] for note in seen[who] if note["method"] == "notifications/resources/updated"]

        out["a_updated"] = await wait_for(lambda: document in updates("A"))
        await anyio.sleep(1.0)  # time for anything misrouted to reach B too
        out["a_updates"] = updates("A")
        out["b_notes_while_a_worked"] = seen["B"][:]

        # A leaves: its own server process ends; B's goes on.
        started = re.findall(r"server everything@(\d+): started pid (\d+)", await anyio.Path(log_path).read_text())
        out["own_connections"] = started
        (_, b_pid), (_, a_pid) = started[:2]
        await stack_a.aclose()
        out["a_process_gone"] = await wait_for(lambda: not alive(int(a_pid)))
        out["b_process_alive"] = alive(int(b_pid))
        echo = await b.call_tool("everything__echo", {"message": "still here"})
        out["b_echo_after"] = echo.content[0].text
        out["b_resources_after"] = await resources(b)
    print(json.dumps(out))


anyio.run(main, sys.argv[1], sys.argv[2])
