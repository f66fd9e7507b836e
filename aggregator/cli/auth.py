"""``aggregator auth list`` and ``aggregator auth revoke USER [SERVER]``: the users' tokens
for servers kept in the token vault (``credentials.vault``).

``list`` shows who granted what, for which server, until when, with which scopes: never a
token. ``revoke`` removes a user's tokens (for one server, or all) and asks the
authorization server to revoke them (RFC 7009) when it has a revocation endpoint.

With ``[cluster] store`` the grants are in the shared store, not the file: both commands
work there, and a revoke holds for every replica at once (they keep no copy).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from aggregator.cli.common import DEFAULT_CONFIG
from aggregator.cli.terminal import printable
from aggregator.config import Config, load_config
from aggregator.config.upstream_auth import VAULT_KEY_VARIABLE, vault_key_bytes
from aggregator.errors import ConfigError

if TYPE_CHECKING:
    from aggregator.credentials.shared import Vault

STORE_SECONDS = 5.0  # how long to wait for the shared store to answer


def _config(args: argparse.Namespace) -> Config:
    """The config (these commands start no server, so the guard against serving oneself is not needed)."""
    path = Path(args.config or DEFAULT_CONFIG)
    if args.config is None and not path.exists():
        raise ConfigError(f"no {DEFAULT_CONFIG} here; pass --config PATH")
    return load_config(path)


def _key(config: Config) -> bytes:
    key = vault_key_bytes(config.credentials, os.environ)
    if key is None:
        raise ConfigError(
            f"credentials.vault_key: the vault key is needed (or the {VAULT_KEY_VARIABLE} environment variable)"
        )
    return key


def _until(expires_at: float | None) -> str:
    if expires_at is None:
        return "no expiry given"
    left = expires_at - time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(expires_at))
    return f"{stamp} (expired)" if left <= 0 else stamp


def _has_grants(config: Config) -> bool:
    """Whether there may be grants to look at (a vault file that does not exist has none)."""
    return config.cluster.store is not None or os.path.exists(config.credentials.vault)


@asynccontextmanager
async def _vault(config: Config) -> AsyncIterator[Vault]:
    """The grants: the vault file, or the shared store ([cluster] store) once it answers."""
    from aggregator.credentials.service import refresh_lock_seconds
    from aggregator.credentials.shared import StoreVault
    from aggregator.credentials.vault import TokenVault

    if config.cluster.store is None:
        vault = await TokenVault.open(config.credentials.vault, _key(config))
        try:
            yield vault
        finally:
            await vault.aclose()
        return
    from aggregator.cluster.store import RedisStore, open_store

    store = open_store(config.cluster.store, prefix=config.cluster.prefix)
    failure: Exception | None = None  # raised after the nursery, not inside its exception group
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        if isinstance(store, RedisStore):
            with trio.move_on_after(STORE_SECONDS):
                await store.client.wait_connected()
            status = store.status()
            if not status.up:
                failure = ConfigError(
                    f"cluster.store: the shared store {status.address} cannot be reached"
                    f" ({status.last_error or f'no connection within {STORE_SECONDS:g}s'})"
                )
        if failure is None:
            try:
                yield StoreVault(store, _key(config), lock_seconds=refresh_lock_seconds(config.credentials))
            except Exception as exc:
                failure = exc
        nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure


def run_auth_list(args: argparse.Namespace) -> int:
    config = _config(args)

    async def entries() -> list[str]:
        async with _vault(config) as vault:
            found = await vault.entries()
        return [
            "\t".join(
                printable(part)
                for part in (
                    entry.principal.subject,
                    entry.principal.issuer,
                    entry.server,
                    _until(entry.expires_at),
                    entry.scope or "-",
                    "sealed with another key" if not entry.opens else "refreshable" if entry.refreshable else "-",
                )
            )
            for entry in found
        ]

    lines = trio.run(entries) if _has_grants(config) else []
    if not lines:
        where = "the shared store" if config.cluster.store is not None else config.credentials.vault
        print(f"no user has granted access to a server (vault: {where})")
        return 0
    print("\t".join(("USER", "ISSUER", "SERVER", "EXPIRES", "SCOPE", "REFRESH")))
    for line in lines:
        print(line)
    return 0


def run_auth_revoke(args: argparse.Namespace) -> int:
    config = _config(args)
    if args.server is not None and args.server not in config.servers:
        raise ConfigError(f"servers.{args.server}: no such server")
    from aggregator.credentials.fetching import Fetcher, oauth_http_client
    from aggregator.credentials.keeper import UserTokens

    settings = config.credentials

    async def revoke() -> list[str]:
        async with _vault(config) as vault, oauth_http_client() as client:
            fetcher = Fetcher(client, timeout=settings.fetch_timeout, max_bytes=settings.max_response_bytes)
            tokens = UserTokens(vault, fetcher, margin=settings.refresh_margin)
            done = await tokens.revoke(args.user, args.server, args.issuer)
        return [f"{printable(str(grant.principal))}, server {grant.server}: {outcome}" for grant, outcome in done]

    lines = trio.run(revoke) if _has_grants(config) else []
    if not lines:
        print(
            f"nothing to revoke: {printable(args.user)} has granted no access"
            + (f" to {args.server}" if args.server else "")
        )
        return 1
    for line in lines:
        print(line)
    return 0
