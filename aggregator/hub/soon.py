"""Writing once per turn of the scheduler what many tasks queued in it.

A front that dispatches one request per connection task (Streamable HTTP, one POST each)
would otherwise write to a server's stdin once per request: a system call, and a wake-up of
the server, each. ``SoonWriter.request()`` instead wakes one task that writes everything
queued meanwhile, after the tasks the same turn woke have run: sixteen requests that
arrived together go out in one write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

log = logging.getLogger(__name__)


class SoonWriter:
    """Runs ``write`` once per scheduler turn, however many tasks asked for it."""

    def __init__(self, write: Callable[[], None]) -> None:
        self._write = write
        self._lot = trio.lowlevel.ParkingLot()
        self._pending = False
        self._running = False

    def request(self) -> None:
        """Have ``write`` run soon (at once while no task runs it)."""
        if not self._running:
            self._write()
        elif not self._pending:
            self._pending = True
            self._lot.unpark()

    async def run(self) -> None:
        self._running = True
        try:
            while True:
                await self._lot.park()
                self._pending = False
                try:
                    self._write()
                except Exception:  # noqa: BLE001 - one failed write must not stop the others'
                    log.exception("internal error writing queued messages; writing goes on")
        finally:
            self._running = False
