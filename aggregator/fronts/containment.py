"""The boundary every task a listener starts runs inside: catch, log, answer, close one thing.

A bug or an input nobody foresaw in one connection, request or session must end that one
thing, never the process and never another party. So each task a front starts (a
connection, a request, a stream, a timer of its own) catches any ``Exception`` at its top,
logs it once at ERROR with the traceback (for the operator; never to the client), answers
what can still be answered with a JSON-RPC internal error that carries no detail, and
closes only what it owns. Cancellation (a ``BaseException``) passes through untouched.

This module holds the pieces the fronts share; each front places its own boundary, as
only it knows what "its own thing" is and how to answer on its wire.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from aggregator.jsonrpc.codec import dumps
from aggregator.jsonrpc.errors import INTERNAL_ERROR, error_response
from aggregator.transports.http_server import HttpConnection

log = logging.getLogger(__name__)

INTERNAL_MESSAGE = "Internal error: the aggregator failed while handling this message; its log has the details"


def readable_id(raw: bytes | None) -> Any:
    """The id of the request in ``raw``, if one can be read; else None (JSON-RPC's null id)."""
    if not raw:
        return None
    try:
        message = orjson.loads(raw)
    except ValueError:  # orjson.JSONDecodeError, and anything else it cannot read
        return None
    if type(message) is not dict or "method" not in message:
        return None
    id = message.get("id")
    return id if type(id) is str or type(id) is int else None


def internal_error(raw: bytes | None = None) -> dict[str, Any]:
    """The answer to a message whose handling failed: -32603, its id when readable, no detail."""
    return error_response(
        readable_id(raw), INTERNAL_ERROR, INTERNAL_MESSAGE, {"source": "aggregator", "reason": "internal"}
    )


async def contained(what: str, function: Callable[..., Awaitable[Any]], *args: Any) -> None:
    """Run a background task of a front; if it fails, log it and end just that task."""
    try:
        await function(*args)
    except Exception:
        log.exception("%s failed; ended it alone", what)


async def connection_failed(connection: HttpConnection, label: str, logger: logging.Logger) -> None:
    """The boundary of one HTTP connection, called in the ``except Exception`` block around
    ``connection.serve`` (placed by the listener, so that a request's way runs through no
    frame of this module): the failure is logged once (``label`` names the listener),
    answered 500 with a detail-free JSON-RPC internal error if no response had started, and
    ends this connection only. The caller closes it."""
    request = connection.current
    # The path without its query: a query may hold what must not be logged (a code, a token).
    where = f"{request.method} {request.path.partition('?')[0][:100]}" if request is not None else "reading a request"
    logger.exception("%s: internal error in %s; closing this connection only", label, where)
    if request is not None and connection.response_pending():
        headers = [("content-type", "application/json"), ("connection", "close")]
        await connection.respond(500, headers, dumps(internal_error(request.body)))
