"""What the router counts of the requests it forwards, for the metrics. Sans-IO.

Counting is on the hot path, so it is plain ints in dicts keyed by tuples: one dict
update when a request ends, one more with its duration. Nothing here knows of any metrics
library; ``aggregator.metrics`` reads these tables when it is scraped.

Rules
-----
1. A request for a server is counted once, when it ends (``Router._end``), with what
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
    """The router's counts (see the rules above). Only the router writes them."""

    def __init__(self) -> None:
        # (method, server, outcome, reason) -> requests ended so
        self.requests: dict[tuple[str, str, str, str], int] = {}
        # (method, server) -> how long the server took to answer
        self.upstream: dict[tuple[str, str], Histogram] = {}
        # who sent it (client, server) -> how long the router took over one message; the
        # trio layer measures it around the call (the router reads no clock for it)
        self.proxy = {"client": Histogram(PROXY_BUCKETS), "server": Histogram(PROXY_BUCKETS)}

    def ended(self, method: str, server: str, outcome: str, reason: str, seconds: float | None) -> None:
        """A forwarded request ended (rule 1); ``seconds``: its upstream duration, if answered."""
        key = (method, server, outcome, reason)
        try:
            self.requests[key] += 1
        except KeyError:
            self.requests[key] = 1
        if seconds is not None:
            try:
                histogram = self.upstream[method, server]
            except KeyError:
                histogram = self.upstream[method, server] = Histogram(UPSTREAM_BUCKETS)
            histogram.observe(seconds)
