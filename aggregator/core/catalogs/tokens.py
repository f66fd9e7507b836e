"""How many tokens a piece of the protocol costs a model's context: an estimate. Sans-IO.

The estimate is the length of the compact JSON in UTF-8 bytes divided by four, rounded
up: the rule of thumb the model vendors give for English text and code (about four
characters a token). It needs no tokenizer and no data downloaded at run time, costs one
``len``, and is the same for every client; a real tokenizer gives figures within about
a quarter of it either way for tool definitions (more for JSON punctuation, fewer for
long English words). What it is used for (a budget, and what one mode saves against
another) needs the same ruler on both sides, not the exact count of one model.
"""

from __future__ import annotations

from typing import Any

from aggregator.jsonrpc.codec import dumps

BYTES_PER_TOKEN = 4


def tokens_of_bytes(size: int) -> int:
    """The estimated tokens of ``size`` bytes of UTF-8 text."""
    return -(-size // BYTES_PER_TOKEN)


def tokens_of(value: Any) -> int:
    """The estimated tokens of a JSON value, as the proxy would send it (compact)."""
    if isinstance(value, bytes):
        return tokens_of_bytes(len(value))
    if isinstance(value, str):
        return tokens_of_bytes(len(value.encode("utf-8", "surrogatepass")))
    return tokens_of_bytes(len(dumps(value)))


def tools_list_tokens(tools: list[dict[str, Any]]) -> int:
    """The estimated tokens of a ``tools/list`` result holding all of ``tools``."""
    return tokens_of({"tools": tools})
