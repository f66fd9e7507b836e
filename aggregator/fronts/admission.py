"""Who gets in: the admission path of every network front, the connection and session caps.

The path a client takes in, the same on the Streamable HTTP, legacy SSE and WebSocket
fronts: Host and Origin against their allowlists, then the bearer token
(``check_access``); the token names a principal, and the principal and the profile the
path names give the session's profile (``choose_profile``); ``admit`` is both steps for a
request that also names a path. A front only turns a ``Denial`` into its own kind of
answer (an HTTP response, a rejected WebSocket handshake). The rules themselves are the
``AccessPolicy``'s (``aggregator.fronts.access``).

One ``Admission`` per hub, shared by the Streamable HTTP, legacy SSE and WebSocket
endpoints, so each cap is one number however a client arrives (a cap counted per
transport would let in three times as many). While the hub drains for shutdown no new
session is admitted; connections are, so that clients can still reach the sessions they
have. stdio clients are not counted: there is one, and it started the process.

Every admission that succeeds must be released exactly once on every exit path; the
counters never go below zero, so a double release shows up as a warning, not as a cap
that silently grows.

Refusals are logged at WARNING at most once per ``WARN_EVERY`` seconds with a count, so
a flood of refused connections cannot also flood the log.

Pure bookkeeping: no trio, no I/O.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Mapping

    from aggregator.fronts.access import AccessPolicy

log = logging.getLogger(__name__)
WARN_EVERY = 10.0  # seconds


class Admitted(NamedTuple):
    """Who a request admitted by the access rules is, and the profile its session gets."""

    principal: int | None  # which configured token it carries (None without tokens)
    profile: str


class Denial(NamedTuple):
    """Why a request may not get in: an HTTP status, a reason for the client, extra headers,
    and the level every front logs it at (``level``): WARNING for what the access check
    refuses (a foreign Host or Origin, a missing or wrong token: someone may be probing),
    DEBUG for a client at the wrong place (a path that is no endpoint, a profile its token
    does not give), which says nothing about security and would only fill the log."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    level: int = logging.WARNING


def check_access(access: AccessPolicy, headers: Mapping[str, str]) -> Denial | None:
    """The first step on every front, before anything else: Host (421), Origin (403), then
    the bearer token when tokens are configured (401)."""
    refused = access.refusal(headers)
    return None if refused is None else Denial(*refused)


def choose_profile(access: AccessPolicy, headers: Mapping[str, str], named: str) -> Admitted | Denial:
    """The principal a request's token names and the profile its session gets: the one the
    path names (``named``, "" for none), if the token (when tokens are used) gives it (else
    403), or the token's own."""
    principal = access.principal(headers)
    profile = access.profile(principal)
    if named:
        if principal is not None and profile != named:
            return Denial(403, f"this token does not give access to profile {named!r}", [], logging.DEBUG)
        profile = named
    return Admitted(principal, profile)


def admit(access: AccessPolicy, headers: Mapping[str, str], target: str) -> Admitted | Denial:
    """The whole path for a request that opens a session on the MCP endpoint's path
    (``target``, ``/mcp`` or ``/mcp/<profile>``): the access check, then 404 for a path
    that names no endpoint or profile, then the profile."""
    denial = check_access(access, headers)
    if denial is not None:
        return denial
    named = access.named_profile(target)
    if named is None:
        return Denial(404, f"not found; the MCP endpoint is {access.endpoint}", [], logging.DEBUG)
    return choose_profile(access, headers, named)


class Refusal(NamedTuple):
    """Why a new session may not start: what to tell the client, and when to come back."""

    message: str
    reason: str  # "overloaded" (full) or "unavailable" (shutting down): data.reason of the error
    retry_after: int | None  # seconds, for a Retry-After header; None: do not come back here


class Admission:
    def __init__(self, max_connections: int, max_sessions: int, draining: Callable[[], bool]) -> None:
        self.max_connections = max_connections
        self.max_sessions = max_sessions
        self._draining = draining
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

    def admit_session(self) -> Refusal | None:
        """Count a new session in, or say why not (nothing counted then)."""
        if self._draining():
            self._note_refusal("session", "shutting down")
            return Refusal("The aggregator is shutting down and accepts no new sessions", "unavailable", None)
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
