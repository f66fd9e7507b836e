"""Reading an upstream's output: its stdout (messages, handed to the hub line by line),
a network server's messages (read by its connection, handed over as they were decoded),
and its stderr (to the log, with its last lines kept, secrets masked, for the reason a
server did not start).
"""

from __future__ import annotations

import collections
import logging

import trio

from aggregator.config.masking import SecretMask
from aggregator.jsonrpc.framing import LineSplitter, OversizedLine
from aggregator.telemetry import traffic
from aggregator.transports.channel import ServerMessage
from aggregator.upstreams.port import ServerReader

READ_SIZE = 65536
BATCH = 64  # messages of a network server handled between two flushes, at most
STDERR_TAIL_LINES = 5  # of a server that did not start: shown by check, tools and the log


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
