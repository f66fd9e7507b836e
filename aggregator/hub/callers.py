"""Who each client session acts for upstream: the principal its front authenticated and
the OAuth access token it last showed, for the servers that act as each user
(``auth = "token-exchange"`` or ``"oauth"``, ``credentials``).

The token is kept in memory only, with its session, and goes nowhere but to the token
exchange of the server's authorization server: never upstream, never to a log, the status
or the metrics. A session that shows a fresh token of the same user (its client refreshed
it) has it used for the next exchange. A session with no access token (no ``[auth]``, a
static token, stdio) has no principal to act for: such a server refuses it with an error
saying why, never falling back to anyone else's credential.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from aggregator.config import ServerConfig

if TYPE_CHECKING:
    from aggregator.credentials.service import UserBearer, UserCredentials


@attrs.define(eq=False)
class Caller:
    """One client session's identity for servers that act as its user."""

    principal: Any  # the front's principal: an access token's (issuer, subject), a static token's index, None
    token: str | None = attrs.field(default=None, repr=False)
    # The credentials of this session's own connections: each reads the token when it exchanges.
    bearers: list[UserBearer] = attrs.field(factory=list, repr=False)

    def show(self, token: str | None) -> None:
        """The session's latest request carried ``token`` (None: none of an access token)."""
        if token is None or token == self.token:
            return
        self.token = token
        for bearer in self.bearers:
            bearer.subject_token = token


def user_principal(principal: Any) -> Any:
    """The credentials' ``Principal`` (issuer and subject) of an access token's principal,
    or None for any other (a static token's index, nobody)."""
    from aggregator.credentials.principal import Principal

    issuer, subject = getattr(principal, "issuer", None), getattr(principal, "subject", None)
    if isinstance(issuer, str) and isinstance(subject, str):
        return Principal(issuer=issuer, subject=subject)
    return None


def bearer_for(
    credentials: UserCredentials, caller: Caller | None, server: ServerConfig, capabilities: dict[str, Any]
) -> UserBearer:
    """The ``httpx.Auth`` of one session's own connection to ``server``: its user's
    credential on every request. ``capabilities``: its client's, which say how a grant the
    user must give is asked for (a URL-mode elicitation when declared)."""
    principal = user_principal(caller.principal) if caller is not None else None
    bearer = credentials.bearer(principal, server, caller.token if caller is not None else None)
    elicitation = capabilities.get("elicitation")
    bearer.url_elicitation = type(elicitation) is dict and type(elicitation.get("url")) is dict
    if caller is not None:
        caller.bearers.append(bearer)
    return bearer
