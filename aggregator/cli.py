"""The command line: serve, tools, check, import."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import trio

from aggregator import __version__
from aggregator.access import check_exposure
from aggregator.config import Config, load_config, mcp_servers_json_to_raw, raw_to_toml, same_listener
from aggregator.core.nesting import CHAIN_VARIABLE, NestingRefused, chain_value, enter, parse_chain
from aggregator.errors import AggregatorError, ConfigError
from aggregator.hub import Hub
from aggregator.mcp.constants import CONFIG_KIND, KEY_OF, KINDS

log = logging.getLogger("aggregator")
DEFAULT_CONFIG = "aggregator.toml"


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.log_level != "debug":
        # httpx logs every request it makes at info: one line per message to an HTTP server.
        logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        return args.run(args)
    except ConfigError as exc:
        print(f"aggregator: {exc}", file=sys.stderr)
        return 2
    except AggregatorError as exc:  # the proxy could not start: one line, no traceback
        print(f"aggregator: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `aggregator tools | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aggregator",
        description="One MCP endpoint in front of many MCP servers.",
    )
    parser.add_argument("--version", action="version", version=f"aggregator {__version__}")
    parser.set_defaults(command=None)
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    def command(name: str, log_level: str = "warning", **kwargs: Any) -> argparse.ArgumentParser:
        # Each command its own --log-level: argparse shares a parent parser's actions between
        # its children, so one child's set_defaults would change every other's default.
        p = sub.add_parser(name, **kwargs)
        p.add_argument(
            "--log-level",
            default=log_level,
            choices=["debug", "info", "warning", "error"],
            help=f"how much to log to stderr (default: {log_level})",
        )
        return p

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--config",
            "-c",
            default=None,
            metavar="PATH",
            help=f"aggregator.toml, or a Claude Desktop / Cursor / VS Code JSON file (default: ./{DEFAULT_CONFIG})",
        )

    serve = command(
        "serve", "info", help="run the proxy", description="Run the proxy. With --stdio it speaks MCP on stdin/stdout."
    )
    with_config(serve)
    serve.add_argument(
        "--stdio", action="store_true", help="serve one client on stdin/stdout (the default when --http is not given)"
    )
    serve.add_argument(
        "--http",
        metavar="[HOST:]PORT",
        default=None,
        help="serve MCP over Streamable HTTP at http://HOST:PORT/mcp, and the legacy"
        " HTTP+SSE transport at /sse; HOST defaults to 127.0.0.1"
        " (default: http.listen from the config)",
    )
    serve.add_argument(
        "--ws",
        metavar="[HOST:]PORT",
        default=None,
        help="serve MCP over WebSocket at ws://HOST:PORT/mcp (default: http.websocket_listen from the config)",
    )
    serve.set_defaults(command="serve", run=_serve)

    tools = command(
        "tools", help="print the merged catalog", description="Start the servers and print what a client would see."
    )
    with_config(tools)
    tools.add_argument("--json", action="store_true", help="print JSON instead of a table")
    tools.add_argument(
        "--profile",
        metavar="NAME",
        default=None,
        help="show what clients of this profile see (default: the default profile)",
    )
    tools.add_argument("--explain", action="store_true", help="also list each hidden item and the rule that hid it")
    tools.set_defaults(command="tools", run=_tools)

    check = command(
        "check",
        help="validate the config and the servers",
        description="Validate the config, start every server, report each one's status; exit non-zero on any error.",
    )
    with_config(check)
    check.set_defaults(command="check", run=_check)

    approve = command(
        "approve",
        help="accept tool definitions that changed",
        description="Start the servers and accept the current definitions of the tools"
        " the pin-definitions plugin quarantined (all, or those named).",
    )
    with_config(approve)
    approve.add_argument("names", nargs="*", metavar="NAME", help="exposed tool names (default: every changed one)")
    approve.set_defaults(command="approve", run=_approve)

    imp = command(
        "import",
        help="convert an mcpServers JSON file to TOML",
        description="Print the aggregator.toml equivalent of a Claude Desktop, Cursor or VS Code server list.",
    )
    imp.add_argument("file", metavar="FILE.json")
    imp.set_defaults(command="import", run=_import)
    return parser


def _config(args: argparse.Namespace) -> tuple[Config, Path]:
    """The config of a command that starts servers, once the loop guard lets it run."""
    path = Path(args.config or DEFAULT_CONFIG)
    if args.config is None and not path.exists():
        raise ConfigError(f"no {DEFAULT_CONFIG} here; pass --config PATH")
    _enter_chain(path)
    return load_config(path), path


def _enter_chain(path: Path) -> None:
    """Refuse a config that an aggregator above this one serves already (or a chain too
    deep); otherwise pass the chain, this config last, to every server this process starts."""
    try:
        chain = enter(parse_chain(os.environ.get(CHAIN_VARIABLE)), os.path.realpath(path))
    except NestingRefused as exc:
        raise AggregatorError(f"refusing to start: {exc}") from None
    os.environ[CHAIN_VARIABLE] = chain_value(chain)


# --- serve ------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    config, path = _config(args)
    listen = args.http or config.http.listen
    ws_listen = args.ws or config.http.websocket_listen
    for option, address in (("--http", listen), ("--ws", ws_listen)):
        if address is not None:
            check_exposure(config.http, address, option)
    if listen is not None and ws_listen is not None and same_listener(listen, ws_listen):
        raise ConfigError(
            f"--http {listen} and --ws {ws_listen} name the same address;"
            " the WebSocket endpoint needs a port of its own"
        )
    stdio = args.stdio or (listen is None and ws_listen is None)
    trio.run(_serve_all, config, path.resolve(), stdio, listen, ws_listen)
    return 0


async def _serve_all(config: Config, path: Path, stdio: bool, listen: str | None, ws_listen: str | None) -> None:
    from aggregator.session import serve_stream_session
    from aggregator.transports.stdio import OwnStdio

    own = OwnStdio() if stdio else None
    interactive = stdio and os.isatty(0)
    # With no network front the stdio client is the only one there can ever be.
    hub = Hub(config, single_client=stdio and listen is None and ws_listen is None)
    cannot_listen: str | None = None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_signals, nursery.cancel_scope, hub)
            await nursery.start(hub.run)
            cannot_listen = await _start_endpoints(nursery, hub, config, listen, ws_listen)
            if cannot_listen is not None:
                # Raised once the nursery has stopped the servers it started, so that the
                # user reads one line and no server outlives the proxy.
                nursery.cancel_scope.cancel()
                return
            if interactive:
                nursery.start_soon(_greet, hub, path)
            if own is not None:
                ended_by_client = await serve_stream_session(hub, own.receive, own.send, label="stdio")
                if ended_by_client or (listen is None and ws_listen is None):
                    log.info("the stdio session ended; shutting down")
                    nursery.cancel_scope.cancel()
                else:
                    # A failure in the stdio client's session ends that session, not the
                    # network clients': close stdout so the stdio client sees the end.
                    log.error("the stdio session failed; still serving the network endpoints")
                    with trio.CancelScope(shield=True):
                        await own.aclose()
                    own = None
    finally:
        if own is not None:
            with trio.CancelScope(shield=True):
                await own.aclose()
        if cannot_listen is not None:
            raise AggregatorError(cannot_listen)


async def _start_endpoints(
    nursery: trio.Nursery, hub: Hub, config: Config, listen: str | None, ws_listen: str | None
) -> str | None:
    """Start the network endpoints in the serve nursery; None, or why one cannot listen
    (an address in use, a host that does not resolve, a port that needs privileges)."""
    from aggregator.http_endpoint import StreamableHttpEndpoint
    from aggregator.websocket_endpoint import WebSocketEndpoint

    for address, endpoint in ((listen, StreamableHttpEndpoint), (ws_listen, WebSocketEndpoint)):
        if address is None:
            continue
        failure: BaseException | None = None
        try:
            await nursery.start(endpoint(hub, config.http).serve, address)
        except* OSError as group:
            failure = group
        while isinstance(failure, BaseExceptionGroup):
            failure = failure.exceptions[0]
        if failure is not None:
            return f"cannot listen on {address}: {getattr(failure, 'strerror', None) or failure}"
    return None


async def _cancel_on_signals(scope: trio.CancelScope, hub: Hub | None = None) -> None:
    """SIGTERM, SIGINT or SIGHUP: finish what is in flight (up to proxy.drain_timeout,
    taking nothing new), then stop everything. A second signal stops at once."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("received %s; shutting down", signal.Signals(signum).name)
            if hub is not None:
                async with trio.open_nursery() as nursery:

                    async def second_signal() -> None:
                        async for _ in signals:
                            log.info("second signal: stopping now")
                            nursery.cancel_scope.cancel()
                            return

                    nursery.start_soon(second_signal)
                    await hub.drain(hub.config.proxy.drain_timeout)
                    nursery.cancel_scope.cancel()
            scope.cancel()
            return


async def _greet(hub: Hub, path: Path) -> None:
    """Tell a person at a terminal what is running and how to use it from a client."""
    await hub.startup_done.wait()
    lines = ["", f"aggregator {__version__} is serving MCP on stdin/stdout.", "Servers:"]
    lines += _status_lines(hub)
    snippet = {
        "mcpServers": {
            "aggregator": {
                "command": _own_command(),
                "args": ["serve", "--stdio", "--config", str(path)],
            }
        }
    }
    lines += [
        "",
        "An MCP client starts it itself. Paste this into its mcpServers config:",
        json.dumps(snippet, indent=2),
        "",
        "Type JSON-RPC here to talk to it by hand; Ctrl-D stops it.",
        "",
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)


def _own_command() -> str:
    """The absolute path of the `aggregator` script running now (for client configs)."""
    script = Path(sys.argv[0])
    if script.name == "aggregator" and script.exists():
        return str(script.resolve())
    return shutil.which("aggregator") or "aggregator"


def _status_lines(hub: Hub, *, only_down: bool = False) -> list[str]:
    """One line per server (its state, counts or last error, and the last stderr lines of
    one that did not start); ``only_down``: just the servers that are not ready."""
    lines = []
    for name, upstream in hub.upstreams.items():
        if only_down and upstream.state == "ready":
            continue
        counts = ", ".join(f"{len(hub.catalog.items_of(name, kind))} {_label(kind)}" for kind in KINDS)
        if upstream.state == "ready":
            lines.append(f"  {name:<20} ready    {counts}")
        else:
            lines.append(f"  {name:<20} {upstream.state:<8} {upstream.last_error or ''}")
            lines += [f"  {'':<20} [stderr] {line}" for line in upstream.last_stderr]
    disabled = [] if only_down else [s for s, c in hub.config.servers.items() if not c.enabled]
    for name in disabled:
        lines.append(f"  {name:<20} disabled")
    return lines


def _label(kind: str) -> str:
    return CONFIG_KIND[kind]


# --- tools / check ----------------------------------------------------------------------


async def _with_started_hub(config: Config, work: Any, built: Any = None) -> Any:
    """Start the hub (its plugins, then its servers), wait for startup, run ``work(hub)``.
    ``built()`` is called once the plugins are loaded, before any server starts."""
    hub = Hub(config)
    if built is not None:
        built()
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.run)
        await hub.startup_done.wait()
        result = work(hub)
        nursery.cancel_scope.cancel()
    return result


def _tools(args: argparse.Namespace) -> int:
    config, _ = _config(args)
    profile = args.profile or "default"
    if profile != "default" and profile not in config.profiles:
        known = ", ".join(["default", *config.profiles])
        raise ConfigError(f"--profile: no profile {profile!r} (known: {known})")

    def collect(hub: Hub) -> dict[str, Any]:
        catalog = hub.router.profile_catalog(profile)
        out: dict[str, Any] = {}
        for kind in KINDS:
            rows = []
            for item in catalog.exposed[kind]:
                key = KEY_OF[kind]
                exposed = item.get(key)
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
        out["down"] = _status_lines(hub, only_down=True)
        out["hidden"] = {
            kind: [
                {"server": server, "original": original, "rule": reason}
                for server, original, reason in catalog.hidden[kind]
            ]
            for kind in KINDS
        }
        return out

    catalog = trio.run(_with_started_hub, config, collect)
    hidden = catalog.pop("hidden")
    down = catalog.pop("down")
    if down and not any(catalog.values()):
        print("aggregator: no server is ready, so there is nothing to list:", file=sys.stderr)
        print("\n".join(down), file=sys.stderr)
        return 1
    for line in down:
        print(line, file=sys.stderr)
    if args.json:
        if args.explain:
            catalog["hidden"] = hidden
        print(json.dumps(catalog, indent=2, ensure_ascii=False, default=str))  # JsonNumber: as its text
        return 0
    width = max(shutil.get_terminal_size((120, 20)).columns, 40)
    if profile != "default":
        print(f"profile {profile}\n")
    for kind, rows in catalog.items():
        if not rows:
            continue
        print(f"{_label(kind).upper()} ({len(rows)})")
        name_w = min(max(len(r["name"]) for r in rows), 60)
        server_w = max(len(r["server"] or "") for r in rows)
        for row in rows:
            text = (row["title"] or row["description"] or "").strip().splitlines()
            summary = text[0] if text else ""
            print(f"  {row['name']:<{name_w}}  {row['server'] or '':<{server_w}}  {summary}"[:width])
        print()
    if args.explain:
        for kind, rows in hidden.items():
            if not rows:
                continue
            print(f"HIDDEN {_label(kind).upper()} ({len(rows)})")
            for row in rows:
                print(f"  {row['server']}:{row['original']}  hidden by {row['rule']}"[:width])
            print()
    return 0


def _route_of(catalog: Any, kind: str, exposed: str) -> Any:
    if kind == "tools":
        return catalog.tools.get(exposed)
    if kind == "prompts":
        return catalog.prompts.get(exposed)
    if kind == "resources":
        return catalog.route_uri(exposed)
    return catalog.route_template(exposed)


def _check(args: argparse.Namespace) -> int:
    config, path = _config(args)
    # What serve would refuse, check refuses too.
    for option, address in (
        ("http.listen", config.http.listen),
        ("http.websocket_listen", config.http.websocket_listen),
    ):
        if address is not None:
            check_exposure(config.http, address, option)
    lines, collisions, ok = trio.run(
        _with_started_hub,
        config,
        lambda hub: (
            _status_lines(hub),
            [c for kind in KINDS for c in hub.catalog.collisions[kind]],
            all(u.state == "ready" for u in hub.upstreams.values()),
        ),
        lambda: print(f"config {path}: ok ({len(config.servers)} servers)", flush=True),
    )
    print("\n".join(lines))
    for collision in collisions:
        print(f"  note: name collision: {collision}")
    return 0 if ok else 1


def _approve(args: argparse.Namespace) -> int:
    config, _ = _config(args)

    def approve(hub: Hub) -> tuple[bool, list[str]]:
        pinners = [p for p in hub.plugins.plugins if callable(getattr(p, "approve", None))]
        approved = [name for pinner in pinners for name in pinner.approve(args.names or None)]
        return bool(pinners), approved

    found, approved = trio.run(_with_started_hub, config, approve)
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


def _import(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    raw = mcp_servers_json_to_raw(data, source=str(path))
    text = raw_to_toml(raw)
    # Prove the output loads before printing it (variables stay unexpanded).
    import tomllib

    from aggregator.config import structure_config

    structure_config(tomllib.loads(text), environ=_AnyEnviron(), source="(converted)")
    sys.stdout.write(f"# converted from {path}\n{text}")
    return 0


class _AnyEnviron(dict):
    """An environment in which every variable is set: for validating without expanding."""

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> str:
        return "${" + key + "}"
