"""The HTTP headers a request to a modern (2026-07-28) Streamable HTTP server carries.

Every POST names its revision (``MCP-Protocol-Version``, the body's ``_meta`` one) and its
method (``Mcp-Method``); ``tools/call``, ``prompts/get`` and ``resources/read`` name their
target (``Mcp-Name``: ``params.name`` or ``params.uri``); a ``tools/call`` mirrors each
argument its tool's ``inputSchema`` marks with ``x-mcp-header`` into ``Mcp-Param-{Name}``
(``2026-07-28/basic/transports/streamable-http.mdx``). A value that is not plain visible
ASCII (or has leading or trailing white space, or looks like the sentinel itself) goes as
``=?base64?...?=``. A tool whose annotations break the rules is dropped from the listing
with a warning (``ToolHeaders.listed``), so one bad definition costs only itself.
"""

from __future__ import annotations

import base64
import logging
import re
from typing import Any

from aggregator.mcp import modern

log = logging.getLogger(__name__)

ANNOTATION = "x-mcp-header"
NAMED = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    **dict.fromkeys(modern.TASK_REQUESTS, modern.TASK_ID),
}
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_PLAIN = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")
_SAFE_INTEGER = 2**53 - 1


def header_value(value: str) -> str:
    """``value`` as a header value: as it is when plain visible ASCII, else the Base64 sentinel."""
    if _PLAIN.fullmatch(value) and not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    return f"=?base64?{base64.b64encode(value.encode()).decode()}?="


def _annotations(schema: Any, path: tuple[str, ...], found: list[tuple[tuple[str, ...], str]]) -> str | None:
    """Collect ``(property path, header name)`` of ``schema``'s properties; the problem, if any."""
    if type(schema) is not dict:
        return None
    for key, value in schema.items():
        if key == "properties" and type(value) is dict:
            for name, sub in value.items():
                if type(sub) is dict and ANNOTATION in sub:
                    header = sub[ANNOTATION]
                    if type(header) is not str or not _TOKEN.fullmatch(header):
                        return f"{ANNOTATION} {header!r} of {'.'.join((*path, name))} is not a header name token"
                    if sub.get("type") not in ("string", "integer", "boolean"):
                        return f"{ANNOTATION} on {'.'.join((*path, name))} of type {sub.get('type')!r}"
                    found.append(((*path, name), header))
                problem = _annotations(sub, (*path, name), found)
                if problem is not None:
                    return problem
        elif type(value) in (dict, list) and ANNOTATION in repr(value):
            return f"{ANNOTATION} under {key!r} is not statically reachable through properties"
    return None


def tool_annotations(tool: dict[str, Any]) -> list[tuple[tuple[str, ...], str]] | str:
    """The ``x-mcp-header`` annotations of a tool, or why they make it invalid."""
    found: list[tuple[tuple[str, ...], str]] = []
    problem = _annotations(tool.get("inputSchema"), (), found)
    if problem is not None:
        return problem
    names = [header.lower() for _, header in found]
    if len(set(names)) != len(names):
        return f"{ANNOTATION} names repeat (case-insensitively)"
    return found


class ToolHeaders:
    """What one connection knows of its tools' ``x-mcp-header`` annotations."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.by_tool: dict[str, list[tuple[tuple[str, ...], str]]] = {}

    def listed(self, result: dict[str, Any]) -> bool:
        """Learn a ``tools/list`` page's annotations; drop its invalid tools (in place).
        Whether the page changed."""
        tools = result.get("tools")
        if type(tools) is not list:
            return False
        kept = []
        for tool in tools:
            name = tool.get("name") if type(tool) is dict else None
            found: list[tuple[tuple[str, ...], str]] | str = tool_annotations(tool) if type(tool) is dict else []
            if isinstance(found, str):
                log.warning("server %s: tool %r dropped from its listing: %s", self.server, name, found)
                continue
            if type(name) is str:
                if found:
                    self.by_tool[name] = found
                else:
                    self.by_tool.pop(name, None)
            kept.append(tool)
        if len(kept) == len(tools):
            return False
        result["tools"] = kept
        return True

    def params(self, name: Any, arguments: Any) -> dict[str, str]:
        """The ``Mcp-Param-*`` headers of a call of tool ``name`` with ``arguments``."""
        out: dict[str, str] = {}
        for path, header in self.by_tool.get(name, ()) if type(name) is str else ():
            value: Any = arguments
            for key in path:
                value = value.get(key) if type(value) is dict else None
            if type(value) is bool:
                out[f"mcp-param-{header}"] = "true" if value else "false"
            elif type(value) is int and -_SAFE_INTEGER <= value <= _SAFE_INTEGER:
                out[f"mcp-param-{header}"] = str(value)
            elif type(value) is str:
                out[f"mcp-param-{header}"] = header_value(value)
        return out


def request_headers(message: dict[str, Any], tools: ToolHeaders) -> dict[str, str] | None:
    """The modern headers of request ``message``, or None when it is not a modern request."""
    meta = modern.request_meta(message)
    if meta is None:
        return None
    version = meta[modern.PROTOCOL_VERSION]
    method = message["method"]
    headers = {"mcp-protocol-version": str(version), "mcp-method": header_value(str(method))}
    params = message["params"]
    key = NAMED.get(method)
    if key is not None and type(params.get(key)) is str:
        headers["mcp-name"] = header_value(params[key])
    if method == "tools/call":
        headers.update(tools.params(params.get("name"), params.get("arguments")))
    return headers
