"""A modern (2026-07-28) server that asks its caller for input, built with the official
Python SDK 2.x ``MCPServer``: ``python modern_asking_server.py`` serves stdio,
``python modern_asking_server.py http PORT`` Streamable HTTP on 127.0.0.1:PORT (``/mcp``).

Each tool takes what it needs through ``Resolve(...)``: to a modern caller that is an
``input_required`` result and a retry (what the proxy's bridge turns into server-to-client
requests for a legacy client). ``name`` elicits a name, ``summarize`` samples the
client's model, ``roots`` lists the client's roots, ``both`` asks for a name and a
summary at once (two inputRequests in one round), ``twice`` asks for a name, then, on the
retry, for a second one (two rounds), ``steps`` asks for a name, then (on the retry)
reports progress twice before it answers."""

from __future__ import annotations

import sys
from typing import Annotated

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, ListRoots, Resolve, Sample
from pydantic import BaseModel

app = MCPServer("modern-asking")


class Name(BaseModel):
    name: str


def ask_name() -> Elicit[Name]:
    return Elicit("Your name?", Name)


def ask_other(first: Annotated[Name, Resolve(ask_name)]) -> Elicit[Name]:
    return Elicit(f"Who else, {first.name}?", Name)


def ask_summary(text: str) -> Sample:
    message = types.SamplingMessage.model_validate({"role": "user", "content": {"type": "text", "text": text}})
    return Sample([message], max_tokens=20)


def ask_roots() -> ListRoots:
    return ListRoots()


@app.tool()
def name(who: Annotated[Name, Resolve(ask_name)]) -> str:
    return f"hello {who.name}"


@app.tool()
def summarize(text: str, summary: Annotated[types.CreateMessageResult, Resolve(ask_summary)]) -> str:
    return f"summary: {getattr(summary.content, 'text', '')}"


@app.tool()
def roots(found: Annotated[types.ListRootsResult, Resolve(ask_roots)]) -> str:
    return "roots: " + ", ".join(sorted(str(root.uri) for root in found.roots))


@app.tool()
def both(
    text: str,
    who: Annotated[Name, Resolve(ask_name)],
    summary: Annotated[types.CreateMessageResult, Resolve(ask_summary)],
) -> str:
    return f"{who.name}: {getattr(summary.content, 'text', '')}"


@app.tool()
def twice(who: Annotated[Name, Resolve(ask_name)], other: Annotated[Name, Resolve(ask_other)]) -> str:
    return f"{who.name} and {other.name}"


@app.tool()
async def steps(who: Annotated[Name, Resolve(ask_name)], ctx: Context) -> str:
    for step in (1, 2):
        await ctx.report_progress(step, 2)
    return f"{who.name} after 2 steps"


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run("stdio")
