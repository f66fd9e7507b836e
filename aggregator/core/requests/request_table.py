"""Every client request in flight through the proxy, its deadlines, the one way out of every
table (invariant 2 of the router), and what ended how. Sans-IO.

A request is one ``Pending`` (``core.records.links``), in the tables its ``Phase`` names: the
link's ``pending`` (by upstream id) once sent, its client's ``in_flight`` (by the
client's id) while it is on a session, ``progress`` (by the proxy's progress token) if
it asked for progress, ``held`` (by server) while it waits for that server's listing, and
the ``deadlines`` heap (``Deadlines``) while anything may time it out. ``start`` puts a sent
request in the link's table and the heap; ``end`` takes it out of every table at once,
whatever its phase, and counts how it ended (``Tallies``, rules below). Nothing else removes
one, so the tables hold exactly what is in flight. ``fail`` ends one with an error of the
proxy's.

The table reads the links and the clients it is given (the router's own dicts); it
writes only their in-flight entries, and undoes a subscription whose request failed.

Deadlines
---------
A heap with lazy deletion. Each entry is ``(when, sequence, item)``. An item is due only if
it is still live and its own ``deadline`` is still ``when``: moving a deadline (progress
resets the timeout) pushes a new entry and leaves the old one to be skipped, so nothing is
ever searched. Entries left behind by finished items are counted, and once they outnumber
the live ones the heap is rebuilt from the live entries: memory stays proportional to what
is in flight, even at a hundred thousand requests a second with minute-long timeouts.

Tallies
-------
What the router counts of the requests it forwards, for the metrics. Counting is on the hot
path, so it is plain ints in dicts keyed by tuples: one dict update when a request ends,
one more with its duration. Nothing here knows of any metrics library;
``aggregator.telemetry`` reads these tables when it is scraped.

1. A request for a server is counted once, when it ends (``RequestTable.end``), with what
   ended it: ``outcome`` is ``ok`` (the server's result), ``error`` (the server's error,
   or one the proxy made: then ``reason`` is that error's ``data.reason``) or
   ``cancelled`` (its client cancelled it, or went away). A record another takes over (a
   held request re-sent, a call retried for input) is not counted: the other one is.
   One the proxy refuses before sending it (the server is out, overloaded, or the proxy
   is shutting down) is counted then, as an ``error`` with that reason.
2. Labels are bounded: ``method`` is one the router forwards (a fixed set), ``server`` a
   configured server's key (never a per-session connection's name), ``reason`` one of the
   proxy's own reasons or ``server_error``. No tool name, no argument, no id.
3. A request's upstream duration is from the moment it was sent to the server to the
   moment its answer came; only answered requests (``ok`` and ``error`` from the server)
   have one.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from aggregator.core.commands import Command, ToClient
from aggregator.core.notices.subscriptions import Subscriptions
from aggregator.core.records.clients import ClientState
from aggregator.core.records.links import Pending, UpstreamLink
from aggregator.core.replies import proxy_error

# The progress tokens the proxy sends upstream: strings no server would pick by chance, so
# one in a server's request names the proxy's request in flight and nothing else.
PROGRESS_TOKEN_PREFIX = "aggregator-progress-"


class RequestTable:
    """The requests in flight, by every key they are found by, and their deadlines."""

    def __init__(
        self,
        clock: Callable[[], float],
        links: dict[str, UpstreamLink],
        clients: dict[int, ClientState],
        tallies: Tallies,
        subscriptions: Subscriptions,
    ) -> None:
        self.clock = clock
        self.links = links
        self.clients = clients
        self.tallies = tallies  # what ended how
        self.subscriptions = subscriptions  # a subscribe that fails is undone
        self.progress: dict[str, Pending] = {}  # the proxy's progress token -> its request
        self.deadlines = Deadlines()  # timeouts (of parked calls and gatherings too, ``core.era.parked``)
        self.held: dict[str, list[Pending]] = {}  # server -> requests waiting for its listing
        self._next_token = 1

    def token(self) -> str:
        """A progress token of the proxy's, never used before."""
        token = f"{PROGRESS_TOKEN_PREFIX}{self._next_token}"
        self._next_token += 1
        return token

    def client_of(self, pending: Pending) -> ClientState | None:
        """The client a request is for, if it is still connected (a parked call's is none)."""
        session = pending.session
        return None if session is None else self.clients.get(session)

    def start(self, pending: Pending, link: UpstreamLink) -> None:
        """``pending`` was sent to ``link`` now: in its table, under its deadlines."""
        now = pending.sent_at = self.clock()
        pending.hard_deadline = now + link.max_request_timeout
        # tasks/result blocks until the task is done, by design: only the hard maximum applies.
        # (The config guarantees request_timeout <= max_request_timeout.)
        if pending.method == "tasks/result":
            pending.deadline = pending.hard_deadline
        else:
            pending.deadline = now + link.request_timeout
        link.pending[pending.upstream_id] = pending
        self.deadlines.push(pending.deadline, pending)

    def end(self, pending: Pending, outcome: str | None = None, reason: str = "", seconds: float | None = None) -> None:
        """Forget a request everywhere. Safe to call twice. ``outcome`` (and ``reason``,
        ``seconds``) is what it is counted as (``Tallies``); None: not counted, another
        record of the same request takes over."""
        if pending.done:
            return
        pending.done = True
        link = self.links[pending.server]
        link.pending.pop(pending.upstream_id, None)
        if link.idle_stop_after:  # its idle time starts again (``core.upstreams.idle_stops``)
            link.used_at = self.clock()
        if outcome is not None:
            self.tallies.ended(pending.method, link.server or pending.server, outcome, reason, seconds)
        session = pending.session  # (``client_of``, inline: every request ends here)
        client = self.clients.get(session) if session is not None else None
        if client is not None:
            client.in_flight.pop(pending.client_id, None)
        if pending.token is not None:
            self.progress.pop(pending.token, None)
        self.deadlines.discard()

    def fail(self, pending: Pending, message: str, reason: str) -> list[Command]:
        """End one forwarded request with an error of the proxy's (its client told, if it is
        still there; a subscribe that failed is undone)."""
        self.end(pending, "error", reason)
        if pending.session not in self.clients:
            return []
        if pending.subscription is not None:
            self.subscriptions.remove(pending.subscription, pending.session)
        server = self.links[pending.server].server or pending.server
        return [ToClient(pending.session, proxy_error(pending.client_id, message, reason=reason, server=server))]


# What the heap holds: anything with ``done`` and ``deadline`` (a ``Pending``, or a parked
# call or a gathering of ``core.era.parked``, a floor above: hence not named here).
Timed = Any


class Deadlines:
    """The deadline heap (see "Deadlines" above)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timed]] = []
        self._sequence = itertools.count()
        self._stale = 0

    def push(self, when: float, item: Timed) -> None:
        heapq.heappush(self._heap, (when, next(self._sequence), item))

    def move(self, when: float, item: Timed) -> None:
        """Give a live item a new deadline (set ``item.deadline = when`` first)."""
        self._stale += 1
        self.push(when, item)

    def discard(self) -> None:
        """Note that one live item has finished (its entry is now stale)."""
        self._stale += 1
        if self._stale > 1024 and self._stale * 2 > len(self._heap):
            self._heap = [entry for entry in self._heap if _live(entry)]
            heapq.heapify(self._heap)
            self._stale = 0

    def next(self) -> float | None:
        """The earliest deadline still live, or None."""
        heap = self._heap
        while heap and not _live(heap[0]):
            heapq.heappop(heap)
            self._stale = max(0, self._stale - 1)
        return heap[0][0] if heap else None

    def pop_due(self, now: float) -> list[Timed]:
        due = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if _live(entry):
                due.append(entry[2])
            else:
                self._stale = max(0, self._stale - 1)
        return due

    def __len__(self) -> int:
        return len(self._heap)


def _live(entry: tuple[float, int, Timed]) -> bool:
    item = entry[2]
    return not item.done and item.deadline == entry[0]


# Upper bounds, in seconds, of the latency histograms' buckets (the last bucket, +Inf, is
# implied): from a local stdio round trip (well under a millisecond) to a slow tool call.
UPSTREAM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# The proxy's own handling of one message: microseconds, unless something is wrong.
PROXY_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.1)


class Histogram:
    """Observations counted per bucket (not cumulative), with their sum. ``counts`` has
    one more entry than ``bounds``: the observations above the last bound."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value


class Tallies:
    """The router's counts (see the rules above). Only the router writes them.

    A server's result (the common case) is one histogram observation, under the server,
    then the method (``answered``): its count is the ``ok`` requests' count, read at a
    scrape (``requests``, ``upstream`` merge the tables)."""

    def __init__(self) -> None:
        # (method, server, outcome, reason) -> requests ended so, but for a server's result
        self._requests: dict[tuple[str, str, str, str], int] = {}
        # (method, server) -> how long the server took to answer with an error
        self._errors: dict[tuple[str, str], Histogram] = {}
        # server -> method -> how long the server took to answer with a result
        self._ok: dict[str, dict[str, Histogram]] = {}
        # who sent it (client, server) -> how long the router took over one message; the
        # trio layer measures it around the call (the router reads no clock for it)
        self.proxy = {"client": Histogram(PROXY_BUCKETS), "server": Histogram(PROXY_BUCKETS)}

    def answered(self, method: str, server: str, seconds: float) -> None:
        """A forwarded request the server answered with a result, after ``seconds``."""
        try:
            histogram = self._ok[server][method]
        except KeyError:
            histogram = self._ok.setdefault(server, {}).setdefault(method, Histogram(UPSTREAM_BUCKETS))
        histogram.counts[bisect_left(histogram.bounds, seconds)] += 1
        histogram.total += seconds

    def ended(self, method: str, server: str, outcome: str, reason: str, seconds: float | None) -> None:
        """A forwarded request ended otherwise (rule 1); ``seconds``: its upstream duration,
        if the server answered (with an error)."""
        if outcome == "ok" and seconds is not None:
            self.answered(method, server, seconds)
            return
        key = (method, server, outcome, reason)
        self._requests[key] = self._requests.get(key, 0) + 1
        if seconds is not None:
            histogram = self._errors.get((method, server))
            if histogram is None:
                histogram = self._errors[method, server] = Histogram(UPSTREAM_BUCKETS)
            histogram.observe(seconds)

    @property
    def requests(self) -> dict[tuple[str, str, str, str], int]:
        """Requests ended, by (method, server, outcome, reason) (a snapshot)."""
        merged = dict(self._requests)
        for server, methods in self._ok.items():
            for method, histogram in methods.items():
                merged[method, server, "ok", ""] = sum(histogram.counts)
        return merged

    @property
    def upstream(self) -> dict[tuple[str, str], Histogram]:
        """How long the server took to answer, by (method, server), results and errors
        together (a snapshot)."""
        merged: dict[tuple[str, str], Histogram] = {}
        tables = [((method, server), h) for server, methods in self._ok.items() for method, h in methods.items()]
        for key, histogram in [*tables, *self._errors.items()]:
            into = merged.get(key)
            if into is None:
                into = merged[key] = Histogram(histogram.bounds)
            into.counts = [a + b for a, b in zip(into.counts, histogram.counts, strict=True)]
            into.total += histogram.total
        return merged
