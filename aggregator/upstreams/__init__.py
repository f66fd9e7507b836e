"""The servers side: one upstream session per configured server, and every way of reaching one.

Owns ``UpstreamSession`` (``session``: start, initialize, serve, restart with backoff),
stdio children (``child_process``) and the reading of their output (``upstream_streams``),
and the network connectors (``network_upstream``, ``network_link``, Streamable HTTP in
``streamable_http_upstream`` and ``streamable_http_modern`` with ``modern_headers`` and
``resumption``, legacy HTTP+SSE in ``sse_upstream``, WebSocket in ``websocket_upstream``)
over the upstream HTTP client (``http_client``).

Imports of the project's packages: ``transports``, ``core``, ``config``, ``mcp``,
``jsonrpc``, ``errors``; and ``ops`` for the traffic log and trace headers
(``upstream_streams`` -> ``ops.traffic``, ``streamable_http_upstream`` -> ``ops.tracing``).
"""
