"""A dual-era MCP server built with the official Python SDK 2.x, for the end-to-end tests.

It serves 2026-07-28 (stateless: ``input_required`` results, ``subscriptions/listen``) and
2025-11-25 (``initialize``, server-to-client requests, ``resources/subscribe``) over stdio or
Streamable HTTP, with one of each thing a client does:

- ``add``, ``echo``: plain tools;
- ``slow``: reports progress once a step; a cancelled call is counted, ``cancellations`` tells;
- ``ask_name``, ``summarize``, ``roots``: need an elicitation, a sampling and the client's roots,
  asked through ``Resolve(...)`` (an ``input_required`` result for a modern caller, a
  server-to-client request for a legacy one);
- ``grow``: adds a tool and announces the changed list;
- ``test://counter``: a resource ``bump`` changes, announced to its subscribers;
- the prompt ``greeting`` (arguments ``name`` and ``style``), whose ``style`` completes.

Run: ``python tests/e2e/modern_server.py`` (stdio) or ``... http PORT`` (127.0.0.1:PORT/mcp).
With ``MODERN_SERVER_STATE_KEY`` set, its own ``requestState`` is sealed under that key, so
that several instances of it read each other's (else under a key of its own process).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import anyio
import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, ListRoots, Resolve, Sample
from mcp.server.request_state import RequestStateSecurity
from mcp_types.version import is_version_at_least
from pydantic import BaseModel

MODERN = "2026-07-28"
COUNTER = "test://counter"
STYLES = ("formal", "pirate", "plain")

STATE_KEY = os.environ.get("MODERN_SERVER_STATE_KEY")
app = MCPServer(
    "e2e-modern",
    version="1.0.0",
    request_state_security=RequestStateSecurity(keys=[STATE_KEY]) if STATE_KEY else None,
)
state: dict[str, Any] = {"cancelled": 0, "count": 0, "grown": 0, "watchers": set()}


def legacy(ctx: Context) -> bool:
    version = ctx.protocol_version
    return version is None or not is_version_at_least(version, MODERN)


@app.tool(description="Adds two integers.")
def add(a: int, b: int) -> int:
    return a + b


@app.tool(description="Returns its text.")
def echo(text: str) -> str:
    return text


@app.tool(description="Takes `steps` steps of `delay` seconds, reporting progress after each.")
async def slow(ctx: Context, steps: int = 5, delay: float = 0.1) -> str:
    try:
        for step in range(1, steps + 1):
            await anyio.sleep(delay)
            await ctx.report_progress(step, steps, f"step {step}")
    except anyio.get_cancelled_exc_class():
        state["cancelled"] += 1
        raise
    return f"done after {steps} steps"


@app.tool(description="How many calls of `slow` were cancelled.")
def cancellations() -> int:
    return int(state["cancelled"])


class Name(BaseModel):
    name: str


def ask_for_name() -> Elicit[Name]:
    return Elicit("What is your name?", Name)


@app.tool(description="Greets the user by the name it asks for.")
def ask_name(who: Annotated[Name, Resolve(ask_for_name)]) -> str:
    return f"hello {who.name}"


def ask_for_summary(text: str) -> Sample:
    message = types.SamplingMessage.model_validate({"role": "user", "content": {"type": "text", "text": text}})
    return Sample([message], max_tokens=50, system_prompt="Summarize in one line.")


@app.tool(description="Summarizes `text` with the client's model.")
def summarize(text: str, summary: Annotated[types.CreateMessageResult, Resolve(ask_for_summary)]) -> str:
    content = summary.content
    return f"summary: {getattr(content, 'text', '')}"


def ask_for_roots() -> ListRoots:
    return ListRoots()


@app.tool(description="Lists the client's roots.")
def roots(found: Annotated[types.ListRootsResult, Resolve(ask_for_roots)]) -> str:
    return "roots: " + ", ".join(sorted(str(root.uri) for root in found.roots))


@app.tool(description="Adds a tool `extra_N` and announces the changed tool list.")
async def grow(ctx: Context) -> str:
    state["grown"] += 1
    name = f"extra_{state['grown']}"
    app.add_tool(lambda: name, name=name, description="Added by grow.")
    await ctx.notify_tools_changed()  # modern listeners
    if legacy(ctx):
        await ctx.session.send_tool_list_changed()
    return name


@app.resource(COUNTER, name="counter", description="Counts bumps.", mime_type="text/plain")
def counter() -> str:
    return str(state["count"])


@app.tool(description="Changes test://counter and announces it to its subscribers.")
async def bump(ctx: Context) -> int:
    state["count"] += 1
    await ctx.notify_resource_updated(COUNTER)  # modern listeners
    for session in list(state["watchers"]):  # legacy subscribers
        try:
            await session.send_resource_updated(COUNTER)
        except Exception:  # noqa: BLE001 - a session that went away
            state["watchers"].discard(session)
    return int(state["count"])


async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
    if str(params.uri) == COUNTER:
        state["watchers"].add(ctx.session)
    return types.EmptyResult()


async def unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    state["watchers"].discard(ctx.session)
    return types.EmptyResult()


app._lowlevel_server.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribe)
app._lowlevel_server.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, unsubscribe)


@app.prompt(description="Greets `name` in a `style` (formal, pirate or plain).")
def greeting(name: str, style: str = "plain") -> str:
    if style == "pirate":
        return f"Ahoy, {name}!"
    return f"Good day, {name}." if style == "formal" else f"Hi {name}"


@app.completion()
async def complete(ref: Any, argument: types.CompletionArgument, context: Any) -> types.Completion:
    if isinstance(ref, types.PromptReference) and ref.name == "greeting" and argument.name == "style":
        values = [style for style in STYLES if style.startswith(argument.value)]
        return types.Completion(values=values, total=len(values), has_more=False)
    return types.Completion(values=[], total=0, has_more=False)


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run("stdio")
