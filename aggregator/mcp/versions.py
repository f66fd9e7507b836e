"""MCP protocol revisions the proxy speaks (handshake era) and how it negotiates them.

The proxy negotiates separately with each side: a client gets the revision it proposed
if we speak it, else our newest; each upstream is offered our newest and may answer any
revision we speak.
"""

from __future__ import annotations

LATEST = "2025-11-25"
SUPPORTED = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")


def negotiate(proposed: object) -> str:
    return proposed if proposed in SUPPORTED else LATEST  # type: ignore[return-value]
