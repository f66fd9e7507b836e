"""Dropping clients when all their queues together hold more than the total budget.

Each client's queue enforces its own budget; ``ClientMemory`` counts what they hold
together. Past its limit, the clients that have stopped reading are dropped, the longest
stalled first, until under it; a client that reads is never taken for one that does not,
however large what it is being sent.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import trio

from aggregator.transports.budget import ClientMemory
from aggregator.transports.sink import ClientSink

log = logging.getLogger(__name__)

# A client past the total budget is dropped only once no write to it has finished for this
# long while the kernel takes no more for it: a client that reads is never taken for one
# that does not, however large what it is being sent.
STALLED_AFTER = 0.5
SHED_RECHECK = 0.05  # seconds between looks while everybody over the total still reads


class Shedder:
    """Watches the total of ``clients``' queues (``memory``) and sheds stalled clients."""

    def __init__(
        self,
        clients: dict[int, ClientSink],
        limit: float,
        mark_dirty: Callable[[ClientSink], None],
        write_dirty: Callable[[], None],
    ) -> None:
        self.clients = clients
        self.memory = ClientMemory(limit, self.shed)
        self.nursery: trio.Nursery | None = None  # for a later look; set once running
        self._mark_dirty = mark_dirty
        self._write_dirty = write_dirty
        self._running = False
        self._recheck_at = -math.inf
        self._pending = False
        self._warned_at = -math.inf

    async def _later(self) -> None:
        await trio.sleep(STALLED_AFTER)
        self._pending = False
        self._recheck_at = -math.inf
        self.shed()
        self._write_dirty()

    def shed(self) -> None:
        """All clients together hold more than their budget: drop clients that have stopped
        reading, most stalled first, until under it. A client counts as stalled when a
        write to it waits for it to read (the kernel takes no more) and none has finished
        for ``STALLED_AFTER`` seconds; one that reads, however much it is being sent, is
        never dropped for the total (its own budget still holds). Called by a queue as it
        grows (maybe in the middle of a batch: each client's ``shed`` frees its memory at
        once and defers what must wait for the batch's end, for which it is marked dirty);
        while nobody is stalled it looks again at most every ``SHED_RECHECK`` seconds."""
        now = trio.current_time()
        if self._running or now < self._recheck_at:
            return
        self._running = True
        memory = self.memory
        try:
            while memory.total > memory.limit:
                stalled = [
                    client
                    for client in self.clients.values()
                    if client.held > 0 and now - client.last_progress() >= STALLED_AFTER and client.blocked()
                ]
                if not stalled:
                    self._recheck_at = now + SHED_RECHECK
                    if not self._pending and self.nursery is not None:
                        # Nothing more may arrive to make anyone look again: look once a
                        # client could have become stalled.
                        self._pending = True
                        self.nursery.start_soon(self._later)
                    if now >= self._warned_at:
                        self._warned_at = now + 10.0
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
                self._mark_dirty(victim)
                if victim.held:
                    log.error("internal error: a dropped client still holds %d bytes", victim.held)
                    return
        finally:
            self._running = False
