"""Operating the proxy: the admin paths and what they report, and the hub's instruments.

Owns the admin listener and paths (``admin``), health, readiness and the status snapshot
(``status``) and its page (``status_page``), Prometheus metrics (``metrics``,
``metrics_collector``), OpenTelemetry traces (``tracing``), the debug line per message
(``traffic``), and the last warnings and errors logged (``recent_errors``).

Imports of the project's packages: ``hub`` (``admin``, ``status`` read the ``Hub``),
``fronts`` (``admin`` takes the admission path and boundary every front shares),
``cli`` (``status`` -> ``cli.catalog`` for the catalog view), ``transports``, ``core``,
``config``, ``mcp``, ``jsonrpc``; and, for type checking only, ``upstreams`` and
``plugins``.
"""
