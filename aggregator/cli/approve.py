"""``aggregator approve``: start the servers and accept the current definitions of the
tools a pinning plugin quarantined (all of them, or those named).

With ``[cluster] store`` the pins are the store's: the plugin reads them first (the
command waits for that, ``STORE_WAIT`` seconds at most), and the approvals are written
there and told to every running replica, which serves the approved definitions at once."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import trio

from aggregator.cli.common import command_config, status_lines
from aggregator.config import Config
from aggregator.errors import ConfigError, StoreError
from aggregator.hub.hub import Hub

STORE_WAIT = 15.0  # seconds the command waits for the store's pins


def run_approve(args: argparse.Namespace) -> int:
    config, _ = command_config(args)
    found, approved, down = trio.run(approve_with_hub, config, args.names or None)
    for line in down:  # a server that did not start listed nothing to approve
        print(line, file=sys.stderr)
    if not found:
        raise ConfigError('no plugin here approves definitions: add [[plugins]] use = "pin-definitions"')
    missing = sorted(set(args.names) - set(approved))
    if missing:
        print(
            "aggregator: no quarantined tool named "
            + ", ".join(missing)
            + " (not changed since it was pinned, or no such tool)",
            file=sys.stderr,
        )
    print("approved: " + (", ".join(approved) if approved else "nothing (no definition has changed)"))
    return 1 if missing else 0


async def approve_with_hub(config: Config, names: list[str] | None) -> tuple[bool, list[str], list[str]]:
    """Start the hub (its plugins, then its servers), approve, stop it: whether a plugin
    approves definitions, what was approved, the servers that are not ready."""
    hub = Hub(config, looking=True)
    approved: list[str] = []
    failed: str | None = None
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.run)
        await hub.startup_done.wait()
        pinners = [p for p in hub.plugins.plugins if callable(getattr(p, "approve", None))]
        for pinner in pinners:
            failed = failed or await _approve(config, pinner, names, approved)
        nursery.cancel_scope.cancel()
    if failed is not None:
        raise ConfigError(failed)
    return bool(pinners), approved, status_lines(hub, only_down=True)


async def _approve(config: Config, pinner: Any, names: list[str] | None, approved: list[str]) -> str | None:
    """Approve with one plugin, adding to ``approved``: why it could not, or None."""
    if config.cluster.store is None or not callable(getattr(pinner, "share_approvals", None)):
        approved += pinner.approve(names)
        return None
    with trio.move_on_after(STORE_WAIT):
        await pinner.synced.wait()
    if not pinner.synced.is_set():
        return f"the pins in the store could not be read within {STORE_WAIT:g}s (is the store up?)"
    chosen = pinner.approve(names)
    try:
        await pinner.share_approvals()
    except StoreError as exc:
        return f"the approvals could not be written to the store: {exc}"
    approved += chosen
    return None
