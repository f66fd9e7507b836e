"""One upstream server: its process, its connection, and the supervisor that restarts it.

``UpstreamSession.run`` owns the whole lifetime: start the child, initialize, list its
catalog, serve, and when anything ends the connection (exit, stdout EOF, a failed
handshake) fail every pending request at once, stop the child with the full ladder, and
start again after an exponential, full-jitter backoff. One upstream never takes another
down: everything that can go wrong here ends here.

What to say to the server and when (handshake, listing, re-listing, the proxy's own
requests) is the core's (``core.lifecycle.upstream_lifecycle``, driven by the router in
``core.upstreams.upstream_control``, its deadlines kept by the hub's clock): this module tells the
hub, through its ``UpstreamPort`` (``upstreams.port``; it never holds the router), that
the connection is up (``upstream_connected``) or lost (``server_lost``), and does what the
router says of it when the hub carries that out: serving (``serving``), drop it
(``drop``).

Reading the server's output is the session's too (``_read_output`` runs ``read_messages``
or ``read_decoded``): its stdout (messages, handed to the hub line by line), a
network server's messages (read by its connection, handed over as they were decoded),
and its stderr (``StderrLog``: to the log, with its last lines kept, secrets masked, for
the reason a server did not start).
"""

from __future__ import annotations

import collections
import logging
import random
import time
import traceback
from typing import Any

import trio

from aggregator.config import ServerConfig
from aggregator.config.masking import SecretMask, shown_url
from aggregator.errors import UpstreamError
from aggregator.jsonrpc.framing import LineSplitter, OversizedLine
from aggregator.telemetry import traffic
from aggregator.transports.channel import Channel, ServerMessage
from aggregator.transports.outbox import Outbox
from aggregator.upstreams.child_process import run_stdio_server
from aggregator.upstreams.port import Connector, OwnCall, ServerReader, UpstreamPort

log = logging.getLogger(__name__)

HEALTHY_RESET = 60.0
READ_SIZE = 65536
BATCH = 64  # messages of a network server handled between two flushes, at most
STDERR_TAIL_LINES = 5  # of a server that did not start: shown by check, tools and the log


class UpstreamSession:
    def __init__(
        self,
        hub: UpstreamPort,
        config: ServerConfig,
        *,
        name: str | None = None,
        client_capabilities: dict[str, Any] | None = None,
        auth: Any = None,
        dormant: bool = False,
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
        # A per-session connection's user's own credential (an ``httpx.Auth``), for a server
        # that acts as each user; None: the configured headers only.
        self.auth = auth
        self.log = logging.getLogger(f"aggregator.server.{config.name}")
        self.cancel_scope = trio.CancelScope()
        self.ended = trio.Event()  # its supervisor returned: its process is stopped
        self.outbox: Outbox | None = None
        # starting, ready, down (starting again soon); lazy (not started yet: its catalog is
        # its cached listing), idle-stopped (stopped after nobody used it).
        self.state = "lazy" if dormant else "starting"
        # Stopped on purpose (lazy, idle-stopped) until ``wake``; how long its last start
        # took, to its first listing (seconds; None: it never served).
        self._dormant = dormant
        self._wake = trio.Event()
        self._idle_stopping = False
        self._lazy_again = False  # lost while nothing held it: lazy again (``_back_to_lazy``)
        # The state a request woke it from while that start is under way (a start on demand
        # that fails makes it that again), and such failures in a row (for their backoff).
        self._woken_from: str | None = None
        self._wake_failures = 0
        self.last_start: float | None = None
        self.last_error: str | None = None
        self.last_error_at: float | None = None  # time.time() when last_error was set
        # The last stderr lines of the attempt that set last_error (secrets masked).
        self.last_stderr: tuple[str, ...] = ()
        # Times it was lost or did not start and is started again on its own (a start on
        # demand that failed is not: the next request starts it).
        self.restarts = 0
        self.ready_since: float | None = None  # time.monotonic() when it last became ready
        self.pid: int | None = None  # its process's, while it runs (stdio)
        # Why a connection ended may quote a header's value (an exception's text): every reason
        # is masked here, before it is logged, shown by check or told to callers (lastError).
        self.mask = SecretMask.of(config)
        self._stderr = StderrLog(self.log, self.mask)
        self._calls: set[OwnCall] = set()  # waiting in ``request``
        self._lost: str | None = None
        self._cancel: trio.CancelScope | None = None
        self._reported = False  # the router was told this connection is lost
        self._started = 0.0  # when the supervisor's current attempt started
        self._attempts = 0  # attempts since it last served a while (for the backoff)
        self._retry_at: float | None = None  # when the supervisor starts it again, once it is lost
        # For the metrics: bytes read and written (``restarts`` is above).
        self.traffic = Traffic()
        self._sent_before = 0  # written over its earlier connections

    @property
    def sent_bytes(self) -> int:
        """Bytes written to the server over all its connections."""
        return self._sent_before + (self.outbox.written if self.outbox is not None else 0)

    # --- called by the hub, synchronously -----------------------------------------------

    def serving(self) -> None:
        """The router says its connection serves (listed, or a per-session handshake done)."""
        if self.state != "ready":
            self.last_start = trio.current_time() - self._started
        self.state = "ready"
        self.last_error = None
        self.last_error_at = None
        self._woken_from = None
        self._wake_failures = 0
        self.ready_since = time.monotonic()
        if not self.per_session:
            self.hub.server_settled(self.name)

    def drop(self, reason: str) -> None:
        """The router says its connection cannot be used (``reason``): close it; a shared
        server starts again after its backoff."""
        self._lose(reason)

    def wake(self) -> None:
        """The router says a request waits for it: start it, if it is stopped on purpose
        (once stopping, if it is being stopped as idle)."""
        self._wake.set()

    def stop_idle(self) -> None:
        """The router says nobody used it for its ``idle_stop_after`` and has let go of its
        connection already: stop it, and start it again only when woken."""
        if self.per_session or self._cancel is None:
            return
        self._idle_stopping = True
        self._reported = True  # the router let go of this connection when it decided
        self._wake = trio.Event()
        self.state = "idle-stopped"
        self.ready_since = None
        self._lose("stopped: nobody used it for its idle_stop_after")

    def not_ready(self) -> tuple[str, tuple[str, ...]]:
        """Why it is not ready and the last lines of its stderr (secrets masked): the reason
        it was lost, or, while its first attempt is still starting, how long it has had."""
        if self.state in ("lazy", "idle-stopped"):
            if self.last_error is not None:
                return f"its last start on demand failed: {self.last_error}", self.last_stderr
            return "not started: it starts on the first request that needs it", ()
        if self.state != "starting" or self.last_error is not None:
            return self.last_error or "", self.last_stderr
        waited = trio.current_time() - self._started
        return (
            f"no answer yet after {waited:.1f}s: it has not finished its handshake and first"
            f" listing (servers.{self.config.name}.init_timeout = {self.config.init_timeout:g}s)",
            tuple(self._stderr.tail),
        )

    def warn_if_starting(self) -> None:
        """Log why it is not ready yet, if its first attempt is still starting."""
        if self.state == "starting" and self.last_error is None:
            reason, stderr = self.not_ready()
            tail = f"; its stderr so far: {' | '.join(stderr)}" if stderr else ""
            self.log.warning("server %s is not ready: %s%s", self.name, reason, tail)

    def stderr_tail(self) -> list[str]:
        """The last lines of its stderr (secrets masked): of the connection now, or of the
        attempt that failed last when this one said nothing yet."""
        return list(self._stderr.tail) or list(self.last_stderr)

    # --- the supervisor -----------------------------------------------------------------

    async def run(self) -> None:
        """Run this upstream until cancelled, restarting it whenever it is lost."""
        try:
            with self.cancel_scope:
                if self.per_session:
                    reason = await self._attempt()
                    self.log.info("server %s: session connection ended: %s", self.name, reason)
                    return
                await self._supervise()
        finally:
            self.ended.set()

    async def _supervise(self) -> None:
        while True:
            if self._dormant:  # stopped on purpose: until a request needs it
                await self._wake.wait()
                self._wake = trio.Event()
                self._dormant = False
                self._woken_from = self.state
                self.state = "starting"
                self.log.info("server %s: starting it for a request", self.name)
            self._started = trio.current_time()
            self._retry_at = None
            reason = await self._attempt()
            if self._idle_stopping:
                self._idle_stopping = False
                self._dormant = True
                self.log.info("server %s: stopped, nobody used it for its idle_stop_after", self.name)
                continue
            if self._lazy_again:
                self._lazy_again = False
                if await self._back_to_lazy(reason):
                    continue
            if self._retry_at is None:  # not told when it was lost (it did not start)
                self._went_down(reason)
            if self._dormant:  # a start on demand failed: the next request starts it again
                continue
            await trio.sleep_until(self._next_start())

    def _may_be_lazy_again(self) -> bool:
        """Whether a lost connection leaves it lazy rather than started again: a shared
        ``start = "lazy"`` server that served and ended while nothing held it (no call,
        subscription or listen): the next request starts it."""
        return (
            self.state == "ready" and self.hub.config.starts_lazily(self.config) and not self.hub.server_held(self.name)
        )

    async def _back_to_lazy(self, reason: str) -> bool:
        """Make it lazy again, listed from its cache (False: it has none, and is started
        again as any server)."""
        self._wake = trio.Event()
        self._dormant = True
        self.state, self.ready_since = "lazy", None
        if not await self.hub.server_dormant(self.name):
            self._dormant, self.state = False, "ready"  # (as it was: ``_went_down`` goes on)
            return False
        self.log.info(
            "server %s ended (%s) while nothing used it: it is lazy again, and the next request starts it",
            self.name,
            reason,
        )
        return True

    def _next_start(self) -> float:
        """When the supervisor starts the server again (set once it was lost)."""
        assert self._retry_at is not None
        return self._retry_at

    def _went_down(self, reason: str) -> None:
        """The connection is lost (``reason``): note it, log it and tell the router when it
        starts again (the requests held for it learn that now)."""
        proxy = self.hub.config.proxy
        was_ready = self.state == "ready"
        self.state = "down"
        self.last_error = reason
        self.last_error_at = time.time()
        self.ready_since = None
        self.last_stderr = tuple(self._stderr.tail) if not was_ready else ()
        self.hub.server_settled(self.name)
        now = trio.current_time()
        if self._woken_from is not None and not was_ready:  # not restarted: not counted
            self._start_failed_on_demand(reason, now)
            return
        self.restarts += 1
        if now - self._started > HEALTHY_RESET:
            self._attempts = 0
        delay = random.uniform(0, min(proxy.restart_backoff_max, proxy.restart_backoff_initial * 2**self._attempts))
        self._attempts += 1
        self._retry_at = now + delay
        self.log.log(
            logging.INFO if self.hub.looking else logging.WARNING,
            "server %s %s: %s; starting it again in %.1fs (attempt %d)%s",
            self.name,
            "lost" if was_ready else "did not start",
            reason,
            delay,
            self._attempts,
            f"; its stderr ended: {' | '.join(self.last_stderr)}" if self.last_stderr else "",
        )
        # Its callers meanwhile hear when it is tried again (or wait for it, if that is soon).
        self.hub.server_down(self.name, reason, delay)

    def _start_failed_on_demand(self, reason: str, now: float) -> None:
        """A start a request asked for failed: the server is dormant again (its catalog stays
        listed, the router's side), and the next request may start it again after
        ``restart_backoff_initial``, doubled by each such failure in a row up to
        ``restart_backoff_max`` (no jitter: requests, not a timer, start it). Meanwhile
        requests hear why at once."""
        proxy = self.hub.config.proxy
        self._wake_failures += 1
        delay = min(proxy.restart_backoff_max, proxy.restart_backoff_initial * 2 ** (self._wake_failures - 1))
        self.state, self._woken_from = self._woken_from or "lazy", None
        self._dormant = True
        self._retry_at = now + delay
        self.log.warning(
            "server %s did not start for a request: %s; it stays %s, its catalog listed, and a request"
            " starts it again in %.1fs or later%s",
            self.name,
            reason,
            self.state,
            delay,
            f"; its stderr ended: {' | '.join(self.last_stderr)}" if self.last_stderr else "",
        )
        self.hub.server_down(self.name, reason, delay)

    async def _attempt(self) -> str:
        """One connection; return why it ended. A bug in it ends only it: logged (its
        traceback's text masked too: an exception may quote a header's value) and its reason."""
        try:
            return await self._connect_once()
        except Exception as exc:  # noqa: BLE001 - a bug here must not stop the others
            self.log.error(
                "server %s: internal error in its connection\n%s",
                self.name,
                self.mask("".join(traceback.format_exception(exc)).rstrip()),
            )
            return self.mask(f"internal error: {exc!r}")[:300]

    async def _connect_once(self) -> str:
        """Start, initialize, serve; return why the connection ended."""
        config = self.config
        self._lost = None
        self._reported = False
        self._stderr.tail.clear()
        limit = self.hub.config.proxy.max_message_bytes
        try:
            async with trio.open_nursery() as nursery:
                self._cancel = nursery.cancel_scope
                try:
                    channel = await nursery.start(self._transport)
                except OSError as exc:
                    if config.effective_transport == "stdio":
                        return self.mask(f"cannot start {config.command!r}: {exc.strerror or exc}")
                    return self.mask(str(exc))
                if channel.pid is not None:
                    self.pid = channel.pid
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
                self.hub.server_streams(self.name, channel.streams)
                nursery.start_soon(self._read_output, channel, limit)
                if channel.stderr is not None:
                    nursery.start_soon(self._stderr.read, channel.stderr)
                await self._handshake()
            return self._lost or "connection ended"
        finally:
            self._cancel = None
            self.pid = None
            for call in self._calls:
                call.event.set()  # the connection ended before an answer
            if self.outbox is not None:
                self.outbox.closed = True
                self._sent_before += self.outbox.written
                self.outbox = None
            self._report_lost()

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
            from aggregator.upstreams import network_upstream

            connectors: dict[str, Connector] = {
                "streamable-http": network_upstream.run_streamable_http_server,
                "sse": network_upstream.run_sse_server,
                "websocket": network_upstream.run_websocket_server,
            }
            connect = connectors[transport]
            depth = self.hub.max_json_depth
            extra = {"auth": self.auth} if self.auth is not None else {}
            reason = await connect(self.config, limit, depth, task_status=task_status, **extra)
        self._lose(reason)

    def _congested(self, reason: str | None) -> None:
        """Its input is backed up (``reason``) or flowing again (None). Nothing waits for it:
        while backed up, new requests to it are refused; once it has read nothing for the
        deadline, its requests in flight fail too. Both with reason ``overloaded``."""
        in_flight = self.hub.server_congested(self.name, reason)
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
            self.hub.server_overloaded(self.name, reason)
        else:
            self.log.warning(
                "server %s: not keeping up with its input (%s); new requests are refused until it catches up",
                self.name,
                reason,
            )

    def _lose(self, reason: str) -> None:
        if self._lost is None:
            self._lost = self.mask(reason)
        if self._cancel is not None:
            self._cancel.cancel()
            # The router hears it now, not once the child is stopped (that may take
            # seconds): requests waiting for this connection fail at once.
            self._report_lost()
            if not self.per_session and self._retry_at is None and not self._idle_stopping:
                if self._may_be_lazy_again():
                    self._lazy_again = True  # (the supervisor lists it from its cache)
                else:
                    self._went_down(self._lost)

    def _report_lost(self) -> None:
        """Tell the router the connection is lost, once per connection."""
        if not self._reported:
            self._reported = True
            self.hub.server_lost(self.name, self._lost or "stopped")

    # --- tasks --------------------------------------------------------------------------

    async def _read_output(self, channel: Channel, limit: int) -> None:
        """Hand what the server says to the hub: its messages as its connection read them,
        or the lines of its output."""
        if channel.messages is not None:
            await read_decoded(channel.messages, self.name, self.hub, self.traffic)
        elif channel.receive is not None:
            await read_messages(channel.receive, limit, self.name, self.hub, self.log, self.traffic)
        # Usually the server is exiting: give its exit status a moment to be the reason we
        # report (the transport task loses the link first if so).
        await trio.sleep(0.5)
        self._lose("the server closed its stdout")

    # --- the proxy's own requests -----------------------------------------------------

    async def _handshake(self) -> None:
        """Tell the router the connection is up: its lifecycle sends ``initialize`` now and
        the router takes it from there (answers, listing, deadlines)."""
        config = self.config
        self.hub.upstream_connected(
            self.name,
            target=shown_url(config.url) if config.url else f"{config.command}",
            init_timeout=config.init_timeout,
            capabilities=self.client_capabilities,
            modern_possible=config.effective_transport in ("stdio", "streamable-http"),
        )

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request of the proxy's own; return its result or raise UpstreamError
        (with the server's error code and message when it answered with an error, or when
        no answer came within the server's request timeout)."""
        call = OwnCall()
        if self.outbox is not None:
            self._calls.add(call)
            try:
                self.hub.own_call_started(self.name, method, params, call)
                await call.event.wait()
            finally:
                self._calls.discard(call)
        answer = call.answer
        if answer is None:
            raise UpstreamError(f"{method}: the connection ended before an answer")
        if answer.result is None:
            raise UpstreamError(answer.error, code=answer.code, message=answer.message)
        return answer.result


# --- reading the server's output -------------------------------------------------------------


class Traffic:
    """Bytes read from one upstream, in all (its metrics)."""

    __slots__ = ("received",)

    def __init__(self) -> None:
        self.received = 0


async def read_messages(
    stream: trio.abc.ReceiveStream,
    limit: int,
    name: str,
    hub: ServerReader,
    log: logging.Logger,
    counted: Traffic | None = None,
) -> None:
    """Hand the lines of each read of server ``name``'s output to the hub, in one call and
    one flush per read; return at its end. What is read is counted in ``counted``."""
    splitter = LineSplitter(limit)
    counted = counted if counted is not None else Traffic()
    peer = f"server {name}"
    noted = traffic.enabled()  # --log-level debug: a line per message
    while True:
        try:
            chunk = await stream.receive_some(READ_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        if not chunk:
            return
        counted.received += len(chunk)
        lines = splitter.feed(chunk if type(chunk) is bytes else bytes(chunk))
        for line in lines:
            if isinstance(line, OversizedLine):
                log.error("server %s: dropped a %d-byte message (limit %d bytes)", name, line.size, limit)
            elif noted:
                traffic.note("in", peer, line)
        hub.server_lines(name, lines, limit)
        await hub.flush()


async def read_decoded(
    messages: trio.MemoryReceiveChannel[ServerMessage], name: str, hub: ServerReader, counted: Traffic | None = None
) -> None:
    """Hand each message of network server ``name`` (decoded by its connection) to the
    hub, with the request it belongs to; those already waiting with it in one batch, one
    flush. Return at its end. Counted as ``read_messages``."""
    counted = counted if counted is not None else Traffic()
    peer = f"server {name}"
    noted = traffic.enabled()  # --log-level debug: a line per message
    ended = (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError)
    while True:
        try:
            batch = [await messages.receive()]
        except ended:
            return
        while len(batch) < BATCH:
            try:
                batch.append(messages.receive_nowait())
            except (trio.WouldBlock, *ended):
                break  # (its end is seen by the next receive)
        for item in batch:
            counted.received += len(item.raw)
            if noted:
                traffic.note("in", peer, item.raw)
        hub.server_messages(name, batch)
        await hub.flush()


class StderrLog:
    """An upstream's stderr, logged line by line and its last lines kept in ``tail``, each line
    with the server's secrets (the values of its env and headers: tokens, keys) replaced by *** (``mask``)."""

    def __init__(self, log: logging.Logger, mask: SecretMask) -> None:
        self.log = log
        self.mask = mask
        self.tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)

    async def read(self, stream: trio.abc.ReceiveStream) -> None:
        """Log and keep each line until the stream ends, the last one also without its newline
        (``printf 'fatal: why' >&2; exit 1`` says why a server did not start)."""
        splitter = LineSplitter(64 * 1024)
        while True:
            try:
                chunk = await stream.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                chunk = b""
            if not chunk:
                self._lines(splitter.feed(b"\n"))  # a newline ends the unfinished line, if any
                return
            self._lines(splitter.feed(chunk if type(chunk) is bytes else bytes(chunk)))

    def _lines(self, lines: list[bytes | OversizedLine]) -> None:
        for line in lines:
            if isinstance(line, OversizedLine):
                self.log.info("[stderr] <%d bytes>", line.size)
            else:
                # Masked before it is logged: a server may print its argv or env.
                text = self.mask(line.decode("utf-8", "replace").rstrip())
                self.log.info("[stderr] %s", text)
                if text.strip():
                    self.tail.append(text[:300])
