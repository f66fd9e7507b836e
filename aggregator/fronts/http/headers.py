"""The request headers of a modern (2026-07-28) Streamable HTTP POST, checked against its body. Pure.

A modern POST mirrors parts of its body in headers (``basic/transports/streamable-http.mdx``,
"Request Metadata"): ``MCP-Protocol-Version`` (= ``_meta`` protocolVersion), ``Mcp-Method``
(= method, every request), ``Mcp-Name`` (= ``params.name`` of tools/call and prompts/get,
``params.uri`` of resources/read) and, for a tool whose input schema marks a parameter with
``x-mcp-header``, ``Mcp-Param-{Name}`` (= that argument). A value may be carried in the
Base64 sentinel ``=?base64?...?=``, decoded before comparing. Whatever is missing, does not
match or is malformed is a ``HeaderMismatch`` (-32020, HTTP 400); a revision the proxy does
not speak is ``UnsupportedProtocolVersion`` (-32022, HTTP 400).

Also here: the HTTP status of a modern answer by its JSON-RPC error code (``answer_status``),
and the ``x-mcp-header`` parameters of a tool, read off its schema once per catalog
generation (``ParamHeaders``).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from aggregator.jsonrpc.errors import INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR, error_response
from aggregator.mcp.modern import (
    HEADER_MISMATCH,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    PROTOCOL_VERSION,
    TASK_ID,
    TASK_REQUESTS,
    UNSUPPORTED_PROTOCOL_VERSION,
    unsupported_version,
)
from aggregator.mcp.versions import MODERN_LATEST, is_modern

SENTINEL_PREFIX = "=?base64?"
SENTINEL_SUFFIX = "?="
X_MCP_HEADER = "x-mcp-header"
PARAM_PREFIX = "mcp-param-"
# The body field ``Mcp-Name`` mirrors, by method.
NAMED_BY = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    **dict.fromkeys(TASK_REQUESTS, TASK_ID),
}
# The HTTP status of a modern request's error answer, by its code (the spec's MUSTs:
# -32601 is 404; a malformed request, missing _meta fields, a header mismatch, a missing
# client capability and an unsupported revision are 400). Anything else, results too: 200.
ERROR_STATUS = {
    PARSE_ERROR: 400,
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    MISSING_REQUIRED_CLIENT_CAPABILITY: 400,
    UNSUPPORTED_PROTOCOL_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}
# A tool's x-mcp-header parameters: (the path of ``properties`` keys, the header's name in lower case).
ParamSpec = tuple[tuple[tuple[str, ...], str], ...]


def answer_status(data: bytes) -> int:
    """The HTTP status for a modern request's JSON answer: by its error code, else 200. A
    result is told by a C-level search; only an answer with an ``"error"`` key is parsed."""
    if b'"error"' not in data:
        return 200
    try:
        message = json.loads(data)
    except ValueError:
        return 200
    error = message.get("error") if type(message) is dict else None
    code = error.get("code") if type(error) is dict else None
    return ERROR_STATUS.get(code, 200) if type(code) is int else 200


def decode_value(value: str) -> str | None:
    """What a header carries: the Base64 sentinel decoded (strict, canonical, UTF-8), a
    plain value as is; None if it is malformed or holds characters a header may not."""
    if value.startswith(SENTINEL_PREFIX) and value.endswith(SENTINEL_SUFFIX) and len(value) >= 11:
        payload = value[9:-2]
        try:
            decoded = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            return None
        if base64.b64encode(decoded).decode("ascii") != payload:
            return None
        try:
            return decoded.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not value.isascii() or not value.replace("\t", " ").isprintable():
        return None
    return value


def mismatch(id: Any, message: str) -> dict[str, Any]:
    return error_response(id, HEADER_MISMATCH, f"Header mismatch: {message}")


def check_version(headers: Mapping[str, str], message: dict[str, Any], meta: Any) -> dict[str, Any] | None:
    """The revision rules: MCP-Protocol-Version present and equal to ``_meta``'s, a revision
    the proxy serves statelessly, and ``_meta`` there at all. The error answer, or None."""
    id = message["id"]
    header = headers.get("mcp-protocol-version")
    if meta is None:  # modern by its header or its method alone
        if header is None or is_modern(header):
            return error_response(
                id,
                INVALID_PARAMS,
                f"Invalid params: a {header or MODERN_LATEST} request must carry _meta {PROTOCOL_VERSION}",
            )
        return unsupported_version(id, header)
    requested = meta.get(PROTOCOL_VERSION)
    if header is None:
        return mismatch(id, "the MCP-Protocol-Version header is required")
    if header != requested:
        return mismatch(id, f"MCP-Protocol-Version header {header[:40]!r} does not match _meta {str(requested)[:40]!r}")
    if not is_modern(requested):
        return unsupported_version(id, requested)
    return None


def check_headers(headers: Mapping[str, str], message: dict[str, Any], params: ParamSpec) -> dict[str, Any] | None:
    """Mcp-Method, Mcp-Name and the tool's Mcp-Param-* headers against the body; the
    -32020 answer, or None when they all match."""
    id = message["id"]
    method = message["method"]
    header = headers.get("mcp-method")
    if header is None:
        return mismatch(id, "the Mcp-Method header is required")
    if header != method:
        return mismatch(id, f"Mcp-Method header {header[:60]!r} does not match the body's method {method[:60]!r}")
    field = NAMED_BY.get(method)
    if field is None:
        return None
    body_params = message.get("params")
    body = body_params.get(field) if type(body_params) is dict else None
    header = headers.get("mcp-name")
    if header is None:
        return mismatch(id, f"the Mcp-Name header is required for {method}")
    name = decode_value(header)
    if name is None:
        return mismatch(id, "the Mcp-Name header is malformed (invalid characters or Base64)")
    if name != body:
        return mismatch(id, f"Mcp-Name header {name[:60]!r} does not match the body's {field} {str(body)[:60]!r}")
    if not params:  # an Mcp-Param-* header no parameter declares is ignored, as the spec says
        return None
    arguments = body_params.get("arguments") if type(body_params) is dict else None
    return _check_params(id, headers, params, arguments if type(arguments) is dict else {})


def _check_params(
    id: Any, headers: Mapping[str, str], params: ParamSpec, arguments: dict[str, Any]
) -> dict[str, Any] | None:
    for path, name in params:
        value: Any = arguments
        for key in path:
            value = value.get(key) if type(value) is dict else None
        header = headers.get(PARAM_PREFIX + name)
        shown = "Mcp-Param-" + name
        if value is None:
            if header is not None:
                return mismatch(id, f"{shown} is sent but the argument {'.'.join(path)!r} is not")
            continue
        if header is None:
            return mismatch(id, f"the {shown} header is required: the argument {'.'.join(path)!r} is given")
        decoded = decode_value(header)
        if decoded is None:
            return mismatch(id, f"the {shown} header is malformed (invalid characters or Base64)")
        if not _same(decoded, value):
            return mismatch(id, f"{shown} header {decoded[:60]!r} does not match the argument {'.'.join(path)!r}")
    return None


def _same(header: str, value: Any) -> bool:
    """Whether a decoded header value is the argument as a client mirrors it (booleans as
    true/false, numbers compared as numbers)."""
    if type(value) is bool:
        return header == ("true" if value else "false")
    if type(value) is int or type(value) is float:
        try:
            return float(header) == value if "." in header or "e" in header.lower() else int(header) == value
        except ValueError:
            return False
    return type(value) is str and header == value


def param_spec(tool: Any) -> ParamSpec:
    """A tool's ``x-mcp-header`` parameters: those reached from the schema's root through
    ``properties`` alone, named by a non-empty token, on a string, integer or boolean."""
    schema = tool.get("inputSchema") if type(tool) is dict else None
    found: list[tuple[tuple[str, ...], str]] = []
    stack: list[tuple[tuple[str, ...], Any]] = [((), schema)]
    while stack and len(found) < 64:
        path, node = stack.pop()
        if type(node) is not dict:
            continue
        name = node.get(X_MCP_HEADER)
        if path and type(name) is str and _is_token(name) and node.get("type") in ("string", "integer", "boolean"):
            found.append((path, name.lower()))
        properties = node.get("properties")
        if type(properties) is dict and len(path) < 32:
            stack.extend(((*path, key), sub) for key, sub in properties.items() if type(key) is str)
    return tuple(found)


_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _is_token(name: str) -> bool:
    return bool(name) and all(char in _TCHAR for char in name)


class ParamHeaders:
    """The ``x-mcp-header`` parameters of each tool a catalog exposes, by exposed name: read
    once per catalog generation, so a call costs one lookup."""

    def __init__(self) -> None:
        self._by_catalog: dict[int, tuple[int, dict[str, ParamSpec]]] = {}

    def of(self, catalog: Any, tool: Any) -> ParamSpec:
        cached = self._by_catalog.get(id(catalog))
        if cached is None or cached[0] != catalog.generation:
            specs = {}
            for item in catalog.exposed.get("tools", ()):
                spec = param_spec(item)
                if spec:
                    specs[item.get("name")] = spec
            cached = self._by_catalog[id(catalog)] = (catalog.generation, specs)
        return cached[1].get(tool, ()) if type(tool) is str else ()
