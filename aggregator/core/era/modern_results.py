"""What a modern (2026-07-28) caller's answers carry that a legacy session's do not. Sans-IO.

Every result to a modern caller carries ``resultType`` (``complete`` unless an upstream's
``input_required`` result passes through) and the proxy's identity in
``_meta[io.modelcontextprotocol/serverInfo]`` (the proxy answers, not the server behind it).
The cacheable results (``modern.CACHEABLE``) carry ``ttlMs`` and ``cacheScope``, merged
conservatively:

- ``ttlMs``: the shortest of the sources' ttls; a source that gives none (every legacy
  upstream, and the proxy's own merged lists, which change whenever any server's does)
  counts as ``DEFAULT_TTL_MS`` (0: stale at once).
- ``cacheScope``: ``private`` when any source says so, or when the answer depends on who
  asks: the proxy has more than one profile (what a caller sees then depends on its
  token), or the answer comes from the caller's own per-session connection. Otherwise
  ``public``. Every page of one list gets the same scope: the rule reads only the
  configuration and the caller, never the page.

Errors: -32002 (the legacy "resource not found") becomes -32602, and no other code of the
range the revision reserves (-32020..-32099) reaches a modern caller unless the revision
defines it (``modern.MODERN_ERRORS``): such an upstream error becomes -32603, its message
and data kept. Legacy sessions' messages never come here.

Must not import trio or do I/O.
"""

from __future__ import annotations

from typing import Any

from aggregator import __version__
from aggregator.jsonrpc.codec import dumps
from aggregator.jsonrpc.errors import INTERNAL_ERROR, INVALID_PARAMS, RESOURCE_NOT_FOUND
from aggregator.mcp.modern import (
    CACHE_SCOPE,
    CACHEABLE,
    CLIENT_CAPABILITIES,
    COMPLETE,
    INPUT_REQUIRED,
    MODERN_ERRORS,
    PRIVATE,
    PUBLIC,
    RESULT_TYPE,
    SERVER_INFO,
    TASK,
    TTL,
    declares_tasks,
)

# The proxy's identity, on every modern result.
IDENTITY: dict[str, Any] = {"name": "aggregator", "version": __version__}
# The ttl of a source that gives none.
DEFAULT_TTL_MS = 0
# The range of error codes the revision reserves: only those it defines may be sent.
_RESERVED = range(-32099, -32019)


def cache_hints(ttls: list[Any], scopes: list[Any], *, depends_on_caller: bool) -> tuple[int, str]:
    """(ttlMs, cacheScope) of an answer made of these sources' hints (one entry per source;
    None where a source gave none)."""
    ttl: int | None = None
    for given in ttls:
        valid = given if type(given) is int and given >= 0 else DEFAULT_TTL_MS
        ttl = valid if ttl is None else min(ttl, valid)
    private = depends_on_caller or PRIVATE in scopes
    return (DEFAULT_TTL_MS if ttl is None else ttl), (PRIVATE if private else PUBLIC)


def stamp_result(result: dict[str, Any], method: str, *, depends_on_caller: bool) -> None:
    """Give a result for a modern caller what the revision asks of it, in place."""
    kind = result.get(RESULT_TYPE)
    if kind != INPUT_REQUIRED and kind != TASK:  # those two pass as they are
        result[RESULT_TYPE] = COMPLETE
        if method in CACHEABLE:
            result[TTL], result[CACHE_SCOPE] = cache_hints(
                [result.get(TTL)], [result.get(CACHE_SCOPE)], depends_on_caller=depends_on_caller
            )
    meta = result.get("_meta")
    result["_meta"] = dict(meta, **{SERVER_INFO: IDENTITY}) if type(meta) is dict else {SERVER_INFO: IDENTITY}


def modern_error(error: Any) -> None:
    """Rewrite an error for a modern caller, in place: no code it must not see."""
    if type(error) is not dict:
        return
    code = error.get("code")
    if code == RESOURCE_NOT_FOUND:
        error["code"] = INVALID_PARAMS
    elif type(code) is int and code in _RESERVED and code not in MODERN_ERRORS:
        error["code"] = INTERNAL_ERROR


def stamp_answer(message: dict[str, Any], method: str, *, depends_on_caller: bool) -> None:
    """A result or an error for a modern caller, stamped or rewritten in place."""
    result = message.get("result")
    if type(result) is dict:
        stamp_result(result, method, depends_on_caller=depends_on_caller)
    elif "error" in message:
        modern_error(message["error"])


def list_page_suffix(*, depends_on_caller: bool) -> bytes:
    """What a serialized list page (a JSON object without these keys) gets before its
    closing brace, for a modern caller: the proxy's merged lists have no ttl of their own."""
    ttl, scope = cache_hints([], [], depends_on_caller=depends_on_caller)
    stamp = {RESULT_TYPE: COMPLETE, TTL: ttl, CACHE_SCOPE: scope, "_meta": {SERVER_INFO: IDENTITY}}
    return b"," + dumps(stamp)[1:]


def splice_page(page: bytes, suffix: bytes) -> bytes:
    """A serialized list page with ``list_page_suffix`` spliced in."""
    return page[:-1] + suffix


def unknown_result_type(result: Any, method: str, meta: dict[str, Any] | None) -> bool:
    """Whether a modern server's result (to ``method``, for a caller whose ``_meta`` was
    ``meta``) has a ``resultType`` it may not: it may be ``complete`` (also when it says
    nothing) or ``input_required``, or a task handle for a ``tools/call`` whose caller
    declared the tasks extension."""
    if type(result) is not dict:
        return False
    kind = result.get(RESULT_TYPE, COMPLETE)
    if kind == TASK:
        return method != "tools/call" or meta is None or not declares_tasks(meta.get(CLIENT_CAPABILITIES))
    return kind not in (COMPLETE, INPUT_REQUIRED)
