"""The hub's metrics in the Prometheus exposition format (``GET /metrics``).

Nothing is counted here. The hot path counts in plain ints and dicts where the work is
done (the router's ``Tallies`` in ``core.requests.request_table``, the upstreams' traffic, the
plugin gate); at a scrape, ``metrics_collector.HubCollector`` reads them and builds the metric
families. So a message costs no metrics library call, and a scrape costs what the tables hold
(bounded: every label is a configured name or one of a fixed set).

Each ``Metrics`` has a ``CollectorRegistry`` of its own, never the library's global one:
a process may run several hubs (the tests do), each scraped for its own numbers. It is
made at the first scrape: ``prometheus_client`` (and the HTTP modules it imports) cost a
proxy that is never scraped nothing, so this module must not import it at its top.

Must not import the hub or the upstreams (they are above the instruments); it reads the
hub through ``metrics_collector.MetricsHost``, a server's connection through ``ServerCounts``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from aggregator.telemetry.metrics_collector import MetricsHost, ServerCounts


class Metrics:
    """One hub's metrics: ``exposition()`` is what ``GET /metrics`` answers."""

    def __init__(self, hub: MetricsHost) -> None:
        self.hub = hub
        # server -> [bytes received, bytes sent] of its per-session connections that ended
        self.retired: dict[str, list[int]] = {}
        # server -> restarts of its shared connections that a reload stopped (changed, removed)
        self.restarts: dict[str, int] = {}
        self._registry: CollectorRegistry | None = None

    @property
    def registry(self) -> CollectorRegistry:
        """This hub's own registry, with its collector (made on first use)."""
        if self._registry is None:
            from prometheus_client.registry import CollectorRegistry

            from aggregator.telemetry.metrics_collector import HubCollector

            self._registry = CollectorRegistry(auto_describe=False)
            self._registry.register(HubCollector(self.hub, self.retired, self.restarts))
        return self._registry

    def exposition(self) -> tuple[bytes, str]:
        """The current metrics as a response body, and its content type."""
        from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_PLAIN_0_0_4

    def retire(self, upstream: ServerCounts) -> None:
        """A per-session connection ended, or a reload stopped a connection: what it moved
        (and a shared one's restarts) stays counted under its server, so that no counter
        goes back while the process lives."""
        name = upstream.config.name
        moved = self.retired.setdefault(name, [0, 0])
        moved[0] += upstream.traffic.received
        moved[1] += upstream.sent_bytes
        if not upstream.per_session:
            self.restarts[name] = self.restarts.get(name, 0) + upstream.restarts
