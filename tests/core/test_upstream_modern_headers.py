"""The headers of a POST to a modern Streamable HTTP server (``transports.modern_headers``):
the Base64 sentinel, ``x-mcp-header`` annotations (valid ones mirrored, a tool with an
invalid one dropped from its listing) and the standard ``Mcp-*`` headers."""

from __future__ import annotations

import logging

import pytest

from aggregator.mcp import modern
from aggregator.upstreams.modern_headers import ToolHeaders, header_value, request_headers

# The spec's own encoding examples (basic/transports/streamable-http.mdx, "Value Encoding").
ENCODINGS = [
    ("us-west1", "us-west1"),
    ("Hello, 世界", "=?base64?SGVsbG8sIOS4lueVjA==?="),
    (" padded ", "=?base64?IHBhZGRlZCA=?="),
    ("line1\nline2", "=?base64?bGluZTEKbGluZTI=?="),
    ("=?base64?literal?=", "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="),
    ("file:///a b.txt", "file:///a b.txt"),
]


@pytest.mark.parametrize(("value", "header"), ENCODINGS)
def test_a_value_is_plain_or_base64(value, header):
    assert header_value(value) == header


def tool(name, properties):
    return {"name": name, "inputSchema": {"type": "object", "properties": properties}}


GOOD = tool(
    "q",
    {
        "region": {"type": "string", "x-mcp-header": "Region"},
        "opts": {"type": "object", "properties": {"n": {"type": "integer", "x-mcp-header": "N"}}},
        "flag": {"type": "boolean", "x-mcp-header": "Flag"},
    },
)
BAD = [
    tool("bad-number", {"x": {"type": "number", "x-mcp-header": "X"}}),
    tool("bad-name", {"x": {"type": "string", "x-mcp-header": "A B"}}),
    tool("bad-empty", {"x": {"type": "string", "x-mcp-header": ""}}),
    tool("bad-repeat", {"x": {"type": "string", "x-mcp-header": "X"}, "y": {"type": "string", "x-mcp-header": "x"}}),
    tool("bad-items", {"x": {"type": "array", "items": {"type": "string", "x-mcp-header": "X"}}}),
    {"name": "bad-oneof", "inputSchema": {"oneOf": [{"properties": {"x": {"x-mcp-header": "X"}}}]}},
]


def test_a_listing_keeps_valid_tools_and_drops_invalid_ones(caplog):
    tools = ToolHeaders("srv")
    result = {"tools": [GOOD, *BAD, tool("plain", {"a": {"type": "string"}})]}
    with caplog.at_level(logging.WARNING):
        assert tools.listed(result)
    assert [t["name"] for t in result["tools"]] == ["q", "plain"]
    for bad in BAD:
        assert repr(bad["name"]) in caplog.text
    headers = tools.params("q", {"region": "Hello, 世界", "opts": {"n": 42}, "flag": False})
    assert headers == {"mcp-param-Region": header_value("Hello, 世界"), "mcp-param-N": "42", "mcp-param-Flag": "false"}
    assert tools.params("q", {"opts": {"n": 2**60}}) == {}  # absent, or past JavaScript's safe integers: omitted
    assert not tools.listed({"tools": [GOOD]})  # nothing to drop: the page is left as it is


def test_a_modern_request_names_its_revision_method_and_target():
    tools = ToolHeaders("srv")
    tools.listed({"tools": [GOOD]})
    meta = {modern.PROTOCOL_VERSION: "2026-07-28", modern.CLIENT_CAPABILITIES: {}}
    call = {"id": 1, "method": "tools/call", "params": {"name": "q", "arguments": {"region": "eu"}, "_meta": meta}}
    assert request_headers(call, tools) == {
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "q",
        "mcp-param-Region": "eu",
    }
    read = {"id": 2, "method": "resources/read", "params": {"uri": "file:///ü", "_meta": meta}}
    assert request_headers(read, tools)["mcp-name"] == "=?base64?ZmlsZTovLy/DvA==?="
    assert request_headers({"id": 3, "method": "initialize", "params": {}}, tools) is None  # legacy: no headers
