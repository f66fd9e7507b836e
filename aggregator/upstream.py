"""One upstream server: its process, its connection, and the supervisor that restarts it.

``UpstreamSession.run`` owns the whole lifetime: start the child, initialize, list its
catalog, serve, and when anything ends the connection (exit, stdout EOF, a failed
handshake) fail every pending request at once, stop the child with the full ladder, and
start again after an exponential, full-jitter backoff. One upstream never takes another
down: everything that can go wrong here ends here.
"""

from __future__ import annotations

import collections
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from aggregator import __version__
from aggregator.config import Config, ServerConfig
from aggregator.core.router import CONTROL_ID_PREFIX, INSTANCE_KEY
from aggregator.errors import UpstreamError
from aggregator.jsonrpc.errors import METHOD_NOT_FOUND
from aggregator.jsonrpc.framing import LineSplitter, OversizedLine
from aggregator.mcp.constants import CAPABILITY_OF, KINDS, LIST_METHOD_OF, TEMPLATES
from aggregator.mcp.initialize import initialize_result_problem
from aggregator.mcp.versions import LATEST
from aggregator.transports.outbox import Outbox
from aggregator.transports.stdio import STREAM_TAG, STREAM_TAG_ROOM, Channel, run_stdio_server, split_tag

if TYPE_CHECKING:
    from aggregator.core.router import Router

log = logging.getLogger(__name__)

MAX_LIST_PAGES = 100
HEALTHY_RESET = 60.0
READ_SIZE = 65536
STDERR_TAIL_LINES = 5  # of a server that did not start: shown by check, tools and the log


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


class _Reply:
    __slots__ = ("event", "message")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.message: dict[str, Any] | None = None


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
        self._capabilities: dict[str, Any] = {}
        self._listed = False
        self.client_capabilities = client_capabilities
        self.log = logging.getLogger(f"aggregator.server.{config.name}")
        self.cancel_scope = trio.CancelScope()
        self.outbox: Outbox | None = None
        self.state = "starting"  # starting, ready, down (starting again soon)
        self.last_error: str | None = None
        # The last stderr lines of the attempt that set last_error (secrets masked).
        self.last_stderr: tuple[str, ...] = ()
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._control: dict[str, _Reply] = {}
        self._control_ids = 0
        self._refresh_kinds: set[str] = set()
        self._refresh_wanted = trio.Event()
        self._lost: str | None = None
        self._cancel: trio.CancelScope | None = None

    # --- called by the hub, synchronously -----------------------------------------------

    def send(self, message: Any) -> None:
        """Send a message of the proxy's own (not on the hot path): queue and flush."""
        if self.outbox is not None:
            self.outbox.put_message(message)
            self.outbox.flush()

    def control_reply(self, message: dict[str, Any]) -> None:
        reply = self._control.get(message["id"])
        if reply is not None and reply.message is None:
            reply.message = message
            reply.event.set()

    def request_refresh(self, kind: str) -> None:
        self._refresh_kinds.add(kind)
        self._refresh_wanted.set()

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
            self.last_stderr = tuple(self._stderr_tail) if not was_ready else ()
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
        self._stderr_tail.clear()
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
                    nursery.start_soon(self._read_stderr, channel.stderr)
                try:
                    await self._handshake()
                except (UpstreamError, trio.TooSlowError) as exc:
                    reason = str(exc) or f"no answer to initialize within {config.init_timeout}s"
                    self._lose(reason)
                    return self._lost or reason
                self.state = "ready"
                self.last_error = None
                if not self.per_session:
                    # Listed: requests that waited for it go now, looked up again.
                    self.hub.dispatch_now(self.hub.router.server_listed(self.name))
                    self.hub.server_settled(self.name)
                nursery.start_soon(self._refresher)
            return self._lost or "connection ended"
        finally:
            self._cancel = None
            if self.outbox is not None:
                self.outbox.closed = True
                self.outbox = None
            for reply in self._control.values():
                reply.event.set()
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
        splitter = LineSplitter(limit + STREAM_TAG_ROOM if tagged else limit)
        hub = self.hub
        router = hub.router
        name = self.name
        while True:
            try:
                data = await stream.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                # Usually the server is exiting: give its exit status a moment to be the
                # reason we report (the transport task loses the link first if so).
                await trio.sleep(0.5)
                self._lose("the server closed its stdout")
                return
            for line in splitter.feed(data):
                if type(line) is OversizedLine:
                    self.log.error("server %s: dropped a %d-byte message (limit %d bytes)", name, line.size, limit)
                    hub.dispatch(router.server_oversized(name, line.head, limit))
                    continue
                if tagged and line[:1] == STREAM_TAG:
                    related, line = split_tag(line)
                    hub.dispatch(router.server_message(name, line, related))
                    continue
                hub.dispatch(router.server_message(name, line))
            await hub.flush()

    async def _read_stderr(self, stream: trio.abc.ReceiveStream) -> None:
        splitter = LineSplitter(64 * 1024)
        while True:
            try:
                data = await stream.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            for line in splitter.feed(data):
                if type(line) is OversizedLine:
                    self.log.info("[stderr] <%d bytes>", line.size)
                else:
                    text = line.decode("utf-8", "replace").rstrip()
                    self.log.info("[stderr] %s", text)
                    if text.strip():
                        self._stderr_tail.append(self._masked(text[:300]))

    def _masked(self, text: str) -> str:
        """A stderr line for the user's eyes: the values of the server's env and headers
        (tokens, keys) replaced by ***."""
        for secret in (*self.config.env.values(), *self.config.headers.values()):
            if len(secret) >= 4 and secret in text:
                text = text.replace(secret, "***")
        return text

    async def _handshake(self) -> None:
        with trio.fail_after(self.config.init_timeout):
            result = await self.request(
                "initialize",
                {
                    "protocolVersion": LATEST,
                    "capabilities": (
                        self.client_capabilities
                        if self.client_capabilities is not None
                        else self.hub.router.upstream_client_capabilities()
                    ),
                    "clientInfo": {"name": "aggregator", "version": __version__},
                },
            )
        problem = initialize_result_problem(result)
        if problem is not None:
            raise UpstreamError(f"its initialize result is unusable: {problem}")
        meta = result.get("_meta")
        if type(meta) is dict and meta.get(INSTANCE_KEY) == self.hub.router.instance:
            raise UpstreamError(
                f"it is this aggregator itself ({self.config.url or self.config.command} leads back"
                " to this proxy); a config must not list the aggregator serving it"
            )
        version = result["protocolVersion"]
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.hub.dispatch_now(self.hub.router.server_ready(self.name, result))
        capabilities = self._capabilities = result["capabilities"]
        info = result.get("serverInfo") or {}
        self.log.info(
            "server %s: initialized (%s %s, protocol %s)", self.name, info.get("name"), info.get("version"), version
        )
        if self.per_session:
            return
        with trio.fail_after(self.config.init_timeout):
            for kind in KINDS:
                if CAPABILITY_OF[kind] in capabilities:
                    items = await self.list_all(kind)
                    self.hub.dispatch_now(self.hub.router.server_items(self.name, kind, items))

    async def _refresher(self) -> None:
        if self.per_session:
            await self._list_own()
        while True:
            await self._refresh_wanted.wait()
            self._refresh_wanted = trio.Event()
            kinds, self._refresh_kinds = self._refresh_kinds, set()
            if self.per_session and not self._listed:
                await self._list_own()
                continue
            for kind in KINDS:
                if kind not in kinds:
                    continue
                try:
                    with trio.fail_after(self.config.request_timeout):
                        items = await self.list_all(kind)
                except (UpstreamError, trio.TooSlowError) as exc:
                    self.log.warning("server %s: re-listing %s failed: %s", self.name, kind, exc)
                    continue
                self.hub.dispatch_now(self.hub.router.server_items(self.name, kind, items))

    async def _list_own(self) -> None:
        """A per-session connection's listing of every kind it has, given to the router at
        once; if one fails, its session keeps the shared listing until the server next
        says a list changed."""
        listing: dict[str, list[dict[str, Any]]] = {}
        for kind in KINDS:
            if CAPABILITY_OF[kind] not in self._capabilities:
                continue
            try:
                with trio.fail_after(self.config.request_timeout):
                    listing[kind] = await self.list_all(kind)
            except (UpstreamError, trio.TooSlowError) as exc:
                self.log.warning(
                    "server %s: listing %s failed: %s; its session sees the shared listing", self.name, kind, exc
                )
                return
        self._listed = True
        self.hub.dispatch_now(self.hub.router.server_listing(self.name, listing))

    # --- the proxy's own requests -------------------------------------------------------

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request of the proxy's own; return its result or raise UpstreamError."""
        self._control_ids += 1
        id = f"{CONTROL_ID_PREFIX}{self._control_ids}"
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            message["params"] = params
        reply = self._control[id] = _Reply()
        try:
            self.send(message)
            await reply.event.wait()
        finally:
            del self._control[id]
        answer = reply.message
        if answer is None:
            raise UpstreamError(f"{method}: the connection ended before an answer")
        if "error" in answer:
            error = answer["error"]
            code, text = error.get("code"), error.get("message")
            raise UpstreamError(
                f"{method} failed: {text} (code {code})",
                code=code if type(code) is int else None,
                message=text if type(text) is str else None,
            )
        result = answer.get("result")
        if type(result) is not dict:
            raise UpstreamError(f"{method}: the result is not an object")
        return result

    async def list_all(self, kind: str) -> list[dict[str, Any]]:
        """Every item of one kind, following the upstream's cursors (bounded)."""
        items: list[dict[str, Any]] = []
        cursor = None
        seen: set[str] = set()
        method = LIST_METHOD_OF[kind]
        for _ in range(MAX_LIST_PAGES):
            try:
                result = await self.request(method, {"cursor": cursor} if cursor is not None else None)
            except UpstreamError as exc:
                if kind == TEMPLATES and exc.code == METHOD_NOT_FOUND:
                    return items  # a resources server without templates
                raise
            page = result.get(kind)
            if type(page) is list:
                items.extend(page)
            cursor = result.get("nextCursor")
            if cursor is None or cursor == "":
                return items
            if type(cursor) is not str or cursor in seen:
                self.log.warning("server %s: %s pagination loops; keeping %d items", self.name, method, len(items))
                return items
            seen.add(cursor)
        self.log.warning(
            "server %s: %s has more than %d pages; keeping %d items", self.name, method, MAX_LIST_PAGES, len(items)
        )
        return items
