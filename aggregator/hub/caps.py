"""How many clients the hub takes: the connection and session caps of the network fronts.

One ``Admission`` per hub, shared by the Streamable HTTP, legacy SSE and WebSocket
endpoints, so each cap is one number however a client arrives (a cap counted per
transport would let in three times as many). While the hub drains for shutdown no new
session is admitted (503 with Retry-After, for a balancer to try another replica) unless
it is one that moves to another replica by itself (``movable``: a Streamable HTTP session,
when the replicas share keys; the drain says, ``hub.drain``); connections are, so that
clients can still reach the sessions they have. stdio clients are not counted: there is
one, and it started the process.

Every admission that succeeds must be released exactly once on every exit path; the
counters never go below zero, so a double release shows up as a warning, not as a cap
that silently grows.

Refusals are logged at WARNING at most once per ``WARN_EVERY`` seconds with a count, so
a flood of refused connections cannot also flood the log. The logger has the name the
admission path's lines have always had (``aggregator.fronts.admission``; the path itself is
``fronts.access``): one logger for who was let in and who not.

Pure bookkeeping: no trio, no I/O; it imports nothing of the project.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NamedTuple

log = logging.getLogger("aggregator.fronts.admission")
WARN_EVERY = 10.0  # seconds
# Retry-After (seconds) of what a draining proxy refuses: a balancer's other replicas take it
# at once; a lone proxy is back (restarted) or gone by then.
DRAINING_RETRY_AFTER = 1


class Refusal(NamedTuple):
    """Why a new session may not start: what to tell the client, and when to come back."""

    message: str
    reason: str  # "overloaded" (full) or "unavailable" (shutting down): data.reason of the error
    retry_after: int | None  # seconds, for a Retry-After header; None: none sent


class Admission:
    def __init__(self, max_connections: int, max_sessions: int, refuses_new: Callable[[bool], bool]) -> None:
        self.max_connections = max_connections
        self.max_sessions = max_sessions
        # Whether the hub refuses a new session now (shutting down), given whether it is movable.
        self._refuses_new = refuses_new
        self.connections = 0
        self.sessions = 0
        self._refused = {"connection": 0, "session": 0}  # since the last warning
        self._next_warning = {"connection": 0.0, "session": 0.0}

    # --- connections ----------------------------------------------------------------------

    def admit_connection(self) -> bool:
        """Count a new connection in; False (nothing counted) when the cap is reached."""
        if self.connections >= self.max_connections:
            self._note_refusal("connection", f"{self.connections} open, the limit (http.max_connections)")
            return False
        self.connections += 1
        return True

    def release_connection(self) -> None:
        if self.connections <= 0:
            log.warning("admission: a connection was released twice")
            return
        self.connections -= 1

    # --- sessions -------------------------------------------------------------------------

    def admit_session(self, *, movable: bool = False) -> Refusal | None:
        """Count a new session in, or say why not (nothing counted then). ``movable``: a
        session any replica serves once its id is sealed (a Streamable HTTP one)."""
        if self._refuses_new(movable):
            self._note_refusal("session", "shutting down")
            return Refusal(
                "The aggregator is shutting down and accepts no new sessions", "unavailable", DRAINING_RETRY_AFTER
            )
        if self.sessions >= self.max_sessions:
            self._note_refusal("session", f"{self.sessions} open, the limit (http.max_sessions)")
            return Refusal(f"Too many sessions (limit {self.max_sessions}); try again later", "overloaded", 5)
        self.sessions += 1
        return None

    def release_session(self) -> None:
        if self.sessions <= 0:
            log.warning("admission: a session was released twice")
            return
        self.sessions -= 1

    def _note_refusal(self, what: str, why: str) -> None:
        self._refused[what] += 1
        now = time.monotonic()
        if now >= self._next_warning[what]:
            log.warning("admission: refused %d new %s(s): %s", self._refused[what], what, why)
            self._refused[what] = 0
            self._next_warning[what] = now + WARN_EVERY
