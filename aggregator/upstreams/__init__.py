"""The servers side: one upstream session per configured server, and every way of reaching one.

Owns ``UpstreamSession`` (``session``: start, initialize, serve, restart with backoff,
read what the server says), what it needs of the hub (``port``: the ``UpstreamPort`` it
reports its connection's events to; it never holds the router), stdio children
(``child_process``), and the network connectors (``network_upstream``,
``network_link``, Streamable HTTP in ``streamable_http_upstream`` and
``streamable_http_modern`` with ``modern_headers`` and ``resumption``, legacy HTTP+SSE in
``sse_upstream``, WebSocket in ``websocket_upstream``) over the upstream HTTP client
(``http_client``).

Floor 5 (tests/core/test_layering.py). May import ``telemetry`` (the traffic log, trace
headers), ``transports``, ``config``, ``core``, ``mcp``, ``jsonrpc``, ``errors``; never the
hub, which is above: what a session needs of it is the ``UpstreamPort`` it is given.
"""
