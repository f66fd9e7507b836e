"""Who an access token names: the identity a session, its limits and what it keeps are tied to.

A principal is its issuer and subject, nothing else: the same user with a fresh token
(other scopes, a later expiry) is the same principal, so a session outlives a token
refresh, while another user presenting that session's id is someone else (404). Its scopes
and the profiles its claims match ride along, out of equality, hashing and repr (the
repr signs request states: ``core.era.request_state``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import attrs

from aggregator.config.model import ProfileConfig


@attrs.frozen(kw_only=True)
class Principal:
    issuer: str
    subject: str
    scopes: frozenset[str] = attrs.field(factory=frozenset, eq=False, repr=False)
    # The profiles whose ``match`` and ``scopes`` hold for this token, in the config's order.
    profiles: tuple[str, ...] = attrs.field(default=(), eq=False, repr=False)
    # When the token stops being good (its exp and the leeway, Unix time; inf: not known).
    expires: float = attrs.field(default=0.0, eq=False, repr=False)

    @property
    def profile(self) -> str:
        """The profile its session gets: the first whose rules its token matches, else the default."""
        return self.profiles[0] if self.profiles else "default"

    def __str__(self) -> str:
        return f"{self.subject} ({self.issuer})"


def who(principal: object) -> str:
    """A principal as logs and the status show it: an access token's subject and issuer,
    a static token's index (never the token), or "anonymous"."""
    if principal is None:
        return "anonymous"
    if isinstance(principal, int):
        return f"token {principal}"
    return str(principal)


def scopes_of(claims: Mapping[str, Any]) -> frozenset[str]:
    """A token's scopes: ``scope`` (a space-separated string, RFC 9068) or ``scp`` (a list)."""
    scope = claims.get("scope")
    if isinstance(scope, str):
        return frozenset(scope.split())
    scp = claims.get("scp")
    if isinstance(scp, list):
        return frozenset(item for item in scp if isinstance(item, str))
    if isinstance(scp, str):
        return frozenset(scp.split())
    return frozenset()


def matching_profiles(
    claims: Mapping[str, Any], scopes: frozenset[str], profiles: Mapping[str, ProfileConfig]
) -> tuple[str, ...]:
    """The profiles (in order) with a ``match`` or ``scopes`` that these claims satisfy: each
    claim of ``match`` holds one of its values (or, for a list claim, shares one), and every
    scope of ``scopes`` is granted."""
    found = []
    for name, profile in profiles.items():
        if not (profile.match or profile.scopes):
            continue
        if not set(profile.scopes) <= scopes:
            continue
        if all(_holds(claims.get(claim), wanted) for claim, wanted in profile.match.items()):
            found.append(name)
    return tuple(found)


def _holds(value: Any, wanted: tuple[str, ...]) -> bool:
    if isinstance(value, str):
        return value in wanted
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int | float):
        return str(value) in wanted
    if isinstance(value, list):
        return any(isinstance(item, str) and item in wanted for item in value)
    return False


class Rejection(NamedTuple):
    """Why a token does not get in: the HTTP status (401, 403, or 503 when the issuer's keys
    cannot be had), the OAuth error code (RFC 6750 section 3.1) and a description."""

    status: int
    error: str
    description: str
