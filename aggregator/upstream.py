"""One upstream server: its process, its connection, and the supervisor that restarts it.

``UpstreamSession.run`` owns the whole lifetime: start the child, initialize, list its
catalog, serve, and when anything ends the connection (exit, stdout EOF, a failed
handshake) fail every pending request at once, stop the child with the full ladder, and
start again after an exponential, full-jitter backoff. One upstream never takes another
down: everything that can go wrong here ends here.

What to say to the server and when (handshake, listing, re-listing, the proxy's own
requests) is ``core.upstream_lifecycle``'s; this module pumps it: it sends what the
lifecycle emits, feeds it the answers and the changed lists, keeps its deadlines with trio
and hands its outcomes to the router. The server's output is read in
``transports.upstream_streams``.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from aggregator.config import Config, ServerConfig
from aggregator.core.upstream_lifecycle import (
    Answer,
    Failed,
    Items,
    Listing,
    Outcome,
    Ready,
    Send,
    Serving,
    UpstreamLifecycle,
)
from aggregator.errors import UpstreamError
from aggregator.transports.outbox import Outbox
from aggregator.transports.stdio import Channel, run_stdio_server
from aggregator.transports.upstream_streams import StderrLog, read_messages

if TYPE_CHECKING:
    from aggregator.core.router import Router

log = logging.getLogger(__name__)

HEALTHY_RESET = 60.0


# async def connector(server_config, *, task_status) -> str: report a Channel through
# task_status, run until the server is gone, return why.
Connector = Callable[..., Awaitable[str]]


class UpstreamHost(Protocol):
    """What an upstream needs of the hub that supervises it (the hub is one; this module
    does not import the hub, which imports it)."""

    config: Config
    router: Router
    # How upstreams are reached; None means by their configured transport.
    connector: Connector | None

    def dispatch(self, commands: list[Any]) -> None:
        """Queue the router's commands; written at the next ``flush``."""

    def dispatch_now(self, commands: list[Any]) -> None:
        """Dispatch the router's commands and start writing at once."""

    async def flush(self, own: Any = None) -> None:
        """Write what the last batch queued."""

    def server_settled(self, name: str) -> None:
        """This upstream is ready, or its first attempt failed."""


class _Call:
    """A request of the proxy's own made with ``UpstreamSession.request``, waiting."""

    __slots__ = ("event", "answer")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.answer: Answer | None = None


class UpstreamSession:
    def __init__(
        self,
        hub: UpstreamHost,
        config: ServerConfig,
        *,
        name: str | None = None,
        client_capabilities: dict[str, Any] | None = None,
    ) -> None:
        self.hub = hub
        self.config = config
        # A per-session connection has its own name (server@session), declares its one
        # client's capabilities and is not restarted: the next request of its client starts
        # it again. It lists after its handshake, all kinds before it tells the router, so
        # its session switches from the shared listing to its own in one step.
        self.name = name or config.name
        self.per_session = name is not None
        self.client_capabilities = client_capabilities
        self.log = logging.getLogger(f"aggregator.server.{config.name}")
        self.cancel_scope = trio.CancelScope()
        self.outbox: Outbox | None = None
        self.state = "starting"  # starting, ready, down (starting again soon)
        self.last_error: str | None = None
        # The last stderr lines of the attempt that set last_error (secrets masked).
        self.last_stderr: tuple[str, ...] = ()
        self._stderr = StderrLog(self.log, (*config.env.values(), *config.headers.values()))
        # The protocol state of the current connection; what it is told waits in the inbox:
        # answers to its own requests (dicts) and kinds whose list changed (str).
        self._lifecycle: UpstreamLifecycle | None = None
        self._inbox: list[dict[str, Any] | str] = []
        self._wake = trio.Event()
        self._calls: set[_Call] = set()  # waiting in ``request``
        self._lost: str | None = None
        self._cancel: trio.CancelScope | None = None

    # --- called by the hub, synchronously -----------------------------------------------

    def send(self, message: Any) -> None:
        """Send a message of the proxy's own (not on the hot path): queue and flush."""
        if self.outbox is not None:
            self.outbox.put_message(message)
            self.outbox.flush()

    def control_reply(self, message: dict[str, Any]) -> None:
        """An answer to one of the proxy's own requests: its lifecycle takes it."""
        if self._lifecycle is not None:
            self._inbox.append(message)
            self._wake.set()

    def request_refresh(self, kind: str) -> None:
        """Its ``kind`` list changed: re-list it once it serves (kept while it is down)."""
        self._inbox.append(kind)
        self._wake.set()

    # --- the supervisor -----------------------------------------------------------------

    async def run(self) -> None:
        """Run this upstream until cancelled, restarting it whenever it is lost."""
        with self.cancel_scope:
            if self.per_session:
                reason = await self._connect_once()
                self.log.info("server %s: session connection ended: %s", self.name, reason)
                return
            await self._supervise()

    async def _supervise(self) -> None:
        attempt = 0
        proxy = self.hub.config.proxy
        while True:
            started = trio.current_time()
            try:
                reason = await self._connect_once()
            except Exception as exc:  # noqa: BLE001 - a bug here must not stop the others
                self.log.exception("server %s: internal error in its connection", self.name)
                reason = f"internal error: {exc!r}"[:300]
            was_ready = self.state == "ready"
            self.state = "down"
            self.last_error = reason
            self.last_stderr = tuple(self._stderr.tail) if not was_ready else ()
            self.hub.server_settled(self.name)
            if trio.current_time() - started > HEALTHY_RESET:
                attempt = 0
            delay = random.uniform(0, min(proxy.restart_backoff_max, proxy.restart_backoff_initial * 2**attempt))
            attempt += 1
            self.log.warning(
                "server %s %s: %s; starting it again in %.1fs (attempt %d)%s",
                self.name,
                "lost" if was_ready else "did not start",
                reason,
                delay,
                attempt,
                f"; its stderr ended: {' | '.join(self.last_stderr)}" if self.last_stderr else "",
            )
            # Its callers meanwhile hear when it is tried again (or wait for it, if that is soon).
            self.hub.dispatch_now(self.hub.router.server_down(self.name, reason, delay))
            await trio.sleep(delay)

    async def _connect_once(self) -> str:
        """Start, initialize, serve; return why the connection ended."""
        config = self.config
        self._lost = None
        self._stderr.tail.clear()
        limit = self.hub.config.proxy.max_message_bytes
        try:
            async with trio.open_nursery() as nursery:
                self._cancel = nursery.cancel_scope
                try:
                    channel = await nursery.start(self._transport)
                except OSError as exc:
                    if config.effective_transport == "stdio":
                        return f"cannot start {config.command!r}: {exc.strerror or exc}"
                    return str(exc)
                if channel.pid is not None:
                    self.log.info("server %s: started pid %d", self.name, channel.pid)
                proxy = self.hub.config.proxy
                self.outbox = Outbox(
                    channel.send,
                    limit=proxy.server_buffer_bytes,
                    name=f"server {self.name}",
                    write_timeout=proxy.server_write_timeout,
                    on_congestion=self._congested,
                )
                nursery.start_soon(self.outbox.run)
                self.hub.router.server_streams(self.name, channel.tagged)
                nursery.start_soon(self._read_stdout, channel.receive, limit, channel.tagged)
                if channel.stderr is not None:
                    nursery.start_soon(self._stderr.read, channel.stderr)
                await self._handshake()
                nursery.start_soon(self._pump)
            return self._lost or "connection ended"
        finally:
            self._cancel = None
            self._lifecycle = None
            for call in self._calls:
                call.event.set()  # the connection ended before an answer
            if self.outbox is not None:
                self.outbox.closed = True
                self.outbox = None
            self.hub.dispatch_now(self.hub.router.server_lost(self.name, self._lost or "stopped"))

    async def _transport(self, *, task_status: trio.TaskStatus[Channel]) -> None:
        """Run the connector (a child process by default) and lose the link when it ends."""
        transport = self.config.effective_transport
        limit = self.hub.config.proxy.max_message_bytes
        if self.hub.connector is not None:
            reason = await self.hub.connector(self.config, task_status=task_status)
        elif transport == "stdio":
            reason = await run_stdio_server(self.config, task_status=task_status)
        else:
            # Imported here: httpx and trio-websocket cost memory a stdio-only proxy need not pay.
            from aggregator.transports import network_upstream

            connect = {
                "streamable-http": network_upstream.run_streamable_http_server,
                "sse": network_upstream.run_sse_server,
                "websocket": network_upstream.run_websocket_server,
            }[transport]
            reason = await connect(self.config, limit, task_status=task_status)
        self._lose(reason)

    def _congested(self, reason: str | None) -> None:
        """Its input is backed up (``reason``) or flowing again (None). Nothing waits for it:
        while backed up, new requests to it are refused; once it has read nothing for the
        deadline, its requests in flight fail too. Both with reason ``overloaded``."""
        router = self.hub.router
        in_flight = router.server_congested(self.name, reason)
        if in_flight is None:
            return
        if reason is None:
            self.log.info("server %s: reading its input again; taking requests", self.name)
            return
        if self.outbox is not None and self.outbox.stalled:
            self.log.error(
                "server %s: not reading its input (%s); its %d request(s) in flight fail, new ones"
                " are refused until it reads again",
                self.name,
                reason,
                in_flight,
            )
            self.hub.dispatch_now(router.server_overloaded(self.name, reason))
        else:
            self.log.warning(
                "server %s: not keeping up with its input (%s); new requests are refused until it catches up",
                self.name,
                reason,
            )

    def _lose(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason
        if self._cancel is not None:
            self._cancel.cancel()

    # --- tasks --------------------------------------------------------------------------

    async def _read_stdout(self, stream: trio.abc.ReceiveStream, limit: int, tagged: bool = False) -> None:
        await read_messages(stream, limit, tagged, self.name, self.hub, self.log)
        # Usually the server is exiting: give its exit status a moment to be the reason we
        # report (the transport task loses the link first if so).
        await trio.sleep(0.5)
        self._lose("the server closed its stdout")

    # --- the lifecycle's pump -----------------------------------------------------------

    async def _handshake(self) -> None:
        """Start this connection's lifecycle: it sends ``initialize`` now; ``_pump`` feeds
        it from then on."""
        config = self.config
        router = self.hub.router
        # Answers to an ended connection's requests are stale; changed lists are not.
        self._inbox = [event for event in self._inbox if type(event) is str]
        lifecycle = self._lifecycle = UpstreamLifecycle(
            self.name,
            instance=router.instance,
            target=f"{config.url or config.command}",
            init_timeout=config.init_timeout,
            request_timeout=config.request_timeout,
            per_session=self.per_session,
            log=self.log,
        )
        capabilities = (
            self.client_capabilities if self.client_capabilities is not None else router.upstream_client_capabilities()
        )
        self._apply(lifecycle.connected(trio.current_time(), capabilities))

    async def _pump(self) -> None:
        """Tell the lifecycle what arrived and when its deadlines pass; do what it says."""
        lifecycle = self._lifecycle
        assert lifecycle is not None
        while True:
            deadline = lifecycle.next_deadline()
            with trio.move_on_at(math.inf if deadline is None else deadline):
                await self._wake.wait()
            self._wake = trio.Event()
            inbox, self._inbox = self._inbox, []
            now = trio.current_time()
            for event in inbox:
                if isinstance(event, str):
                    self._apply(lifecycle.list_changed(event, now))
                else:
                    self._apply(lifecycle.answer(event, now))
            self._apply(lifecycle.expire(now))

    def _apply(self, outcomes: list[Outcome]) -> None:
        hub = self.hub
        router = hub.router
        for outcome in outcomes:
            if type(outcome) is Send:
                self.send(outcome.message)
            elif type(outcome) is Items:
                hub.dispatch_now(router.server_items(self.name, outcome.kind, outcome.items))
            elif type(outcome) is Ready:
                self._ready(outcome.result)
            elif type(outcome) is Serving:
                self.state = "ready"
                self.last_error = None
                if not self.per_session:
                    # Listed: requests that waited for it go now, looked up again.
                    hub.dispatch_now(router.server_listed(self.name))
                    hub.server_settled(self.name)
            elif type(outcome) is Listing:
                hub.dispatch_now(router.server_listing(self.name, outcome.listing))
            elif type(outcome) is Failed:
                self._lose(outcome.reason)
            elif type(outcome) is Answer:
                call = outcome.caller
                if isinstance(call, _Call) and call.answer is None:
                    call.answer = outcome
                    call.event.set()

    def _ready(self, result: dict[str, Any]) -> None:
        self.hub.dispatch_now(self.hub.router.server_ready(self.name, result))
        info = result.get("serverInfo") or {}
        self.log.info(
            "server %s: initialized (%s %s, protocol %s)",
            self.name,
            info.get("name"),
            info.get("version"),
            result["protocolVersion"],
        )

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request of the proxy's own; return its result or raise UpstreamError
        (with the server's error code and message when it answered with an error, or when
        no answer came within the server's request timeout)."""
        lifecycle = self._lifecycle
        call = _Call()
        if lifecycle is not None:
            self._calls.add(call)
            try:
                now = trio.current_time()
                self._apply([lifecycle.request(method, params, call, now, self.config.request_timeout)])
                self._wake.set()  # the pump keeps its deadline
                await call.event.wait()
            finally:
                self._calls.discard(call)
        answer = call.answer
        if answer is None:
            raise UpstreamError(f"{method}: the connection ended before an answer")
        if answer.result is None:
            raise UpstreamError(answer.error, code=answer.code, message=answer.message)
        return answer.result
