"""``aggregator check``: validate the config (refusing what ``serve`` would refuse, and a
config with nothing to serve), start every server, print each one's status (once, however
often it was retried), the name collisions, and a warning for a shared store that cannot be
reached; non-zero on any failure of a server."""

from __future__ import annotations

import argparse

import trio

from aggregator.cli.common import (
    check_vault,
    command_config,
    nothing_to_serve,
    status_lines,
    vault_warnings,
    with_started_hub,
)
from aggregator.cli.terminal import printable
from aggregator.cluster.store import unreachable
from aggregator.config.store_url import RedisAddress
from aggregator.core.catalogs.policy import unmatched_rules
from aggregator.errors import AggregatorError
from aggregator.fronts.access import check_exposure
from aggregator.mcp.constants import KINDS
from aggregator.ops.admin import admin_access, admin_exposure


def run_check(args: argparse.Namespace) -> int:
    config, path = command_config(args)
    # What serve would refuse, check refuses too.
    for option, address in (
        ("http.listen", config.http.listen),
        ("http.websocket_listen", config.http.websocket_listen),
    ):
        if address is not None:
            check_exposure(config.http, address, option, oauth=config.auth.enabled)
    if config.http.admin_listen is not None:
        admin_exposure(config.http, config.http.admin_listen, "http.admin_listen", oauth=config.auth.enabled)
    check_vault(config)
    vault_notes = vault_warnings(config)
    reason = nothing_to_serve(config)
    if reason is not None:  # serve only warns (a reload may add servers); a check fails
        raise AggregatorError(f"config {path} has nothing to serve: {reason}")
    lines, collisions, ok, unmatched = trio.run(
        with_started_hub,
        config,
        lambda hub: (
            status_lines(hub),
            [c for kind in KINDS for c in hub.catalog.collisions[kind]],
            all(u.state == "ready" for u in hub.upstreams.values()),
            unmatched_rules(
                hub.config, hub.catalog.items_of, [n for n, u in hub.upstreams.items() if u.state == "ready"]
            ),
        ),
        lambda: print(f"config {path}: ok ({len(config.servers)} servers)", flush=True),
    )
    print("\n".join(lines))  # status_lines escapes what the servers wrote; names too:
    for collision in collisions:
        print(printable(f"  note: name collision: {collision}"))
    for warning in [*vault_notes, *unmatched]:  # warnings, not failures: a rule may await a server's new item
        print(printable(f"  warning: {warning}"))
    if config.cluster.store is not None:  # a warning: serve starts without it, and waits for it
        reason = trio.run(unreachable, config.cluster.store)
        if reason is not None:
            shown = RedisAddress.parse(config.cluster.store).display()
            print(printable(f"  warning: the shared store {shown} cannot be reached: {reason}"))
    if (access := admin_access(config)) is not None:
        print(access)
    return 0 if ok else 1
