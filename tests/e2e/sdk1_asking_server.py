"""A legacy (2025) server built with the official Python SDK 1.x that asks its client for
input in the middle of a call (run with the interpreter of a venv that has ``mcp<2``):
``python sdk1_asking_server.py`` (stdio) or ``python sdk1_asking_server.py PORT``
(Streamable HTTP on 127.0.0.1:PORT/mcp).

Its tool ``interview`` {topic} elicits a name (form mode), samples a line about
``topic``, then asks for the client's roots, each a server-to-client request related to
the call, and answers with what it got: ``name=...; sampled=...; roots=...``.
"""

import sys

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import SamplingMessage, TextContent
from pydantic import BaseModel

HTTP = len(sys.argv) > 1
server = FastMCP("sdk1-asking", host="127.0.0.1", port=int(sys.argv[1]) if HTTP else 8000, log_level="WARNING")


class Name(BaseModel):
    name: str


@server.tool()
async def interview(topic: str, ctx: Context) -> str:
    answer = await ctx.elicit("Your name?", schema=Name)
    name = answer.data.name if answer.action == "accept" else answer.action
    message = SamplingMessage(role="user", content=TextContent(type="text", text=f"say something about {topic}"))
    sampled = await ctx.session.create_message(messages=[message], max_tokens=20, related_request_id=ctx.request_id)
    text = sampled.content.text if isinstance(sampled.content, TextContent) else "?"
    roots = await ctx.session.list_roots()
    return f"name={name}; sampled={text}; roots={','.join(str(r.uri) for r in roots.roots)}"


server.run(transport="streamable-http" if HTTP else "stdio")
