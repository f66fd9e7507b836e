"""The clients side: every way a client reaches the proxy, each turned into a hub client.

Owns the stdio front (``own_stdio``, and ``session``: a client session over a byte
stream), the admission path every network front shares (``access``: Host, Origin and
token; ``admission``: principal, profile, connection and session caps), the boundary each
front's task runs inside (``containment``), the HTTP fronts (``fronts.http``) and the
WebSocket front (``fronts.websocket``).

Imports of the project's packages: ``hub`` (the ``Hub`` a front hands its clients to),
``transports``, ``core``, ``config``, ``mcp``, ``jsonrpc``, ``errors``; and ``ops``
(``http.endpoint`` serves the admin paths; several fronts count refusals in
``ops.recent_errors``).
"""
