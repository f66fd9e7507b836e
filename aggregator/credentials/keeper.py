"""A user's access token for a server from the vault, refreshed before it expires.

Single flight: one refresh at a time per (principal, server), in this process and (with the
grants in the shared store) across replicas (``vault.refreshing``). Whoever comes while a
refresh runs waits for it and reads the row again, so two calls at once refresh once (a refresh
token used twice is, with rotation, a theft signal that revokes the whole grant). A refresh
the authorization server refuses (``invalid_grant``: revoked, expired) removes the row: the
user is asked to grant access again.

A refresh the authorization server answered is never lost to a vault that cannot store it
(a full disk, a locked file): with rotation the old refresh token is dead, so dropping the
answer would make the user grant access again. The refreshed grant is kept in memory for
its (principal, server) and served from there; storing it is tried ``STORE_ATTEMPTS``
times at once, then again on a later use of it, at most every ``STORE_RETRY_SECONDS``,
until the vault takes it. One such grant per (principal, server), never more: what the
vault holds bounds what waits here. A grant removed from the vault meanwhile (revoked)
is dropped, never written back.
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
from aggregator.credentials.shared import Vault
from aggregator.credentials.tokens import TokenRefused, request_tokens, revoke
from aggregator.credentials.vault import Grant, VaultFailed

log = logging.getLogger(__name__)

STORE_ATTEMPTS = 3  # tries to store a refreshed grant at once, with STORE_PAUSE between them
STORE_PAUSE = 0.2  # seconds (doubling)
STORE_RETRY_SECONDS = 10.0  # then at most this often, on its use


@attrs.define(eq=False)
class _Unsaved:
    """A refreshed grant the vault could not take yet, and when storing it is tried again."""

    grant: Grant
    retry_at: float


class UserTokens:
    def __init__(
        self, vault: Vault, fetcher: Fetcher, *, margin: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.vault = vault
        self.fetcher = fetcher
        self.margin = margin
        self.clock = clock
        self._refreshing: dict[tuple[Principal, str], trio.Lock] = {}
        self._unsaved: dict[tuple[Principal, str], _Unsaved] = {}  # refreshed, not in the vault yet
        self.refreshes = 0  # refresh requests made (for tests and the status page)

    async def access_token(self, principal: Principal, server: str) -> str | None:
        """The user's access token for ``server``, fresh; None when there is none (or it
        cannot be renewed): the user must grant access."""
        key = (principal, server)
        if key not in self._unsaved:  # (one kept in memory is read, and stored, under the lock)
            grant = await self.vault.get(principal, server)
            if grant is None:
                return None
            if grant.tokens.fresh(self.clock(), self.margin):
                return grant.tokens.access_token
        lock = self._refreshing.setdefault(key, trio.Lock())
        try:
            async with lock, self.vault.refreshing(principal, server):
                return await self._renewed(principal, server)
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._refreshing.pop(key, None)

    async def _renewed(self, principal: Principal, server: str) -> str | None:
        grant = await self._current(principal, server)  # again: another call may have refreshed it
        if grant is None:
            return None
        now = self.clock()
        if grant.tokens.fresh(now, self.margin):
            return grant.tokens.access_token
        if grant.tokens.refresh_token is None:
            if grant.tokens.fresh(now, 0.0):
                return grant.tokens.access_token  # still good a little while; no way to renew it
            await self.forget(principal, server)
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
            await self.forget(principal, server)
            return None
        log.info("server %s: refreshed the token of %s", server, principal)
        await self._keep(attrs.evolve(grant, tokens=tokens))
        return tokens.access_token

    async def forget(self, principal: Principal, server: str) -> None:
        """Remove the user's grant for ``server``: from the vault, and from memory."""
        self._unsaved.pop((principal, server), None)
        await self.vault.forget(principal, server)

    async def _current(self, principal: Principal, server: str) -> Grant | None:
        """The user's grant for ``server``: the one kept in memory (stored first, when its
        retry is due and the vault takes it now), else the vault's."""
        key = (principal, server)
        kept = self._unsaved.get(key)
        if kept is None:
            return await self.vault.get(principal, server)
        if self.clock() >= kept.retry_at:
            try:
                if await self.vault.get(principal, server) is None:  # removed meanwhile: revoked
                    del self._unsaved[key]
                    return None
                await self.vault.put(kept.grant)
            except VaultFailed:
                kept.retry_at = self.clock() + STORE_RETRY_SECONDS
                log.warning(
                    "server %s: the refreshed token of %s is still not stored (the vault fails); kept in memory",
                    server,
                    principal,
                )
            else:
                del self._unsaved[key]
                log.info("server %s: the refreshed token of %s is stored now", server, principal)
        return kept.grant

    async def _keep(self, grant: Grant) -> None:
        """Store a refreshed grant; one the vault does not take is kept in memory, to be
        served from there and stored later (its old refresh token is dead by now)."""
        key = (grant.principal, grant.server)
        pause = STORE_PAUSE
        for attempt in range(STORE_ATTEMPTS):
            try:
                await self.vault.put(grant)
            except VaultFailed:
                if attempt + 1 < STORE_ATTEMPTS:
                    await trio.sleep(pause)
                    pause *= 2
                continue
            self._unsaved.pop(key, None)
            return
        self._unsaved[key] = _Unsaved(grant, self.clock() + STORE_RETRY_SECONDS)
        log.error(
            "server %s: the refreshed token of %s cannot be stored (the vault fails); kept in memory,"
            " stored once the vault takes it",
            grant.server,
            grant.principal,
        )

    async def revoke(
        self, subject: str, server: str | None = None, issuer: str | None = None
    ) -> list[tuple[Grant, str]]:
        """Remove the grants of ``subject`` (for ``server``, or all) from the vault, and
        revoke their tokens where the authorization server has a revocation endpoint; each
        grant with what became of it."""
        for principal, name in list(self._unsaved):  # gone from memory too, stored or not
            if principal.subject == subject and server in (None, name) and issuer in (None, principal.issuer):
                del self._unsaved[(principal, name)]
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
