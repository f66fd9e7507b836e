"""``aggregator approve``: start the servers and accept the current definitions of the
tools a pinning plugin quarantined (all of them, or those named)."""

from __future__ import annotations

import argparse
import sys

import trio

from aggregator.cli.common import command_config, status_lines, with_started_hub
from aggregator.errors import ConfigError
from aggregator.hub.hub import Hub


def run_approve(args: argparse.Namespace) -> int:
    config, _ = command_config(args)

    def approve(hub: Hub) -> tuple[bool, list[str], list[str]]:
        pinners = [p for p in hub.plugins.plugins if callable(getattr(p, "approve", None))]
        approved = [name for pinner in pinners for name in pinner.approve(args.names or None)]
        return bool(pinners), approved, status_lines(hub, only_down=True)

    found, approved, down = trio.run(with_started_hub, config, approve)
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
