"""``aggregator serve``: run the proxy on stdio and/or the network fronts until a signal
(draining what is in flight first), and greet a person at a terminal."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

import trio

from aggregator import __version__
from aggregator.access import check_exposure
from aggregator.cli.common import command_config, status_lines
from aggregator.config import Config, same_listener
from aggregator.errors import AggregatorError, ConfigError
from aggregator.hub import Hub
from aggregator.reload import remove_pid_file, watch_config, write_pid_file

log = logging.getLogger("aggregator")

# The cyclic collector's youngest generation once serving (``_settle_memory``).
_GC_YOUNG = 10_000


def run_serve(args: argparse.Namespace) -> int:
    config, path = command_config(args)
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
    pid_file = Path(args.pid_file) if args.pid_file else None
    if pid_file is not None:
        write_pid_file(pid_file)
    try:
        trio.run(_serve_all, config, path.resolve(), stdio, listen, ws_listen, args.watch)
    finally:
        if pid_file is not None:
            remove_pid_file(pid_file)
    return 0


async def _serve_all(
    config: Config, path: Path, stdio: bool, listen: str | None, ws_listen: str | None, watch: bool = False
) -> None:
    from aggregator.session import serve_stream_session
    from aggregator.transports.stdio import OwnStdio

    own = OwnStdio() if stdio else None
    interactive = stdio and os.isatty(0)
    # With no network front the stdio client is the only one there can ever be.
    hub = Hub(config, single_client=stdio and listen is None and ws_listen is None)
    hub.config_path = path
    cannot_listen: str | None = None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_signals, nursery.cancel_scope, hub)
            nursery.start_soon(_reload_on_sighup, hub)
            await nursery.start(hub.run)
            if watch:
                nursery.start_soon(watch_config, hub, path)
            cannot_listen = await _start_endpoints(nursery, hub, config, listen, ws_listen)
            if cannot_listen is not None:
                # Raised once the nursery has stopped the servers it started, so that the
                # user reads one line and no server outlives the proxy.
                nursery.cancel_scope.cancel()
                return
            if interactive:
                nursery.start_soon(_greet, hub, path)
            nursery.start_soon(_settle_memory, hub)
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


async def _reload_on_sighup(hub: Hub) -> None:
    """SIGHUP: reload the config file (``Hub.reload``); the proxy goes on either way."""
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            log.info("received SIGHUP; reloading %s", hub.config_path)
            await hub.reload()


async def _cancel_on_signals(scope: trio.CancelScope, hub: Hub | None = None) -> None:
    """SIGTERM or SIGINT: finish what is in flight (up to proxy.drain_timeout, taking
    nothing new), then stop everything. A second signal stops at once. (SIGHUP reloads
    the config: ``_reload_on_sighup``.)"""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
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


async def _settle_memory(hub: Hub) -> None:
    """Once every server has started, what startup built (modules, config, catalogs) is
    set aside from the cyclic collector, and its youngest generation is collected every
    ``_GC_YOUNG`` allocations instead of 700: a request allocates a handful of short-lived
    containers, most freed by reference counting at once, and collecting the survivors
    of every hundred calls again and again costs more CPU than the few hundred kilobytes
    a larger young generation holds."""
    await hub.startup_done.wait()
    gc.collect()
    gc.freeze()
    gc.set_threshold(_GC_YOUNG, *gc.get_threshold()[1:])


async def _greet(hub: Hub, path: Path) -> None:
    """Tell a person at a terminal what is running and how to use it from a client."""
    await hub.startup_done.wait()
    lines = ["", f"aggregator {__version__} is serving MCP on stdin/stdout.", "Servers:"]
    lines += status_lines(hub)
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
