"""The official Python SDK 1.x (run with ``.venv-mcp1``) through a balancer in front of
replicas of the proxy, each in front of ``sdk1_asking_server.py`` (prefix ``asking``):
``python cluster_asking_client.py URL CALLS``. Calls ``asking__interview`` CALLS times; its
callbacks answer the server's elicitation, sampling and roots requests, each answer a POST
that the balancer may send to another replica than the call's. Prints JSON: what each call
returned and the ids the client was asked under. Every wait is bounded."""

import json
import sys

import anyio
from mcp import ClientSession, types
from mcp.client.streamable_http import streamablehttp_client
from pydantic import FileUrl

asked: list[object] = []


async def on_elicit(context, params: types.ElicitRequestParams) -> types.ElicitResult:
    asked.append(context.request_id)
    return types.ElicitResult(action="accept", content={"name": "ada"})


async def on_sample(context, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    asked.append(context.request_id)
    text = types.TextContent(type="text", text=params.messages[0].content.text.upper())
    return types.CreateMessageResult(role="assistant", content=text, model="test-model")


async def on_roots(context) -> types.ListRootsResult:
    asked.append(context.request_id)
    return types.ListRootsResult(roots=[types.Root(uri=FileUrl("file:///work/one"))])


async def main(url: str, calls: int) -> None:
    results = []
    with anyio.fail_after(60):
        async with (
            streamablehttp_client(url) as (read, write, _),
            ClientSession(
                read, write, sampling_callback=on_sample, elicitation_callback=on_elicit, list_roots_callback=on_roots
            ) as session,
        ):
            await session.initialize()
            for number in range(calls):
                result = await session.call_tool("asking__interview", {"topic": f"tea {number}"})
                results.append([result.isError, result.content[0].text])
    print(json.dumps({"results": results, "asked": asked}))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]))
