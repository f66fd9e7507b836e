"""Startup: which servers the hub waits for before it serves, and for how long.

``Startup`` holds the servers started at launch (a lazy server listed from its cache is
not waited for), those that settled (ready, or their first attempt failed), and two
events: ``all_settled`` and ``done`` (the hub served nothing before it; fronts and
commands wait on it). ``wait`` waits for every server to settle, ``startup_timeout``
seconds at most, and warns of those still starting or down (a command's one look stays
quiet: it reports each server itself). The hub then tells the router and sets ``done``;
this module never holds the router.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import trio

log = logging.getLogger(__name__)


class Startup:
    """The servers startup waits for, and whether it is over."""

    def __init__(self, initial: set[str]) -> None:
        self._initial = initial  # started at launch: startup waits for these
        self._settled: set[str] = set()
        self.all_settled = trio.Event()
        self.done = trio.Event()
        if not initial:
            self.all_settled.set()

    def settled(self, name: str) -> None:
        """An upstream is ready, or its first attempt failed: startup need not wait for it."""
        self._settled.add(name)
        if self._settled >= self._initial:
            self.all_settled.set()

    async def wait(self, seconds: float, upstreams: Mapping[str, Any], *, quiet: bool) -> None:
        """Wait for every server to settle, ``seconds`` at most; warn of those that did not."""
        with trio.move_on_after(seconds):
            await self.all_settled.wait()
        waiting = [name for name, up in upstreams.items() if up.state in ("starting", "down")]
        if waiting and not quiet:
            log.warning("startup: serving without %s (not ready yet; they join when ready)", ", ".join(waiting))
            for name in waiting:  # those down said why when they went down; these say it now
                upstreams[name].warn_if_starting()
