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
from typing import TYPE_CHECKING, Any

import trio

from aggregator import __version__
from aggregator.cli.common import INTERRUPTED, check_vault, command_config, nothing_to_serve, status_lines
from aggregator.config import Config, parse_listen, same_listener
from aggregator.errors import AggregatorError, ConfigError
from aggregator.fronts.access import check_exposure
from aggregator.hub.hub import Hub
from aggregator.hub.reload import remove_pid_file, watch_config, write_pid_file
from aggregator.ops.admin import admin_exposure
from aggregator.telemetry.tracing import from_environment

if TYPE_CHECKING:
    from aggregator.credentials.callback import OAuthCallback
    from aggregator.credentials.service import UserCredentials

log = logging.getLogger("aggregator")

# The cyclic collector's youngest generation once serving (``_settle_memory``).
_GC_YOUNG = 10_000


def run_serve(args: argparse.Namespace) -> int:
    config, path = command_config(args)
    listen = args.http or config.http.listen
    ws_listen = args.ws or config.http.websocket_listen
    admin_listen = getattr(args, "admin", None) or config.http.admin_listen
    for option, address in (("--http", listen), ("--ws", ws_listen)):
        if address is not None:
            check_exposure(config.http, address, option, oauth=config.auth.enabled)
    if admin_listen is not None:
        admin_exposure(config.http, admin_listen, "--admin", oauth=config.auth.enabled)
        for option, address in (("--http", listen), ("--ws", ws_listen)):
            if address is not None and same_listener(admin_listen, address):
                raise ConfigError(f"--admin {admin_listen} and {option} {address} name the same address")
    if listen is not None and ws_listen is not None and same_listener(listen, ws_listen):
        raise ConfigError(
            f"--http {listen} and --ws {ws_listen} name the same address;"
            " the WebSocket endpoint needs a port of its own"
        )
    check_vault(config)
    reason = nothing_to_serve(config)
    if reason is not None:  # served all the same: a reload may add servers (check refuses it)
        log.warning(
            "config %s has nothing to serve: %s; clients see nothing until a reload adds a server", path, reason
        )
    stdio = args.stdio or (listen is None and ws_listen is None)
    pid_file = Path(args.pid_file) if args.pid_file else None
    _HELD_SIGHUP.install()  # a reload asked for as soon as the pid file is there is not fatal
    if pid_file is not None:
        write_pid_file(pid_file)
    try:
        stopped_by = trio.run(_serve_all, config, path.resolve(), stdio, listen, ws_listen, admin_listen, args.watch)
    finally:
        if pid_file is not None:
            remove_pid_file(pid_file)
    return INTERRUPTED if stopped_by == signal.SIGINT else 0


async def _serve_all(
    config: Config,
    path: Path,
    stdio: bool,
    listen: str | None,
    ws_listen: str | None,
    admin_listen: str | None = None,
    watch: bool = False,
) -> signal.Signals | None:
    """Serve until the stdio client leaves or a signal comes; return the signal, if one did."""
    from aggregator.fronts.own_stdio import OwnStdio

    # An address that cannot be used is found before any server starts (and again when
    # the endpoint takes it, should another process take it meanwhile).
    for address in (listen, ws_listen, admin_listen):
        if address is not None:
            await _probe_listener(address)
    own = OwnStdio() if stdio else None
    # A person reads the greeting: at stdin for stdio (they may type), else at stderr.
    interactive = os.isatty(0) if stdio else os.isatty(2)
    # With no network front the stdio client is the only one there can ever be.
    hub = _hub(config, path, single_client=stdio and listen is None and ws_listen is None)
    cannot_listen: str | None = None
    stopped_by: list[signal.Signals] = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_signals, nursery.cancel_scope, hub, stopped_by)
            running = trio.Event()
            nursery.start_soon(_reload_on_sighup, hub, running)
            await nursery.start(hub.run)
            running.set()
            if watch:
                nursery.start_soon(watch_config, hub.reload, path)
            callback = await _user_credentials(nursery, hub, config, listen)
            urls, cannot_listen = await _start_endpoints(
                nursery, hub, config, listen, ws_listen, admin_listen, callback=callback
            )
            if cannot_listen is not None:
                # Raised once the nursery has stopped the servers it started, so that the
                # user reads one line and no server outlives the proxy.
                nursery.cancel_scope.cancel()
                return None
            if interactive:
                _print_urls(urls, stdio)
                nursery.start_soon(_greet, hub, path, stdio)
            nursery.start_soon(_settle_memory, hub)
            if own is not None and await _serve_stdio(hub, own, nursery, listen is None and ws_listen is None):
                own = None
    finally:
        if own is not None:
            with trio.CancelScope(shield=True):
                await own.aclose()
        if hub.tracing is not None:
            hub.tracing.shutdown()  # (sends the spans still batched)
        if cannot_listen is not None:
            raise AggregatorError(cannot_listen)
    return stopped_by[0] if stopped_by else None


async def _serve_stdio(hub: Hub, own: Any, nursery: trio.Nursery, alone: bool) -> bool:
    """Serve the stdio client until it leaves (then, or if it is ``alone``, stop the proxy);
    True if its session failed and stdout was closed while the network endpoints go on."""
    from aggregator.fronts.session import serve_stream_session

    ended_by_client = await serve_stream_session(hub, own.receive, own.send, label="stdio")
    if ended_by_client or alone:
        log.info("the stdio session ended; shutting down")
        nursery.cancel_scope.cancel()
        return False
    # A failure in the stdio client's session ends that session, not the network
    # clients': close stdout so the stdio client sees the end.
    log.error("the stdio session failed; still serving the network endpoints")
    with trio.CancelScope(shield=True):
        await own.aclose()
    return True


def _hub(config: Config, path: Path, *, single_client: bool) -> Hub:
    """The hub, traced if the environment asks for it, reloading from ``path``."""
    hub = Hub(config, single_client=single_client)
    tracing = from_environment()
    if tracing is not None:
        hub.trace(tracing)
    hub.config_path = path
    return hub


async def _probe_listener(address: str) -> None:
    """Raise AggregatorError if ``address`` cannot be listened on now (in use, a host that
    does not resolve, a port that needs privileges); the listeners are closed at once."""
    host, port = parse_listen(address)
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise AggregatorError(f"cannot listen on {address}: {exc.strerror or exc}") from None
    for listener in listeners:
        await listener.aclose()


async def _user_credentials(
    nursery: trio.Nursery, hub: Hub, config: Config, listen: str | None
) -> OAuthCallback | None:
    """Users' own credentials for servers (the vault opened, the OAuth client ready), when a
    server takes them, handed to the hub for each session's own connections; the callback
    path the HTTP endpoint serves, or None."""
    if all(server.auth == "static" for server in config.enabled_servers):
        return None
    credentials: UserCredentials = await nursery.start(_hold_credentials, config, listen, hub)
    hub.use_credentials(credentials)
    return credentials.callback


async def _hold_credentials(
    config: Config, listen: str | None, hub: Hub, *, task_status: trio.TaskStatus[UserCredentials]
) -> None:
    """Keep the credentials (their HTTP client and vault) open while the proxy serves."""
    # Imported here: sqlite and cryptography cost a proxy without such servers nothing.
    from aggregator.credentials.fetching import oauth_http_client
    from aggregator.credentials.service import UserCredentials

    async with oauth_http_client() as client:
        verifier = None
        if config.auth.enabled:  # the connect page checks whose browser it is with it
            from aggregator.fronts.authorization.tokens import TokenVerifier

            verifier = TokenVerifier.shared(config.auth, config.profiles)
        from aggregator.cluster.keys import BROWSER, FLOWS

        credentials = await UserCredentials.open(
            config,
            client,
            listen=listen,
            environ=os.environ,
            verifier=verifier,
            # [cluster]: grants, flows and sign-ins in the shared store; the cookie read by every replica.
            store=hub.store if config.cluster.store is not None else None,
            browser_key=hub.keys.keys_for(BROWSER).signing[1] if hub.keys.shared else None,
            flow_keys=hub.keys.keys_for(FLOWS),
        )
        try:
            task_status.started(credentials)
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await credentials.aclose()


async def _start_endpoints(
    nursery: trio.Nursery,
    hub: Hub,
    config: Config,
    listen: str | None,
    ws_listen: str | None,
    admin_listen: str | None = None,
    *,
    callback: OAuthCallback | None = None,
) -> tuple[list[str], str | None]:
    """Start the network endpoints in the serve nursery; return the URLs they serve at (each
    with what speaks there) and None, or why one cannot listen (an address in use, a host that does not resolve, a port
    that needs privileges)."""
    from aggregator.fronts.http.endpoint import StreamableHttpEndpoint
    from aggregator.fronts.websocket.endpoint import WebSocketEndpoint
    from aggregator.ops.admin import AdminEndpoint, AdminRoutes

    urls: list[str] = []
    endpoints: tuple[tuple[str | None, Any], ...] = (
        (listen, StreamableHttpEndpoint),
        (ws_listen, WebSocketEndpoint),
        (admin_listen, AdminEndpoint),
    )
    for address, endpoint in endpoints:
        if address is None:
            continue
        if endpoint is StreamableHttpEndpoint:  # it serves the read-only admin paths too
            serving = endpoint(hub, config.http, admin=AdminRoutes(hub, config.http, reload=False), callback=callback)
        else:
            serving = endpoint(hub, config.http)
        failure: BaseException | None = None
        try:
            started = await nursery.start(serving.serve, address)
        except* OSError as group:
            failure = group
        while isinstance(failure, BaseExceptionGroup):
            failure = failure.exceptions[0]
        if failure is not None:
            return urls, f"cannot listen on {address}: {getattr(failure, 'strerror', None) or failure}"
        if endpoint is StreamableHttpEndpoint:
            for sockname in started:
                sse = _url("http", sockname, config.http.sse_path)
                urls.append(f"{_url('http', sockname, config.http.path)}  (Streamable HTTP; HTTP+SSE at {sse})")
        elif endpoint is AdminEndpoint:
            urls += [
                f"{_url('http', sockname, '/status')}  (status page; /healthz, /readyz, /metrics)"
                for sockname in started
            ]
        else:
            urls.append(f"{_url('ws', (parse_listen(address)[0], started.port), config.http.path)}  (WebSocket)")
    return urls, None


def _url(scheme: str, sockname: tuple[Any, ...], path: str) -> str:
    host = str(sockname[0])
    return f"{scheme}://{'[' + host + ']' if ':' in host else host}:{sockname[1]}{path}"


def _print_urls(urls: list[str], stdio: bool) -> None:
    """Where the proxy serves, for a person at a terminal, as soon as it listens."""
    lines = [f"aggregator {__version__} is serving MCP at"]
    lines += [f"  {url}" for url in urls]
    if stdio:
        lines.append("  stdin/stdout")
    print("\n".join(lines), file=sys.stderr, flush=True)


class _HeldSighup:
    """A SIGHUP that comes before ``_reload_on_sighup`` listens (``serve --pid-file`` writes
    the file first, and a reload may be asked for at once): noted, not fatal, and the
    reload is done once the hub runs."""

    def __init__(self) -> None:
        self.came = False

    def install(self) -> None:
        if hasattr(signal, "SIGHUP"):
            signal.signal(signal.SIGHUP, self._note)

    def _note(self, signum: int, frame: object) -> None:
        self.came = True

    def take(self) -> bool:
        came, self.came = self.came, False
        return came


_HELD_SIGHUP = _HeldSighup()


async def _reload_on_sighup(hub: Hub, running: trio.Event | None = None) -> None:
    """SIGHUP: reload the config file (``Hub.reload``) once the hub runs (``running``); the
    proxy goes on either way."""
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        if running is not None:
            await running.wait()
        if _HELD_SIGHUP.take():
            log.info("received SIGHUP while starting; reloading %s", hub.config_path)
            await hub.reload()
        async for _ in signals:
            log.info("received SIGHUP; reloading %s", hub.config_path)
            await hub.reload()


async def _cancel_on_signals(
    scope: trio.CancelScope, hub: Hub | None = None, stopped_by: list[signal.Signals] | None = None
) -> None:
    """SIGTERM or SIGINT: drain (``Hub.drain``: not ready, no new session or stateless
    request, the sessions open served until nothing is in flight, up to
    proxy.drain_timeout), then stop everything. A second signal stops at once. The first signal is
    appended to ``stopped_by`` (SIGINT, Ctrl-C, makes the exit status 130). (SIGHUP
    reloads the config: ``_reload_on_sighup``.)"""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("received %s; shutting down", signal.Signals(signum).name)
            if stopped_by is not None:
                stopped_by.append(signal.Signals(signum))
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


async def _greet(hub: Hub, path: Path, stdio: bool) -> None:
    """Tell a person at a terminal which servers run and how to use the proxy from a client."""
    await hub.startup_done.wait()
    lines = ["", "Servers:"]
    lines += status_lines(hub)
    if stdio:
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
    else:
        lines += ["", "Give a client the URL above; Ctrl-C stops the proxy.", ""]
    print("\n".join(lines), file=sys.stderr, flush=True)


def _own_command() -> str:
    """The absolute path of the `aggregator` script running now (for client configs)."""
    script = Path(sys.argv[0])
    if script.name == "aggregator" and script.exists():
        return str(script.resolve())
    return shutil.which("aggregator") or "aggregator"
