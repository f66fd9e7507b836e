"""Errors for refused JSON-RPC messages: what exactly is wrong, and whom the error answers. Sans-IO.

A message refused for its content (too deep, unreadable) still has its envelope read when
it can be, so the error names the request it answers and says what the message was: by
a lenient parse, and where no parser can read it (past orjson's 1024 levels or Python's
stack, cut short, invalid bytes) by ``salvage_envelope``, a bounded scan of its first
bytes for the message's own ``"id"`` and ``"method"`` keys. Both run only for a message
already refused, so they cost nothing to the messages that pass.
"""

from __future__ import annotations

import json
import re
from typing import Any

from aggregator.jsonrpc.errors import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, RemoteProtocolError
from aggregator.jsonrpc.kinds import NOTIFICATION, REQUEST, RESPONSE
from aggregator.jsonrpc.reading import _INT_DIGITS, JsonNumber, NestingTooDeep
from aggregator.jsonrpc.salvage import salvage_envelope

# A key that is absent (None is a value: an id may be null).
MISSING = object()
_LENIENT_LIMIT = 1 << 20


def envelope(message: Any) -> tuple[int | None, Any]:
    """What a message refused for its content is meant to be, and its id if readable:
    (REQUEST, NOTIFICATION, RESPONSE or None, the id or None)."""
    if type(message) is not dict:
        return None, None
    id = message.get("id", MISSING)
    method = message.get("method", MISSING)
    readable = id if type(id) is int or type(id) is str else None
    if type(method) is str:
        return (NOTIFICATION, None) if id is MISSING else (REQUEST, readable)
    if method is MISSING and id is not MISSING:
        return RESPONSE, readable
    return None, readable


def too_deep(exc: NestingTooDeep, raw: bytes) -> RemoteProtocolError:
    # No value when no parser could read that deep: the envelope is salvaged from the text.
    kind, id = envelope(exc.value) if exc.value is not None else salvage_envelope(raw)
    return RemoteProtocolError(
        INVALID_REQUEST,
        f"Invalid request: JSON nested deeper than {exc.limit} levels",
        data={"source": "aggregator", "reason": "too_large", "max_depth": exc.limit},
        **_who(kind, id),
    )


def oversized(head: bytes, size: int, limit: int, tail: bytes = b"") -> RemoteProtocolError:
    """A message over the size limit, of which only ``head`` and ``tail`` (its first and last
    bytes) were kept: answered under its id when either shows it, as any other refused
    request. An id the message ends with (``..., "id": 7}``) is the message's own: its
    closing brace follows."""
    kind, id = salvage_envelope(head, whole=False)
    last = _LAST_ID.search(tail) if id is None else None
    if last is not None:
        id = _id_value(last.group(1))  # None for one no answer could carry (5.5): id null
        if kind == NOTIFICATION:  # a method, and an id after all: a request
            kind = REQUEST
    return RemoteProtocolError(
        INVALID_REQUEST,
        f"Invalid request: message of {size} bytes, larger than the limit of {limit}",
        data={"source": "aggregator", "reason": "too_large", "max_bytes": limit},
        **_who(kind, id),
    )


# The id a message ends with: a string or an integer, then the top-level object's closing brace.
_LAST_ID = re.compile(rb'[{,]\s*"id"\s*:\s*("(?:[^"\\]|\\.){0,1000}"|[-+.0-9eE]{1,300}|null)\s*\}\s*$')


def _id_value(text: bytes) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if type(value) is str or type(value) is int and len(text) <= 100 else None


def _who(kind: int | None, id: Any) -> dict[str, Any]:
    """Whom a refusal answers: a request (or what cannot be told apart) by its id; never a
    notification; a response not at all (it names the refused answer's request instead)."""
    if kind == RESPONSE:
        return {"kind": kind, "answer": False, "response_to": id}
    return {"kind": kind, "answer": kind != NOTIFICATION, "id": id}


def unreadable(raw: bytes, exc: BaseException) -> RemoteProtocolError:
    """A parse error; the envelope is read leniently (NaN, lone surrogates, bad UTF-8
    replaced) so that the error can name the request it answers."""
    parsed = None
    if len(raw) <= _LENIENT_LIMIT:
        try:
            parsed = json.loads(
                raw.decode("utf-8", "replace"), parse_float=_ignore, parse_int=_lenient_int, parse_constant=_ignore
            )
        except (ValueError, RecursionError):
            pass
    who = envelope(parsed) if parsed is not None else salvage_envelope(raw)
    return RemoteProtocolError(PARSE_ERROR, f"Parse error: {_reason(exc)}", **_who(*who))


def _ignore(text: str) -> None:
    return None


def _lenient_int(text: str) -> int | None:
    return int(text) if len(text) <= _INT_DIGITS else None


def refusal(message: dict[str, Any], id: Any, method: Any) -> RemoteProtocolError:
    """The error for a message the fast path did not accept: say precisely what is wrong."""
    error = _refusal_of(message, id, method)
    error.kind, envelope_id = envelope(message)
    if error.kind == RESPONSE:
        error.response_to = envelope_id
    elif error.kind == NOTIFICATION:
        error.answer = False  # a notification is never answered, however malformed
    return error


def _refusal_of(message: dict[str, Any], id: Any, method: Any) -> RemoteProtocolError:
    readable_id = id if type(id) is int or type(id) is str else None
    if message.get("jsonrpc") != "2.0":
        return RemoteProtocolError(INVALID_REQUEST, 'Invalid request: "jsonrpc" must be "2.0"', id=readable_id)
    if method is not MISSING:
        if type(method) is not str:
            return RemoteProtocolError(INVALID_REQUEST, 'Invalid request: "method" must be a string', id=readable_id)
        if type(message.get("params")) is list:
            return RemoteProtocolError(
                INVALID_PARAMS,
                "Invalid params: MCP params must be an object",
                id=readable_id,
                answer=id is not MISSING,
            )
        if "params" in message and type(message["params"]) is not dict:
            return RemoteProtocolError(INVALID_REQUEST, 'Invalid request: "params" must be an object', id=readable_id)
        return RemoteProtocolError(INVALID_REQUEST, _bad_id(id))
    if id is MISSING or ("result" in message) == ("error" in message):
        return RemoteProtocolError(
            INVALID_REQUEST, "Invalid request: neither a request, a notification nor a response", id=readable_id
        )
    if "error" in message and (readable_id is not None or id is None):
        return RemoteProtocolError(INVALID_REQUEST, 'Invalid response: "error" must be an object with a code')
    return RemoteProtocolError(INVALID_REQUEST, _bad_id(id).replace("Invalid request", "Invalid response"))


def _bad_id(id: Any) -> str:
    if type(id) is JsonNumber:  # -0, or more digits than an id may have
        shown = id.text if len(id.text) <= 40 else f"{id.text[:20]}...({len(id.text)} digits)"
        return (
            f"Invalid request: the id {shown} cannot be echoed exactly; use a string or an integer"
            f" of at most {_INT_DIGITS} digits"
        )
    return 'Invalid request: "id" must be a string or an integer'


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nesting too deep"
    text = str(exc).split(": line ", 1)[0]
    return text[:200] or type(exc).__name__
