"""The refusals every part of the HTTP front answers with: an error with its status, a 503
when no session or request is admitted, and the 405 of a GET or DELETE that names no session.

Owns nothing: each is a function of the connection and what to say. Imports no other module
of the HTTP front.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aggregator.core.router import proxy_error
from aggregator.fronts.http.queue import JSON
from aggregator.hub.caps import Refusal
from aggregator.jsonrpc.codec import dumps
from aggregator.jsonrpc.errors import INVALID_REQUEST, error_response
from aggregator.transports.http_server import HttpConnection, Request


async def reject(
    connection: HttpConnection,
    status: int,
    code: int,
    message: str,
    id: Any = None,
    headers: Sequence[tuple[str, str]] = (),
) -> None:
    await connection.respond(status, [JSON, *headers], dumps(error_response(id, code, message)))


async def refuse_session(connection: HttpConnection, refusal: Refusal, id: Any = None) -> None:
    """503: the session cap is reached, or the aggregator is shutting down."""
    headers = [JSON] if refusal.retry_after is None else [JSON, ("retry-after", str(refusal.retry_after))]
    await connection.respond(503, headers, dumps(proxy_error(id, refusal.message, reason=refusal.reason)))


async def no_session(connection: HttpConnection, request: Request) -> None:
    """405 to a GET or DELETE without Mcp-Session-Id: a modern client has no session, a
    legacy one names its own."""
    await connection.respond(
        405,
        [("allow", "POST"), JSON],
        dumps(
            {
                "jsonrpc": "2.0",
                "id": None,
                "error": {
                    "code": INVALID_REQUEST,
                    "message": f"Method not allowed: {request.method} needs the Mcp-Session-Id of a session "
                    "(2025-11-25 and earlier); a 2026-07-28 client sends each request as a POST",
                },
            }
        ),
    )
