"""``aggregator auth list`` and ``aggregator auth revoke USER [SERVER]``: the users' tokens
for servers kept in the token vault (``credentials.vault``).

``list`` shows who granted what, for which server, until when, with which scopes: never a
token. ``revoke`` removes a user's tokens (for one server, or all) and asks the
authorization server to revoke them (RFC 7009) when it has a revocation endpoint.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import trio

from aggregator.cli.common import DEFAULT_CONFIG
from aggregator.cli.terminal import printable
from aggregator.config import Config, load_config
from aggregator.config.upstream_auth import VAULT_KEY_VARIABLE, vault_key_bytes
from aggregator.errors import ConfigError


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


def run_auth_list(args: argparse.Namespace) -> int:
    config = _config(args)
    from aggregator.credentials.vault import TokenVault

    async def entries() -> list[str]:
        vault = await TokenVault.open(config.credentials.vault, _key(config))
        try:
            found = await vault.entries()
        finally:
            await vault.aclose()
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

    lines = trio.run(entries) if os.path.exists(config.credentials.vault) else []
    if not lines:
        print(f"no user has granted access to a server (vault: {config.credentials.vault})")
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
    from aggregator.credentials.vault import TokenVault

    settings = config.credentials

    async def revoke() -> list[str]:
        vault = await TokenVault.open(settings.vault, _key(config))
        try:
            async with oauth_http_client() as client:
                fetcher = Fetcher(client, timeout=settings.fetch_timeout, max_bytes=settings.max_response_bytes)
                tokens = UserTokens(vault, fetcher, margin=settings.refresh_margin)
                done = await tokens.revoke(args.user, args.server, args.issuer)
        finally:
            await vault.aclose()
        return [f"{printable(str(grant.principal))}, server {grant.server}: {outcome}" for grant, outcome in done]

    lines = trio.run(revoke) if os.path.exists(settings.vault) else []
    if not lines:
        print(
            f"nothing to revoke: {printable(args.user)} has granted no access"
            + (f" to {args.server}" if args.server else "")
        )
        return 1
    for line in lines:
        print(line)
    return 0
