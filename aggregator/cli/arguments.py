"""The argument parser: each command, its options and the function that runs it."""

from __future__ import annotations

import argparse
from typing import Any

from aggregator import __version__
from aggregator.cli.approve import run_approve
from aggregator.cli.catalog import run_tools
from aggregator.cli.check import run_check
from aggregator.cli.common import DEFAULT_CONFIG
from aggregator.cli.convert import run_import
from aggregator.cli.logs import FORMATS, LEVELS
from aggregator.cli.serve import run_serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aggregator",
        description="One MCP endpoint in front of many MCP servers.",
    )
    parser.add_argument("--version", action="version", version=f"aggregator {__version__}")
    parser.set_defaults(command=None)
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    _add_serve(sub)
    _add_tools(sub)
    _add_check(sub)
    _add_approve(sub)
    _add_import(sub)
    _add_status(sub)
    _add_reload(sub)
    _add_auth(sub)
    _add_search(sub)
    _add_add(sub)
    return parser


def _command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, log_level: str = "warning", **kwargs: Any
) -> argparse.ArgumentParser:
    # Each command its own --log-level: argparse shares a parent parser's actions between
    # its children, so one child's set_defaults would change every other's default.
    p = sub.add_parser(name, **kwargs)
    p.set_defaults(parser=p)  # an unknown option is shown with this command's usage
    p.add_argument(
        "--log-level",
        default=log_level,
        choices=LEVELS,
        help=f"how much to log to stderr (default: {log_level}); debug adds a line per message (direction,"
        " method, id, size)",
    )
    p.add_argument(
        "--log-format",
        default="text",
        choices=FORMATS,
        help="text lines, or one JSON object a line (default: text)",
    )
    return p


def _with_config(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        "-c",
        default=None,
        metavar="PATH",
        help=f"aggregator.toml, or a Claude Desktop / Cursor / VS Code JSON file (default: ./{DEFAULT_CONFIG})",
    )


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = _command(
        sub,
        "serve",
        "info",
        help="run the proxy",
        description="Run the proxy. With --stdio it speaks MCP on stdin/stdout.",
    )
    _with_config(serve)
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
    serve.add_argument(
        "--admin",
        metavar="[HOST:]PORT",
        default=None,
        help="serve /healthz, /readyz, /status, /metrics and POST /reload at http://HOST:PORT"
        " (default: http.admin_listen from the config)",
    )
    serve.add_argument(
        "--watch",
        action="store_true",
        help="reload the config whenever the file changes (looked at every second), as on SIGHUP",
    )
    serve.add_argument(
        "--pid-file",
        metavar="PATH",
        default=None,
        help="write the proxy's process id here (for `aggregator reload --pid-file PATH`); removed on exit",
    )
    serve.set_defaults(command="serve", run=run_serve)


def _add_tools(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tools = _command(
        sub,
        "tools",
        help="print the merged catalog",
        description="Start the servers and print what a client would see.",
    )
    _with_config(tools)
    tools.add_argument("--json", action="store_true", help="print JSON instead of a table")
    tools.add_argument(
        "--profile",
        metavar="NAME",
        default=None,
        help="show what clients of this profile see (default: the default profile)",
    )
    tools.add_argument("--explain", action="store_true", help="also list each hidden item and the rule that hid it")
    tools.add_argument(
        "--tokens",
        action="store_true",
        help="show each profile's tools/list size in tokens (estimated), in all and in search mode",
    )
    tools.set_defaults(command="tools", run=run_tools)


def _add_check(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = _command(
        sub,
        "check",
        help="validate the config and the servers",
        description="Validate the config, start every server, report each one's status; exit non-zero on any error.",
    )
    _with_config(check)
    check.set_defaults(command="check", run=run_check)


def _add_approve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    approve = _command(
        sub,
        "approve",
        help="accept tool definitions that changed",
        description="Start the servers and accept the current definitions of the tools"
        " the pin-definitions plugin quarantined (all, or those named).",
    )
    _with_config(approve)
    approve.add_argument("names", nargs="*", metavar="NAME", help="exposed tool names (default: every changed one)")
    approve.set_defaults(command="approve", run=run_approve)


def _add_import(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    imp = _command(
        sub,
        "import",
        help="convert an mcpServers JSON file to TOML",
        description="Print the aggregator.toml equivalent of a Claude Desktop, Cursor or VS Code server list.",
    )
    imp.add_argument("file", metavar="FILE.json")
    imp.add_argument(
        "-o",
        "--output",
        metavar="FILE.toml",
        help="write FILE.toml (only once the conversion succeeded) instead of stdout",
    )
    imp.set_defaults(command="import", run=run_import)


def _add_status(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = _command(
        sub,
        "status",
        help="show how a running proxy is",
        description="Ask a running proxy's admin endpoint for its status: servers, sessions,"
        " recent errors and what each profile hides. Exit 0 when it is ready, 1 otherwise.",
    )
    _with_config(status)
    status.add_argument(
        "--admin",
        metavar="URL",
        default=None,
        help="the admin endpoint, http://HOST:PORT or HOST:PORT"
        " (default: http.admin_listen, else http.listen, from the config)",
    )
    status.add_argument(
        "--token",
        metavar="TOKEN",
        default=None,
        help="the bearer token (default: $AGGREGATOR_ADMIN_TOKEN); prefer the variable: options show in ps",
    )
    status.add_argument("--json", action="store_true", help="print status.json as it came")
    status.set_defaults(command="status", run=run_status)


def _add_reload(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    reload = _command(
        sub,
        "reload",
        help="make a running proxy read its config again",
        description="Make a running proxy reload its config file, as SIGHUP does: servers added,"
        " removed or changed are started, stopped or restarted; clients stay connected.",
    )
    reload.add_argument(
        "--pid-file",
        metavar="PATH",
        default=None,
        help="the file `serve --pid-file PATH` wrote: send SIGHUP to the process it names",
    )
    reload.add_argument(
        "--admin",
        metavar="URL",
        default=None,
        help="the proxy's admin listener (http://127.0.0.1:PORT): POST /reload and print what changed;"
        " the token, if the listener wants one, is taken from $AGGREGATOR_ADMIN_TOKEN",
    )
    reload.set_defaults(command="reload", run=run_reload)


def _add_auth(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    auth = _command(
        sub,
        "auth",
        help="list or revoke users' tokens for servers",
        description='The token vault: users\' own tokens for servers with auth = "oauth".',
    )
    actions = auth.add_subparsers(title="actions", metavar="ACTION", required=True)
    listing = _command(actions, "list", help="who granted access to which server (never a token)")
    _with_config(listing)
    listing.set_defaults(command="auth", run=run_auth_list)
    revoke = _command(
        actions,
        "revoke",
        help="remove a user's tokens and revoke them at the authorization server",
        description="Remove USER's tokens (for SERVER, or every server) from the vault and revoke them"
        " where the authorization server has a revocation endpoint (RFC 7009).",
    )
    _with_config(revoke)
    revoke.add_argument("user", metavar="USER", help="the user's subject (sub) at their issuer")
    revoke.add_argument("server", metavar="SERVER", nargs="?", default=None, help="one server (default: all)")
    revoke.add_argument("--issuer", default=None, help="only the user of this issuer (subjects are unique per issuer)")
    revoke.set_defaults(command="auth", run=run_auth_revoke)


def _with_registry(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--registry",
        metavar="URL",
        default=None,
        help="an MCP registry's base URL (https; http only on 127.0.0.1), a file:// URL or a directory of"
        " server.json files (default: [registry] url from the config, else the official registry)",
    )


def _add_search(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    search = _command(
        sub,
        "search",
        help="find servers in an MCP registry",
        description="List the servers a registry matches: name, latest version, status, how each runs,"
        " description. Exit 1 when none matches.",
    )
    search.add_argument("query", metavar="QUERY", nargs="?", default="", help="what to look for (default: list all)")
    _with_config(search)
    _with_registry(search)
    search.add_argument("--limit", type=int, default=30, metavar="N", help="list at most N servers (default: 30)")
    search.add_argument(
        "--updated-since",
        metavar="TIME",
        default=None,
        help="only servers updated since TIME (RFC 3339, 2026-01-31T00:00:00Z); for polling a registry",
    )
    search.set_defaults(command="search", run=run_search)


def _add_add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add = _command(
        sub,
        "add",
        help="add a server from an MCP registry to the config",
        description="Resolve NAME in a registry and append its [servers.KEY] table to the config file"
        " (the rest of the file is kept as it is): the package runner at the pinned version, its arguments,"
        " its environment variables as ${VAR}. The file is checked as serve would load it, and put back if"
        " it does not load.",
    )
    add.add_argument("name", metavar="NAME", help="the server's registry name (io.github.owner/server)")
    add.add_argument("--version", default=None, metavar="V", help="this version (default: the latest)")
    add.add_argument(
        "--as",
        dest="key",
        default=None,
        metavar="KEY",
        help="the server's key in the config (default: from its name, io.github.x/server-memory -> memory)",
    )
    add.add_argument("--replace", action="store_true", help="replace the [servers.KEY] table if there is one")
    _with_config(add)
    _with_registry(add)
    add.set_defaults(command="add", run=run_add)


# The vault's commands import sqlite and cryptography when they run, not with every command.
def run_auth_list(args: argparse.Namespace) -> int:
    from aggregator.cli.auth import run_auth_list as run

    return run(args)


def run_auth_revoke(args: argparse.Namespace) -> int:
    from aggregator.cli.auth import run_auth_revoke as run

    return run(args)


# search and add speak HTTP (httpx) and check with the plugin layer: imported when they run.
def run_search(args: argparse.Namespace) -> int:
    from aggregator.cli.registry import run_search as run

    return run(args)


def run_add(args: argparse.Namespace) -> int:
    from aggregator.cli.registry import run_add as run

    return run(args)


# status and reload speak HTTP (urllib): imported when they run, not by every command.
def run_status(args: argparse.Namespace) -> int:
    from aggregator.cli.status import run_status as run

    return run(args)


def run_reload(args: argparse.Namespace) -> int:
    from aggregator.cli.reload import run_reload as run

    return run(args)
