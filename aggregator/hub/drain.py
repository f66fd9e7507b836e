"""Shutting down gently (SIGTERM, SIGINT): the drain's state and its two steps, timed.

Draining (at once): ``/readyz`` answers 503, no new session and no new stateless request
is admitted (503 with Retry-After: a balancer sends them to another replica), and the
sessions already open are served as before, so that what they have in flight, and what
they send meanwhile, is answered. Closing (once nothing is in flight, at the latest after
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

    def __init__(self, *, in_flight: Callable[[], int], closing: Callable[[], bool]) -> None:
        self._in_flight = in_flight  # requests in flight in the router
        self._closing = closing  # the router takes nothing new (its own drain flag)
        self.started = False

    @property
    def draining(self) -> bool:
        """Shutting down: no new session, no new stateless request, not ready."""
        return self.started or self._closing()

    async def run(
        self, seconds: float, sessions: int, close: Callable[[], None], clients: Callable[[], Iterable[ClientSink]]
    ) -> None:
        """Drain (``sessions``: how many are open, for the log), then ``close`` once nothing
        is in flight or after ``seconds``; then wait up to a second for ``clients`` to read."""
        self.started = True
        log.info(
            "draining: not ready, refusing new sessions and stateless requests;"
            " %d session(s) served until %d request(s) in flight finish (up to %.0fs)",
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
