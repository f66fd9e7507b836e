"""Several concurrent clients of the official Python SDK 1.x, each its own session, against
one proxy (run with the interpreter of a venv that has ``mcp<2``):

    python sdk1_many.py URL PLAN_JSON [PYTHON]

URL is the proxy's Streamable HTTP endpoint, ``sse:URL`` (its legacy HTTP+SSE endpoint),
``ws:URL`` (its WebSocket endpoint), or ``stdio:CONFIG`` (then one client only,
which starts ``PYTHON -m aggregator serve --stdio``). PLAN_JSON maps a label to a client's plan:
``roots`` (a list of file URIs; absent: the client declares no roots), ``level`` (sent
as logging/setLevel first), ``calls`` (a list of [tool, arguments], made in order; ["sleep", {"seconds": S}] pauses) and
``linger`` (seconds to stay connected after them), ``url`` (this client's own URL, for
clients of several fronts at once), ``start_delay`` (seconds to wait
after initializing before the first call). Every client runs at the same time;
each answers sampling with its own label (after ``answer_delay`` seconds, so the calls of
several clients overlap) and declines elicitations. Prints, per label, what it was asked,
the log lines, progress and list changes it got and the calls' results (text, or the error), as JSON.
"""

import json
import sys

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client
from mcp.client.websocket import websocket_client
from pydantic import AnyUrl


def connect(url: str):
    if url.startswith("stdio:"):
        return stdio_client(
            StdioServerParameters(
                command=sys.argv[3],
                args=[
                    "-m",
                    "aggregator",
                    "serve",
                    "--stdio",
                    "--config",
                    url[len("stdio:") :],
                    "--log-level",
                    "warning",
                ],
            )
        )
    if url.startswith("sse:"):
        return sse_client(url[len("sse:") :])
    if url.startswith("ws:"):
        return websocket_client(url[len("ws:") :])
    return streamablehttp_client(url)


async def run_client(url: str, label: str, plan: dict, seen: dict) -> None:
    record = seen[label] = {
        "sampling": [],
        "elicitation": [],
        "roots_asked": 0,
        "logs": [],
        "results": [],
        "progress": [],
        "list_changed": [],
    }
    delay = plan.get("answer_delay", 0.5)

    async def sampling(context, params: types.CreateMessageRequestParams):
        text = params.messages[0].content.text if params.messages else ""
        record["sampling"].append(text)
        await anyio.sleep(delay)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=label), model=label
        )

    async def elicitation(context, params):
        record["elicitation"].append(params.message)
        await anyio.sleep(delay)
        return types.ElicitResult(action="decline")

    async def roots(context):
        record["roots_asked"] += 1
        return types.ListRootsResult(roots=[types.Root(uri=AnyUrl(uri)) for uri in plan["roots"]])

    async def logging(params: types.LoggingMessageNotificationParams):
        record["logs"].append(params.data if isinstance(params.data, str) else json.dumps(params.data))

    async def notices(message) -> None:
        if isinstance(message, types.ServerNotification) and message.root.method.endswith("list_changed"):
            record["list_changed"].append(message.root.method)

    async with connect(url) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(
            read,
            write,
            sampling_callback=sampling,
            elicitation_callback=elicitation,
            list_roots_callback=roots if "roots" in plan else None,
            logging_callback=logging,
            message_handler=notices,
        ) as session:
            await session.initialize()
            if plan.get("level"):
                await session.set_logging_level(plan["level"])
            await anyio.sleep(plan.get("start_delay", 0))
            for name, arguments in plan.get("calls", []):
                if name == "sleep":  # a pause between calls, not a call
                    await anyio.sleep(arguments["seconds"])
                    continue
                try:

                    async def progress(done, total, message, name=name):
                        record["progress"].append([name, done, total])

                    result = await session.call_tool(name, arguments, progress_callback=progress)
                    text = " ".join(c.text for c in result.content if isinstance(c, types.TextContent))
                    record["results"].append({"error": result.isError, "text": text})
                except Exception as exc:  # noqa: BLE001 - the SDK raises McpError for a JSON-RPC error
                    record["results"].append({"error": True, "text": str(exc)})
            await anyio.sleep(plan.get("linger", 0))


async def main(url: str, plans: dict) -> None:
    seen: dict = {}
    with anyio.fail_after(90):
        async with anyio.create_task_group() as group:
            for label, plan in plans.items():
                group.start_soon(run_client, plan.get("url", url), label, plan, seen)
    print(json.dumps(seen))


anyio.run(main, sys.argv[1], json.loads(sys.argv[2]))
