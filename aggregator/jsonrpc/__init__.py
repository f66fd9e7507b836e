"""JSON-RPC 2.0 for MCP, without I/O: the codec, message kinds, framing and error codes.

Must not import trio or any I/O library (tests/core/test_layering.py checks).

Floor 0: imports nothing of the project.
"""

from aggregator.jsonrpc.codec import (
    DEFAULT_MAX_DEPTH,
    ERROR,
    NOTIFICATION,
    REQUEST,
    RESPONSE,
    JsonNumber,
    NestingTooDeep,
    decode_message,
    dumps,
    loads,
)
from aggregator.jsonrpc.errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RemoteProtocolError,
    error_response,
)
from aggregator.jsonrpc.framing import LineSplitter, OversizedLine

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "ERROR",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "JsonNumber",
    "METHOD_NOT_FOUND",
    "NestingTooDeep",
    "NOTIFICATION",
    "PARSE_ERROR",
    "REQUEST",
    "RESPONSE",
    "LineSplitter",
    "OversizedLine",
    "RemoteProtocolError",
    "decode_message",
    "dumps",
    "error_response",
    "loads",
]
