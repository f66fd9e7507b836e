"""A user's access token for a server from the vault, refreshed before it expires.

Single flight: one refresh at a time per (principal, server). Whoever comes while a refresh
runs waits for it and reads the row again, so two calls at once refresh once (a refresh
token used twice is, with rotation, a theft signal that revokes the whole grant). A refresh
the authorization server refuses (``invalid_grant``: revoked, expired) removes the row: the
user is asked to grant access again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import attrs
import trio

from aggregator.credentials.fetching import Fetcher
from aggregator.credentials.principal import Principal
from aggregator.credentials.problems import CredentialError
from aggregator.credentials.tokens import TokenRefused, request_tokens, revoke
from aggregator.credentials.vault import Grant, TokenVault

log = logging.getLogger(__name__)


class UserTokens:
    def __init__(
        self, vault: TokenVault, fetcher: Fetcher, *, margin: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.vault = vault
        self.fetcher = fetcher
        self.margin = margin
        self.clock = clock
        self._refreshing: dict[tuple[Principal, str], trio.Lock] = {}
        self.refreshes = 0  # refresh requests made (for tests and the status page)

    async def access_token(self, principal: Principal, server: str) -> str | None:
        """The user's access token for ``server``, fresh; None when there is none (or it
        cannot be renewed): the user must grant access."""
        grant = await self.vault.get(principal, server)
        if grant is None:
            return None
        if grant.tokens.fresh(self.clock(), self.margin):
            return grant.tokens.access_token
        key = (principal, server)
        lock = self._refreshing.setdefault(key, trio.Lock())
        try:
            async with lock:
                return await self._renewed(principal, server)
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._refreshing.pop(key, None)

    async def _renewed(self, principal: Principal, server: str) -> str | None:
        grant = await self.vault.get(principal, server)  # again: another call may have refreshed it
        if grant is None:
            return None
        now = self.clock()
        if grant.tokens.fresh(now, self.margin):
            return grant.tokens.access_token
        if grant.tokens.refresh_token is None:
            if grant.tokens.fresh(now, 0.0):
                return grant.tokens.access_token  # still good a little while; no way to renew it
            await self.vault.forget(principal, server)
            return None
        self.refreshes += 1
        form = {"grant_type": "refresh_token", "refresh_token": grant.tokens.refresh_token, "resource": grant.resource}
        if grant.tokens.scope:
            form["scope"] = grant.tokens.scope
        try:
            tokens = await request_tokens(
                self.fetcher,
                grant.token_endpoint,
                form,
                grant.client,
                f"refreshing the token of {principal} for server {server!r}",
                keep_refresh=grant.tokens.refresh_token,
                now=now,
            )
        except TokenRefused as exc:
            log.warning("server %s: %s; access must be granted again", server, exc)
            await self.vault.forget(principal, server)
            return None
        await self.vault.put(attrs.evolve(grant, tokens=tokens))
        log.info("server %s: refreshed the token of %s", server, principal)
        return tokens.access_token

    async def revoke(
        self, subject: str, server: str | None = None, issuer: str | None = None
    ) -> list[tuple[Grant, str]]:
        """Remove the grants of ``subject`` (for ``server``, or all) from the vault, and
        revoke their tokens where the authorization server has a revocation endpoint; each
        grant with what became of it."""
        done = []
        for grant in await self.vault.take(subject, server, issuer):
            outcome = "removed (the authorization server has no revocation endpoint)"
            if grant.revocation_endpoint is not None:
                try:
                    said = True
                    if grant.tokens.refresh_token is not None:  # revoking it revokes its access tokens too
                        said = await revoke(
                            self.fetcher,
                            grant.revocation_endpoint,
                            grant.tokens.refresh_token,
                            "refresh_token",
                            grant.client,
                        )
                    said = said and await revoke(
                        self.fetcher, grant.revocation_endpoint, grant.tokens.access_token, "access_token", grant.client
                    )
                    outcome = "removed and revoked" if said else "removed; the revocation endpoint refused"
                except CredentialError as exc:
                    outcome = f"removed; revoking failed: {exc}"
            done.append((grant, outcome))
        return done
