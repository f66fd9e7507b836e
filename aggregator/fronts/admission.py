"""Who gets in: the admission path of every network front.

The path a client takes in, the same on the Streamable HTTP, legacy SSE and WebSocket
fronts: Host and Origin against their allowlists, then the bearer token (``check_access``,
awaited: an access token may need its issuer's keys fetched); the token names a principal
(a static token's index, or an access token's ``Principal``), and the principal and the profile the
path names give the session's profile (``choose_profile``); ``admit`` is both steps for a
request that also names a path. A front only turns a ``Denial`` into its own kind of
answer (an HTTP response, a rejected WebSocket handshake). The rules themselves are the
``AccessPolicy``'s (``aggregator.fronts.access``).

The caps every front counts against are the hub's (``aggregator.hub.caps.Admission``).

Pure bookkeeping apart from the token check, whose I/O is the verifier's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NamedTuple

from aggregator.fronts.authorization import Principal

if TYPE_CHECKING:
    from collections.abc import Mapping

    from aggregator.fronts.access import AccessPolicy


class Admitted(NamedTuple):
    """Who a request admitted by the access rules is, and the profile its session gets."""

    principal: int | Principal | None  # which configured token it carries, whose access token (None without)
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


async def check_access(access: AccessPolicy, headers: Mapping[str, str], target: str = "") -> Denial | None:
    """The first step on every front, before anything else: Host (421), Origin (403), then
    the bearer token when tokens are configured (401; 403 for an access token without a
    required scope; 503 when its issuer's keys cannot be had). ``target``: the request's
    path and query (a token there is refused)."""
    refused = await access.check(headers, target)
    return None if refused is None else Denial(*refused)


def choose_profile(access: AccessPolicy, headers: Mapping[str, str], named: str) -> Admitted | Denial:
    """The principal a request's token names and the profile its session gets: the one the
    path names (``named``, "" for none), if the token (when tokens are used) gives it (else
    403), or the token's own. An access token gives every profile whose rules its claims
    match. Runs after ``check_access``; a token not known good by then (its cached check
    expired meanwhile) is a 401, never the default profile."""
    principal = access.principal(headers)
    if principal is None and access.requires_token:
        return Denial(*access.unauthenticated())
    profile = access.profile(principal)
    if named:
        if principal is not None and profile != named:
            if not (isinstance(principal, Principal) and named in principal.profiles):
                return Denial(403, f"this token does not give access to profile {named!r}", [], logging.DEBUG)
        profile = named
    return Admitted(principal, profile)


async def admit(access: AccessPolicy, headers: Mapping[str, str], target: str) -> Admitted | Denial:
    """The whole path for a request that opens a session on the MCP endpoint's path
    (``target``, ``/mcp`` or ``/mcp/<profile>``): the access check, then 404 for a path
    that names no endpoint or profile, then the profile."""
    denial = await check_access(access, headers, target)
    if denial is not None:
        return denial
    named = access.named_profile(target)
    if named is None:
        return Denial(404, f"not found; the MCP endpoint is {access.endpoint}", [], logging.DEBUG)
    return choose_profile(access, headers, named)
