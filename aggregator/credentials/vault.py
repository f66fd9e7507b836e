"""The token vault: each user's tokens for each server, in an SQLite file, their secrets
encrypted.

One row per (principal, server): the issuer and subject of the user, the server's name, and
what the tokens came with (expiry, scope, the token and revocation endpoints, the client id,
the resource). The access token, refresh token and client secret of a row are sealed
together with AES-256-GCM under the vault key, with the row's identity as associated data:
a sealed value copied into another row does not open. What ``entries`` lists (for
``aggregator auth list``) is never secret.

The vault is checked when it is opened: a file that cannot be opened, is no SQLite
database or cannot be written (a full disk) is refused with its path, and one made with
another key than ``credentials.vault_key`` is refused naming that setting (a check value
sealed under the key when the vault was made). Later, a call that fails on the file is
logged with its path and fails that one call (``VaultFailed``), never the proxy.

A row that does not open with the vault key all the same (sealed under another key than
the check value, or moved from another row) is no grant: ``get`` answers None, so the user
is asked again and the new grant replaces the row; the first such row of each server is
logged as a warning naming the file and the key setting. ``entries`` marks such rows and ``unopened`` counts them
(``aggregator check`` warns).

SQLite blocks, so every call runs in a worker thread (``trio.to_thread.run_sync``), one at
a time (a limiter of one): the event loop never waits on the disk. The file is created
readable by its owner only.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import orjson
import trio
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from aggregator.credentials.principal import Principal
from aggregator.credentials.problems import CredentialError
from aggregator.credentials.tokens import ClientCredentials, TokenSet

log = logging.getLogger(__name__)
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS grants (
    issuer TEXT NOT NULL,
    subject TEXT NOT NULL,
    server TEXT NOT NULL,
    sealed BLOB NOT NULL,
    expires_at REAL,
    scope TEXT NOT NULL,
    token_endpoint TEXT NOT NULL,
    revocation_endpoint TEXT,
    client_id TEXT NOT NULL,
    resource TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (issuer, subject, server)
)
"""
# One row: a known value sealed under the vault key when the vault was made, so a vault
# opened with another key is refused at start rather than failing user by user.
_KEY_CHECK_SCHEMA = "CREATE TABLE IF NOT EXISTS key_check (id INTEGER PRIMARY KEY CHECK (id = 1), sealed BLOB NOT NULL)"
_KEY_CHECK = b'["the vault key check"]'
KEY_SETTING = "credentials.vault_key (or AGGREGATOR_VAULT_KEY)"
_COLUMNS = (
    "issuer, subject, server, sealed, expires_at, scope, token_endpoint, revocation_endpoint, client_id, resource"
)


@attrs.frozen(kw_only=True)
class Grant:
    """What a user granted the proxy for one server, and where its tokens are renewed."""

    principal: Principal
    server: str
    tokens: TokenSet
    token_endpoint: str
    revocation_endpoint: str | None = None
    client: ClientCredentials
    resource: str


@attrs.frozen(kw_only=True)
class Entry:
    """A row as ``aggregator auth list`` shows it: nothing secret."""

    principal: Principal
    server: str
    expires_at: float | None
    scope: str
    refreshable: bool
    updated_at: float
    opens: bool = True  # False: sealed with another key (or moved), no grant any more

    @classmethod
    def of(
        cls,
        sealer: Sealer,
        principal: Principal,
        server: str,
        sealed: bytes,
        expires_at: float | None,
        scope: str,
        updated_at: float,
    ) -> Entry:
        """A row as listed, from its fields: whether its secrets open is tried, never shown."""
        try:
            refreshable, opens = sealer.open(principal, server, sealed).get("refresh_token") is not None, True
        except CredentialError:
            refreshable = opens = False
        return cls(
            principal=principal,
            server=server,
            expires_at=expires_at,
            scope=scope,
            refreshable=refreshable,
            updated_at=updated_at,
            opens=opens,
        )


class ForeignSeal(CredentialError):
    """A row's secrets do not open with the vault key: sealed with another, or moved."""


class VaultFailed(CredentialError):
    """The vault file could not be read or written (a full disk, a file changed or removed
    under the proxy): what a user is told, without the file's path; the log names it."""


class Sealer:
    """AES-256-GCM over a row's secrets, bound to the row's identity."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("the vault key must be 32 bytes")
        self._aead = AESGCM(key)

    @staticmethod
    def _identity(principal: Principal, server: str) -> bytes:
        return orjson.dumps([principal.issuer, principal.subject, server])

    def seal(self, principal: Principal, server: str, secrets: dict[str, str | None]) -> bytes:
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, orjson.dumps(secrets), self._identity(principal, server))

    def seal_check(self) -> bytes:
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, _KEY_CHECK, _KEY_CHECK)

    def opens_check(self, sealed: bytes) -> bool:
        try:
            return self._aead.decrypt(sealed[:12], sealed[12:], _KEY_CHECK) == _KEY_CHECK
        except InvalidTag:
            return False

    def open(self, principal: Principal, server: str, sealed: bytes) -> dict[str, Any]:
        try:
            plain = self._aead.decrypt(sealed[:12], sealed[12:], self._identity(principal, server))
        except InvalidTag:
            raise ForeignSeal(
                f"the vault's tokens of {principal} for server {server!r} do not open with this vault key"
                " (another key, or the file was changed)"
            ) from None
        value = orjson.loads(plain)
        assert isinstance(value, dict)
        return value


class TokenVault:
    """The vault file. Open it with ``TokenVault.open`` (async); ``aclose`` when done."""

    def __init__(self, connection: sqlite3.Connection, sealer: Sealer, path: str) -> None:
        self._db = connection
        self._sealer = sealer
        self.path = path
        self._limiter = trio.CapacityLimiter(1)  # one statement at a time, in order
        self._unopened_warned: set[str] = set()  # servers with a row that did not open, logged once

    @classmethod
    async def open(cls, path: str, key: bytes) -> TokenVault:
        """The vault at ``path`` (created if missing), its key checked; raises CredentialError
        naming the file (and the key setting, for another key)."""
        sealer = Sealer(key)
        connection = await trio.to_thread.run_sync(_connect, path, sealer)
        return cls(connection, sealer, path)

    @staticmethod
    def check(path: str, key: bytes | None = None) -> None:
        """Raise CredentialError unless the vault file at ``path`` can be opened (created if
        missing), holds the vault's table and, given ``key``, was sealed with it (blocks:
        for a command, before trio runs)."""
        _connect(path, Sealer(key) if key is not None else None).close()

    async def _run(self, work: Callable[[], T]) -> T:
        """``work`` on the vault's thread; a file that fails to read or write (a full disk,
        a file changed under the proxy) is logged with its path and raised as
        ``VaultFailed``: that one call fails, and whoever made it tells its own user."""
        try:
            return await trio.to_thread.run_sync(work, limiter=self._limiter)
        except (sqlite3.Error, OSError) as exc:
            log.error("vault: the token vault %s (credentials.vault) failed: %s", self.path, exc)
            raise VaultFailed("the proxy's token vault cannot be used now (its log says why)") from None

    async def aclose(self) -> None:
        await self._run(self._db.close)

    async def get(self, principal: Principal, server: str) -> Grant | None:
        def read() -> Any:
            return self._db.execute(
                f"SELECT {_COLUMNS} FROM grants WHERE issuer = ? AND subject = ? AND server = ?",
                (principal.issuer, principal.subject, server),
            ).fetchone()

        row = await self._run(read)
        if row is None:
            return None
        try:
            return self._grant(row)
        except ForeignSeal:
            # No grant: the user is asked again, and what they grant replaces the row.
            if server not in self._unopened_warned:
                self._unopened_warned.add(server)
                log.warning(
                    "server %s: the token vault %s holds users' tokens sealed with another key than"
                    " %s (first: %s); they are treated as no grant, and those users are asked again",
                    server,
                    self.path,
                    KEY_SETTING,
                    principal,
                )
            return None

    async def put(self, grant: Grant) -> None:
        values = _sealed_row(self._sealer, grant)

        def write() -> None:
            with self._db:
                self._db.execute(
                    f"INSERT OR REPLACE INTO grants ({_COLUMNS}, updated_at) VALUES ({'?, ' * 10}?)", values
                )

        await self._run(write)

    async def take(self, subject: str, server: str | None = None, issuer: str | None = None) -> list[Grant]:
        """Remove the rows of users named ``subject`` (at ``issuer``, if given), for
        ``server`` or all servers; the grants they held (to revoke them)."""
        where = (
            "subject = ?" + (" AND server = ?" if server is not None else "") + (" AND issuer = ?" if issuer else "")
        )
        args = (subject, *((server,) if server is not None else ()), *((issuer,) if issuer else ()))

        def remove() -> list[Any]:
            with self._db:
                rows = self._db.execute(f"SELECT {_COLUMNS} FROM grants WHERE {where}", args).fetchall()
                self._db.execute(f"DELETE FROM grants WHERE {where}", args)
            return rows

        grants = []
        for row in await self._run(remove):
            try:
                grants.append(self._grant(row))
            except CredentialError as exc:  # removed all the same; it cannot be revoked
                log.warning("vault: %s", exc)
        return grants

    async def forget(self, principal: Principal, server: str) -> None:
        """Remove one row (its tokens no longer work)."""

        def remove() -> None:
            with self._db:
                self._db.execute(
                    "DELETE FROM grants WHERE issuer = ? AND subject = ? AND server = ?",
                    (principal.issuer, principal.subject, server),
                )

        await self._run(remove)

    async def entries(self) -> list[Entry]:
        def read() -> list[Any]:
            return self._db.execute(
                "SELECT issuer, subject, server, expires_at, scope, sealed, updated_at FROM grants"
                " ORDER BY subject, issuer, server"
            ).fetchall()

        return [
            Entry.of(
                self._sealer, Principal(issuer=issuer, subject=subject), server, sealed, expires_at, scope, updated_at
            )
            for issuer, subject, server, expires_at, scope, sealed, updated_at in await self._run(read)
        ]

    @staticmethod
    def unopened(path: str, key: bytes) -> int:
        """How many rows of the vault at ``path`` do not open with ``key`` (blocks: for a
        command, before trio runs; 0 for a vault that does not exist yet)."""
        if not os.path.exists(path):
            return 0
        sealer = Sealer(key)
        connection = _connect(path)
        try:
            rows = connection.execute("SELECT issuer, subject, server, sealed FROM grants").fetchall()
        finally:
            connection.close()
        count = 0
        for issuer, subject, server, sealed in rows:
            try:
                sealer.open(Principal(issuer=issuer, subject=subject), server, sealed)
            except CredentialError:
                count += 1
        return count

    def _grant(self, row: Any) -> Grant:
        return _grant(self._sealer, row)

    @asynccontextmanager
    async def refreshing(self, principal: Principal, server: str) -> AsyncIterator[None]:
        """Held while a row is refreshed: one process has the file, and its callers take
        turns already (``keeper``), so there is nothing more to hold."""
        yield


def _grant(sealer: Sealer, row: Any) -> Grant:
    issuer, subject, server, sealed, expires_at, scope, token_endpoint, revocation, client_id, resource = row[:10]
    principal = Principal(issuer=issuer, subject=subject)
    secrets = sealer.open(principal, server, sealed)
    return Grant(
        principal=principal,
        server=server,
        tokens=TokenSet(
            access_token=secrets["access_token"],
            refresh_token=secrets.get("refresh_token"),
            expires_at=expires_at,
            scope=scope,
        ),
        token_endpoint=token_endpoint,
        revocation_endpoint=revocation,
        client=ClientCredentials(client_id=client_id, client_secret=secrets.get("client_secret")),
        resource=resource,
    )


def _sealed_row(sealer: Sealer, grant: Grant) -> tuple[Any, ...]:
    """A grant as a row: its secrets sealed, then what is not secret, then when."""
    secrets = {
        "access_token": grant.tokens.access_token,
        "refresh_token": grant.tokens.refresh_token,
        "client_secret": grant.client.client_secret,
    }
    return (
        grant.principal.issuer,
        grant.principal.subject,
        grant.server,
        sealer.seal(grant.principal, grant.server, secrets),
        grant.tokens.expires_at,
        grant.tokens.scope,
        grant.token_endpoint,
        grant.revocation_endpoint,
        grant.client.client_id,
        grant.resource,
        time.time(),
    )


def _connect(path: str, sealer: Sealer | None = None) -> sqlite3.Connection:
    """Open (creating, owner-only) the vault file and its tables; with ``sealer``, check
    that the vault was sealed with its key (a new vault is marked with it)."""
    connection = None
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.close(descriptor)
        connection = sqlite3.connect(path, check_same_thread=False, isolation_level="DEFERRED")
        connection.execute(_SCHEMA)
        connection.execute(_KEY_CHECK_SCHEMA)
        connection.commit()
        if sealer is not None:
            _check_key(connection, sealer, path)
    except (OSError, sqlite3.Error) as exc:
        if connection is not None:
            connection.close()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc  # (the path once)
        raise CredentialError(f"cannot open the token vault {path}: {reason}") from None
    except CredentialError:
        assert connection is not None
        connection.close()
        raise
    return connection


def _check_key(connection: sqlite3.Connection, sealer: Sealer, path: str) -> None:
    """Raise CredentialError unless the vault opens with ``sealer``'s key: its key check, or
    (a vault made before it had one) its first row; a vault without either is marked."""
    found = connection.execute("SELECT sealed FROM key_check WHERE id = 1").fetchone()
    if found is not None:
        opens = sealer.opens_check(found[0])
    else:
        row = connection.execute("SELECT issuer, subject, server, sealed FROM grants LIMIT 1").fetchone()
        try:
            if row is not None:
                sealer.open(Principal(issuer=row[0], subject=row[1]), row[2], row[3])
            opens = True
        except CredentialError:
            opens = False
        if opens:
            with connection:
                connection.execute("INSERT INTO key_check (id, sealed) VALUES (1, ?)", (sealer.seal_check(),))
    if not opens:
        raise CredentialError(
            f"the token vault {path} does not open with {KEY_SETTING}: it was made with another key."
            " Give that key, or move the file away to start afresh (users then grant access again)"
        )
