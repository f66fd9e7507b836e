"""The hub: the top nursery. Supervises upstreams, owns the router, serves clients.

It is also the one place that executes the router's commands: ``dispatch`` turns
``ToClient`` / ``ToServer`` into queued writes, and what the router says of an upstream's
connection (``UpstreamServing``, ``DropUpstream``, an ``Answer`` to its own request) into
calls of its ``UpstreamSession``. ``dispatch`` never blocks or writes; readers call ``flush`` per read
(a task per request: ``dispatch_soon``, written once per scheduler turn by ``soon.SoonWriter``),
and wait only on their party's queue (``flush(own)``): nothing shared waits for one slow party.
Each queue enforces its own byte budget and deadline and tells its owner when one is
passed (a client is dropped, a server's requests fail); see ``transports.outbox``. What
all clients' queues hold together is counted in ``client_memory``; past its limit the
clients that have stopped reading are dropped, the longest stalled first, until under it
(``shedding``). The plugins' hooks run in ``plugins.gate``, between the clients and the router.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from time import perf_counter
from typing import Any

import trio

from aggregator.config import Config
from aggregator.core.catalogs.policy import unmatched_rules
from aggregator.core.commands import Command, RequestEnded
from aggregator.core.events import (
    ClientConnected,
    ClientDecoded,
    ClientDisconnected,
    ClientMessage,
    ClientRefused,
    LinkEnded,
    StartupCompleted,
    TimePassed,
)
from aggregator.core.router import (
    Answer,
    DropUpstream,
    SessionInfo,
    StartUpstream,
    StopUpstream,
    ToClient,
    ToServer,
    UpstreamServing,
    WaitForStartup,
)
from aggregator.hub.caps import Admission
from aggregator.hub.catalogs import make_router
from aggregator.hub.draining import drain
from aggregator.hub.reload import ReloadResult, reload_hub
from aggregator.hub.shedding import Shedder
from aggregator.hub.soon import SoonWriter
from aggregator.jsonrpc.codec import decode_message
from aggregator.jsonrpc.errors import RemoteProtocolError
from aggregator.jsonrpc.kinds import REQUEST
from aggregator.plugins.api import load_plugins
from aggregator.plugins.gate import PluginGate
from aggregator.telemetry import traffic
from aggregator.telemetry.metrics import Metrics
from aggregator.telemetry.recent_errors import RecentErrors
from aggregator.telemetry.tracing import Tracing
from aggregator.transports.sink import ClientSink
from aggregator.upstreams.session import Connector, OwnCall, UpstreamSession

log = logging.getLogger(__name__)


class Hub:
    def __init__(self, config: Config, *, connector: Connector | None = None, single_client: bool = False) -> None:
        self.config = config
        self.tracing: Tracing | None = None  # spans per request (``trace``), or none
        self.config_path: Path | None = None  # the file it came from: what ``reload`` reads
        # How upstreams are reached (None: their configured transport; tests pass an in-memory
        # connector). ``single_client``: it serves stdio alone (shared servers see its roots).
        self.connector = connector
        servers = config.enabled_servers
        proxy = config.proxy
        self.plugins = load_plugins(list(config.plugins), Path(config.directory) if config.directory else None)
        # Catalog hooks run inside the core; what they leave to do (I/O) runs in a task here.
        self._catalog_hooks_ran = trio.Event()
        self.plugins.catalog_changed = lambda: self._catalog_hooks_ran.set()
        self.router, self.catalog = make_router(config, self.plugins, single_client, self._server_request_allowed)
        self.upstreams = {server.name: UpstreamSession(self, server) for server in servers}
        # The network endpoints' shared caps (connections, sessions); none while draining.
        self.admission = Admission(
            config.http.max_connections, config.http.max_sessions, draining=lambda: self.router.draining
        )
        self._initial = set(self.upstreams)
        # Where each client session's messages go: an Outbox for a stream transport, an
        # HTTP session, a WebSocket sink. Each drops its own client when it is past its budget.
        self.clients: dict[int, ClientSink] = {}
        # What all clients' queues hold together; each also has ``held`` and ``shed``.
        self._shedder = Shedder(self.clients, proxy.total_client_buffer_bytes, self._mark_dirty, self._write_dirty)
        self.client_memory = self._shedder.memory
        self.startup_done = trio.Event()
        self._settled: set[str] = set()
        self._all_settled = trio.Event()
        self._client_keys = itertools.count(1)
        self.started_at = time.monotonic()
        self.looking = False  # a command's one look (check, tools): it serves nobody, reports each server
        self.client_since: dict[int, float] = {}  # when each client connected (time.monotonic())
        self.recent_errors = RecentErrors()  # warnings and errors logged while it runs
        self._dirty: list[ClientSink] = []
        self.soon = SoonWriter(self._write_dirty)  # dispatch_soon's writes, once per scheduler turn
        self._nursery: trio.Nursery | None = None
        self.gate = PluginGate(self, self.plugins)  # the plugins' hooks around the router
        self._watched = self.gate.watched  # requests plugins want answers of (checked per answer)
        self._timer_at = math.inf
        self._timer_poke = trio.Event()
        self._notification_hooks = self.plugins.watch_notifications
        # What each of the router's commands does: one dict lookup on its type.
        self._handlers: dict[type, Callable[[Any], None]] = {
            ToClient: self._to_client,
            ToServer: self._to_server,
            UpstreamServing: self._upstream_serving,
            DropUpstream: self._drop_upstream,
            Answer: self._answered,
            StartUpstream: self._start_upstream,
            StopUpstream: self._stop_upstream,
            RequestEnded: self._request_ended,
        }
        self._traffic = traffic.watch_commands(self._handlers)  # --log-level debug: a line per message
        if not self.upstreams:
            self._all_settled.set()
        self._handling = self.router.tallies.proxy["client"]  # how long routing took, per message
        self.metrics = Metrics(self)  # GET /metrics: read from the tables above at each scrape

    # --- lifetime -----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Hub] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the plugins' load hooks, start every upstream concurrently and supervise them
        until cancelled; then (also after an error) the plugins' done hooks."""
        self.recent_errors.attach()
        try:
            await self.plugins.load()
            async with trio.open_nursery() as nursery:
                self._nursery = self.gate.nursery = self._shedder.nursery = nursery
                for upstream in self.upstreams.values():
                    nursery.start_soon(upstream.run, name=f"upstream {upstream.name}")
                nursery.start_soon(self._startup_gate)
                nursery.start_soon(self._timer)
                nursery.start_soon(self.soon.run)
                if self.plugins.after_catalog_hooks:
                    nursery.start_soon(self._after_catalog)
                task_status.started(self)
        finally:
            self.recent_errors.detach()
            await self.plugins.done()

    async def reload(self) -> ReloadResult:
        """Read ``config_path`` again and apply what changed, clients staying connected."""
        return await reload_hub(self)

    async def _after_catalog(self) -> None:
        """Run the plugins' after_catalog hooks, outside the core, once catalog hooks ran."""
        while True:
            await self._catalog_hooks_ran.wait()
            self._catalog_hooks_ran = trio.Event()
            await self.plugins.after_catalog()

    async def _timer(self) -> None:
        """Run the router's clock: time out requests, send debounced notices."""
        while True:
            deadline = self.router.next_deadline()
            self._timer_at = math.inf if deadline is None else deadline
            with trio.move_on_at(self._timer_at):
                await self._timer_poke.wait()
            self._timer_poke = trio.Event()
            try:
                self.dispatch_now(self.router.handle(TimePassed()))
            except Exception:  # noqa: BLE001 - a bug in one expiry must not stop the clock for all
                log.exception("internal error expiring requests and notices; the clock goes on")

    def _check_timer(self) -> None:
        """Wake the timer if the router now has an earlier deadline than it sleeps to."""
        deadline = self.router.next_deadline()
        if deadline is not None and deadline < self._timer_at:
            self._timer_at = deadline
            self._timer_poke.set()

    async def _startup_gate(self) -> None:
        with trio.move_on_after(self.config.proxy.startup_timeout):
            await self._all_settled.wait()
        waiting = [name for name, up in self.upstreams.items() if up.state in ("starting", "down")]
        if waiting and not self.looking:
            log.warning("startup: serving without %s (not ready yet; they join when ready)", ", ".join(waiting))
            for name in waiting:  # those down said why when they went down; these say it now
                self.upstreams[name].warn_if_starting()
        self.router.handle(StartupCompleted())
        self.startup_done.set()
        ready = [name for name, upstream in self.upstreams.items() if upstream.state == "ready"]
        for warning in unmatched_rules(self.config, self.catalog.items_of, ready):
            log.warning("policy: %s", warning)

    def server_settled(self, name: str) -> None:
        """An upstream is ready, or its first attempt failed: startup need not wait for it."""
        self._settled.add(name)
        if self._settled >= self._initial:
            self._all_settled.set()

    async def drain(self, seconds: float) -> None:
        """Let requests in flight finish (up to ``seconds``) while refusing new ones."""
        await drain(self.router, self.clients, self.dispatch_now, seconds)

    # --- clients ------------------------------------------------------------------------

    def add_client(self, outbox: ClientSink, profile: str = "default", **kind: Any) -> int:
        """A new client. ``kind``: ``era`` (MODERN: it speaks a modern revision from its first message),
        ``principal`` (who the front authenticated), ``stateless`` (a stateless HTTP request's own)."""
        key = next(self._client_keys)
        self.clients[key] = outbox
        self.client_since[key] = time.monotonic()
        self.router.handle(ClientConnected(key, profile, **kind))
        return key

    def _server_request_allowed(self, server: str, method: str, params: dict[str, Any]) -> bool:
        """The per-server policy for sampling, elicitation and roots requests, then plugins."""
        return self.gate.server_request_allowed(server, method, params)

    # --- the one way in for clients' messages ---------------------------------------------

    async def client_message(self, key: int, raw: bytes) -> list[Command]:
        """Route a client's message: plugins' request hooks, the startup gate, the router."""
        if self._traffic:
            traffic.note("in", f"client {key}", raw)
        if not self.plugins.watch_requests and self.tracing is None:
            started = perf_counter()
            commands = self.router.handle(ClientMessage(key, raw))
            if commands and type(commands[0]) is WaitForStartup:
                await self.startup_done.wait()
                return self.router.handle(ClientMessage(key, raw))
            self._handling.observe(perf_counter() - started)
            return commands
        try:
            kind, message = decode_message(raw, self.router.max_json_depth)
        except RemoteProtocolError as exc:
            return self.router.handle(ClientRefused(key, exc))
        return await self._hooked(key, kind, message)

    async def client_event(self, key: int, kind: int, message: dict[str, Any]) -> list[Command]:
        """Route a decoded client message: plugins' request hooks, the startup gate, the router."""
        if self._traffic:
            traffic.note("in", f"client {key}", message)
        return await self._hooked(key, kind, message)

    async def _hooked(self, key: int, kind: int, message: dict[str, Any]) -> list[Command]:
        if kind == REQUEST and message["method"] == "tools/call":
            self.router.unwrap_call_tool(key, message)  # plugins and traces see the tool it names
        route = self.gate.client_event if self.plugins.watch_requests else self.routed
        if self.tracing is not None and kind == REQUEST:
            return await self.tracing.traced(key, message, route)
        return await route(key, kind, message)  # no request hooks: nothing can be hooking

    async def routed(self, key: int, kind: int, message: dict[str, Any]) -> list[Command]:
        """The router's commands for a message, past the startup gate."""
        started = perf_counter()
        commands = self.router.handle(ClientDecoded(key, kind, message))
        if not commands or type(commands[0]) is not WaitForStartup:
            self._handling.observe(perf_counter() - started)
        while commands and type(commands[0]) is WaitForStartup:
            await self.startup_done.wait()
            commands = self.router.handle(ClientDecoded(key, kind, message))
        return commands

    def rest_client(self, key: int) -> bool:
        """Keep a client connected with nothing to do (a stateless HTTP client between its
        caller's requests), if the router holds nothing of it (``client_idle``): True, and
        no plugin watches anything of it any more; False, and the caller removes it."""
        if not self.router.client_idle(key):
            return False
        self.gate.forget_client(key)
        return True

    def sessions(self) -> list[tuple[int, ClientSink, SessionInfo | None]]:
        """The client sessions now, each with what the router knows of it: the clients
        less those of stateless 2026-07-28 HTTP requests, which are no session (status,
        metrics)."""
        found = []
        for key, sink in list(self.clients.items()):
            info = self.router.session_info(key)
            if info is None or not info.stateless:
                found.append((key, sink, info))
        return found

    def remove_client(self, key: int) -> None:
        if self.tracing is not None:
            self.tracing.client_gone(key)
        self.clients.pop(key, None)
        self.client_since.pop(key, None)
        self.gate.forget_client(key)
        self.dispatch_now(self.router.handle(ClientDisconnected(key)))

    def trace(self, tracing: Tracing) -> None:
        """A span per request from now on; untraced, no ToClient checks for it."""
        self.tracing = tracing
        self._handlers.update(tracing.handlers(self._handlers))

    # --- commands -----------------------------------------------------------------------

    def dispatch(self, commands: list[Command]) -> None:
        """Queue the commands' messages; they are written at the next ``flush``. Each
        command goes to its handler in ``_handlers``, by its type."""
        handlers = self._handlers
        for command in commands:
            try:
                handler = handlers[type(command)]
            except KeyError:
                raise TypeError(f"cannot dispatch {command!r}") from None
            handler(command)

    def _to_client(self, command: ToClient) -> None:
        target = self.clients.get(command.session)
        if self._watched:
            self.gate.answered(command.session, command.message)
        if self._notification_hooks and not self.gate.notify(command):
            return
        if target is not None:
            target.put_message(command.message, command.related)
            if not target.dirty:
                target.dirty = True
                self._dirty.append(target)

    def _request_ended(self, command: RequestEnded) -> None:
        """A client's request ended unanswered (it cancelled it): a front with a stream per
        request ends that request's stream (``ClientSink.request_ended``)."""
        client = self.clients.get(command.session)
        if client is not None:
            client.request_ended(command.id)

    def _to_server(self, command: ToServer) -> None:
        target = self.upstreams[command.server].outbox
        if target is not None:
            target.put_message(command.message)
            if not target.dirty:
                target.dirty = True
                self._dirty.append(target)

    def _upstream_serving(self, command: UpstreamServing) -> None:
        upstream = self.upstreams.get(command.server)
        if upstream is not None:
            upstream.serving()

    def _drop_upstream(self, command: DropUpstream) -> None:
        upstream = self.upstreams.get(command.server)
        if upstream is not None:
            upstream.drop(command.reason)

    def _answered(self, command: Answer) -> None:
        if isinstance(command.caller, OwnCall):
            command.caller.settle(command)

    def _start_upstream(self, command: StartUpstream) -> None:
        upstream = UpstreamSession(
            self, self.config.servers[command.server], name=command.name, client_capabilities=command.capabilities
        )
        self.upstreams[command.name] = upstream
        assert self._nursery is not None
        self._nursery.start_soon(self._run_session_upstream, upstream, name=f"upstream {command.name}")

    def _stop_upstream(self, command: StopUpstream) -> None:
        upstream = self.upstreams.get(command.name)
        if upstream is not None:
            upstream.cancel_scope.cancel()

    async def _run_session_upstream(self, upstream: UpstreamSession) -> None:
        try:
            await upstream.run()
        except Exception:  # noqa: BLE001 - one session's server, never the process
            log.exception("server %s: internal error in a per-session connection; it ends", upstream.name)
        finally:
            if self.upstreams.get(upstream.name) is upstream:
                del self.upstreams[upstream.name]
                self.metrics.retire(upstream)
            # If it ended on its own (crashed, or could not start), the next request of its
            # client starts a fresh one.
            self.router.handle(LinkEnded(upstream.name))

    def dispatch_now(self, commands: list[Command]) -> None:
        """Dispatch and start writing at once (for events outside a reader's batch)."""
        self.dispatch(commands)
        self._write_dirty()
        self._check_timer()

    def dispatch_soon(self, commands: list[Command]) -> None:
        """Dispatch; write with what else this turn of the scheduler queues."""
        self.dispatch(commands)
        self._check_timer()
        if self._dirty:
            self.soon.request()

    async def flush(self, own: Any = None) -> None:
        """Write what the last batch queued; then, if ``own`` (the queue of the reader's
        own connection) is backed up, wait for it to drain.

        Readers call this once per read, after dispatching everything in it. Only a
        client's reader passes ``own``: a client that sends faster than it reads is slowed
        down, and no reader ever waits for anybody else's queue.
        """
        self._check_timer()
        if self._dirty:
            self._write_dirty()
        if own is not None:
            await own.wait_writable()

    def _mark_dirty(self, target: ClientSink) -> None:
        """Flush ``target`` with the others the batch touched."""
        if not target.dirty:
            target.dirty = True
            self._dirty.append(target)

    def _write_dirty(self) -> None:
        dirty, self._dirty = self._dirty, []
        for outbox in dirty:
            outbox.flush()
