"""Who each client session acts for upstream: the principal its front authenticated and
the OAuth access token it last showed, for the servers that act as each user
(``auth = "token-exchange"`` or ``"oauth"``, ``credentials``).

The token is kept in memory only, with its session, and goes nowhere but to the token
exchange of the server's authorization server: never upstream, never to a log, the status
or the metrics. A session that shows a fresh token of the same user (its client refreshed
it) has it used for the next exchange. A session with no access token (no ``[auth]``, a
static token, stdio) has no principal to act for: such a server refuses it with an error
saying why, never falling back to anyone else's credential.

``Callers`` keeps them per session, the credentials ``serve`` opened, and which session was
asked by URL elicitation to grant access, so that it hears when the grant is given.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs

from aggregator.config import ServerConfig

if TYPE_CHECKING:
    from aggregator.credentials.problems import ConsentRequired
    from aggregator.credentials.service import UserBearer, UserCredentials

MAX_CONSENTS_WAITING = 1024  # clients remembered as asked for a grant (the oldest forgotten)
ELICITATION_COMPLETE = "notifications/elicitation/complete"


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


class Callers:
    """Each client session's ``Caller``, the users' credentials, and the sessions asked to
    grant access (elicitation id -> session, oldest first, at most ``MAX_CONSENTS_WAITING``)."""

    def __init__(self) -> None:
        self.by_key: dict[int, Caller] = {}
        self.credentials: UserCredentials | None = None
        self._consents: OrderedDict[str, int] = OrderedDict()

    def connected(self, key: int, principal: Any, token: str | None) -> None:
        """A session opened as ``principal`` showing ``token``; one with neither acts for nobody."""
        if principal is not None or token is not None:
            self.by_key[key] = Caller(principal, token)

    def forget(self, key: int) -> None:
        """The session is gone, and with it what it was asked."""
        self.by_key.pop(key, None)
        if self._consents:
            for elicitation in [e for e, asked in self._consents.items() if asked == key]:
                del self._consents[elicitation]

    def use(self, credentials: UserCredentials, tell: Callable[[int, dict[str, Any]], None]) -> None:
        """Serve users' credentials; ``tell(session, notification)`` sends a session that was
        asked by URL elicitation to grant access, once the user granted it (the tokens are
        in the vault), that the elicitation is complete: it may retry its call."""
        self.credentials = credentials
        if credentials.flows is not None:
            credentials.flows.listeners.append(partial(self._given, tell))

    def show(self, key: int, token: str | None) -> None:
        """Session ``key``'s request carried ``token``, its OAuth access token (maybe refreshed
        since). Every HTTP request tells it: a session that acts for nobody costs one lookup."""
        caller = self.by_key.get(key)
        if caller is not None:
            caller.show(token)

    def bearer(self, key: int, server: ServerConfig, capabilities: dict[str, Any]) -> UserBearer | None:
        """The credential of session ``key``'s own connection to ``server``: None for a
        server with static headers (or without users' credentials)."""
        if server.auth == "static" or self.credentials is None:
            return None
        bearer = bearer_for(self.credentials, self.by_key.get(key), server, capabilities)
        if bearer.url_elicitation:
            bearer.on_consent = partial(self._asked, key)
        return bearer

    def _asked(self, key: int, asked: ConsentRequired) -> None:
        self._consents[asked.elicitation_id] = key
        while len(self._consents) > MAX_CONSENTS_WAITING:
            self._consents.popitem(last=False)

    def _given(self, tell: Callable[[int, dict[str, Any]], None], pending: Any) -> None:
        key = self._consents.pop(pending.elicitation_id, None)
        if key is not None:
            params = {"elicitationId": pending.elicitation_id}
            tell(key, {"jsonrpc": "2.0", "method": ELICITATION_COMPLETE, "params": params})
