"""Shared servers stopped when nobody uses them (``idle_stop_after``). Sans-IO.

The rules:

1. A shared server with ``idle_stop_after`` (its link's; 0: never) is *idle* when it is
   listed and serving, has no client request in flight (``link.pending``), none held for
   it, no resource subscription (a legacy ``resources/subscribe`` or the resources of a
   modern caller's open listen: both are in ``subscriptions``), and no client request
   ended there for ``idle_stop_after`` seconds (``link.used_at``, set by
   ``RequestTable.end`` and when it is listed). The proxy's own requests (listing,
   re-listing, pings) are no use.
2. An idle server is stopped (``StopIdle``) by the router's clock: ``due`` says which. Its
   items stay in the catalogs (clients see no change) and the next request for one of them
   wakes it (``core.catalogs.outages`` rule 6).
3. Per-session servers are never stopped here: each session's own connection stops with
   its session.
4. ``at`` is never later than the first server could be idle: ``used_at`` only moves
   forward, so waking at ``at`` is at worst early, and ``due`` schedules the next look.
   Nothing here runs per message: the clock looks when ``at`` comes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from aggregator.core.catalogs.outages import Outage
from aggregator.core.notices.subscriptions import Subscriptions
from aggregator.core.records.links import Pending, UpstreamLink


class IdleStops:
    """When shared servers become idle, and which are idle now."""

    def __init__(
        self,
        links: dict[str, UpstreamLink],
        outages: dict[str, Outage],
        held: dict[str, list[Pending]],  # the request table's held requests, by server
        subscriptions: Subscriptions,
        clock: Callable[[], float],
    ) -> None:
        self.links = links
        self.outages = outages  # a server that is out is not running: nothing to stop
        self.held = held
        self.subscriptions = subscriptions
        self.clock = clock
        self.at: float | None = None  # when ``due`` may have work next

    def listed(self, link: UpstreamLink) -> None:
        """A shared server is listed and serves: its idle time starts now."""
        link.used_at = now = self.clock()
        if link.idle_stop_after > 0:
            when = now + link.idle_stop_after
            if self.at is None or when < self.at:
                self.at = when

    def due(self, now: float) -> list[str]:
        """The shared servers idle at ``now`` (rule 1), to be stopped; ``at`` moves to the
        next time one could be."""
        if self.at is None or now < self.at:
            return []
        idle: list[str] = []
        next_at = math.inf
        for name, link in self.links.items():
            after = link.idle_stop_after
            if after <= 0 or link.session is not None or not link.ready or name in self.outages:
                continue
            when = link.used_at + after
            if self.in_use(name):
                when = now + after  # in use now: at the earliest a full idle time from now
            if when <= now:
                idle.append(name)
            else:
                next_at = min(next_at, when)
        self.at = None if next_at == math.inf else next_at
        return idle

    def in_use(self, name: str) -> bool:
        """Whether a client request in flight or held, or a subscription, holds ``name``."""
        link = self.links.get(name)
        if link is not None and link.pending:
            return True
        return any(not held.done for held in self.held.get(name, ())) or bool(self.subscriptions.of_server(name))
