"""Log levels: one per client session, the most verbose of them for each upstream.

RFC 5424 severities as MCP names them, least to most severe. A session that never sent
``logging/setLevel`` receives ``info`` and above; an upstream is only told a level once a
session has asked for one, and then always the most verbose any session wants.
"""

from __future__ import annotations

LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
RANK = {name: rank for rank, name in enumerate(LEVELS)}
DEFAULT = "info"


def most_verbose(levels: list[str]) -> str | None:
    return min(levels, key=RANK.__getitem__) if levels else None


def passes(message_level: object, session_level: str | None) -> bool:
    """Whether a message at ``message_level`` goes to a session at ``session_level``."""
    rank = RANK.get(message_level) if type(message_level) is str else None
    if rank is None:
        return True  # an unknown level: deliver rather than lose it
    return rank >= RANK[session_level or DEFAULT]
