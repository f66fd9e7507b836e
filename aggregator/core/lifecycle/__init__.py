"""One upstream connection's own life, below everything that routes. Sans-IO.

Owns how a connection finds its server's era (``upstream_era``: the ``Era`` enum, the
probe and its verdicts), the connection's lifecycle (``upstream_lifecycle``: handshake,
listing, re-listing), the proxy's own requests to it (``own_requests.OwnRequests``) and
what the lifecycle returns (``upstream_outcomes``).

May import: ``core.commands``, ``core.defaults``, ``aggregator.mcp`` and ``aggregator.jsonrpc``.
"""
