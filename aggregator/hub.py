"""The hub: the top nursery. Supervises upstreams, owns the router, serves clients.

It is also the one place that executes the router's commands: ``dispatch`` turns
``ToClient`` / ``ToServer`` / ``Refresh`` / ``ControlReply`` into queued writes and
wake-ups. ``dispatch`` never blocks and never writes; readers call ``flush`` once per
read, which writes every queue the batch touched. A reader waits only on its own
party's queue (``flush(own)``): nothing shared ever waits for one slow client or server.
Each queue enforces its own byte budget and deadline and tells its owner when one is
passed (a client is dropped, a server's requests fail); see ``transports.outbox``. What
all clients' queues hold together is counted in ``client_memory``; past its limit the
clients that have stopped reading are dropped, the longest stalled first, until under it
(``transports.budget``).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from aggregator.admission import Admission
from aggregator.config import Config
from aggregator.config.core_settings import router_settings
from aggregator.core.catalog import Catalog
from aggregator.core.policy import ProfilePolicy, server_request_allowed
from aggregator.core.router import (
    ControlReply,
    Refresh,
    Router,
    StartUpstream,
    StopUpstream,
    ToClient,
    ToServer,
    WaitForStartup,
    proxy_error,
)
from aggregator.jsonrpc.codec import NOTIFICATION, REQUEST, decode_message
from aggregator.jsonrpc.errors import INVALID_REQUEST, RemoteProtocolError
from aggregator.plugins import (
    HOOKED_METHODS,
    Deny,
    Notification,
    Request,
    Response,
    ServerRequest,
    load_plugins,
)
from aggregator.transports.budget import ClientMemory
from aggregator.transports.sink import ClientSink
from aggregator.upstream import Connector, UpstreamSession

log = logging.getLogger(__name__)
# A client past the total budget is dropped only once no write to it has finished for this
# long while the kernel takes no more for it: a client that reads is never taken for one
# that does not, however large what it is being sent.
STALLED_AFTER = 0.5
SHED_RECHECK = 0.05  # seconds between looks while everybody over the total still reads


class Hub:
    def __init__(self, config: Config, *, connector: Connector | None = None, single_client: bool = False) -> None:
        self.config = config
        # How upstreams are reached; None means by their configured transport. Tests pass
        # an in-memory connector to run fake servers without processes. ``single_client``:
        # it serves stdio alone, so shared servers may see that one client's roots.
        self.connector = connector
        servers = config.enabled_servers
        proxy = config.proxy
        store: dict[str, Any] = {}  # every server's items, shared by the profiles' catalogs

        self.plugins = load_plugins(list(config.plugins), Path(config.directory) if config.directory else None)
        # Catalog hooks run inside the core; what they leave to do (I/O) runs in a task here.
        self._catalog_hooks_ran = trio.Event()
        self.plugins.catalog_changed = lambda: self._catalog_hooks_ran.set()

        def catalog_for(profile: str | None) -> Catalog:
            return Catalog(
                servers,
                proxy.separator,
                proxy.page_size,
                store=store,
                policy=ProfilePolicy(config, profile),
                max_name_length=proxy.max_name_length,
                charset=proxy.name_charset,
                catalog_hook=self.plugins.catalog_hook,
            )

        self.catalog = catalog_for(None)
        self.router = Router(
            self.catalog,
            router_settings(config, servers=servers, single_client=single_client),
            clock=trio.current_time,
            profiles={name: catalog_for(name) for name in config.profiles},
            server_request_policy=self._server_request_allowed,
        )
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
        self.client_memory = ClientMemory(proxy.total_client_buffer_bytes, self._shed)
        self._shedding = False
        self._shed_recheck_at = -math.inf
        self._shed_pending = False
        self._shed_warned_at = -math.inf
        self.startup_done = trio.Event()
        self._settled: set[str] = set()
        self._all_settled = trio.Event()
        self._client_keys = itertools.count(1)
        self._dirty: list[ClientSink] = []
        self._nursery: trio.Nursery | None = None
        self._watched: dict[tuple[int, Any], Request] = {}  # requests plugins want answers of
        self._hooking: dict[tuple[int, Any], trio.CancelScope] = {}  # requests plugins decide on
        self._timer_at = math.inf
        self._timer_poke = trio.Event()
        self._notification_hooks = self.plugins.watch_notifications
        # What each of the router's commands does: one dict lookup on its type.
        self._handlers: dict[type, Callable[[Any], None]] = {
            ToClient: self._to_client,
            ToServer: self._to_server,
            Refresh: self._refresh,
            ControlReply: self._control_reply,
            StartUpstream: self._start_upstream,
            StopUpstream: self._stop_upstream,
        }
        if not self.upstreams:
            self._all_settled.set()

    # --- lifetime -----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Hub] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the plugins' load hooks, start every upstream concurrently and supervise them
        until cancelled; then (also after an error) the plugins' done hooks."""
        try:
            await self.plugins.load()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for upstream in self.upstreams.values():
                    nursery.start_soon(upstream.run, name=f"upstream {upstream.name}")
                nursery.start_soon(self._startup_gate)
                nursery.start_soon(self._timer)
                if self.plugins.after_catalog_hooks:
                    nursery.start_soon(self._after_catalog)
                task_status.started(self)
        finally:
            await self.plugins.done()

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
                self.dispatch_now(self.router.expire())
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
        if waiting:
            log.warning("startup: serving without %s (not ready yet; they join when ready)", ", ".join(waiting))
        self.router.startup_completed()
        self.startup_done.set()

    def server_settled(self, name: str) -> None:
        """An upstream is ready, or its first attempt failed: startup need not wait for it."""
        self._settled.add(name)
        if self._settled >= self._initial:
            self._all_settled.set()

    async def drain(self, seconds: float) -> None:
        """Let requests in flight finish (up to ``seconds``) while refusing new ones."""
        self.router.start_draining()
        waiting = self.router.in_flight()
        if waiting:
            log.info("shutting down: waiting up to %.0fs for %d request(s) in flight", seconds, waiting)
        with trio.move_on_after(seconds):
            while self.router.in_flight():  # noqa: ASYNC110 - the router has no event to wait on
                await trio.sleep(0.05)
        left = self.router.in_flight()
        if left:
            log.warning("shutting down: %d request(s) still in flight after %.0fs; they fail now", left, seconds)
        # Also what was held for a server between restarts (or a session's own connection
        # still starting): never sent, it is answered now rather than left to the close.
        self.dispatch_now(self.router.abandon("the aggregator is shutting down"))
        # Let the answers reach the clients before the connections close.
        with trio.move_on_after(1):
            for client in list(self.clients.values()):
                await client.wait_drained()

    # --- clients ------------------------------------------------------------------------

    def add_client(self, outbox: ClientSink, profile: str = "default") -> int:
        key = next(self._client_keys)
        self.clients[key] = outbox
        self.router.client_connected(key, profile)
        return key

    def _server_request_allowed(self, server: str, method: str, params: dict[str, Any]) -> bool:
        """The per-server policy for sampling, elicitation and roots requests, then plugins."""
        return server_request_allowed(self.config, server, method) and self.plugins.server_request(
            ServerRequest(server, method, params)
        )

    # --- the one way in for clients' messages ---------------------------------------------

    async def client_message(self, key: int, raw: bytes) -> list[Any]:
        """Route a client's message: plugins' request hooks, the startup gate, the router."""
        if not self.plugins.watch_requests:
            commands = self.router.client_message(key, raw)
            if commands and type(commands[0]) is WaitForStartup:
                await self.startup_done.wait()
                commands = self.router.client_message(key, raw)
            return commands
        try:
            kind, message = decode_message(raw, self.router.max_json_depth)
        except RemoteProtocolError as exc:
            return self.router.client_refused(key, exc)
        return await self.client_event(key, kind, message)

    async def client_event(self, key: int, kind: int, message: dict[str, Any]) -> list[Any]:
        if self._hooking and kind == REQUEST and (key, message["id"]) in self._hooking:
            return [_already_in_flight(key, message["id"])]
        if kind == REQUEST and self.plugins.watch_requests and message["method"] in HOOKED_METHODS:
            if self.plugins.request_hooks_wait and self._nursery is not None:
                started = self._start_request_hooks(key, message)
                if started is not None:
                    return started
            else:
                answered = await self._request_hooks(key, message)
                if answered is not None:
                    return answered
        elif self._hooking and kind == NOTIFICATION and message["method"] == "notifications/cancelled":
            params = message.get("params")
            scope = self._hooking.get((key, params.get("requestId") if type(params) is dict else None))
            if scope is not None:  # cancelled while its plugins decide: it never goes upstream
                scope.cancel()
                return []
        return await self._routed(key, kind, message)

    async def _routed(self, key: int, kind: int, message: dict[str, Any]) -> list[Any]:
        """The router's commands for a message, past the startup gate."""
        commands = self.router.client_event(key, kind, message)
        while commands and type(commands[0]) is WaitForStartup:
            await self.startup_done.wait()
            commands = self.router.client_event(key, kind, message)
        return commands

    def _start_request_hooks(self, key: int, message: dict[str, Any]) -> list[Any] | None:
        """Run request hooks that may wait in a task of their own, bounded by the server's
        request timeout; the client's reader goes on at once. None: the router answers."""
        target = self.router.describe(key, message)
        if target is None or self.router.session_info(key) is None or self.router.request_in_flight(key, message["id"]):
            return None  # the router answers what names nothing, or reuses an id
        id = message["id"]
        server = target[0]
        timeout = self.config.servers[server].request_timeout if server in self.config.servers else 60.0
        scope = trio.CancelScope(deadline=trio.current_time() + timeout)
        self._hooking[(key, id)] = scope
        assert self._nursery is not None
        self._nursery.start_soon(self._hooked_request, key, message, scope, server, timeout)
        return []

    async def _hooked_request(
        self, key: int, message: dict[str, Any], scope: trio.CancelScope, server: str, seconds: float
    ) -> None:
        id = message["id"]
        try:
            with scope:
                answered = await self._request_hooks(key, message)
                commands = answered if answered is not None else await self._routed(key, REQUEST, message)
            if scope.cancelled_caught:
                if key in self.clients and trio.current_time() >= scope.deadline:
                    log.warning(
                        "client %d: request hooks did not decide on %s within %gs", key, message["method"], seconds
                    )
                    self.dispatch_now(
                        [
                            ToClient(
                                key,
                                proxy_error(
                                    id,
                                    f"Plugins did not decide on this request within {seconds:g}s",
                                    reason="timeout",
                                    server=server,
                                ),
                            )
                        ]
                    )
                return
            self.dispatch_now(commands)
        except Exception:  # noqa: BLE001 - one request's failure, never its client's session
            log.exception("client %d: internal error running request hooks for %s", key, message["method"])
            if key in self.clients:
                self.dispatch_now(
                    [
                        ToClient(
                            key, proxy_error(id, "Internal error in the aggregator", reason="internal", server=server)
                        )
                    ]
                )
        finally:
            self._hooking.pop((key, id), None)

    async def _request_hooks(self, key: int, message: dict[str, Any]) -> list[Any] | None:
        target = self.router.describe(key, message)
        client = self.router.session_info(key)
        if target is None or client is None or self.router.request_in_flight(key, message["id"]):
            return None  # the router answers what names nothing, or reuses an id
        server, name, exposed = target
        params = message.get("params") or {}
        request = Request(key, client.profile, message["method"], server, name, exposed, params)
        try:
            await self.plugins.request(request)
        except Deny as denial:
            data: dict[str, Any] = {"source": "aggregator", "reason": denial.reason, "server": server}
            if denial.retry_after is not None:
                data["retry_after"] = round(denial.retry_after, 3)
            answer = {
                "jsonrpc": "2.0",
                "id": message["id"],
                "error": {"code": INVALID_REQUEST, "message": denial.message, "data": data},
            }
            self.plugins.response(Response(request, None, answer["error"], 0.0), self._background)
            return [ToClient(key, answer)]
        if request.answer is not None:
            self.plugins.response(Response(request, request.answer, None, 0.0), self._background)
            return [ToClient(key, {"jsonrpc": "2.0", "id": message["id"], "result": request.answer})]
        message["params"] = request.params
        self._watched[(key, message["id"])] = request
        return None

    def _notify(self, command: ToClient) -> bool:
        message = command.message
        if type(message) is bytes or "method" not in message or "id" in message:
            return True
        params = message.get("params")
        notification = Notification(command.session, message["method"], params if type(params) is dict else {})
        if not self.plugins.notification(notification):
            return False
        if notification.params is not params and notification.params:
            message["params"] = notification.params
        return True

    def _background(self, awaitable: Any) -> None:
        async def run() -> None:
            try:
                await awaitable
            except Exception:  # noqa: BLE001 - observe-only hooks cannot change anything now
                log.exception("a plugin's response hook failed")

        if self._nursery is not None:
            self._nursery.start_soon(run)

    def _answered(self, session: int, message: Any) -> None:
        """A client gets an answer: run response hooks if plugins watched its request."""
        if type(message) is bytes or "method" in message:
            return
        request = self._watched.pop((session, message.get("id")), None)
        if request is None:
            return
        response = Response(request, message.get("result"), message.get("error"), time.monotonic() - request.started)
        self.plugins.response(response, self._background)
        if response.result is not None and "result" in message:
            message["result"] = response.result

    def remove_client(self, key: int) -> None:
        self.clients.pop(key, None)
        for hooking in [h for h in self._hooking if h[0] == key]:
            self._hooking.pop(hooking).cancel()
        for watched in [w for w in self._watched if w[0] == key]:
            del self._watched[watched]
        self.dispatch_now(self.router.client_disconnected(key))

    # --- commands -----------------------------------------------------------------------

    def dispatch(self, commands: list[Any]) -> None:
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
            self._answered(command.session, command.message)
        if self._notification_hooks and not self._notify(command):
            return
        if target is not None:
            target.put_message(command.message, command.related)
            if not target.dirty:
                target.dirty = True
                self._dirty.append(target)

    def _to_server(self, command: ToServer) -> None:
        target = self.upstreams[command.server].outbox
        if target is not None:
            target.put_message(command.message)
            if not target.dirty:
                target.dirty = True
                self._dirty.append(target)

    def _refresh(self, command: Refresh) -> None:
        upstream = self.upstreams.get(command.server)
        if upstream is not None:
            upstream.request_refresh(command.kind)

    def _control_reply(self, command: ControlReply) -> None:
        upstream = self.upstreams.get(command.server)
        if upstream is not None:
            upstream.control_reply(command.message)

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
            # If it ended on its own (crashed, or could not start), the next request of its
            # client starts a fresh one.
            self.router.link_ended(upstream.name)

    def dispatch_now(self, commands: list[Any]) -> None:
        """Dispatch and start writing at once (for events outside a reader's batch)."""
        self.dispatch(commands)
        self._write_dirty()
        self._check_timer()

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

    def _write_dirty(self) -> None:
        dirty, self._dirty = self._dirty, []
        for outbox in dirty:
            outbox.flush()

    async def _shed_later(self) -> None:
        await trio.sleep(STALLED_AFTER)
        self._shed_pending = False
        self._shed_recheck_at = -math.inf
        self._shed()
        self._write_dirty()

    def _shed(self) -> None:
        """All clients together hold more than their budget: drop clients that have stopped
        reading, most stalled first, until under it. A client counts as stalled when a
        write to it waits for it to read (the kernel takes no more) and none has finished
        for ``STALLED_AFTER`` seconds; one that reads, however much it is being sent, is
        never dropped for the total (its own budget still holds). Called by a queue as it
        grows (maybe in the middle of a batch: each client's ``shed`` frees its memory at
        once and defers what must wait for the batch's end, for which it is marked dirty);
        while nobody is stalled it looks again at most every ``SHED_RECHECK`` seconds."""
        now = trio.current_time()
        if self._shedding or now < self._shed_recheck_at:
            return
        self._shedding = True
        memory = self.client_memory
        try:
            while memory.total > memory.limit:
                stalled = [
                    client
                    for client in self.clients.values()
                    if client.held > 0 and now - client.last_progress() >= STALLED_AFTER and client.blocked()
                ]
                if not stalled:
                    self._shed_recheck_at = now + SHED_RECHECK
                    if not self._shed_pending and self._nursery is not None:
                        # Nothing more may arrive to make anyone look again: look once a
                        # client could have become stalled.
                        self._shed_pending = True
                        self._nursery.start_soon(self._shed_later)
                    if now >= self._shed_warned_at:
                        self._shed_warned_at = now + 10.0
                        log.warning(
                            "all clients together hold %d bytes, more than %d, and every one of them is"
                            " reading; nobody is dropped",
                            memory.total,
                            memory.limit,
                        )
                    return
                victim = min(stalled, key=lambda client: client.last_progress())
                held = victim.held
                victim.shed(
                    f"all clients together hold more than {memory.limit} bytes; it holds {held} of them"
                    f" and has read nothing for {now - victim.last_progress():.1f}s"
                )
                if not victim.dirty:
                    victim.dirty = True
                    self._dirty.append(victim)
                if victim.held:
                    log.error("internal error: a dropped client still holds %d bytes", victim.held)
                    return
        finally:
            self._shedding = False


def _already_in_flight(key: int, id: Any) -> ToClient:
    return ToClient(
        key,
        {
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": INVALID_REQUEST, "message": f"Invalid request: id {id!r} is already in flight"},
        },
    )
