"""Drive the proxy's discovery modes with an official Python SDK client:
``python discovery_client.py MODE TARGET BIGFILE [REPO]``.

The SDK 2.x ``Client`` (MODE ``legacy`` or ``2026-07-28``; TARGET a URL or a command line
run over stdio), or with MODE ``ws`` or ``sse`` the SDK 1.x ``ClientSession`` over
WebSocket or the legacy HTTP+SSE transport (run it with the 1.x interpreter). The proxy must front the real servers of
``tests/real_servers.py``. Prints one JSON object with what each step saw; every wait is
bounded.
"""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any

import anyio


def texts(result: Any) -> list[str]:
    return [str(getattr(item, "text", "")) for item in result.content if getattr(item, "type", "") == "text"]


def structured(result: Any) -> Any:
    """``structuredContent`` (SDK 1.x) or ``structured_content`` (2.x)."""
    return getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)


def links(result: Any) -> list[str]:
    return [str(item.uri) for item in result.content if getattr(item, "type", "") == "resource_link"]


async def steps(client: Any, bigfile: str, repo: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    listed = [tool.name for tool in (await client.list_tools()).tools]
    out["tools"] = listed
    searching = listed == ["find_tools", "call_tool"]
    if searching:
        found = await client.call_tool("find_tools", {"query": "show the commit history of a repository"})
        out["found"] = [tool["name"] for tool in structured(found)["tools"]]
        out["found_text_is_json"] = json.loads(texts(found)[0]) == structured(found)
        time = await client.call_tool("find_tools", {"query": "what time is it in Tokyo", "limit": 2})
        out["found_time"] = [tool["name"] for tool in structured(time)["tools"]]
        wrapped = await client.call_tool("call_tool", {"name": "git__git_status", "arguments": {"repo_path": repo}})
        out["call_tool"] = texts(wrapped)
        try:
            unknown = await client.call_tool("call_tool", {"name": "nope__nothing", "arguments": {}})
            out["call_tool_unknown"] = ["result", texts(unknown)]
        except Exception as exc:  # noqa: BLE001 - the SDK raises a JSON-RPC error: what is recorded
            out["call_tool_unknown"] = ["error", str(exc)]
    direct = await client.call_tool("git__git_status", {"repo_path": repo})
    out["direct"] = texts(direct)
    read = await client.call_tool("filesystem__read_text_file", {"path": bigfile})
    out["read_texts"] = texts(read)
    out["read_links"] = links(read)
    pages = []
    uri = out["read_links"][0] if out["read_links"] else None
    for _ in range(200):  # bounded: each page names the next
        if uri is None:
            break
        contents = (await client.read_resource(uri)).contents
        text = str(getattr(contents[0], "text", ""))
        body, _, rest = text.partition("\n\n[aggregator: page ")
        pages.append(body)
        uri = rest.split("the next is ", 1)[1].rstrip("]") if rest else None
    out["pages"] = pages
    return out


async def run_sdk2(mode: str, target: str, bigfile: str, repo: str) -> dict[str, Any]:
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    if target.startswith("http"):
        server: Any = target
    else:
        command, *args = shlex.split(target)
        server = StdioServerParameters(command=command, args=args)
    async with Client(server, mode=mode, cache=None) as client:  # type: ignore[arg-type]
        return {"version": client.protocol_version, **await steps(client, bigfile, repo)}


async def run_sdk1(mode: str, target: str, bigfile: str, repo: str) -> dict[str, Any]:
    from mcp import ClientSession
    from mcp.client.sse import sse_client
    from mcp.client.websocket import websocket_client

    connect = websocket_client(target) if mode == "ws" else sse_client(target)
    async with connect as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        return {"version": init.protocolVersion, **await steps(session, bigfile, repo)}


async def main(mode: str, target: str, bigfile: str, repo: str) -> None:
    with anyio.fail_after(90):
        sdk1 = mode in ("ws", "sse")
        out = await (run_sdk1(mode, target, bigfile, repo) if sdk1 else run_sdk2(mode, target, bigfile, repo))
    print(json.dumps(out))


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:5])
