"""Shutting down gently (SIGTERM, SIGINT): the drain's state and its two steps, timed.

Draining (at once): ``/readyz`` answers 503, and the sessions already open are served as
before, so that what they have in flight, and what they send meanwhile, is answered. What
is new goes to another replica, in one of two ways:

- With shared ``[cluster] keys`` (a session's id is sealed; any replica adopts it), the
  Streamable HTTP listener closes at once (``listening_ends``): a balancer's new
  connection is refused, and it tries another replica (safe: nothing was sent). What still
  arrives, on a connection already open, is served, a new session or a stateless request
  too: a balancer never sends a POST that reached a replica anywhere else, so a 503 would
  reach the client, while a session opened here goes on on any replica. Every response
  closes its connection (the fronts), so that a balancer's pooled connections move on.
- Without them a session lives in this process: no new session and no new stateless
  request is admitted (503 with Retry-After: a balancer sends them to another replica, a
  client tries again), and the listener stays open for the sessions this replica holds.

A legacy HTTP+SSE stream and a WebSocket handshake (each a GET, which a balancer does try
on another replica after a 503) are refused either way: such a session lives here.

Closing (once nothing is in flight, at the latest after
the deadline): the router takes nothing new, what is left is answered with an error, and
the clients get a second to read it.

``Drain`` holds whether the hub drains and times the steps; it never holds the router:
the hub hands it what it asks (how many requests are in flight, whether the router is
closing) and what closing does (``close``: the router told, what it answers carried out).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import trio

from aggregator.transports.sink import ClientSink

log = logging.getLogger(__name__)
POLL = 0.05  # seconds between looks at what is still in flight (the router has no event for it)
READ_GRACE = 1.0  # seconds the clients get to read the answers closing made


class Drain:
    """Whether the hub drains, and the drain itself (``run``)."""

    def __init__(self, *, in_flight: Callable[[], int], closing: Callable[[], bool], keys_shared: bool) -> None:
        self._in_flight = in_flight  # requests in flight in the router
        self._closing = closing  # the router takes nothing new (its own drain flag)
        self.keys_shared = keys_shared  # [cluster] keys: sealed session ids, adopted anywhere
        self.started = False
        # Set when the drain starts with shared keys: the Streamable HTTP listener closes.
        self.listening_ends = trio.Event()

    @property
    def draining(self) -> bool:
        """Shutting down: no new session, no new stateless request, not ready."""
        return self.started or self._closing()

    def refuses_new(self, movable: bool) -> bool:
        """Whether a new session or stateless request is refused now (503 with Retry-After):
        always once closing; while draining, unless it is ``movable`` (a Streamable HTTP
        session or stateless request, which any replica serves) and the keys are shared."""
        if self._closing():
            return True
        return self.started and not (movable and self.keys_shared)

    async def wait_listening_ends(self) -> None:
        """Until the Streamable HTTP listener is to close (the drain started, keys shared)."""
        await self.listening_ends.wait()

    async def run(
        self, seconds: float, sessions: int, close: Callable[[], None], clients: Callable[[], Iterable[ClientSink]]
    ) -> None:
        """Drain (``sessions``: how many are open, for the log), then ``close`` once nothing
        is in flight or after ``seconds``; then wait up to a second for ``clients`` to read."""
        self.started = True
        if self.keys_shared:
            self.listening_ends.set()
            await trio.lowlevel.checkpoint()  # the listeners close before anything else
        log.info(
            "draining: not ready, %s; %d session(s) served until %d request(s) in flight finish (up to %.0fs)",
            "not listening for new connections (the sessions are sealed: other replicas serve them)"
            if self.keys_shared
            else "refusing new sessions and stateless requests",
            sessions,
            self._in_flight(),
            seconds,
        )
        started = time.monotonic()
        with trio.move_on_after(seconds):
            while self._in_flight():  # noqa: ASYNC110 - the router has no event to wait on
                await trio.sleep(POLL)
        left = self._in_flight()
        if left:
            log.warning("shutting down: %d request(s) still in flight after %.0fs; they fail now", left, seconds)
        else:
            log.info("drained in %.1fs: nothing in flight; stopping", time.monotonic() - started)
        close()
        # Let the answers reach the clients before the connections close.
        with trio.move_on_after(READ_GRACE):
            for client in list(clients()):
                await client.wait_drained()
