"""``aggregator tools``: start the servers and print the merged catalog a profile's
clients see (a table or JSON), with ``--explain`` the items hidden and the rule that hid each."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from typing import Any

import trio

from aggregator.cli.common import command_config, label, status_lines, with_started_hub
from aggregator.core.catalog import Catalog, Route
from aggregator.errors import ConfigError
from aggregator.hub import Hub
from aggregator.mcp.constants import KEY_OF, KINDS


def run_tools(args: argparse.Namespace) -> int:
    config, _ = command_config(args)
    profile = args.profile or "default"
    if profile != "default" and profile not in config.profiles:
        known = ", ".join(["default", *config.profiles])
        raise ConfigError(f"--profile: no profile {profile!r} (known: {known})")
    catalog = trio.run(with_started_hub, config, lambda hub: _collect(hub, profile))
    hidden = catalog.pop("hidden")
    down = catalog.pop("down")
    servers = catalog.pop("servers")
    if down and not any(catalog.values()):
        print("aggregator: no server is ready, so there is nothing to list:", file=sys.stderr)
        print("\n".join(down), file=sys.stderr)
        return 1
    for line in down:
        print(line, file=sys.stderr)
    if args.json:
        if args.explain:
            catalog["hidden"] = hidden
        catalog["servers"] = servers
        print(json.dumps(catalog, indent=2, ensure_ascii=False, default=str))  # JsonNumber: as its text
        return 0
    width = max(shutil.get_terminal_size((120, 20)).columns, 40)
    if profile != "default":
        print(f"profile {profile}\n")
    eras = ", ".join(f"{name} ({about['era']} {about['protocol']})" for name, about in servers.items())
    print(f"servers: {eras}\n")
    _print_table(catalog, width)
    if args.explain:
        _print_hidden(hidden)
    return 0


def _collect(hub: Hub, profile: str) -> dict[str, Any]:
    """What the profile's clients see, per kind; the servers that are down; what is hidden."""
    catalog = hub.router.profile_catalog(profile)
    out: dict[str, Any] = {}
    for kind in KINDS:
        rows = []
        for item in catalog.exposed[kind]:
            exposed = item.get(KEY_OF[kind])
            route = _route_of(catalog, kind, exposed)
            rows.append(
                {
                    "name": exposed,
                    "server": route.server if route else None,
                    "original": route.original if route else None,
                    "title": item.get("title") or (item.get("annotations") or {}).get("title"),
                    "description": item.get("description"),
                }
            )
        out[kind] = rows
    out["down"] = status_lines(hub, only_down=True)
    # Each ready server's era and revision, as the proxy speaks to it now.
    eras = {name: hub.router.server_era(name) for name in hub.upstreams}
    out["servers"] = {name: {"era": known[0], "protocol": known[1]} for name, known in eras.items() if known}
    out["hidden"] = {
        kind: [
            {"server": server, "original": original, "rule": reason}
            for server, original, reason in catalog.hidden[kind]
        ]
        for kind in KINDS
    }
    return out


def _route_of(catalog: Catalog, kind: str, exposed: str | None) -> Route | None:
    if exposed is None:  # every listed item has its key; nothing routes without one
        return None
    route: Route | None
    if kind == "tools":
        route = catalog.tools.get(exposed)
    elif kind == "prompts":
        route = catalog.prompts.get(exposed)
    elif kind == "resources":
        route = catalog.route_uri(exposed)
    else:
        route = catalog.route_template(exposed)
    return route


def _print_table(catalog: dict[str, Any], width: int) -> None:
    for kind, rows in catalog.items():
        if not rows:
            continue
        print(f"{label(kind).upper()} ({len(rows)})")
        name_w = min(max(len(r["name"]) for r in rows), 60)
        server_w = max(len(r["server"] or "") for r in rows)
        for row in rows:
            text = (row["title"] or row["description"] or "").strip().splitlines()
            summary = text[0] if text else ""
            print(f"  {row['name']:<{name_w}}  {row['server'] or '':<{server_w}}  {summary}"[:width])
        print()


def _print_hidden(hidden: dict[str, list[dict[str, Any]]]) -> None:
    """Each hidden item and the rule that hid it, never cut short: the rule is the point."""
    for kind, rows in hidden.items():
        if not rows:
            continue
        print(f"HIDDEN {label(kind).upper()} ({len(rows)})")
        for row in rows:
            print(f"  {row['server']}:{row['original']}  hidden by {row['rule']}")  # whole: the rule is the point
        print()
