"""``aggregator check``: validate the config (refusing what ``serve`` would refuse), start
every server, print each one's status and the name collisions; non-zero on any failure."""

from __future__ import annotations

import argparse

import trio

from aggregator.access import check_exposure
from aggregator.admin import admin_exposure
from aggregator.cli.common import command_config, status_lines, with_started_hub
from aggregator.mcp.constants import KINDS


def run_check(args: argparse.Namespace) -> int:
    config, path = command_config(args)
    # What serve would refuse, check refuses too.
    for option, address in (
        ("http.listen", config.http.listen),
        ("http.websocket_listen", config.http.websocket_listen),
    ):
        if address is not None:
            check_exposure(config.http, address, option)
    if config.http.admin_listen is not None:
        admin_exposure(config.http, config.http.admin_listen, "http.admin_listen")
    lines, collisions, ok = trio.run(
        with_started_hub,
        config,
        lambda hub: (
            status_lines(hub),
            [c for kind in KINDS for c in hub.catalog.collisions[kind]],
            all(u.state == "ready" for u in hub.upstreams.values()),
        ),
        lambda: print(f"config {path}: ok ({len(config.servers)} servers)", flush=True),
    )
    print("\n".join(lines))
    for collision in collisions:
        print(f"  note: name collision: {collision}")
    return 0 if ok else 1
