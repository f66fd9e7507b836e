"""The envelope of a message no parser can read. Sans-IO.

When a message is refused before its envelope could be read (nested past orjson's 1,024
levels or Python's stack, cut short, invalid bytes), the proxy still wants to know whom to
answer: a client's request gets its error under its id, a server's answer fails the
request it answers at once. ``salvage_envelope`` reads that from the text: a bounded scan
of the first bytes that follows strings, escapes and nesting and looks only at the
message's own keys. It runs only after a parser has refused a message.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from aggregator.jsonrpc.kinds import NOTIFICATION, REQUEST, RESPONSE

_MISSING = object()

# What salvage_envelope reads: a string (with ``:`` after it, a key), a quote that opens a
# string never closed (the scan stops), a run of opening or of closing brackets. Numbers,
# literals, commas and stray bytes are skipped.
_SALVAGE_BYTES = 64 * 1024
_SALVAGE_TOKEN = re.compile(rb'("[^"\\]*(?:\\.[^"\\]*)*")(\s*:)?|"|[\[{]+|[\]}]+', re.DOTALL)
# An id: a string, or an integer an id may be (at most 100 digits, as ``codec`` reads ids), ended as a value ends.
_SALVAGE_ID = re.compile(rb'\s*(?:("[^"\\]*(?:\\.[^"\\]*)*")|(-?(?:0|[1-9][0-9]{0,99})))\s*[,}]', re.DOTALL)
_OPEN = frozenset(b"[{")


def salvage_envelope(raw: bytes, *, whole: bool = True) -> tuple[int | None, Any]:
    """What an unparseable message is meant to be and its id, from its text: ``(kind, id)``
    as ``_envelope`` gives them, ``(None, None)`` when they cannot be told.

    ``whole=False``: ``raw`` is only the head of a message too large to keep, and what the
    head shows is taken as the whole story: a ``"method"`` and no ``"id"`` is a
    notification, a ``"result"`` or ``"error"`` and no ``"id"`` an answer to no one known
    (the SDKs write the id before params and result, so a later one is rare).

    A bounded scan (the first ``_SALVAGE_BYTES``) that follows strings, escapes and
    nesting, and looks only at the keys of the message's own object: an ``"id"`` inside
    ``params`` is not the message's. The kind needs evidence: a ``"method"`` key makes a
    request (with an id) or a notification (none, the whole object seen); a ``"result"``
    or ``"error"`` key, or the whole object seen without a ``method``, makes a response.
    For the failure path only: it runs after a parser has refused the message.
    """
    head = raw[:_SALVAGE_BYTES]
    start = len(head) - len(head.lstrip())
    if head[start : start + 1] != b"{":
        return None, None
    depth = 0
    id: Any = _MISSING
    method = answer = closed = False
    for match in _SALVAGE_TOKEN.finditer(head, start):
        key = match.group(1)
        if key is None:
            token = match.group()
            if token[0] in _OPEN:
                depth += len(token)
                continue
            if token == b'"':  # a string cut short: nothing after it can be read
                break
            depth -= len(token)
            if depth <= 0:
                closed = True
                break
            continue
        if depth != 1 or match.group(2) is None:
            continue  # a value, or a key of something nested
        if b"\\" in key:
            try:
                key = orjson.dumps(orjson.loads(key))
            except orjson.JSONDecodeError:
                continue
        if key == b'"id"':
            id = _salvage_id(head, match.end())
        elif key == b'"method"':
            method = True
        elif key == b'"result"' or key == b'"error"':
            answer = True
    return _verdict(id, method=method, answer=answer, closed=closed, whole=whole)


def _verdict(id: Any, *, method: bool, answer: bool, closed: bool, whole: bool) -> tuple[int | None, Any]:
    """What the keys seen make of a message (``closed``: its whole object was seen)."""
    if id is _MISSING:
        if method and (closed or not whole):
            return NOTIFICATION, None
        if answer and not whole:
            return RESPONSE, None
        return None, None
    if method:
        return REQUEST, id
    if answer or closed:
        return RESPONSE, id
    return None, id


def _salvage_id(head: bytes, at: int) -> Any:
    """The id value that starts at ``at``: a string or an integer; None for any other."""
    match = _SALVAGE_ID.match(head, at)
    if match is None:
        return None
    text, number = match.groups()
    if number is not None:
        return int(number) if number != b"-0" else None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # an invalid escape, a lone surrogate, invalid UTF-8
        return None
