"""The router's clock: one task that wakes at the router's next deadline.

The router keeps its deadlines (requests that time out, debounced notices, idle servers)
and says which comes first (``next_deadline``); it has no timer of its own (the core does
no I/O). ``RouterClock.run`` sleeps until that deadline, then has the hub tell the router
the time passed (``tick``: it carries out what the router says). A dispatch that gave the
router an earlier deadline than the one slept to pokes it (``check``, called after every
dispatch: one comparison when nothing changed).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import trio

log = logging.getLogger(__name__)


class RouterClock:
    """Runs ``tick`` at ``next_deadline()`` (trio's clock), and again at each next one."""

    def __init__(self, next_deadline: Callable[[], float | None], tick: Callable[[], None]) -> None:
        self._next_deadline = next_deadline
        self._tick = tick
        self._at = math.inf  # the deadline slept to
        self._poke = trio.Event()

    async def run(self) -> None:
        """Time out requests, send debounced notices: until cancelled."""
        while True:
            deadline = self._next_deadline()
            self._at = math.inf if deadline is None else deadline
            with trio.move_on_at(self._at):
                await self._poke.wait()
            self._poke = trio.Event()
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - a bug in one expiry must not stop the clock for all
                log.exception("internal error expiring requests and notices; the clock goes on")

    def check(self) -> None:
        """Wake the clock if the router now has an earlier deadline than it sleeps to."""
        deadline = self._next_deadline()
        if deadline is not None and deadline < self._at:
            self._at = deadline
            self._poke.set()
