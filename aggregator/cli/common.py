"""What the commands share: loading a command's config (behind the nesting guard),
starting the hub for one look at the servers, and the per-server status lines."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import trio

from aggregator.cli.terminal import printable
from aggregator.config import Config, load_config
from aggregator.config.upstream_auth import acts_as_users
from aggregator.core.catalogs.nesting import CHAIN_VARIABLE, NestingRefused, chain_value, enter, parse_chain
from aggregator.errors import AggregatorError, ConfigError
from aggregator.hub.hub import Hub
from aggregator.mcp.constants import CONFIG_KIND, KINDS
from aggregator.plugins.resolve import plugin_problems

DEFAULT_CONFIG = "aggregator.toml"
INTERRUPTED = 130  # the exit status after Ctrl-C: 128 + SIGINT, as shells report it

T = TypeVar("T")


def command_config(args: argparse.Namespace) -> tuple[Config, Path]:
    """The config of a command that starts servers, once the loop guard lets it run."""
    path = Path(args.config or DEFAULT_CONFIG)
    if args.config is None and not path.exists():
        raise ConfigError(f"no {DEFAULT_CONFIG} here; pass --config PATH")
    _enter_chain(path)
    return load_config(path, plugin_check=plugin_problems), path


def _enter_chain(path: Path) -> None:
    """Refuse a config that an aggregator above this one serves already (or a chain too
    deep); otherwise pass the chain, this config last, to every server this process starts."""
    try:
        chain = enter(parse_chain(os.environ.get(CHAIN_VARIABLE)), os.path.realpath(path))
    except NestingRefused as exc:
        raise AggregatorError(f"refusing to start: {exc}") from None
    os.environ[CHAIN_VARIABLE] = chain_value(chain)


def check_vault(config: Config) -> None:
    """Raise ConfigError naming ``credentials.vault`` if a server keeps users' tokens in the
    vault and it cannot be opened: said before anything starts, by ``serve`` and ``check``."""
    if any(server.auth == "oauth" for server in config.enabled_servers):
        # Imported here: sqlite and cryptography cost a proxy without such servers nothing.
        from aggregator.credentials.service import check_vault as open_the_vault

        open_the_vault(config)


def vault_warnings(config: Config) -> list[str]:
    """What ``check`` warns of in the vault: rows that do not open with the vault key (they
    count as no grant: those users are asked again). Not the file's when the grants are in
    the shared store ([cluster] store)."""
    if not any(server.auth == "oauth" for server in config.enabled_servers) or config.cluster.store is not None:
        return []
    from aggregator.config.upstream_auth import vault_key_bytes
    from aggregator.credentials.vault import KEY_SETTING, TokenVault

    key = vault_key_bytes(config.credentials, os.environ)
    if key is None:  # (refused at load)
        return []
    unopened = TokenVault.unopened(config.credentials.vault, key)
    if not unopened:
        return []
    return [
        f"the token vault {config.credentials.vault} holds {unopened} user grant(s) sealed with another key than"
        f" {KEY_SETTING}: they count as no grant, and those users are asked again"
    ]


def nothing_to_serve(config: Config) -> str | None:
    """Why ``config`` serves nothing (it has no server, or none enabled); None if it serves."""
    if config.enabled_servers:
        return None
    if not config.servers:
        return "it lists no servers"
    return f"every server in it is disabled ({', '.join(config.servers)})"


async def with_started_hub(config: Config, work: Callable[[Hub], T], built: Callable[[], object] | None = None) -> T:
    """Start the hub (its plugins, then its servers), wait for startup, run ``work(hub)``.
    ``built()`` is called once the plugins are loaded, before any server starts. The hub
    only looks: the command reports each server itself, so their failures are logged at info."""
    hub = Hub(config, looking=True)
    if built is not None:
        built()
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.run)
        await hub.startup_done.wait()
        result = work(hub)
        nursery.cancel_scope.cancel()
    return result


def status_lines(hub: Hub, *, only_down: bool = False) -> list[str]:
    """One line per server (its state, counts or last error, and the last stderr lines of
    one that did not start, control characters shown as ``\\x1b``); ``only_down``: just the
    servers that are not ready."""
    lines = []
    for name, upstream in hub.upstreams.items():
        if only_down and upstream.state == "ready":
            continue
        counts = ", ".join(f"{len(hub.catalog.items_of(name, kind))} {label(kind)}" for kind in KINDS)
        if upstream.state == "ready":
            lines.append(f"  {name:<20} ready    {era(hub, name):<20} {counts}")
        else:
            reason, stderr = upstream.not_ready()
            lines.append(f"  {name:<20} {upstream.state:<8} {reason}")
            lines += [f"  {'':<20} [stderr] {line}" for line in stderr]
    for name, config in hub.config.servers.items():
        if config.enabled and acts_as_users(config) and not only_down:
            lines.append(
                f"  {name:<20} per user needs a user: connected per session, as each client's user"
                f' (auth = "{config.auth}"); not connected without one'
            )
    disabled = [] if only_down else [s for s, c in hub.config.servers.items() if not c.enabled]
    for name in disabled:
        lines.append(f"  {name:<20} disabled")
    # For a terminal: a server's stderr and errors are shown as text, never as escape sequences.
    return [printable(line) for line in lines]


def era(hub: Hub, name: str) -> str:
    """How the proxy speaks to a server now: "modern 2026-07-28" or "legacy 2025-11-25"."""
    known = hub.router.server_era(name)
    return "" if known is None else " ".join(known)


def label(kind: str) -> str:
    """The plural a person reads for a kind of item ("tools", "resource templates")."""
    return CONFIG_KIND[kind]
