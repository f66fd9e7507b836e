"""Bytes -> classified JSON-RPC messages, and the public face of the JSON codec. Sans-IO.

Classification is by key presence, as JSON-RPC defines it: ``method`` + ``id`` is a
request, ``method`` alone a notification, ``id`` + ``result`` / ``error`` a response.
Ids are strings or integers; booleans, floats, null, objects and arrays are refused.

The work is split by job: ``reading`` turns bytes into values (depth limit, exact
numbers), ``writing`` turns values into bytes, ``refusals`` builds the error for a
message refused. This module classifies, and re-exports what callers import from it
(the functions themselves, not wrappers: nothing is added per message).
"""

from __future__ import annotations

from typing import Any

import orjson

from aggregator.jsonrpc.errors import INVALID_REQUEST, RemoteProtocolError
from aggregator.jsonrpc.kinds import ERROR, NOTIFICATION, REQUEST, RESPONSE
from aggregator.jsonrpc.reading import (
    DEFAULT_MAX_DEPTH,
    MAX_DEPTH_LIMIT,
    JsonNumber,
    NestingTooDeep,
    loads,
)
from aggregator.jsonrpc.refusals import MISSING, refusal, too_deep, unreadable
from aggregator.jsonrpc.writing import dumps

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "ERROR",
    "MAX_DEPTH_LIMIT",
    "NOTIFICATION",
    "REQUEST",
    "RESPONSE",
    "JsonNumber",
    "NestingTooDeep",
    "decode_message",
    "dumps",
    "loads",
    "nameless_refusal",
]


def decode_message(raw: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> tuple[int, dict[str, Any]]:
    """Parse and classify one JSON-RPC message.

    Returns ``(kind, message)``. Raises RemoteProtocolError carrying the error to answer
    with; its ``id`` is the message's id when that could be read, else None, and its
    ``kind`` what the message is meant to be, when that could be read.
    """
    try:
        message = loads(raw, max_depth)
    except NestingTooDeep as exc:
        raise too_deep(exc, raw) from None
    except (ValueError, RecursionError) as exc:
        raise unreadable(raw, exc) from None
    if type(message) is not dict:
        if type(message) is list:
            raise RemoteProtocolError(INVALID_REQUEST, "Invalid request: batches (JSON arrays) are not supported")
        raise RemoteProtocolError(INVALID_REQUEST, "Invalid request: expected a JSON object")
    get = message.get
    id = get("id", MISSING)
    method = get("method", MISSING)
    # The common cases first, with as few lookups as possible: this runs on every message.
    if get("jsonrpc") == "2.0":
        if type(method) is str:
            params = get("params")
            if params is None or type(params) is dict:
                if id is MISSING:
                    return NOTIFICATION, message
                if type(id) is int or type(id) is str:
                    return REQUEST, message
        elif method is MISSING and id is not MISSING:
            id_type = type(id)
            if "result" in message:
                if "error" not in message and (id_type is int or id_type is str):
                    return RESPONSE, message
            elif id_type is int or id_type is str or id is None:  # null: answers the unreadable
                error = get("error")
                if type(error) is dict and type(error.get("code")) is int:
                    return ERROR, message
    raise refusal(message, id, method)


def nameless_refusal(raw: bytes) -> RemoteProtocolError | None:
    """The refusal of a message that names no party: unreadable, and neither its id nor
    its being a request or a notification could be read (``\\xff\\xfe{"js``, a JSON array).

    For a transport that knows which request a message answers (the body or event stream
    of an HTTP POST): such a message answers that request, which fails with this refusal.
    None for anything the router reads, or refuses naming whom it answers. Costs one
    C-level parse for a readable message.
    """
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    else:
        if type(value) is dict and ("id" in value or "method" in value):
            return None
    try:
        decode_message(raw)
    except RemoteProtocolError as exc:
        if exc.kind is None and exc.id is None or exc.kind == RESPONSE and exc.response_to is None:
            return exc
    return None
