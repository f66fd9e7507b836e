"""A downstream session: one client connection, one reader task, one writer task.

The reader feeds each complete line to the router and hands the commands to the hub;
the writer is the client's Outbox. When the reader ends (EOF, a broken pipe) the client
is removed and everything it had in flight upstream is cancelled. A client that does not
read what it is sent is dropped the same way: more than ``proxy.client_buffer_bytes``
waiting for it, or a write unfinished after ``proxy.client_write_timeout``, ends the
session (its stream is closed) and nothing else waits for it; so does having stopped
reading when all clients together hold more than ``proxy.total_client_buffer_bytes``.

The session is a containment boundary: an exception while handling a line is logged
with its traceback, that line's request is answered with a JSON-RPC internal error (its
id when readable), and the session ends as on EOF; a failure anywhere else in it (the
writer, say) ends it too. Neither reaches the hub, other sessions or the process.
"""

from __future__ import annotations

import logging

import trio

from aggregator.fronts.containment import internal_error
from aggregator.fronts.port import ClientPort
from aggregator.jsonrpc.codec import oversized
from aggregator.jsonrpc.framing import LineSplitter, OversizedLine
from aggregator.transports.outbox import Outbox

log = logging.getLogger(__name__)
READ_SIZE = 65536


async def serve_stream_session(
    hub: ClientPort, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream, *, label: str = "stream"
) -> bool:
    """Serve one newline-delimited MCP client until it closes its side (or is dropped).

    True when the client ended the session (EOF, or dropped for not reading); False when a
    failure of ours did."""
    proxy = hub.config.proxy
    limit = proxy.max_message_bytes
    session = trio.CancelScope()
    key = 0

    def congested(reason: str | None) -> None:
        if reason is None:
            return
        log.error("%s: client session %d dropped: %s (it does not read what it is sent)", label, key, reason)
        outbox.abort()
        session.cancel()

    outbox = Outbox(
        send,
        limit=proxy.client_buffer_bytes,
        name=label,
        write_timeout=proxy.client_write_timeout,
        on_congestion=congested,
        memory=hub.client_memory,
    )
    key = hub.client_connected(outbox)
    log.info("%s: client session %d opened", label, key)
    ended_by_client = False
    try:
        with session:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(outbox.run)
                ended_by_client = await _read_client(hub, key, receive, outbox, limit, label)
                if ended_by_client:
                    # End of input is not a cancel: what was received is finished (within
                    # drain_timeout) and answered, then the session ends.
                    await _finish_in_flight(hub, key, proxy.drain_timeout, label)
                # Give the writer a moment to flush answers already queued, then stop.
                with trio.move_on_after(1):
                    await outbox.wait_drained()
                nursery.cancel_scope.cancel()
        if session.cancelled_caught:
            ended_by_client = True  # dropped for not reading: as if it had gone
            with trio.CancelScope(shield=True):
                await send.aclose()
    except Exception:
        ended_by_client = False
        log.exception("%s: internal error in client session %d; closing this session only", label, key)
    finally:
        hub.client_disconnected(key)
        log.info("%s: client session %d closed", label, key)
    if not ended_by_client:
        await trio.aclose_forcefully(send)  # the client sees its session end
    return ended_by_client


async def _finish_in_flight(hub: ClientPort, key: int, seconds: float, label: str) -> None:
    """Wait until this client's requests in flight are answered, for ``seconds`` at most;
    what is left is cancelled upstream (the client is removed) and answered with an error,
    as a shutdown answers it: the client's output may still be read."""

    def in_flight() -> int:
        client = hub.session_info(key)
        return client.in_flight if client is not None else 0

    waiting = in_flight()
    if not waiting:
        return
    log.info("%s: end of input; finishing %d request(s) in flight (up to %gs)", label, waiting, seconds)
    with trio.move_on_after(seconds):
        while in_flight() and hub.has_client(key):  # noqa: ASYNC110 - the router has no event to wait on
            await trio.sleep(0.01)
    waiting = in_flight()
    if waiting and hub.has_client(key):
        log.warning(
            "%s: %d request(s) still in flight %gs after end of input; cancelling them", label, waiting, seconds
        )
        # Cancelled upstream and answered with an error, as at shutdown; a late answer is dropped.
        hub.client_finished(key)


async def _read_client(
    hub: ClientPort, key: int, receive: trio.abc.ReceiveStream, outbox: Outbox, limit: int, label: str
) -> bool:
    """Read and route the client's lines; True at its EOF, False after a failure handling one.
    At EOF a last line without its newline is still a message."""
    splitter = LineSplitter(limit)
    at_eof = False
    while not at_eof:
        try:
            data = await receive.receive_some(READ_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return True
        if not data:
            data, at_eof = b"\n", True  # ends an unterminated last line, if any
        for line in splitter.feed(data):
            if isinstance(line, OversizedLine):  # answered under its id when its first or last bytes show it
                hub.client_refused(key, oversized(line.head, line.size, limit, line.tail))
                continue
            try:
                await hub.client_message(key, line)
            except Exception:
                log.exception(
                    "%s: internal error handling a message of client session %d; closing this session", label, key
                )
                outbox.put_message(internal_error(line))
                outbox.flush()
                return False
        await hub.flush(outbox)
    return True
