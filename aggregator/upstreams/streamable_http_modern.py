"""Reading what comes back on a POST to a modern (2026-07-28) Streamable HTTP server.

A request carrying modern ``_meta`` (the lifecycle found a modern server, or probes with
``server/discover``) is posted statelessly: no session id, the modern headers
(``upstreams.modern_headers``), no GET stream. Its answer comes as JSON or on an event
stream (request-related notifications first). A 4xx with a JSON-RPC error in its body is
that request's answer (how a modern server refuses, and how the ``server/discover`` probe
tells the eras apart); any other status fails it with "unavailable". A modern response
stream cannot be resumed: one that breaks or closes before its answer fails the request
with "unavailable", and the request is not re-issued (the proxy cannot know whether a
call is safe to repeat; its caller may retry). ``tools/list`` pages are read for their
``x-mcp-header`` annotations on the way, and their invalid tools dropped.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import httpx

from aggregator.jsonrpc.codec import dumps, loads
from aggregator.transports.sse import SseParser
from aggregator.upstreams.modern_headers import ToolHeaders
from aggregator.upstreams.network_link import NetworkLink
from aggregator.upstreams.resumption import is_answer

log = logging.getLogger(__name__)


class _Connection(Protocol):
    """What of a Streamable HTTP connection reading a modern POST uses."""

    config: Any
    limit: int
    link: NetworkLink
    tools: ToolHeaders

    async def answer_failed(self, message: Any, reason: str) -> None: ...

    async def unresumable(self, request: dict[str, Any], problem: str) -> None: ...


async def read_modern(conn: _Connection, response: Any, request: Any) -> None:
    """Read what came back on a modern POST: its answer (JSON or an event stream), or
    the JSON-RPC error of a 4xx, which answers it too."""
    status = response.status_code
    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if status == 202:  # for a notification or an answer; a request must be answered
        await conn.link.no_answer(request, "HTTP 202 Accepted, with no answer")
        return
    if status != 200:
        await answer_refusal(conn, response, request)
        return
    if kind != "text/event-stream":
        await _deliver(conn, await response.aread(), request, body=True)
        return
    parser = SseParser(conn.limit)
    answered = False
    try:
        async for chunk in response.aiter_bytes():
            for event in parser.feed(chunk):
                if event.event == "message" and event.data:
                    answered = answered or is_answer(event.data)
                    await _deliver(conn, event.data, request)
    except httpx.HTTPError as exc:
        if answered:
            return
        await conn.unresumable(request, f"its response stream broke ({conn.link.describe(exc)})")
        return
    if not answered:
        await conn.unresumable(request, "it closed the response stream before the answer")


async def answer_refusal(conn: _Connection, response: Any, request: Any) -> str | None:
    """A POST answered with an HTTP error: a 4xx with a JSON-RPC error in its body is the
    answer to the request it carried (``request``, if it is one: a refused ``initialize``
    is then named by the server's own words); else the request fails with "unavailable".
    What failed it, or None when the server's error answered it."""
    status = response.status_code
    body = (await response.aread())[: conn.limit]
    error = _error_of(body) if 400 <= status < 500 and type(request) is dict and "id" in request else None
    if error is not None:
        await conn.link.deliver(dumps({"jsonrpc": "2.0", "id": request["id"], "error": error}), request)
        return None
    text = body[:300].decode("utf-8", "replace")
    log.warning("server %s: HTTP %d for a POST: %s", conn.config.name, status, conn.link.mask(text))
    await conn.answer_failed(request, f"HTTP {status}")
    return f"HTTP {status}"


async def _deliver(conn: _Connection, data: bytes | str, request: dict[str, Any], *, body: bool = False) -> None:
    """Deliver one message of a modern POST (``body``: its whole JSON body); a
    ``tools/list`` page's annotations are learnt on the way (and its invalid tools dropped)."""
    if request.get("method") == "tools/list" and (
        "x-mcp-header" in data if type(data) is str else b"x-mcp-header" in data
    ):
        try:
            message = loads(data.encode() if isinstance(data, str) else data)
        except ValueError:
            message = None
        result = message.get("result") if type(message) is dict else None
        if type(result) is dict and conn.tools.listed(result):
            data = dumps(message)
    if body:
        await conn.link.deliver_body(data.encode() if isinstance(data, str) else data, request)
    else:
        await conn.link.deliver(data, request)


def _error_of(body: bytes) -> dict[str, Any] | None:
    """The JSON-RPC error object of a refusal's body, or None when it has none."""
    try:
        message = loads(body)
    except ValueError:
        return None
    error = message.get("error") if type(message) is dict else None
    return error if type(error) is dict and type(error.get("code")) is int else None
