"""MCP protocol revisions the proxy speaks (handshake era) and how it negotiates them.

The proxy negotiates separately with each side: a client gets the revision it proposed
if we speak it, else our newest; each upstream is offered our newest and may answer any
revision we speak. A client's ``server/discover`` (the probe of a later revision) is
refused at once with the same answer on every front.
"""

from __future__ import annotations

from typing import Any

from aggregator.jsonrpc.errors import METHOD_NOT_FOUND, error_response

LATEST = "2025-11-25"
SUPPORTED = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")


def negotiate(proposed: object) -> str:
    return proposed if proposed in SUPPORTED else LATEST  # type: ignore[return-value]


# The stateless probe of the 2026 revision, which this proxy does not speak.
DISCOVER = "server/discover"


def discover_refused(id: Any) -> dict[str, Any]:
    """The answer to ``server/discover`` on any front: method not found, at once, so the
    client falls back to ``initialize`` without waiting (and never learns an upstream's answer)."""
    return error_response(
        id, METHOD_NOT_FOUND, "Method not found: server/discover (this server speaks the initialize handshake)"
    )
