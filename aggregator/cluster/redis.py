"""A small Redis client on trio: RESP2 over TCP or a unix socket, replies parsed by hiredis.

Owns the wire to one Redis server: the address (``RedisAddress``, from
``config.store_url``), one
command connection (``RedisClient``) and one pub/sub connection (``RedisSubscriber``). It
knows nothing of what the keys mean (``cluster.store`` does). Must not import the hub, the
fronts or anything above them.

Theory of operation (the rules, and the races they close):

- Rule 1, one owner per connection: a client's ``run`` task connects, authenticates and
  selects the database (AUTH/SELECT from the URL, pipelined), reads every reply of that
  connection, and when it breaks fails every call in flight with ``StoreUnavailable`` and
  connects again with exponential backoff and jitter. ``run`` reports started at once: a
  store that is down at start does not hold the start.
- Rule 2, nobody waits for a store that is down: while no connection is up a call fails at
  once with ``StoreUnavailable``. An outage is logged once when it begins and once when it
  ends, never per call.
- Rule 3, pipelining: many calls may be in flight on the one connection. A call's commands
  and its waiter are queued in one synchronous step, so the waiters' order is the wire's
  order; the connection's writer task sends all that is queued in one write at its next
  turn (the calls of one scheduler turn share a system call). Redis answers in order, and
  the reader gives each reply to the waiter at the head of the queue.
- Rule 4, deadlines: a call waits at most ``timeout`` for its replies. A server that does
  not answer in time is taken as gone: the connection is dropped (a reply that came late
  would be matched to the next caller's command), every waiter fails, ``run`` reconnects.
- Rule 5, bounded replies: the bytes fed to the parser since the last complete reply are
  counted; past ``max_reply_bytes`` the connection is dropped (a stream cannot be
  resynchronised in the middle of a reply) and the caller gets ``StoreError``. The bytes are
  also scanned before hiredis sees them (``_HeaderGuard``): an aggregate header whose count
  cannot fit in the bound (each element takes at least 3 bytes) drops the connection at
  once, as hiredis would allocate the whole list first (a hostile ``*2147483647`` costs
  seconds of the event loop to build and free).
- Rule 6, no secret in a line: the password only ever goes to the socket. Every log line,
  error and status names the server by ``RedisAddress.display`` (the password masked).

Errors are typed: ``StoreUnavailable`` (not reachable, dropped, timed out: a later retry may
work), ``StoreError`` (the server refused the command, or the reply was over the bound).
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import hiredis
import trio

from aggregator.config.store_url import RedisAddress
from aggregator.errors import StoreError, StoreUnavailable

log = logging.getLogger(__name__)

Arg = bytes | str | int | float
StreamEntry = tuple[str, dict[bytes, bytes]]  # an entry's id and its fields

DEFAULT_TIMEOUT = 2.0
DEFAULT_MAX_REPLY_BYTES = 16 * 1024 * 1024
RECEIVE_BYTES = 64 * 1024
HEARTBEAT_SECONDS = 5.0  # an idle connection is PINGed this often: an outage is seen without traffic
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 5.0


# --- the wire --------------------------------------------------------------------------------


def encode_command(args: Sequence[Arg]) -> bytes:
    """One command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, int):
            data = b"%d" % arg
        else:
            data = repr(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


async def _open_stream(address: RedisAddress) -> trio.abc.Stream:
    if address.path is not None:
        return await trio.open_unix_socket(address.path)
    return await trio.open_tcp_stream(address.host, address.port)


def _login_commands(address: RedisAddress, select: bool) -> list[list[Arg]]:
    """AUTH and SELECT as the URL says, then a PING: a server that accepts connections but
    does not answer (hung, stopped) is not taken as up."""
    commands: list[list[Arg]] = []
    if address.password is not None:
        login = [address.username] if address.username else []
        commands.append(["AUTH", *login, address.password])
    if select and address.db:
        commands.append(["SELECT", address.db])
    commands.append(["PING"])
    return commands


_AGGREGATES = frozenset(b"*%~>|")  # arrays, maps, sets, pushes, attributes: a count of elements
_BULKS = frozenset(b"$=!")  # bulk strings, verbatim strings, bulk errors: a length, then the bytes
_HEADERS = _AGGREGATES | _BULKS
_MAX_HEADER = 64  # a header line longer than this is not RESP a server sends


class _HeaderGuard:
    """Walks the RESP lines and bulk payloads of a stream (no nesting needed: a header tells
    whether a payload follows) and refuses a count or length no reply within the bound can
    have, before the reader allocates for it (a bulk length needs no check: the reader waits
    for its bytes, which rule 5 counts). Headers split across reads are kept until whole."""

    def __init__(self, max_reply_bytes: int) -> None:
        self._max_count = max_reply_bytes // 3
        self._max_length = max_reply_bytes
        self._skip = 0  # payload bytes (with their CRLF) still to pass over
        self._line = bytearray()  # the start of a line not yet ended

    def check(self, data: bytes) -> None:
        """Raises StoreUnavailable on an impossible header in ``data``."""
        at, end = 0, len(data)
        while at < end:
            if self._skip:
                step = min(self._skip, end - at)
                self._skip -= step
                at += step
                continue
            newline = data.find(b"\n", at)
            if newline < 0:
                self._line += data[at:end]
                if self._line[0] in _HEADERS and len(self._line) > _MAX_HEADER:
                    raise StoreUnavailable("the server sent a reply header that is not RESP")
                return
            self._line += data[at : newline + 1]
            at = newline + 1
            line, self._line = bytes(self._line), bytearray()
            self._header(line)

    def _header(self, line: bytes) -> None:
        kind = line[0] if line else 0
        if kind not in _AGGREGATES and kind not in _BULKS:
            return
        try:
            count = int(line[1:].rstrip(b"\r\n"))
        except ValueError:
            return  # hiredis reports it as not RESP
        if kind in _AGGREGATES:
            if count > self._max_count:
                raise StoreUnavailable(
                    f"the server announced {count} elements, more than a reply within {self._max_length} bytes can hold"
                )
        elif count >= 0:  # a length over the bound is refused by the byte count (rule 5): hiredis waits for the bytes
            self._skip = count + 2


class _Parser:
    """hiredis' reader with the reply bound (rule 5) kept."""

    def __init__(self, max_reply_bytes: int) -> None:
        self._reader = hiredis.Reader()
        self._guard = _HeaderGuard(max_reply_bytes)
        self._max = max_reply_bytes
        self._partial = 0  # bytes fed since the last complete reply

    @property
    def over(self) -> bool:
        """The reply being read is past the bound (the replies before it were returned)."""
        return self._partial > self._max

    def refusal(self) -> StoreError:
        return StoreError(f"a reply over {self._max} bytes was refused")

    def feed(self, data: bytes | bytearray) -> list[Any]:
        """The replies ``data`` completes (then check ``over``). Raises StoreUnavailable on
        bytes that are not RESP or a header no reply within the bound can have."""
        data = bytes(data)
        self._guard.check(data)
        self._reader.feed(data)
        self._partial += len(data)
        replies = []
        while True:
            try:
                reply = self._reader.gets()
            except hiredis.ProtocolError as exc:
                raise StoreUnavailable(f"the server sent something that is not RESP ({exc})") from None
            if reply is False:
                break
            replies.append(reply)
            self._partial = self._reader.len()
        return replies


async def _handshake(stream: trio.abc.Stream, parser: _Parser, commands: list[list[Arg]]) -> None:
    """Send AUTH/SELECT and read their answers (the caller bounds the time)."""
    if not commands:
        return
    await stream.send_all(b"".join(encode_command(command) for command in commands))
    replies: list[Any] = []
    while len(replies) < len(commands):
        data = await stream.receive_some(RECEIVE_BYTES)
        if not data:
            raise StoreUnavailable("the server closed the connection while logging in")
        replies += parser.feed(data)
        if parser.over:
            raise parser.refusal()
    for command, reply in zip(commands, replies, strict=False):
        if isinstance(reply, hiredis.ReplyError):
            # The reply names no password; the command's name is enough to say what failed.
            raise StoreUnavailable(f"{command[0]!s} refused: {reply}")


class _Waiter:
    """A call in flight: how many replies it waits for, and those come so far."""

    __slots__ = ("expected", "replies", "error", "done")

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.replies: list[Any] = []
        self.error: StoreError | None = None
        self.done = trio.Event()


class _Connection:
    """One live command connection: its stream, parser and the calls in flight (rule 3)."""

    def __init__(self, stream: trio.abc.Stream, parser: _Parser) -> None:
        self.stream = stream
        self.parser = parser
        self.outgoing: list[bytes] = []  # commands queued, in the waiters' order, not yet written
        self.wanted = trio.Event()  # set when something is queued: the writer's wake-up
        self.waiters: deque[_Waiter] = deque()
        self.scope = trio.CancelScope()  # the reader's: cancelled to drop the connection
        self.reason: str | None = None

    def drop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.scope.cancel()

    def deliver(self, replies: list[Any]) -> None:
        for reply in replies:
            if not self.waiters:
                raise StoreUnavailable("the server sent a reply nobody asked for")
            waiter = self.waiters[0]
            waiter.replies.append(reply)
            if len(waiter.replies) == waiter.expected:
                self.waiters.popleft()
                waiter.done.set()

    def fail_all(self, error: StoreError) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            waiter.error = error
            waiter.done.set()


class _Outage:
    """Up or down, the last error, and the one line per change of state (rule 2)."""

    def __init__(self, address: RedisAddress, what: str, *, level: int = logging.WARNING) -> None:
        self.address = address
        self.what = what
        self.level = level  # of the down line; the up lines are INFO
        self.up = False
        self.last_error: str | None = None
        self.ever_up = False
        self.logged_down = False

    def went_up(self) -> None:
        if self.logged_down:
            log.info("%s %s is up again", self.what, self.address.display())
        else:
            log.info("%s connected to %s", self.what, self.address.display())
        self.up = self.ever_up = True
        self.logged_down = False

    def went_down(self, reason: str) -> None:
        self.up = False
        self.last_error = reason
        if not self.logged_down:
            log.log(self.level, "%s %s is down: %s", self.what, self.address.display(), reason)
            self.logged_down = True
        else:
            log.debug("%s %s still down: %s", self.what, self.address.display(), reason)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


# --- the command connection ------------------------------------------------------------------


class RedisClient:
    """Commands to one Redis server over one pipelined connection, kept by ``run``."""

    def __init__(
        self,
        address: RedisAddress,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
        heartbeat: float = HEARTBEAT_SECONDS,
        outage_level: int = logging.WARNING,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.max_reply_bytes = max_reply_bytes
        self.heartbeat = heartbeat
        self._connection: _Connection | None = None
        self._outage = _Outage(address, "store", level=outage_level)
        self.round_trip: float | None = None  # seconds, the last call's
        self._connected = trio.Event()

    @property
    def up(self) -> bool:
        """A connection is up and not being dropped."""
        connection = self._connection
        return connection is not None and connection.reason is None

    @property
    def last_error(self) -> str | None:
        connection = self._connection
        if connection is not None and connection.reason is not None:
            return connection.reason
        return self._outage.last_error

    async def wait_connected(self) -> None:
        """Until a connection is up (tests and ``check``; callers never wait, rule 2)."""
        while not self.up:
            await self._connected.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep a connection up until cancelled (rule 1)."""
        task_status.started()
        delay = BACKOFF_FIRST
        while True:
            try:
                connection = await self._connect()
            except StoreError as exc:
                self._outage.went_down(str(exc))
                await trio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            delay = BACKOFF_FIRST
            self._connection = connection
            self._outage.went_up()
            self._connected.set()
            self._connected = trio.Event()
            try:
                await self._serve(connection)
            finally:
                self._connection = None
                reason = connection.reason or "the connection was closed"
                connection.fail_all(StoreUnavailable(f"store {self.address.display()}: {reason}"))
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(connection.stream)
            self._outage.went_down(reason)
            # A connection dropped by a deadline or an oversized reply: the server may well
            # be there, so the first try is at once; a refused connect backs off above.

    async def _connect(self) -> _Connection:
        parser = _Parser(self.max_reply_bytes)
        try:
            with trio.fail_after(self.timeout):
                stream = await _open_stream(self.address)
                try:
                    await _handshake(stream, parser, _login_commands(self.address, select=True))
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
        except trio.TooSlowError:
            raise StoreUnavailable(f"no connection within {self.timeout:g}s") from None
        except (OSError, trio.BrokenResourceError) as exc:
            raise StoreUnavailable(f"cannot connect: {_describe(exc)}") from None
        return _Connection(stream, parser)

    async def _serve(self, connection: _Connection) -> None:
        with connection.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write, connection)
                nursery.start_soon(self._beat, connection)
                try:
                    while True:
                        data = await connection.stream.receive_some(RECEIVE_BYTES)
                        if not data:
                            connection.drop("the server closed the connection")
                            return
                        connection.deliver(connection.parser.feed(data))
                        if connection.parser.over:
                            raise connection.parser.refusal()
                except StoreError as exc:
                    # Over the bound: the call at the head is told why; the rest find the
                    # connection dropped.
                    if isinstance(exc, StoreUnavailable) or not connection.waiters:
                        connection.drop(str(exc))
                    else:
                        head = connection.waiters.popleft()
                        head.error = exc
                        head.done.set()
                        connection.drop(str(exc))
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    connection.drop(_describe(exc))
                finally:
                    nursery.cancel_scope.cancel()

    async def _write(self, connection: _Connection) -> None:
        """The connection's one writer: what the calls of a scheduler turn queued leaves in
        one write (a cancelled caller never leaves half a command: it does not write)."""
        while True:
            await connection.wanted.wait()
            connection.wanted = trio.Event()
            data = b"".join(connection.outgoing)
            connection.outgoing.clear()
            try:
                await connection.stream.send_all(data)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                connection.drop(_describe(exc))
                return

    async def _beat(self, connection: _Connection) -> None:
        """PING an idle connection now and then, so that an outage is seen (and the round
        trip known) without traffic."""
        while True:
            await trio.sleep(self.heartbeat)
            try:
                await self._call(connection, [["PING"]])
            except StoreError:
                return

    async def execute(self, *args: Arg) -> Any:
        """One command's reply; an error reply raises StoreError."""
        (reply,) = await self.pipeline([list(args)])
        return reply

    async def pipeline(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """Several commands written at once and answered in order, in one round trip.
        The first error reply among them raises StoreError (after all were answered)."""
        connection = self._connection
        if connection is None or connection.reason is not None:
            raise StoreUnavailable(f"store {self.address.display()} is down: {self.last_error or 'not connected'}")
        replies = await self._call(connection, commands)
        for reply in replies:
            if isinstance(reply, hiredis.ReplyError):
                raise StoreError(f"store refused {commands[replies.index(reply)][0]!s}: {reply}")
        return replies

    async def _call(self, connection: _Connection, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        waiter = _Waiter(len(commands))
        payload = b"".join(encode_command(command) for command in commands)
        started = time.perf_counter()
        # Queued with its waiter in one step (no checkpoint between): the wire's order is the
        # waiters' order. The connection's writer sends all that is queued at its next turn.
        connection.outgoing.append(payload)
        connection.waiters.append(waiter)
        connection.wanted.set()
        with trio.move_on_after(self.timeout) as deadline:
            await waiter.done.wait()
        if deadline.cancelled_caught:
            connection.drop(f"no answer within {self.timeout:g}s")
            raise StoreUnavailable(f"store {self.address.display()}: no answer within {self.timeout:g}s")
        if waiter.error is not None:
            raise waiter.error
        self.round_trip = time.perf_counter() - started
        return waiter.replies

    # --- streams (one per session's events) ---

    async def xadd(self, key: Arg, fields: dict[bytes, bytes], *, maxlen: int, expire_ms: int | None = None) -> str:
        """Append an entry (the stream trimmed to about ``maxlen``), its id back; the key's
        expiry renewed in the same round trip."""
        flat: list[Arg] = [item for pair in fields.items() for item in pair]
        commands: list[list[Arg]] = [["XADD", key, "MAXLEN", "~", maxlen, "*", *flat]]
        if expire_ms is not None:
            commands.append(["PEXPIRE", key, expire_ms])
        replies = await self.pipeline(commands)
        return bytes(replies[0]).decode()

    async def xrange(
        self, key: Arg, start: str = "-", end: str = "+", *, count: int | None = None
    ) -> list[StreamEntry]:
        extra: list[Arg] = ["COUNT", count] if count is not None else []
        return _entries(await self.execute("XRANGE", key, start, end, *extra))

    async def xread(self, key: Arg, after: str, *, count: int) -> list[StreamEntry]:
        """The entries after ``after`` (never blocking: the connection is shared; wake-ups
        come by pub/sub)."""
        reply = await self.execute("XREAD", "COUNT", count, "STREAMS", key, after)
        if not reply:
            return []
        return _entries(reply[0][1])


def _entries(reply: list[Any]) -> list[StreamEntry]:
    out = []
    for entry_id, flat in reply:
        out.append((bytes(entry_id).decode(), dict(zip(flat[::2], flat[1::2], strict=True))))
    return out


# --- the pub/sub connection ------------------------------------------------------------------


class RedisSubscriber:
    """A connection in subscribe mode: each channel's messages go to a bounded trio channel;
    after a reconnect every channel is subscribed again. A subscriber that does not keep up
    loses messages (pub/sub is at most once), never holds the others back."""

    def __init__(
        self, address: RedisAddress, *, timeout: float = DEFAULT_TIMEOUT, max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.max_reply_bytes = max_reply_bytes
        self._channels: dict[bytes, trio.MemorySendChannel[bytes]] = {}
        self._confirmed: dict[bytes, trio.Event] = {}  # each channel's: set once the server confirmed it
        self._stream: trio.abc.Stream | None = None
        self._nursery: trio.Nursery | None = None  # the live connection's, for its writes
        self._send_lock = trio.StrictFIFOLock()
        self._outage = _Outage(address, "store subscriber")
        self.dropped = 0  # messages a full subscriber lost
        self.subscribed = trio.Event()  # set each time the server confirmed every channel

    @property
    def up(self) -> bool:
        return self._outage.up

    def subscribe(self, channel: bytes, buffer: int = 256) -> trio.MemoryReceiveChannel[bytes]:
        """Messages published to ``channel`` from now on (a connection that is up is told at
        once; one that is down, when it is up again)."""
        if channel in self._channels:
            raise ValueError(f"already subscribed to {channel!r}")
        send, receive = trio.open_memory_channel[bytes](buffer)
        self._channels[channel] = send
        self._confirmed[channel] = trio.Event()
        self.subscribed = trio.Event()
        self._tell(["SUBSCRIBE", channel])
        return receive

    async def wait_subscribed(self, channel: bytes) -> None:
        """Until the server confirmed ``channel`` (at once for one not subscribed): from
        then on what is published there reaches it, while the connection stays up."""
        confirmed = self._confirmed.get(channel)
        if confirmed is None:
            await trio.lowlevel.checkpoint()
        else:
            await confirmed.wait()

    def unsubscribe(self, channel: bytes) -> None:
        """Leave ``channel``; a no-op for one not subscribed, and once the subscriber stopped."""
        send = self._channels.pop(channel, None)
        confirmed = self._confirmed.pop(channel, None)
        if confirmed is not None:
            confirmed.set()  # nobody waits for it any more
        if send is not None:
            send.close()
            self._tell(["UNSUBSCRIBE", channel])

    def _tell(self, command: list[Arg]) -> None:
        stream = self._stream
        if stream is None or self._nursery is None:
            return  # sent with the others when the connection is up
        self._nursery.start_soon(self._send, stream, encode_command(command))

    async def _send(self, stream: trio.abc.Stream, payload: bytes) -> None:
        async with self._send_lock:
            try:
                with trio.fail_after(self.timeout):
                    await stream.send_all(payload)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
                pass  # the reader sees the connection end and resubscribes everything

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the subscriptions up until cancelled (rule 1); then every channel is closed."""
        task_status.started()
        delay = BACKOFF_FIRST
        try:
            while True:
                parser = _Parser(self.max_reply_bytes)
                try:
                    with trio.fail_after(self.timeout):
                        stream = await _open_stream(self.address)
                        await _handshake(stream, parser, _login_commands(self.address, select=False))
                except (OSError, trio.BrokenResourceError, trio.TooSlowError, StoreError) as exc:
                    reason = "no connection in time" if isinstance(exc, trio.TooSlowError) else _describe(exc)
                    self._outage.went_down(reason)
                    await trio.sleep(delay * random.uniform(0.5, 1.0))
                    delay = min(delay * 2, BACKOFF_MAX)
                    continue
                delay = BACKOFF_FIRST
                reason = await self._serve(stream, parser)
                self._outage.went_down(reason)
        finally:
            for send in self._channels.values():
                send.close()

    async def _serve(self, stream: trio.abc.Stream, parser: _Parser) -> str:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._stream = stream
                try:
                    if self._channels:
                        await self._send(stream, encode_command(["SUBSCRIBE", *self._channels]))
                    else:
                        self.subscribed.set()
                    self._outage.went_up()
                    while True:
                        data = await stream.receive_some(RECEIVE_BYTES)
                        if not data:
                            return "the server closed the connection"
                        for reply in parser.feed(data):
                            self._handle(reply)
                        if parser.over:
                            return str(parser.refusal())
                except StoreError as exc:
                    return str(exc)
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    return _describe(exc)
                finally:
                    # Nothing more is started in this connection's nursery: it winds down,
                    # and once its last task ends it takes no new one (``_tell`` would
                    # raise). What is told from here on goes with the next connection.
                    self._stream = self._nursery = None
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)

    def _handle(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind = reply[0]
        if kind == b"message":
            send = self._channels.get(reply[1])
            if send is None:
                return
            try:
                send.send_nowait(reply[2])
            except trio.WouldBlock:
                self.dropped += 1
                log.warning("store subscriber: a message on %r was dropped (its reader is behind)", reply[1])
            except trio.BrokenResourceError:
                self.unsubscribe(reply[1])  # its reader went away
        elif kind == b"subscribe":
            confirmed = self._confirmed.get(reply[1])
            if confirmed is not None:
                confirmed.set()
            if reply[2] == len(self._channels):
                self.subscribed.set()
