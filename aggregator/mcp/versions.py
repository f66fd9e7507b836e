"""MCP protocol revisions the proxy speaks, in both eras, and how it negotiates them. Sans-IO.

Two eras (``2026-07-28/basic/versioning.mdx``):

- **legacy** revisions (2025-11-25 and earlier) open with an ``initialize`` handshake that
  fixes the revision for the stdio process or the HTTP session;
- **modern** revisions (2026-07-28 and later) have no handshake: every request carries its
  revision, the client's capabilities and identity in ``_meta``
  (``aggregator.mcp.modern``), and a server answers ``server/discover``.

The proxy is dual-era on each side. Downstream it serves a request according to how it
opens: one with modern ``_meta`` statelessly, ``initialize`` selects legacy for the
session. Upstream it finds each server's era (``server/discover``, falling back to
``initialize``) unless the configuration pins it.
"""

from __future__ import annotations

# Legacy revisions, newest first: the ones ``initialize`` negotiates.
LATEST = "2025-11-25"
SUPPORTED = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
# Modern revisions, newest first: the ones a request's ``_meta`` may name.
MODERN_LATEST = "2026-07-28"
MODERN = ("2026-07-28",)
# Every revision the proxy speaks, newest first (what ``server/discover`` and an
# unsupported-version error list).
ALL_VERSIONS = MODERN + SUPPORTED


def negotiate(proposed: object) -> str:
    """The legacy revision a client's ``initialize`` gets: the one it proposed if we speak
    it, else our newest."""
    return proposed if proposed in SUPPORTED else LATEST  # type: ignore[return-value]


def is_modern(version: object) -> bool:
    """Whether ``version`` names a modern revision the proxy speaks."""
    return version in MODERN


# The request a modern server MUST answer, and a dual-era client probes with.
DISCOVER = "server/discover"
