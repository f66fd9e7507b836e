"""``aggregator tools``: start the servers and print the merged catalog a profile's
clients see (a table or JSON), with ``--explain`` the items hidden and the rule that hid each."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from typing import Any

import trio

from aggregator.cli.common import command_config, label, nothing_to_serve, status_lines, with_started_hub
from aggregator.errors import AggregatorError, ConfigError
from aggregator.hub.hub import Hub
from aggregator.ops.catalog_view import catalog_view

ESTIMATE = "estimated as the compact JSON's UTF-8 bytes / 4, rounded up (aggregator.core.catalogs.tokens)"


def run_tools(args: argparse.Namespace) -> int:
    config, path = command_config(args)
    if args.profile == "":
        raise ConfigError("--profile: expected a profile's name, got an empty string")
    profile = args.profile or "default"
    if profile != "default" and profile not in config.profiles:
        known = ", ".join(["default", *config.profiles])
        raise ConfigError(f"--profile: no profile {profile!r} (known: {known})")
    reason = nothing_to_serve(config)
    if reason is not None:  # as check: nothing would be listed
        raise AggregatorError(f"config {path} has nothing to serve: {reason}")
    if args.tokens:
        names = [profile] if args.profile else ["default", *config.profiles]
        return _print_tokens(trio.run(with_started_hub, config, lambda hub: _token_rows(hub, names)), args.json)
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
    out = catalog_view(hub.router.profile_catalog(profile))
    out["down"] = status_lines(hub, only_down=True)
    # Each ready server's era and revision, as the proxy speaks to it now.
    eras = {name: hub.router.server_era(name) for name in hub.upstreams}
    out["servers"] = {name: {"era": known[0], "protocol": known[1]} for name, known in eras.items() if known}
    return out


def _token_rows(hub: Hub, profiles: list[str]) -> dict[str, Any]:
    """Each profile's tools/list in estimated tokens, in each discovery mode, and its mode now."""
    report = hub.router.context_report()
    rows = [{"profile": name, **report[name]} for name in profiles]
    return {"profiles": rows, "down": status_lines(hub, only_down=True), "estimate": ESTIMATE}


def _print_tokens(collected: dict[str, Any], as_json: bool) -> int:
    for line in collected["down"]:
        print(line, file=sys.stderr)
    if as_json:
        print(json.dumps({"profiles": collected["profiles"], "estimate": collected["estimate"]}, indent=2))
        return 0
    head = f"{'profile':<16} {'mode':<7} {'lists':<7} {'tools':>5} {'all':>9} {'search':>7} {'search saves':>14}"
    print(head)
    for row in collected["profiles"]:
        everything, search = row["tools_list_tokens"], row["search_list_tokens"]
        saved = everything - search
        saves = f"{saved:>8,} ({saved / everything:.0%})" if saved > 0 else "    none (it is the larger list)"
        auto = f"   (auto: all while <= {row['budget_tokens']:,})" if row["mode"] == "auto" else ""
        print(
            f"{row['profile']:<16} {row['mode']:<7} {row['lists']:<7} {row['tools']:>5} {everything:>9,} "
            f"{search:>7,} {saves}{auto}"
        )
    print(f"\ntokens of tools/list: {collected['estimate']}")
    return 0


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
