"""JSON-RPC error codes and the one exception a peer's bad input raises.

`RemoteProtocolError` is "the peer sent something we cannot accept"; it carries the
JSON-RPC error to answer with (code, message, optional data) and the request id when it
could be read, so whoever catches it can answer without knowing what went wrong.
"""

from __future__ import annotations

from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# MCP: resource not found (2025-06-18 / 2025-11-25).
RESOURCE_NOT_FOUND = -32002


class RemoteProtocolError(Exception):
    """The peer sent a message we cannot accept; answer with `.code` / `.message`."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        id: Any = None,
        data: Any = None,
        answer: bool = True,
        kind: int | None = None,
        response_to: Any = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.id = id
        self.data = data
        # False for a well-formed JSON-RPC notification that MCP cannot accept (params as
        # an array): notifications are never answered, so it is dropped silently.
        self.answer = answer
        # What the message was meant to be (codec.REQUEST, NOTIFICATION or RESPONSE), when
        # its envelope could be read; for a response, the id of the request it answers
        # (never answered with: that id is the other side's): that request fails at once.
        self.kind = kind
        self.response_to = response_to

    def to_response(self) -> dict[str, Any]:
        return error_response(self.id, self.code, self.message, self.data)


def unknown_method(id: Any, method: str, why: str = "") -> dict[str, Any]:
    """The answer to a request for a method nobody serves: -32601, unless the method is a
    notification's (MCP names them all ``notifications/...``) sent with an id, which is an
    invalid request, not an unknown method (``why``: said after the method's name)."""
    if method.startswith("notifications/"):
        text = f"Invalid Request: {method} is a notification, sent as a request (with an id); send it without one"
        return error_response(id, INVALID_REQUEST, text)
    return error_response(id, METHOD_NOT_FOUND, f"Method not found: {method}{why}")


def error_response(id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": id, "error": error}
