"""JSON values -> bytes, every number written exactly as it was read. Sans-IO.

orjson writes nearly everything; a ``JsonNumber`` is written as its text (an orjson
``Fragment``), and a value orjson refuses (an integer beyond 64 bits, nesting deeper than
it writes) goes to an iterative writer with its own bounded stack.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import orjson

from aggregator.jsonrpc.reading import JsonNumber

_encode_string = json.encoder.encode_basestring


def _number_text(value: Any) -> orjson.Fragment:
    """orjson's ``default``: write a JsonNumber as its text, a finite Decimal exactly."""
    if type(value) is JsonNumber:
        return orjson.Fragment(value.text)
    if isinstance(value, Decimal) and value.is_finite():
        return orjson.Fragment(str(value))
    raise TypeError(f"cannot serialize {type(value).__name__}")


def dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value, default=_number_text)
    except TypeError:  # orjson.JSONEncodeError: an int beyond 64 bits, or deeper than orjson writes
        return _write_exact(value).encode("utf-8")


# The exact writer keeps its own stack: its depth is bounded by this, never by Python's.
_MAX_WRITE_DEPTH = 4096
_END = object()


def _write_exact(value: Any) -> str:
    out: list[str] = []
    append = out.append
    # Each open container is (its closing bracket, an iterator over its items, is a dict).
    stack: list[tuple[str, Any, bool]] = []
    item = value
    while True:
        if isinstance(item, dict):
            if len(stack) >= _MAX_WRITE_DEPTH:
                raise ValueError(f"cannot serialize a value nested deeper than {_MAX_WRITE_DEPTH} levels")
            append("{")
            stack.append(("}", iter(item.items()), True))
        elif isinstance(item, list | tuple):
            if len(stack) >= _MAX_WRITE_DEPTH:
                raise ValueError(f"cannot serialize a value nested deeper than {_MAX_WRITE_DEPTH} levels")
            append("[")
            stack.append(("]", iter(item), False))
        else:
            append(_scalar(item))
        # The next item to write, closing every container that is done.
        while stack:
            closer, items, is_dict = stack[-1]
            entry: Any = next(items, _END)
            if entry is _END:
                append(closer)
                stack.pop()
                continue
            if out[-1] != "{" and out[-1] != "[":
                append(",")
            if is_dict:
                append(_encode_string(str(entry[0])))
                append(":")
                item = entry[1]
            else:
                item = entry
            break
        else:
            return "".join(out)


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return _encode_string(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return orjson.dumps(value).decode()
    if type(value) is JsonNumber:
        return value.text
    if isinstance(value, Decimal) and value.is_finite():
        return str(value)
    raise TypeError(f"cannot serialize {type(value).__name__}")
