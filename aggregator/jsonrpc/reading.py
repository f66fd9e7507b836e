"""Bytes -> JSON values, with the two promises a proxy needs. Sans-IO.

Theory of operation
-------------------
-------------------
Parsing is orjson: fast and strict (it refuses NaN/Infinity, lone surrogates, invalid
UTF-8 and nesting deeper than 1024). A proxy needs two more promises, and both are kept
here, where bytes become values, so that nothing later has to care:

**Rule 1: nothing nests deeper than ``max_depth``** (``proxy.max_json_depth``; the
outermost object or array is level 1), so every later walk over a value (our rewriting,
plugins, the writer) is bounded. Nesting d takes at least 2d bytes and d opening
brackets, so most messages are cleared by their length or by two ``bytes.count``. The
rest are checked at C speed: orjson's writer refuses values nested deeper than
``_DUMPS_DEPTH`` (probed), so the value is written once wrapped in
``_DUMPS_DEPTH - max_depth`` lists, a write that also serves Rule 2. A limit above
orjson's own gets an iterative walk instead.

**Rule 2: the proxy never changes a number it forwards.** orjson turns an integer beyond
64 bits into a float, writes every float its shortest way (``1e2`` -> ``100.0``, ``1.50``
-> ``1.5``, ``-0`` -> ``0``, ``1e-400`` -> ``0.0``) and refuses numbers beyond a double
(``1e400``, a 400-digit integer). So:

- The value is written back with orjson and compared with the input: identical bytes
  mean every literal survives. Compact JSON, which the SDKs and this proxy write, passes
  so, for the price of one ``orjson.dumps`` and a ``memcmp``.
- Otherwise (whitespace, escapes such as ``\\u00e9``, or a literal written another way) a
  ``bytes.translate`` scan says whether a literal *may* be at fault: ``0.`` (a fraction or
  exponent, not counting quoted versions such as ``"2.0"``), ``-0,`` or 18 digits in a row.
- If so, and whenever orjson refuses the input, the stdlib parser reads it again with
  hooks: a literal that orjson writes back the same is an ``int`` or ``float``; any other
  becomes a ``JsonNumber``, a ``Decimal`` that remembers its text and is written back as
  that text (orjson's ``Fragment``). Integers longer than ``_INT_DIGITS`` digits stay
  text too (Python's ``int()`` is quadratic in the digits, and refuses 4300).
- The stdlib parser is laxer than orjson in three ways, each closed: it gets text decoded
  strictly as UTF-8; ``NaN``/``Infinity`` are refused by a hook, by name; where orjson did
  not validate the input (it refused a number first) a walk refuses lone surrogates.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

DEFAULT_MAX_DEPTH = 128
# The most a configuration may allow: the stdlib parser (exact numbers) and any recursive
# walk (plugins) need that many of Python's ~1000 frames, and the proxy needs its own.
MAX_DEPTH_LIMIT = 512


def _dumps_depth() -> int:
    """How deep orjson's writer goes before it refuses (254 in orjson 3.x): probed, not assumed."""
    value: list[Any] = []
    for depth in range(1, 4096):
        try:
            orjson.dumps(value)
        except orjson.JSONEncodeError:
            return depth - 1
        value = [value]
    return 4096


_DUMPS_DEPTH = _dumps_depth()

# digits -> "0", ".eE" -> ".", what may end a number -> ",": four to ten times faster
# than a regex over the same bytes.
_SCAN = bytes.maketrans(b"0123456789.eE,]} \t\r\n", b"0000000000...,,,,,,,")
_LONG_RUN = b"0" * 18
_INT_DIGITS = 100
_SURROGATE = re.compile("[\ud800-\udfff]")


class JsonNumber(Decimal):
    """A JSON number the proxy must write back exactly as it read it.

    A ``Decimal`` (so code that reads it gets its exact value) that remembers its text:
    ``JsonNumber("1e2")`` is 100 and is written ``1e2``. The stdlib's ``json.dumps`` does
    not know it: give it ``default=str`` (the literal, as a string) or use ``dumps``.
    """

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str) -> JsonNumber:
        self = super().__new__(cls, text)
        self.text = text
        return self

    def __repr__(self) -> str:
        return f"JsonNumber({self.text!r})"

    def __str__(self) -> str:  # so json.dumps(..., default=str) and logs show the literal
        return self.text


class NestingTooDeep(ValueError):
    """The JSON text nests deeper than the limit; ``value`` is what was parsed, if anything."""

    def __init__(self, limit: int, value: Any = None) -> None:
        super().__init__(f"nested deeper than {limit} levels")
        self.limit = limit
        self.value = value


def loads(raw: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Parse one JSON text; raise ValueError for anything a strict parser refuses, and
    NestingTooDeep (a ValueError) past ``max_depth``. Numbers keep their exact text."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # Perhaps valid JSON with a number beyond a double; or a NaN or a lone surrogate,
        # which the exact path names. It refuses whatever else orjson refused.
        return _loads_exact(raw, max_depth, refused=exc)
    # Rule 1. Nesting d takes 2d bytes and d opening brackets: most messages are cleared
    # by their length or the count, the rest by writing them wrapped (see above).
    pad = 0
    wrapped = value
    if len(raw) > 2 * max_depth and raw.count(b"[") + raw.count(b"{") > max_depth:
        if max_depth < _DUMPS_DEPTH:
            pad = _DUMPS_DEPTH - max_depth
            for _ in range(pad):
                wrapped = [wrapped]
        elif _exceeds(value, max_depth):
            raise NestingTooDeep(max_depth, value)
    # Rule 2. Written back identically, every literal survives.
    try:
        written = orjson.dumps(wrapped)
    except orjson.JSONEncodeError:
        if pad:
            raise NestingTooDeep(max_depth, value) from None
        written = b""  # deeper than orjson writes (a limit above its own): not identical
    if pad == 0:
        if written == raw:
            return value
    elif len(written) == len(raw) + 2 * pad and written.startswith(raw, pad):
        return value
    text = raw.strip()
    if text is not raw and len(written) == len(text) + 2 * pad and written.startswith(text, pad):
        return value
    # Not identical: whitespace, escapes (\u00e9, \/), or a literal written another way.
    # Every fraction or exponent leaves a "0." in the scan; so does every short quoted
    # version such as "2.0" (one in each message: "jsonrpc":"2.0"), while a literal never
    # follows a quote: more "0." than '"0.0"' means a literal may be there.
    # (find, not `in`: bytes.__contains__ first tries the argument as an int, and pays
    # for the exception.)
    scan = raw.translate(_SCAN)
    if (
        scan.count(b"0.") > scan.count(b'"0.0"')
        or scan.find(b"-0,") != -1
        or scan.find(_LONG_RUN) != -1
        or scan.endswith(b"-0")
    ):
        return _loads_exact(raw, max_depth)
    return value


def _loads_exact(raw: bytes, max_depth: int, refused: ValueError | None = None) -> Any:
    """The stdlib parser with number hooks. ``refused``: orjson's refusal, if it refused
    (then it did not validate everything, and its message is the one to give)."""
    try:
        text = raw.decode("utf-8")
        value = json.loads(text, parse_float=_exact_float, parse_int=_exact_int, parse_constant=_no_constant)
    except _Refused:
        raise
    except RecursionError:
        raise NestingTooDeep(max_depth) from None
    except UnicodeDecodeError as exc:  # orjson's words for it speak of surrogates
        raise ValueError(f"the message is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:  # JSONDecodeError
        raise (refused or exc) from None
    if refused is not None:
        _check_tree(value, max_depth)
    return value


class _Refused(ValueError):
    """Valid JSON grammar the proxy still cannot carry (said in words a person understands)."""


def _exact_float(text: str) -> float | JsonNumber:
    number = float(text)
    if orjson.dumps(number) == text.encode():
        return number
    return _exact(text)


def _exact_int(text: str) -> int | JsonNumber:
    if len(text) <= _INT_DIGITS and text != "-0":
        return int(text)
    return _exact(text)


def _exact(text: str) -> JsonNumber:
    try:
        return JsonNumber(text)
    except InvalidOperation:
        shown = text if len(text) <= 40 else f"{text[:20]}...{text[-12:]}"
        raise _Refused(f"the number {shown} is out of range") from None


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number")


def _check_tree(value: Any, max_depth: int) -> None:
    """Refuse nesting past ``max_depth`` and lone surrogates, without recursion."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if type(node) is dict:
            children: Any = node.values()
            for key in node:
                if _SURROGATE.search(key):
                    raise _Refused("a string holds a lone surrogate (not valid Unicode)")
        elif type(node) is list:
            children = node
        else:
            if type(node) is str and _SURROGATE.search(node):
                raise _Refused("a string holds a lone surrogate (not valid Unicode)")
            continue
        if depth > max_depth:
            raise NestingTooDeep(max_depth, value)
        for child in children:
            kind = type(child)
            if kind is dict or kind is list or kind is str:
                stack.append((child, depth + 1))


def _exceeds(value: Any, max_depth: int) -> bool:
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        for child in node.values() if type(node) is dict else node:
            kind = type(child)
            if kind is dict or kind is list:
                if depth >= max_depth:
                    return True
                stack.append((child, depth + 1))
    return False
