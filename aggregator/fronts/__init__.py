"""The clients side: every way a client reaches the proxy, each turned into a hub client.

Every front reaches the hub through its ``ClientPort`` (``port``) and never holds the
router: it says what its client did, and the hub routes it and writes what follows.

Owns the stdio front (``own_stdio``, and ``session``: a client session over a byte
stream), the admission path every network front shares (``access``: Host, Origin, token,
principal and profile; the connection and session caps are the hub's), the boundary each
front's task runs inside (``containment``), the HTTP fronts (``fronts.http``) and the
WebSocket front (``fronts.websocket``).

Floor 7 (tests/core/test_layering.py). May import ``hub`` (the ``Hub`` a front hands its
clients to, and its caps), ``telemetry`` (refusals are marked for ``recent_errors``),
``transports``, ``config``, ``core``, ``mcp``, ``jsonrpc``, ``errors``; never ``ops`` (the
admin paths the HTTP front serves are handed to it) or ``cli``.
"""
