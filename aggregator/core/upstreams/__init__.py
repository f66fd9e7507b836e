"""What the proxy asks of upstreams itself, and what waits for them. Sans-IO.

Owns the proxy's own requests to an upstream (``upstream_control.UpstreamControl``: the
handshake a connection starts, log levels, subscriptions, in each link's table of its own
requests), how a modern server acknowledges a listen (``listen_acks``) and the requests
held for a shared server between its starts (``held_requests``). An upstream's life and
its messages are handled above (``core.handlers``); the link record is in
``core.records``, a connection's lifecycle in ``core.lifecycle``, the outages in
``core.catalogs``.

May import: the packages below it: the records, ``core.lifecycle``, ``core.catalogs``,
``core.notices``, ``core.requests``, ``core.reverse``, the handshake (``core.clients``),
``core.commands``, ``core.replies``, ``core.settings``, ``aggregator.mcp`` and
``aggregator.jsonrpc``.
"""
