"""What the proxy says itself: its own errors (invariant 6 of the router), results and
cancellations, and the reason a refused message gives. Sans-IO.

Pure functions over the wire types; may import only ``core.commands``,
``aggregator.mcp`` and ``aggregator.jsonrpc``.
"""

from __future__ import annotations

from typing import Any

from aggregator.core.commands import ToClient
from aggregator.jsonrpc.errors import INTERNAL_ERROR, RemoteProtocolError, error_response
from aggregator.mcp.constants import CANCELLED


def proxy_error(
    id: Any, message: str, *, reason: str, server: str | None = None, code: int = INTERNAL_ERROR
) -> dict[str, Any]:
    """An error the proxy makes itself (invariant 6): ``data.source`` says so."""
    data: dict[str, Any] = {"source": "aggregator", "reason": reason}
    if server is not None:
        data["server"] = server
    return error_response(id, code, message, data)


def refusal_reason(exc: RemoteProtocolError) -> str:
    """The reason a refused message gives the party waiting for it: ``too_large`` past a
    limit (depth), ``malformed`` for what could not be read."""
    data = exc.data
    return data["reason"] if type(data) is dict and "reason" in data else "malformed"


def answer(session: int, id: Any, result: dict[str, Any]) -> ToClient:
    """A result for client ``session``'s request ``id``."""
    return ToClient(session, {"jsonrpc": "2.0", "id": id, "result": result})


def cancelled(upstream_id: int | str, reason: str) -> dict[str, Any]:
    """The notification that tells a server the proxy gave up on its request."""
    return {
        "jsonrpc": "2.0",
        "method": CANCELLED,
        "params": {"requestId": upstream_id, "reason": reason},
    }
