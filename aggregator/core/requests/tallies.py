"""What the router counts of the requests it forwards, for the metrics. Sans-IO.

Counting is on the hot path, so it is plain ints in dicts keyed by tuples: one dict
update when a request ends, one more with its duration. Nothing here knows of any metrics
library; ``aggregator.metrics`` reads these tables when it is scraped.

Rules
-----
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

from bisect import bisect_left

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
