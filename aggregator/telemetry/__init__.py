"""The instruments: what the proxy counts, traces and remembers while it runs.

Owns Prometheus metrics (``metrics``, and ``metrics_collector``, imported at the first
scrape), OpenTelemetry traces (``tracing``), the debug line per message (``traffic``),
and the last warnings and errors logged (``recent_errors``). The hub builds and feeds
them, the upstreams count their traffic and send trace headers through them, the fronts
mark refusals with ``recent_errors.REFUSAL``, and the admin pages (``ops``) read them.

Floor 4 (tests/core/test_layering.py). May import ``transports``, ``core``, ``jsonrpc``
(and ``aggregator`` for its version); what it reads of the hub, the upstreams and the
plugin gate, which are above it, it describes as protocols (``metrics_collector``).
"""
