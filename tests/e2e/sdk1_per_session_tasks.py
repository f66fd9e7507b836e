"""Two concurrent clients of the official Python SDK 1.x against a proxy whose
server-everything is per-session (run with the interpreter of a venv that has ``mcp<2``):
``python sdk1_per_session_tasks.py URL``. Client A starts its own connection and creates a
task on it; client B initializes once A's connection is up and lists tasks. Prints, as
JSON, what each was told in its initialize result and what its tasks/list returned."""

import json
import sys
from contextlib import AsyncExitStack

import anyio
from mcp import ClientSession, types
from mcp.client.streamable_http import streamablehttp_client


async def open_client(stack: AsyncExitStack, url: str) -> tuple[ClientSession, types.InitializeResult]:
    read, write, _ = await stack.enter_async_context(streamablehttp_client(url))
    session = await stack.enter_async_context(ClientSession(read, write))
    return session, await session.initialize()


async def list_tasks(session: ClientSession) -> list[str]:
    result = await session.send_request(types.ClientRequest(types.ListTasksRequest()), types.ListTasksResult)
    return [task.taskId for task in result.tasks]


async def main(url: str) -> None:
    seen: dict = {}
    with anyio.fail_after(60):
        async with AsyncExitStack() as stack:
            a, a_init = await open_client(stack, url)
            seen["a_instructions"] = a_init.instructions
            echoed = await a.call_tool("everything__echo", {"message": "start my own"})
            seen["a_echo"] = echoed.content[0].text
            created = await a.send_request(
                types.ClientRequest(
                    types.CallToolRequest(
                        params=types.CallToolRequestParams(
                            name="everything__simulate-research-query",
                            arguments={"topic": "owls"},
                            task=types.TaskMetadata(ttl=60000),
                        )
                    )
                ),
                types.CreateTaskResult,
            )
            seen["a_task"] = created.task.taskId
            b, b_init = await open_client(stack, url)
            seen["b_instructions"] = b_init.instructions
            seen["a_tasks"] = await list_tasks(a)
            seen["b_tasks"] = await list_tasks(b)
            await b.call_tool("everything__echo", {"message": "start mine too"})
            seen["b_tasks_own"] = await list_tasks(b)
            seen["a_tasks_after"] = await list_tasks(a)
    print(json.dumps(seen))


anyio.run(main, sys.argv[1])
