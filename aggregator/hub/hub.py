"""The hub: the top nursery. Supervises upstreams, owns the router, serves clients.

It is the one place that routes and carries out the router's commands. The fronts reach it
through their ``ClientPort`` (``fronts.port``: a client connected, sent a message, was
refused, went idle or away) and the upstream sessions through their ``UpstreamPort``
(``upstreams.port``: a server connected, said something, was lost, went down, is backed
up; a call of the proxy's own); neither ever holds the router. Each port method routes
the event and carries out what the router says in one of three timings: batched per read
(``dispatch``, written at the reader's ``flush``), once per scheduler turn
(``dispatch_soon``), or at once (``dispatch_now``).

Carrying out the router's commands: ``dispatch`` turns
``ToClient`` / ``ToServer`` into queued writes, and what the router says of an upstream's
connection (``UpstreamServing``, ``DropUpstream``, an ``Answer`` to its own request) into
calls of its ``UpstreamSession``. ``dispatch`` never blocks or writes; readers call ``flush`` per read
(a task per request: ``dispatch_soon``, written once per scheduler turn by ``SoonWriter``),
and wait only on their party's queue (``flush(own)``): nothing shared waits for one slow party.
Each queue enforces its own byte budget and deadline and tells its owner when one is
passed (a client is dropped, a server's requests fail); see ``transports.outbox``. What
all clients' queues hold together is counted in ``client_memory``; past its limit the
clients that have stopped reading are dropped, the longest stalled first, until under it
(``shedding``). The plugins' hooks run in ``plugins.gate``, between the clients and the
router; ``plugin_wiring`` puts the plugins in place, at start and by a reload.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any

import trio

from aggregator.cluster.kept import SharedKept
from aggregator.cluster.keys import KEPT, KeyRing
from aggregator.cluster.store import Store, open_store
from aggregator.config import Config
from aggregator.config.core_settings import discovery_settings, link_settings
from aggregator.config.upstream_auth import acts_as_users
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.catalogs.policy import unmatched_rules
from aggregator.core.commands import Command, FetchKept, RequestEnded, ShareKept
from aggregator.core.events import (
    Abandoned,
    CatalogsRenewed,
    ClientAdopted,
    ClientAnswerRefused,
    ClientConnected,
    ClientDecoded,
    ClientDisconnected,
    ClientMessage,
    ClientRefused,
    DiscoveryRenewed,
    DrainingStarted,
    KeptFetched,
    LinkEnded,
    OwnCallStarted,
    ServerAdded,
    ServerCached,
    ServerCongested,
    ServerDecoded,
    ServerDown,
    ServerLost,
    ServerMessage,
    ServerOverloaded,
    ServerOversized,
    ServerRemoved,
    ServerReplaced,
    ServerRestarting,
    ServerStreams,
    StartupCompleted,
    TimePassed,
    UpstreamConnected,
)
from aggregator.core.requests.request_table import Histogram
from aggregator.core.router import (
    Answer,
    DropUpstream,
    SessionInfo,
    StartUpstream,
    StopIdle,
    StopUpstream,
    ToClient,
    ToServer,
    UpstreamServing,
    WaitForStartup,
    WakeUpstream,
)
from aggregator.hub.callers import Callers
from aggregator.hub.caps import Admission
from aggregator.hub.catalogs import make_router
from aggregator.hub.clock import RouterClock
from aggregator.hub.drain import Drain
from aggregator.hub.listings import KeptListings
from aggregator.hub.plugin_wiring import PluginWiring
from aggregator.hub.reload import (
    CHANGED,
    ReloadPlan,
    ReloadResult,
    cannot_reload,
    internal_error,
    profile_policies,
    read_reload,
    wait_stopped,
)
from aggregator.hub.session_links import SessionLinks
from aggregator.hub.shedding import Shedder
from aggregator.hub.soon import SoonWriter
from aggregator.hub.startup import Startup
from aggregator.jsonrpc.codec import decode_message, dumps
from aggregator.jsonrpc.errors import RemoteProtocolError
from aggregator.jsonrpc.framing import OversizedLine
from aggregator.jsonrpc.kinds import REQUEST
from aggregator.mcp.constants import CANCELLED
from aggregator.plugins.api import Plugins, plugins_of
from aggregator.plugins.gate import PluginGate
from aggregator.telemetry import traffic
from aggregator.telemetry.metrics import Metrics
from aggregator.telemetry.recent_errors import RecentErrors
from aggregator.telemetry.tracing import Tracing
from aggregator.transports import channel
from aggregator.transports.sink import ClientSink
from aggregator.upstreams.port import Connector, OwnCall
from aggregator.upstreams.session import UpstreamSession

if TYPE_CHECKING:
    from aggregator.credentials.service import UserCredentials

log = logging.getLogger(__name__)
# Upper bounds, in seconds, of the buckets of how long a server took to start (to its first listing).
START_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Hub:
    def __init__(
        self,
        config: Config,
        *,
        connector: Connector | None = None,
        single_client: bool = False,
        looking: bool = False,
    ) -> None:
        self.config = config
        self.tracing: Tracing | None = None  # spans per request (``trace``), or none
        self.config_path: Path | None = None  # the file it came from: what ``reload`` reads
        # How upstreams are reached (None: their configured transport; tests pass an in-memory
        # connector). ``single_client``: it serves stdio alone (shared servers see its roots).
        self.connector = connector
        self._nursery: trio.Nursery | None = None
        # What the replicas share ([cluster] store): Redis, or this process's own memory.
        # Opened when the hub runs; one that is down is shown by readiness, never waited for.
        self.store: Store = open_store(config.cluster.store, prefix=config.cluster.prefix)
        # [cluster] keys, derived once: what seals session ids and signs cursors and states.
        self.keys = KeyRing.of(config.cluster)
        self.wiring = PluginWiring(self, plugins_of(config), self.store, self.keys, self.renew)  # plugins, gate, tasks
        self._reloading = trio.Lock()  # one reload at a time
        allowed = self.wiring.server_request_allowed  # sampling, elicitation, roots: the policy, then plugins
        self.router, self.catalog = make_router(config, self.plugins, single_client, allowed, self.keys)
        # A shared connection to each server, but none to one acting as each user: without a
        # user it has nobody to act as (each session's own connection lists it for that session).
        # Each server's last listing is kept in the cache; a lazy server with one is not
        # started (its catalog is that listing) until a request needs it. A command's one
        # look (``looking``: check, tools) starts every server.
        self.listings = KeptListings(config, looking=looking)
        shared = [server for server in config.enabled_servers if not acts_as_users(server)]
        dormant = set() if looking else self.listings.dormant(self.router, shared)
        self.upstreams = {
            server.name: UpstreamSession(self, server, dormant=server.name in dormant) for server in shared
        }
        self.start_latency = Histogram(START_BUCKETS)  # how long servers took to start, to their first listing
        # Shutting down (``drain``): whether it drains, and what it still admits meanwhile.
        self.shutdown = Drain(
            in_flight=self.router.in_flight, closing=lambda: self.router.draining, keys_shared=self.keys.shared
        )
        # The network endpoints' shared caps (connections, sessions); fewer admitted while draining.
        self.admission = Admission(config.http.max_connections, config.http.max_sessions, self.shutdown.refuses_new)
        self.startup = Startup(set(self.upstreams) - dormant)  # the servers startup waits for
        self.startup_done = self.startup.done  # the hub serves nothing before
        # Where each client session's messages go: an Outbox for a stream transport, an
        # HTTP session, a WebSocket sink. Each drops its own client when it is past its budget.
        self.clients: dict[int, ClientSink] = {}
        budget = config.proxy.total_client_buffer_bytes  # all clients' queues together (each: held, shed)
        self._shedder = Shedder(self.clients, budget, self._mark_dirty, self._write_dirty)
        self.client_memory = self._shedder.memory
        self._client_keys = itertools.count(1)
        self.started_at = time.monotonic()
        self.looking = looking  # a command's one look (check, tools): it serves nobody, reports each server
        self.client_since: dict[int, float] = {}  # when each client connected (time.monotonic())
        # Who each client acts as for servers that take users' own credentials, those
        # credentials (``serve`` opens them when a server needs them), who was asked to grant.
        self.callers = Callers()
        self.metrics = Metrics(self)  # GET /metrics: read from the hub's tables at each scrape
        # Each session's own connections (per-session servers, servers acting as each user).
        ended = self.router.handle  # told LinkEnded(name): its session's next request starts another
        self.session_links = SessionLinks(
            self, self.upstreams, self.callers, retire=self.metrics.retire, ended=lambda name: ended(LinkEnded(name))
        )
        self.recent_errors = RecentErrors()  # warnings and errors logged while it runs
        # The rests of cut results in that store, when the router shares them ([cluster] keys and store).
        self.kept = SharedKept(self.store, self.keys.keys_for(KEPT)) if self.router.budgets.shared else None
        self._dirty: list[ClientSink] = []
        self.soon = SoonWriter(self._write_dirty)  # dispatch_soon's writes, once per scheduler turn
        # Wakes at the router's next deadline (requests timing out, debounced notices).
        self.clock = RouterClock(self.router.next_deadline, lambda: self.dispatch_now(self.router.handle(TimePassed())))
        # What each of the router's commands does: one dict lookup on its type.
        self._handlers: dict[type, Callable[[Any], None]] = {
            ToClient: self._to_client,
            ToServer: self._to_server,
            UpstreamServing: self._upstream_serving,
            DropUpstream: self._drop_upstream,
            Answer: self._answered,
            StartUpstream: self._start_upstream,
            StopUpstream: self.session_links.stop,
            WakeUpstream: self._wake_upstream,
            StopIdle: self._stop_idle,
            RequestEnded: self._request_ended,
            ShareKept: self._share_kept,
            FetchKept: self._fetch_kept,
        }
        self._traffic = traffic.watch_commands(self._handlers)  # --log-level debug: a line per message
        self._handling = self.router.tallies.proxy["client"]  # how long routing took, per message, by sender
        self._server_handling = self.router.tallies.proxy["server"]

    # --- lifetime -----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Hub] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the plugins' load hooks, start every upstream concurrently and supervise them
        until cancelled; then (also after an error) the plugins' done hooks."""
        self.recent_errors.attach()
        try:
            await self.plugins.load()
            async with trio.open_nursery() as nursery:
                self._nursery = self._shedder.nursery = self.session_links.nursery = nursery
                await nursery.start(self.store.run)  # at once, even if the store is down
                self.wiring.start(nursery)
                for upstream in self.upstreams.values():
                    nursery.start_soon(upstream.run, name=f"upstream {upstream.name}")
                nursery.start_soon(self._startup_gate)
                nursery.start_soon(self.clock.run)
                nursery.start_soon(self.soon.run)
                task_status.started(self)
        finally:
            self.recent_errors.detach()
            await self.plugins.done()

    @property
    def plugins(self) -> Plugins:  # the plugins in place (a reload may replace them)
        return self.wiring.plugins

    @property
    def gate(self) -> PluginGate:  # their hooks between the clients and the router
        return self.wiring.gate

    # --- reload -------------------------------------------------------------------------

    async def reload(self, *, keep_servers: bool = False) -> ReloadResult:
        """Read ``config_path`` again and apply what changed, clients staying connected; one
        reload at a time (see ``hub.reload``). ``keep_servers`` (``serve --watch``'s): a file
        with no servers is not applied over a running config that has some."""
        refused = cannot_reload(self.config_path, self._nursery is not None, self.draining)
        if refused is not None or self.config_path is None:
            return refused or ReloadResult(False)
        async with self._reloading:
            try:
                plan = read_reload(self.config, self.config_path, keep_servers)
                if isinstance(plan, ReloadResult):
                    return plan
                await self._apply(plan)
                return plan.applied()
            except Exception as exc:  # noqa: BLE001 - a bug in a reload must not stop the proxy
                return internal_error(exc)

    async def _apply(self, plan: ReloadPlan) -> None:
        """Apply a reload: plugins, then removed and changed servers out (their connections
        stopped, waited for), every catalog renewed, added and changed servers started."""
        if plan.plugins is not None:
            await self.wiring.replace(plan.plugins)
        running, self.config = self.config, plan.changes.effective
        config, router = self.config, self.router
        self.listings.config = config  # (its [proxy], and so its cache_dir, never changes live)
        restarting = plan.restarting(running)
        stopping: list[UpstreamSession] = []
        for name in plan.changes.restarts:
            if name in restarting:
                self.dispatch_now(router.handle(ServerRestarting(name, CHANGED)))
            else:
                why = CHANGED if name in plan.changes.changed else "it was removed from the configuration"
                self.dispatch_now(router.handle(ServerRemoved(name, why)))
            for key, upstream in list(self.upstreams.items()):
                if upstream.config.name == name:
                    del self.upstreams[key]
                    self.metrics.retire(upstream)  # its counters go on under its name
                    upstream.cancel_scope.cancel()
                    stopping.append(upstream)
            self.server_settled(name)  # startup, if not over yet, waits for it no more
        await wait_stopped(stopping)
        self.renew()
        self.dispatch_now(router.handle(DiscoveryRenewed(discovery_settings(config))))
        for name in plan.changes.starts:
            server = config.servers[name]
            if name in restarting:
                router.handle(ServerReplaced(link_settings(server, config), CHANGED))
            else:
                router.handle(ServerAdded(link_settings(server, config)))
            if acts_as_users(server):
                continue
            # A lazy server as at launch: with a cached listing (of this configuration) it is
            # listed from it and not started; without one it starts once, to list.
            # Requests held for it while it changed wake it as soon as it is listed from its
            # cache (so it is there before that listing is told).
            cached = await self.listings.cached(server)
            upstream = UpstreamSession(self, server, dormant=cached is not None)
            self.upstreams[name] = upstream
            if cached is not None:
                self.dispatch_now(router.handle(ServerCached(name, cached)))
            assert self._nursery is not None
            self._nursery.start_soon(upstream.run, name=f"upstream {name}")

    def renew(self) -> None:
        """Build every catalog again: the config's servers and rules, the plugins' hooks."""
        policies, hook = profile_policies(self.config), self.plugins.catalog_hook
        self.dispatch_now(self.router.handle(CatalogsRenewed(self.config.enabled_servers, policies, hook)))

    # --- startup ---------------------------------------------------------------------

    async def _startup_gate(self) -> None:
        await self.startup.wait(self.config.proxy.startup_timeout, self.upstreams, quiet=self.looking)
        self.router.handle(StartupCompleted())
        self.startup_done.set()
        ready = [name for name, upstream in self.upstreams.items() if upstream.state == "ready"]
        for warning in unmatched_rules(self.config, self.catalog.items_of, ready):
            log.warning("policy: %s", warning)

    # --- the upstreams' port (upstreams.port.UpstreamPort) -------------------------------

    def upstream_connected(
        self,
        name: str,
        *,
        target: str,
        init_timeout: float,
        capabilities: dict[str, Any] | None,
        modern_possible: bool,
    ) -> None:
        """Server ``name``'s connection is up: its handshake starts, now."""
        self.dispatch_now(
            self.router.handle(
                UpstreamConnected(
                    name,
                    target=target,
                    init_timeout=init_timeout,
                    capabilities=capabilities,
                    modern_possible=modern_possible,
                )
            )
        )

    def server_streams(self, name: str, tagged: bool) -> None:
        """Whether server ``name``'s connection tags each message with the request it belongs to."""
        self.router.handle(ServerStreams(name, tagged))

    def server_lines(self, name: str, lines: list[bytes | OversizedLine], limit: int) -> None:
        """What one read of stdio server ``name``'s output held: each line routed in turn (one
        over ``limit`` bytes, dropped, as whoever waits for it hears so), the commands queued
        for the reader's ``flush`` after the read. One call per read, the loop's names
        local: this is the path of every line a server sends."""
        handle, handling, dispatch = self.router.handle, self._server_handling, self.dispatch
        for line in lines:
            if isinstance(line, OversizedLine):
                dispatch(handle(ServerOversized(name, line.head, limit)))
                continue
            started = perf_counter()
            commands = handle(ServerMessage(name, line))
            handling.observe(perf_counter() - started)
            dispatch(commands)

    def server_messages(self, name: str, batch: list[channel.ServerMessage]) -> None:
        """Messages network server ``name`` sent, each decoded by its connection (or why it
        could not be), with the request on whose stream it came: routed in turn, the
        commands queued for the reader's ``flush`` after the batch."""
        handle, handling, dispatch = self.router.handle, self._server_handling, self.dispatch
        for item in batch:
            started = perf_counter()
            commands = handle(ServerDecoded(name, item.decoded, item.related))
            handling.observe(perf_counter() - started)
            dispatch(commands)

    def server_congested(self, name: str, reason: str | None) -> int | None:
        """Server ``name``'s input is backed up (``reason``) or flowing again (None): its
        requests in flight, or None if the router already knew."""
        self.router.handle(ServerCongested(name, reason))
        return self.router.in_flight_on(name)

    def server_overloaded(self, name: str, reason: str) -> None:
        """Server ``name`` has read nothing for its deadline: its requests fail, now."""
        self.dispatch_now(self.router.handle(ServerOverloaded(name, reason)))

    def server_lost(self, name: str, reason: str) -> None:
        """Server ``name``'s connection is lost: what waits for it fails, now."""
        self.dispatch_now(self.router.handle(ServerLost(name, reason)))

    def server_down(self, name: str, reason: str, retry_in: float) -> None:
        """Server ``name`` starts again in ``retry_in`` seconds: its callers hear so, now."""
        self.dispatch_now(self.router.handle(ServerDown(name, reason, retry_in)))

    def server_held(self, name: str) -> bool:
        """Whether a request, a subscription or a listen holds server ``name``."""
        return self.router.server_in_use(name)

    async def server_dormant(self, name: str) -> bool:
        """Server ``name`` is stopped until a request needs it: listed from its cache (False:
        it has none)."""
        upstream = self.upstreams.get(name)
        cached = None if upstream is None else await self.listings.cached(upstream.config)
        if cached is None:
            return False
        self.dispatch_now(self.router.handle(ServerCached(name, cached)))
        return True

    def own_call_started(self, name: str, method: str, params: dict[str, Any] | None, call: OwnCall) -> None:
        """A request of the proxy's own to server ``name``, settled on ``call``: sent now."""
        self.dispatch_now(self.router.handle(OwnCallStarted(name, method, params, call)))

    def server_settled(self, name: str) -> None:
        """An upstream is ready, or its first attempt failed: startup need not wait for it."""
        self.startup.settled(name)

    async def drain(self, seconds: float) -> None:
        """Shut down gently (``hub.drain``): draining at once (not ready, nothing new
        admitted, the sessions open served); closing once nothing is in flight, at the
        latest after ``seconds``."""
        await self.shutdown.run(seconds, len(self.sessions()), self._close, self.clients.values)

    def _close(self) -> None:
        """The drain's second step: the router takes nothing new, and what was held for a
        server between restarts (or a session's own connection still starting), never
        sent, is answered now rather than left to the close."""
        self.router.handle(DrainingStarted())
        self.dispatch_now(self.router.handle(Abandoned("the aggregator is shutting down")))

    # --- the clients' port (fronts.port.ClientPort) --------------------------------------

    def client_connected(self, sink: ClientSink, profile: str = "default", **kind: Any) -> int:
        """A new client, whose messages go to ``sink``; its key. ``kind``: ``era`` (MODERN: it
        speaks a modern revision from its first message), ``principal`` (who the front
        authenticated), ``stateless`` (a stateless HTTP request's own), ``shared_name`` (its
        session's name on every replica, ``cluster.sealing.shared_name``); ``access_token``: the
        OAuth access token it showed, kept here for token exchange, never told to the router."""
        key = next(self._client_keys)
        self.callers.connected(key, kind.get("principal"), kind.pop("access_token", None))
        self.clients[key] = sink
        self.client_since[key] = time.monotonic()
        self.router.handle(ClientConnected(key, profile, **kind))
        return key

    def client_adopted(
        self,
        sink: ClientSink,
        profile: str,
        *,
        principal: Any,
        access_token: str | None,
        protocol_version: str,
        capabilities: dict[str, Any],
        client_info: dict[str, Any],
        shared_name: str | None = None,
    ) -> int:
        """A legacy session initialized elsewhere (another replica, or before a restart),
        whose messages go to ``sink``, taken over as its handshake left it; its key.
        ``shared_name``: its name on every replica (``cluster.sealing.shared_name``).
        ValueError when ``profile`` is none of this proxy's."""
        key = next(self._client_keys)
        adopted = ClientAdopted(key, profile, principal, protocol_version, capabilities, client_info, shared_name)
        self.router.handle(adopted)  # raises before anything is kept, on an unknown profile
        self.callers.connected(key, principal, access_token)
        self.clients[key] = sink
        self.client_since[key] = time.monotonic()
        return key

    async def client_message(self, key: int, raw: bytes) -> None:
        """A line a stream front read (stdio, WebSocket): routed, its commands queued for
        the reader's ``flush`` after the read."""
        self.dispatch(await self._route_raw(key, raw))

    async def client_decoded(self, key: int, kind: int, message: dict[str, Any]) -> None:
        """A message a front decoded in a task of its own (an HTTP request): routed, written
        with what else this scheduler turn queues."""
        self.dispatch_soon(await self._route_decoded(key, kind, message))

    def client_refused(self, key: int, exc: RemoteProtocolError, *, now: bool = False) -> None:
        """A client's message could not be read (``exc`` says how to answer it): answered,
        with the reader's batch, or ``now``."""
        commands = self.router.handle(ClientRefused(key, exc))
        if now:
            self.dispatch_now(commands)
        else:
            self.dispatch(commands)

    def client_answer_refused(self, key: int, exc: RemoteProtocolError) -> None:
        """A client's answer to a server's request could not be read: that server hears so, now."""
        self.dispatch_now(self.router.handle(ClientAnswerRefused(key, exc)))

    def client_cancelled(self, key: int, id: Any, reason: str) -> None:
        """Nobody will receive the answer of the client's request ``id`` (its stream is gone):
        cancelled upstream, as if the client had sent ``notifications/cancelled``, now."""
        cancel = {"jsonrpc": "2.0", "method": CANCELLED, "params": {"requestId": id, "reason": reason}}
        self.dispatch_now(self.router.handle(ClientMessage(key, dumps(cancel))))

    def client_finished(self, key: int) -> None:
        """The client's input ended with requests still in flight past their time: each is
        cancelled upstream and answered with an error (its output may still be read), now."""
        self.dispatch_now(self.router.handle(ClientDisconnected(key, answer=True)))

    def client_idle(self, key: int) -> bool:
        """Keep a client connected with nothing to do (a stateless HTTP client between its
        caller's requests), if the router holds nothing of it: True, and no plugin watches
        anything of it any more; False, and the caller disconnects it."""
        if not self.router.client_idle(key):
            return False
        self.gate.forget_client(key)
        return True

    def client_disconnected(self, key: int) -> None:
        """The client is gone: what it had in flight is cancelled upstream, now."""
        if self.tracing is not None:
            self.tracing.client_gone(key)
        self.clients.pop(key, None)
        self.client_since.pop(key, None)
        self.callers.forget(key)
        self.gate.forget_client(key)
        self.dispatch_now(self.router.handle(ClientDisconnected(key)))

    def write_now(self) -> None:
        """Write what is queued now, outside any reader's batch (a client that passed the
        budget of all clients meanwhile is dropped at once)."""
        self.dispatch_now([])

    def has_client(self, key: int) -> bool:
        return key in self.clients

    def session_info(self, key: int) -> SessionInfo | None:
        """What the router knows of client ``key``'s session (None: no session now)."""
        return self.router.session_info(key)

    def profile_catalog(self, profile: str) -> Catalog:
        return self.router.profile_catalog(profile)

    @property
    def max_json_depth(self) -> int:
        """How deep a message a front decodes itself may nest."""
        return self.router.max_json_depth

    @property
    def draining(self) -> bool:
        """Shutting down (``drain``): no new session, no new stateless request, not ready."""
        return self.shutdown.draining

    def use_credentials(self, credentials: UserCredentials) -> None:
        """Users' own credentials for servers, opened by ``serve``: each session's own
        connection to a server that acts as each user sends its user's (``hub.callers``)."""
        self.callers.use(credentials, self._tell)

    def _tell(self, key: int, message: dict[str, Any]) -> None:
        """A notification of the proxy's own to client ``key``, if still connected: sent now."""
        if key in self.clients:
            self.dispatch_now([ToClient(key, message)])

    def caller_token(self, key: int, token: str | None) -> None:
        """A client's request carried ``token``, its OAuth access token (``hub.callers``)."""
        self.callers.show(key, token)

    # --- routing a client's message -----------------------------------------------------

    async def _route_raw(self, key: int, raw: bytes) -> list[Command]:
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

    async def _route_decoded(self, key: int, kind: int, message: dict[str, Any]) -> list[Command]:
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

    # --- the plugin gate's port (plugins.gate.GateHost) ----------------------------------

    async def route_now(self, key: int, message: dict[str, Any]) -> None:
        """A request its plugins allowed (in a task of their own): routed, carried out now.
        Its client's message was routed to nothing (``Tracing.traced``): traced, its hop
        gets its client span here."""
        commands = await self.routed(key, REQUEST, message)
        if self.tracing is not None:
            self.tracing.forwarded(key, message["id"], commands)
        self.dispatch_now(commands)

    def answer_now(self, answer: ToClient) -> None:
        """An answer the plugins' hooks made: sent now."""
        self.dispatch_now([answer])

    def describe(self, key: int, message: dict[str, Any]) -> tuple[str, str, str] | None:
        """The server, its name and the exposed name a client's request names, if any."""
        return self.router.describe(key, message)

    def request_in_flight(self, key: int, id: Any) -> bool:
        return self.router.request_in_flight(key, id)

    def stamped(self, key: int, method: str, answer: dict[str, Any]) -> dict[str, Any]:
        """An answer the proxy makes itself, as the router stamps its own for this client."""
        return self.router.stamped(key, method, answer)

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

    def trace(self, tracing: Tracing) -> None:
        """A span per request from now on; untraced, no ToClient checks for it."""
        self.tracing = tracing
        self._handlers.update(tracing.handlers(self._handlers))
        self.router.watch_held(tracing.forwarded)  # held requests leave with upstream events

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
        wiring = self.wiring
        if wiring.watched:
            wiring.gate.answered(command.session, command.message)
        if wiring.notification_hooks and not wiring.gate.notify(command):
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

    def _share_kept(self, command: ShareKept) -> None:
        """A cut result's rest, written to the shared store (``cluster.kept``); its answer is
        sent once the store has it (or could not take it in time)."""
        if self.kept is not None and self._nursery is not None:
            self.kept.start_write(self._nursery, command, lambda: self.dispatch_now([command.answer]))
        else:
            self._to_client(command.answer)

    def _fetch_kept(self, command: FetchKept) -> None:
        """A read of a rest this replica does not hold: the store is asked, and the router
        told what it said (``KeptFetched``), which answers the read."""
        if self.kept is not None and self._nursery is not None:
            self._nursery.start_soon(self._kept_read, self.kept, command)
        else:
            self.dispatch_soon(self.router.handle(KeptFetched(command, None)))

    async def _kept_read(self, kept: SharedKept, command: FetchKept) -> None:
        found = await kept.read(command)
        text, page_bytes, ttl = found if found is not None else (None, 0, 0.0)
        self.dispatch_now(self.router.handle(KeptFetched(command, text, page_bytes, ttl)))

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
            was = upstream.state
            upstream.serving()
            if upstream.per_session:
                return
            if was != "ready" and upstream.last_start is not None:
                self.start_latency.observe(upstream.last_start)
            self.listings.keep(self._nursery, self.catalog, upstream.config)

    def _wake_upstream(self, command: WakeUpstream) -> None:
        """A request waits for a server stopped on purpose (lazy, idle-stopped): start it."""
        upstream = self.upstreams.get(command.server)
        if upstream is not None:
            upstream.wake()

    def _stop_idle(self, command: StopIdle) -> None:
        """Nobody used a shared server for its idle_stop_after: keep its listing, stop it."""
        upstream = self.upstreams.get(command.server)
        if upstream is not None:
            self.listings.keep(self._nursery, self.catalog, upstream.config)
            upstream.stop_idle()

    def _drop_upstream(self, command: DropUpstream) -> None:
        upstream = self.upstreams.get(command.server)
        if upstream is not None:
            upstream.drop(command.reason)

    def _answered(self, command: Answer) -> None:
        if isinstance(command.caller, OwnCall):
            command.caller.settle(command)

    def _start_upstream(self, command: StartUpstream) -> None:
        """A session's own connection to a server (``hub.session_links``)."""
        self.session_links.start(self.config.servers[command.server], command)

    def dispatch_now(self, commands: list[Command]) -> None:
        """Dispatch and start writing at once (for events outside a reader's batch)."""
        self.dispatch(commands)
        self._write_dirty()
        self.clock.check()

    def dispatch_soon(self, commands: list[Command]) -> None:
        """Dispatch; write with what else this turn of the scheduler queues."""
        self.dispatch(commands)
        self.clock.check()
        if self._dirty:
            self.soon.request()

    async def flush(self, own: ClientSink | None = None) -> None:
        """Write what the last batch queued; then, if ``own`` (the queue of the reader's
        own connection) is backed up, wait for it to drain.

        Readers call this once per read, after dispatching everything in it. Only a
        client's reader passes ``own``: a client that sends faster than it reads is slowed
        down, and no reader ever waits for anybody else's queue.
        """
        self.clock.check()
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
