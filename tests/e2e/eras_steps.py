"""The era matrix's steps, shared by its two client drivers (SDK 2.x and SDK 1.x: no SDK import here).

``steps_for(kind, prefix, era)`` lists ``(feature, step)`` for one server behind the proxy; a step
takes the driver's peer (``tools``, ``call``, ``resources``, ``read``, ``prompts``, ``prompt``,
``complete``, ``cancel_call``, ``list_changes``, ``chatter``, and ``logs`` for a legacy peer) and returns what
it saw, for tests/e2e/test_eras_matrix.py to judge. A feature a server lacks has no step.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

ANSWER_NAME = "ada"
ROOTS = ("file:///tmp/matrix-b", "file:///tmp/matrix-a")
Step = Callable[[Any], Awaitable[Any]]


def sample_text(asked: str) -> str:
    return f"short {asked}"


def modern_server(p: str, era: str) -> list[tuple[str, Step]]:
    """tests/e2e/modern_server.py (either era upstream)."""

    async def tools(peer: Any) -> Any:
        return {"listed": await peer.tools(), "add": await peer.call(f"{p}__add", {"a": 2, "b": 3})}

    async def resources(peer: Any) -> Any:
        listed = await peer.resources()
        return {"listed": listed, "read": await peer.read(f"{p}+test://counter")}

    async def prompts(peer: Any) -> Any:
        listed = await peer.prompts()
        got = await peer.prompt(f"{p}__greeting", {"name": "ada", "style": "pirate"})
        return {"listed": listed, "get": got, "complete": await peer.complete(f"{p}__greeting", "style", "pi")}

    async def progress(peer: Any) -> Any:
        seen: list[float] = []

        async def record(value: float, total: float | None, message: str | None) -> None:
            seen.append(value)

        said = await peer.call(f"{p}__slow", {"steps": 3, "delay": 0.05}, record)
        return {"result": said, "progress": seen}

    async def cancellation(peer: Any) -> Any:
        before = int(await peer.call(f"{p}__cancellations", {}))
        await peer.cancel_call(f"{p}__slow", {"steps": 100, "delay": 0.1})
        for _ in range(50):  # the server counts the cancellation asynchronously
            count = int(await peer.call(f"{p}__cancellations", {}))
            if count > before:
                return count - before
            await anyio.sleep(0.1)
        return 0

    async def sampling(peer: Any) -> Any:
        return await peer.call(f"{p}__summarize", {"text": "a long story"})

    async def elicitation(peer: Any) -> Any:
        return await peer.call(f"{p}__ask_name", {})

    async def roots(peer: Any) -> Any:
        return await peer.call(f"{p}__roots", {})

    async def list_changes(peer: Any) -> Any:
        seen = await peer.list_changes(p, f"{p}__grow", f"{p}__bump", f"{p}+test://counter")
        return {**seen, "tools_after": await peer.tools()}

    return [
        ("tools", tools),
        ("resources", resources),
        ("prompts", prompts),
        ("progress", progress),
        ("cancellation", cancellation),
        ("sampling", sampling),
        ("elicitation", elicitation),
        ("roots", roots),
        ("list_changes", list_changes),
    ]


def everything(p: str, era: str) -> list[tuple[str, Step]]:
    """@modelcontextprotocol/server-everything (TS SDK, legacy)."""

    async def tools(peer: Any) -> Any:
        return {"listed": await peer.tools(), "echo": await peer.call(f"{p}__echo", {"message": "hi"})}

    async def resources(peer: Any) -> Any:
        listed = await peer.resources()
        first = next(uri for uri in listed if "static/document" in uri)
        return {"listed": listed, "first": first, "read": await peer.read(first)}

    async def prompts(peer: Any) -> Any:
        return {"listed": await peer.prompts(), "get": await peer.prompt(f"{p}__simple-prompt", {})}

    async def progress(peer: Any) -> Any:
        seen: list[float] = []

        async def record(value: float, total: float | None, message: str | None) -> None:
            seen.append(value)

        said = await peer.call(f"{p}__trigger-long-running-operation", {"duration": 0.3, "steps": 3}, record)
        return {"result": said, "progress": seen}

    async def sampling(peer: Any) -> Any:
        return await peer.call(f"{p}__trigger-sampling-request", {"prompt": "two plus two", "maxTokens": 20})

    async def elicitation(peer: Any) -> Any:
        return await peer.call(f"{p}__trigger-elicitation-request", {})

    async def roots(peer: Any) -> Any:
        return await peer.call(f"{p}__get-roots-list", {})

    async def logging(peer: Any) -> Any:
        return await peer.logs(f"{p}__toggle-simulated-logging")

    steps = [
        ("tools", tools),
        ("resources", resources),
        ("prompts", prompts),
        ("progress", progress),
        ("sampling", sampling),
        ("elicitation", elicitation),
        ("roots", roots),
    ]
    return steps + ([("logging", logging)] if era == "legacy" else [])


def time_server(p: str, era: str) -> list[tuple[str, Step]]:
    """mcp-server-time: tools only."""

    async def tools(peer: Any) -> Any:
        return {"listed": await peer.tools(), "now": await peer.call(f"{p}__get_current_time", {"timezone": "UTC"})}

    return [("tools", tools)]


def git_server(p: str, era: str, repo: str) -> list[tuple[str, Step]]:
    """mcp-server-git: tools only."""

    async def tools(peer: Any) -> Any:
        return {"listed": await peer.tools(), "status": await peer.call(f"{p}__git_status", {"repo_path": repo})}

    return [("tools", tools)]


def logging_server(p: str, era: str) -> list[tuple[str, Step]]:
    """tests/e2e/eras_logging_server.py: a tool that logs at debug, info and warning."""

    async def logging(peer: Any) -> Any:
        return await peer.chatter(f"{p}__chatter")

    return [("logging", logging)]


def steps_for(kind: Any, prefix: str, era: str) -> list[tuple[str, Step]]:
    if kind == "logging":
        return logging_server(prefix, era)
    if kind == "modern_server":
        return modern_server(prefix, era)
    if kind == "everything":
        return everything(prefix, era)
    if kind == "time":
        return time_server(prefix, era)
    if isinstance(kind, list) and kind[0] == "git":
        return git_server(prefix, era, kind[1])
    raise ValueError(f"unknown server kind {kind!r}")
