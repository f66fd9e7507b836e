"""The JSON-RPC codec: bytes -> classified messages (or the error to answer), values ->
bytes, every number as it was read. Sans-IO.

Classification is by key presence, as JSON-RPC defines it: ``method`` + ``id`` is a
request, ``method`` alone a notification, ``id`` + ``result`` / ``error`` a response.
Ids are strings or integers; booleans, floats, null, objects and arrays are refused.
``decode_message`` reads and classifies; ``loads`` and ``dumps`` are the value codec below.

Reading: bytes -> values, with the two promises a proxy needs
-------------------------------------------------------------
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

Writing: values -> bytes
------------------------
Every number is written exactly as it was read. orjson writes nearly everything; a
``JsonNumber`` is written as its text (an orjson ``Fragment``), and a value orjson refuses
(an integer beyond 64 bits, nesting deeper than it writes) goes to an iterative writer
with its own bounded stack.

Refusals
--------
The error for a refused message says what exactly is wrong, and whom it answers. A
message refused for its content (too deep, unreadable) still has its envelope read when
it can be, so the error names the request it answers and says what the message was: by
a lenient parse, and where no parser can read it (past orjson's 1024 levels or Python's
stack, cut short, invalid bytes) by ``salvage_envelope``, a bounded scan of its first
bytes for the message's own ``"id"`` and ``"method"`` keys. Both run only for a message
already refused, so they cost nothing to the messages that pass.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from aggregator.jsonrpc.errors import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, RemoteProtocolError
from aggregator.jsonrpc.kinds import ERROR, NOTIFICATION, REQUEST, RESPONSE
from aggregator.jsonrpc.salvage import salvage_envelope

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


# --- writing --------------------------------------------------------------------------------

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


# --- refusals -------------------------------------------------------------------------------

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
    replaced) so that the error can name the request it answers. An id is answered only as
    it was sent: one whose bytes were replaced (invalid UTF-8 in it) is answered with
    ``"id": null``, as an id that cannot be read."""
    parsed = None
    if len(raw) <= _LENIENT_LIMIT:
        try:
            parsed = json.loads(
                raw.decode("utf-8", "replace"), parse_float=_ignore, parse_int=_lenient_int, parse_constant=_ignore
            )
        except (ValueError, RecursionError):
            pass
    kind, id = envelope(parsed) if parsed is not None else salvage_envelope(raw)
    if type(id) is str and "\ufffd" in id and id != salvage_envelope(raw)[1]:
        id = None  # a replacement character the sender did not send: not its id
    return RemoteProtocolError(PARSE_ERROR, f"Parse error: {_reason(exc)}", **_who(kind, id))


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


# --- classifying ----------------------------------------------------------------------------


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
