"""Users' grants kept in the replicas' shared store (``[cluster] store``) instead of the
vault file, so that a grant given through one replica is used by every one, and a revoke is
seen by all of them at once.

``SharedStore`` is what this package needs of the store (``cluster.store.Store`` is one;
this package may not import it: it sits on the same floor). ``StoreVault`` has the methods
of ``vault.TokenVault``:

- the rows are the same as in the file: the access token, refresh token and client secret
  sealed with AES-256-GCM under the vault key (``credentials.vault_key``), the row's
  identity as associated data, so the store never holds a token in the clear. They are the
  fields of one hash, ``<prefix>:vault``, each named by the SHA-256 of (issuer, subject,
  server); the hash expires ``VAULT_SECONDS`` after its last write (a user who has not
  used any server for that long grants access again).
- nothing is kept in memory: each use of a grant reads its row (one ``HGET``), so a
  revoke through any replica, or ``aggregator auth revoke``, holds everywhere at once.
- one refresh per row across replicas: ``refreshing`` holds ``<prefix>:vault-refresh:<row>``
  (``SET NX PX``, expiring after ``lock_seconds`` should its holder die); a replica that
  finds it held waits for it, then reads the row again (``keeper``), so a rotated refresh
  token is never lost to a race. Removing a row waits for its refresh the same way, so a
  refresh cannot write back a row just revoked.

A store that cannot be reached fails that one call (``VaultFailed``: the user is told, the
store's outage is logged by the store, once).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol, TypeAlias

import orjson
import trio
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from aggregator.core.settings import KEY_ID_BYTES, SigningKeys
from aggregator.credentials.principal import Principal
from aggregator.credentials.problems import CredentialError
from aggregator.credentials.vault import (
    KEY_SETTING,
    Entry,
    ForeignSeal,
    Grant,
    Sealer,
    TokenVault,
    VaultFailed,
    _grant,
    _sealed_row,
)
from aggregator.errors import StoreError

log = logging.getLogger(__name__)
VAULT = "vault"
LOCKS = "vault-refresh:"
VAULT_SECONDS = 400 * 86400.0  # the rows' hash expires this long after its last write
POLL_SECONDS = 0.05  # how often a replica waiting for another's refresh looks again
_FIELDS = (
    "issuer",
    "subject",
    "server",
    "sealed",
    "expires_at",
    "scope",
    "token_endpoint",
    "revocation_endpoint",
    "client_id",
    "resource",
    "updated_at",
)


class SharedStore(Protocol):
    """What this package asks of the replicas' shared store (``cluster.store.Store``)."""

    async def get(self, key: str) -> bytes | None: ...
    async def set(self, key: str, value: bytes, *, ttl: float) -> None: ...
    async def set_new(self, key: str, value: bytes, *, ttl: float) -> bool: ...
    async def take(self, key: str) -> bytes | None: ...
    async def delete(self, key: str) -> None: ...
    async def hget(self, key: str, field: str) -> bytes | None: ...
    async def hset(self, key: str, fields: Mapping[str, bytes], *, ttl: float) -> None: ...
    async def hgetall(self, key: str) -> dict[str, bytes]: ...
    async def hdel(self, key: str, fields: Sequence[str]) -> int: ...
    async def incrby(self, key: str, amount: int, *, ttl: float) -> int: ...


def row_name(principal: Principal, server: str) -> str:
    """The field of a (principal, server) row: what it names cannot be read from it."""
    return hashlib.sha256(orjson.dumps([principal.issuer, principal.subject, server])).hexdigest()


class StoreVault:
    """The vault's rows in the shared store (the methods of ``vault.TokenVault``)."""

    path = "the shared store ([cluster] store)"  # where the rows are, for messages

    def __init__(self, store: SharedStore, key: bytes, *, lock_seconds: float) -> None:
        self.store = store
        self._sealer = Sealer(key)
        self.lock_seconds = lock_seconds
        self._unopened_warned: set[str] = set()

    async def _call(self, work: Any) -> Any:
        try:
            return await work
        except StoreError as exc:
            log.error("vault: users' grants in the shared store cannot be used now: %s", exc)
            raise VaultFailed("the proxy's shared store cannot be used now (its log says why)") from None

    async def aclose(self) -> None:
        pass

    async def get(self, principal: Principal, server: str) -> Grant | None:
        raw = await self._call(self.store.hget(VAULT, row_name(principal, server)))
        if raw is None:
            return None
        try:
            return _grant(self._sealer, _row(raw))
        except ForeignSeal:
            if server not in self._unopened_warned:
                self._unopened_warned.add(server)
                log.warning(
                    "server %s: the shared store holds users' tokens sealed with another key than %s (first: %s);"
                    " they are treated as no grant, and those users are asked again",
                    server,
                    KEY_SETTING,
                    principal,
                )
            return None

    async def put(self, grant: Grant) -> None:
        row = dict(zip(_FIELDS, _sealed_row(self._sealer, grant), strict=True))
        row["sealed"] = base64.b64encode(row["sealed"]).decode("ascii")
        fields = {row_name(grant.principal, grant.server): orjson.dumps(row)}
        await self._call(self.store.hset(VAULT, fields, ttl=VAULT_SECONDS))

    async def forget(self, principal: Principal, server: str) -> None:
        await self._call(self.store.hdel(VAULT, [row_name(principal, server)]))

    async def take(self, subject: str, server: str | None = None, issuer: str | None = None) -> list[Grant]:
        """Remove the rows of users named ``subject`` (at ``issuer``, if given), for
        ``server`` or all servers, each once its refresh (if one runs) is over; the grants
        they held (to revoke them)."""
        grants = []
        for name, raw in sorted((await self._call(self.store.hgetall(VAULT))).items()):
            row = _row(raw)
            if row[1] != subject or (server is not None and row[2] != server) or (issuer and row[0] != issuer):
                continue
            async with self._held(name):
                raw = await self._call(self.store.hget(VAULT, name))  # as the refresh left it
                if raw is None or not await self._call(self.store.hdel(VAULT, [name])):
                    continue
            try:
                grants.append(_grant(self._sealer, _row(raw)))
            except CredentialError as exc:  # removed all the same; it cannot be revoked
                log.warning("vault: %s", exc)
        return grants

    async def entries(self) -> list[Entry]:
        entries = []
        for raw in (await self._call(self.store.hgetall(VAULT))).values():
            issuer, subject, server, sealed, expires_at, scope, *_, updated_at = _row(raw)
            principal = Principal(issuer=issuer, subject=subject)
            entries.append(Entry.of(self._sealer, principal, server, sealed, expires_at, scope, updated_at))
        return sorted(entries, key=lambda entry: (entry.principal.subject, entry.principal.issuer, entry.server))

    def refreshing(self, principal: Principal, server: str) -> AbstractAsyncContextManager[None]:
        """Held while this replica refreshes the row: no other replica refreshes it
        meanwhile (each waits, then reads the row again)."""
        return self._held(row_name(principal, server))

    @asynccontextmanager
    async def _held(self, name: str) -> AsyncIterator[None]:
        lock, mine = LOCKS + name, secrets.token_bytes(16)
        # Bounded: a holder that died lets go when its lock expires, within lock_seconds.
        with trio.move_on_after(2 * self.lock_seconds) as waited:
            while True:  # (no event to wait on: the holder is in another process)
                if await self._call(self.store.set_new(lock, mine, ttl=self.lock_seconds)):
                    break
                await trio.sleep(POLL_SECONDS)
        if waited.cancelled_caught:
            raise VaultFailed("another replica is renewing this grant and has not finished; try again")
        try:
            yield
        finally:
            with trio.CancelScope(shield=True):
                try:  # (another's lock only if ours expired meanwhile: a refresh past its bound)
                    if await self.store.get(lock) == mine:
                        await self.store.delete(lock)
                except StoreError:
                    pass  # it expires


def _row(raw: bytes) -> tuple[Any, ...]:
    row = orjson.loads(raw)
    row["sealed"] = base64.b64decode(row["sealed"])
    return tuple(row[field] for field in _FIELDS)


class SharedFlows:
    """Authorization flows and waiting sign-ins in the shared store, so that the link, the
    sign-in's return and the callback are served by any replica.

    Each record (what the callback needs: the PKCE verifier, the client and its secret, the
    browser it was bound to) is sealed with AES-256-GCM under the cluster key ring's
    ``"flows"`` key (the first seals, each opens the records that name it by key id), its
    store key as associated data, and expires with the flow (``credentials.consent_timeout``).
    Records are named by the SHA-256 of their state, never by the state itself. A record is
    used once: ``take`` gets and deletes it in one command (``GETDEL``), so of two callbacks
    bringing the same state to two replicas, one wins."""

    def __init__(self, store: SharedStore, keys: SigningKeys) -> None:
        self.store = store
        self.keys = keys
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.keys}

    async def _call(self, work: Any) -> Any:
        try:
            return await work
        except StoreError as exc:
            log.error("oauth: authorization flows in the shared store cannot be used now: %s", exc)
            raise CredentialError("the proxy's shared store cannot be used now; try again shortly") from None

    def _seal(self, key: str, record: dict[str, Any]) -> bytes:
        key_id, _ = self.keys.signing
        nonce = secrets.token_bytes(12)
        return key_id + nonce + self._ciphers[key_id].encrypt(nonce, orjson.dumps(record), key.encode())

    def _open(self, key: str, sealed: bytes | None) -> dict[str, Any] | None:
        if sealed is None:
            return None
        cipher = self._ciphers.get(sealed[:KEY_ID_BYTES])
        if cipher is None:  # sealed with a key since removed: as if expired
            return None
        start = KEY_ID_BYTES
        try:
            plain = cipher.decrypt(sealed[start : start + 12], sealed[start + 12 :], key.encode())
        except InvalidTag:
            return None
        record = orjson.loads(plain)
        return record if isinstance(record, dict) else None

    async def put(self, key: str, record: dict[str, Any], *, ttl: float) -> None:
        await self._call(self.store.set(key, self._seal(key, record), ttl=ttl))

    async def get(self, key: str) -> dict[str, Any] | None:
        return self._open(key, await self._call(self.store.get(key)))

    async def take(self, key: str) -> dict[str, Any] | None:
        """The record, deleted in the same command: one taker gets it."""
        return self._open(key, await self._call(self.store.take(key)))

    async def put_text(self, key: str, text: str, *, ttl: float) -> None:
        """A value that is no secret (a flow's name to its state's hash, a bound browser's hash)."""
        await self._call(self.store.set(key, text.encode(), ttl=ttl))

    async def get_text(self, key: str) -> str | None:
        found = await self._call(self.store.get(key))
        return None if found is None else bytes(found).decode("utf-8", "replace")

    async def take_text(self, key: str) -> str | None:
        found = await self._call(self.store.take(key))
        return None if found is None else bytes(found).decode("utf-8", "replace")

    async def delete(self, key: str) -> None:
        await self._call(self.store.delete(key))

    async def count(self, key: str, *, ttl: float) -> int:
        """One more under ``key`` (its expiry set when it is created): a bound on what one
        user begins."""
        return int(await self._call(self.store.incrby(key, 1, ttl=ttl)))


Vault: TypeAlias = TokenVault | StoreVault  # the file, or the shared store
