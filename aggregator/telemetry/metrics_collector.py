"""The collector behind ``GET /metrics``: the hub's counters as Prometheus metric families,
built at each scrape (see ``aggregator.telemetry.metrics``, which imports this module only then).

Must not import the hub, the upstreams or the plugins (they are above the instruments), nor
``aggregator.telemetry.metrics``; it reads the hub through ``MetricsHost``, each server's
connection through ``ServerCounts``, the plugin gate through ``DecisionCounts`` and the
shared store through ``StoreCounts``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from aggregator.core.requests.request_table import Histogram

if TYPE_CHECKING:
    from aggregator.core.router import Router, SessionInfo
    from aggregator.transports.budget import ClientMemory

# A client session's transport, by the type of its sink (``transports.sink``).
TRANSPORTS = {
    "Outbox": "stdio",
    "HttpSession": "http",
    "LegacySession": "sse",
    "WebSocketSink": "websocket",
}
SERVER_STATES = ("starting", "ready", "down", "lazy", "idle-stopped")


class Received(Protocol):
    """What a server's reader counted (``upstreams.session.Traffic``)."""

    @property
    def received(self) -> int: ...


class QueueBytes(Protocol):
    """A server's write queue (``transports.outbox.Outbox``): what it holds now."""

    @property
    def held(self) -> int: ...


class ServerName(Protocol):
    @property
    def name(self) -> str: ...


class ServerCounts(Protocol):
    """What the metrics read of one server's connection (an ``UpstreamSession`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def config(self) -> ServerName: ...
    @property
    def traffic(self) -> Received: ...
    @property
    def sent_bytes(self) -> int: ...
    @property
    def outbox(self) -> QueueBytes | None: ...
    @property
    def per_session(self) -> bool: ...
    @property
    def state(self) -> str: ...
    @property
    def restarts(self) -> int: ...


class DecisionCounts(Protocol):
    """What the plugin gate counted (``plugins.gate.PluginGate``): by (server, method), the
    server-to-client requests a policy refused; by (hook, decision), the plugins' decisions."""

    @property
    def policy_denials(self) -> dict[tuple[str, str], int]: ...
    @property
    def decisions(self) -> dict[tuple[str, str], int]: ...


class StoreTallies(Protocol):
    """The shared store's counts (``cluster.store.StoreStats``)."""

    @property
    def calls(self) -> dict[str, int]: ...
    @property
    def errors(self) -> dict[str, int]: ...
    @property
    def latency(self) -> Histogram: ...


class StoreUp(Protocol):
    @property
    def up(self) -> bool: ...


class StoreCounts(Protocol):
    """What the metrics read of the shared store (``cluster.store``'s ``Store``)."""

    @property
    def stats(self) -> StoreTallies: ...

    def status(self) -> StoreUp: ...


class MetricsHost(Protocol):
    """What the metrics read of the hub (the hub is one)."""

    @property
    def router(self) -> Router: ...
    @property
    def upstreams(self) -> Mapping[str, ServerCounts]: ...
    @property
    def client_memory(self) -> ClientMemory: ...
    @property
    def gate(self) -> DecisionCounts: ...
    @property
    def store(self) -> StoreCounts: ...
    @property
    def start_latency(self) -> Histogram: ...

    def sessions(self) -> list[tuple[int, Any, SessionInfo | None]]: ...


class HubCollector(Collector):
    """Builds the families from the hub's tables at each scrape."""

    def __init__(self, hub: MetricsHost, retired: dict[str, list[int]], restarts: dict[str, int]) -> None:
        self.hub = hub
        self._retired = retired  # server -> [received, sent] of its ended connections
        self._restarts = restarts  # server -> restarts of its shared connections a reload stopped

    def collect(self) -> Iterator[Metric]:
        yield from self._requests()
        yield from self._sessions()
        yield from self._servers()
        yield from self._decisions()
        yield from self._context()
        yield from self._store()

    def _requests(self) -> Iterator[Metric]:
        tallies = self.hub.router.tallies
        requests = CounterMetricFamily(
            "aggregator_requests",
            "Client requests for a server, by how they ended (refused before sending too).",
            labels=["method", "server", "outcome", "reason"],
        )
        for labels, count in sorted(tallies.requests.items()):
            requests.add_metric(list(labels), count)
        yield requests
        upstream = HistogramMetricFamily(
            "aggregator_upstream_request_duration_seconds",
            "From sending a request to a server to its answer.",
            labels=["method", "server"],
        )
        for pair, histogram in sorted(tallies.upstream.items()):
            upstream.add_metric(list(pair), _buckets(histogram), histogram.total)
        yield upstream
        proxy = HistogramMetricFamily(
            "aggregator_proxy_duration_seconds",
            "The router's work on one message, by who sent it: what the proxy adds on the way in and out.",
            labels=["direction"],
        )
        for direction, histogram in tallies.proxy.items():
            proxy.add_metric([direction], _buckets(histogram), histogram.total)
        yield proxy
        in_flight = GaugeMetricFamily(
            "aggregator_requests_in_flight", "Requests sent to a server and not answered yet.", labels=["server"]
        )
        for server, count in sorted(self.hub.router.in_flight_by_server().items()):
            in_flight.add_metric([server], count)
        yield in_flight

    def _sessions(self) -> Iterator[Metric]:
        hub = self.hub
        sessions = GaugeMetricFamily(
            "aggregator_sessions",
            "Client sessions connected, by transport and profile.",
            labels=["transport", "profile"],
        )
        counts: dict[tuple[str, str], int] = {}
        for _, sink, info in hub.sessions():
            label = (TRANSPORTS.get(type(sink).__name__, "other"), info.profile if info else "default")
            counts[label] = counts.get(label, 0) + 1
        for label, count in sorted(counts.items()):
            sessions.add_metric(list(label), count)
        yield sessions
        queued = GaugeMetricFamily(
            "aggregator_client_queue_bytes", "Bytes queued for all clients together, not yet written."
        )
        queued.add_metric([], hub.client_memory.total)
        yield queued

    def _servers(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "aggregator_server_state",
            "1 for the state each shared server is in, 0 for the others.",
            labels=["server", "state"],
        )
        restarts = CounterMetricFamily(
            "aggregator_server_restarts", "Times a shared server was lost and is started again.", labels=["server"]
        )
        received = CounterMetricFamily(
            "aggregator_server_received_bytes", "Bytes read from a server's output.", labels=["server"]
        )
        sent = CounterMetricFamily("aggregator_server_sent_bytes", "Bytes written to a server.", labels=["server"])
        queued = GaugeMetricFamily(
            "aggregator_server_queue_bytes", "Bytes queued for a server, not yet written.", labels=["server"]
        )
        traffic = {server: list(moved) for server, moved in self._retired.items()}
        lost = dict(self._restarts)
        waiting: dict[str, int] = {}
        for upstream in sorted(self.hub.upstreams.values(), key=lambda u: u.name):
            server = upstream.config.name
            moved = traffic.setdefault(server, [0, 0])
            moved[0] += upstream.traffic.received
            moved[1] += upstream.sent_bytes
            outbox = upstream.outbox
            waiting[server] = waiting.get(server, 0) + (outbox.held if outbox is not None else 0)
            if upstream.per_session:
                continue
            for name in SERVER_STATES:
                state.add_metric([server, name], 1 if upstream.state == name else 0)
            lost[server] = lost.get(server, 0) + upstream.restarts
        for server, count in sorted(lost.items()):
            restarts.add_metric([server], count)
        for server, (read, written) in sorted(traffic.items()):
            received.add_metric([server], read)
            sent.add_metric([server], written)
        for server, count in sorted(waiting.items()):
            queued.add_metric([server], count)
        yield from (state, restarts, received, sent, queued)
        started = HistogramMetricFamily(
            "aggregator_server_start_seconds",
            "How long shared servers took to start, from the attempt to their first listing.",
        )
        latency = self.hub.start_latency
        started.add_metric([], _buckets(latency), latency.total)
        yield started

    def _decisions(self) -> Iterator[Metric]:
        denials = CounterMetricFamily(
            "aggregator_policy_denials",
            "Server-to-client requests (sampling, elicitation, roots) refused by a server's policy.",
            labels=["server", "method"],
        )
        for labels, count in sorted(self.hub.gate.policy_denials.items()):
            denials.add_metric(list(labels), count)
        yield denials
        decisions = CounterMetricFamily(
            "aggregator_plugin_decisions",
            "What plugins' hooks decided, by hook and decision.",
            labels=["hook", "decision"],
        )
        for labels, count in sorted(self.hub.gate.decisions.items()):
            decisions.add_metric(list(labels), count)
        yield decisions

    def _context(self) -> Iterator[Metric]:
        tokens = GaugeMetricFamily(
            "aggregator_tools_list_tokens",
            "A profile's tools/list in estimated tokens (UTF-8 bytes / 4): every tool, and what it lists now.",
            labels=["profile", "listing"],
        )
        for profile, row in self.hub.router.context_report().items():
            everything = row["tools_list_tokens"]
            tokens.add_metric([profile, "all"], everything)
            tokens.add_metric([profile, "current"], everything if row["lists"] == "all" else row["search_list_tokens"])
        yield tokens

    def _store(self) -> Iterator[Metric]:
        store = self.hub.store
        stats = store.stats
        calls = CounterMetricFamily(
            "aggregator_store_calls", "Calls on the shared store, by operation.", labels=["operation"]
        )
        errors = CounterMetricFamily(
            "aggregator_store_errors",
            "Calls on the shared store that failed (down, timed out or refused), by operation.",
            labels=["operation"],
        )
        for operation, count in sorted(stats.calls.items()):
            calls.add_metric([operation], count)
        for operation, count in sorted(stats.errors.items()):
            errors.add_metric([operation], count)
        latency = HistogramMetricFamily(
            "aggregator_store_duration_seconds", "How long a call on the shared store took, answered ones."
        )
        latency.add_metric([], _buckets(stats.latency), stats.latency.total)
        up = GaugeMetricFamily("aggregator_store_up", "1 while the shared store is reachable (the embedded one: 1).")
        up.add_metric([], 1 if store.status().up else 0)
        yield from (calls, errors, latency, up)


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    """Cumulative bucket counts, as the exposition format has them, ending with +Inf."""
    out: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*histogram.bounds, math.inf), histogram.counts, strict=True):
        running += count
        out.append(("+Inf" if bound == math.inf else repr(bound), running))
    return out
