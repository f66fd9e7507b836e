"""Upstream connections as the router sees them. Sans-IO.

Owns the link and request records (``links``: ``UpstreamLink``, ``Pending`` in its
``Phase``), each connection's lifecycle (``upstream_lifecycle``: handshake, era probe,
listing, its own requests in ``own_requests``, its ``upstream_outcomes``), the proxy's own
requests to an upstream (``upstream_control.UpstreamControl``), an upstream's life as the
trio layer reports it and what its lifecycle says to do (``upstream_events``), its
messages (``server_messages``) and an answer on its way to its caller (``answers``),
shared servers between starts (``outages``) and the requests held for them
(``held_requests``), and a live reload's changes (``reconfigure``).

May import: ``core.era.upstream_era`` (the ``Era``), ``core.defaults``, the catalogs,
``core.commands``, ``core.replies``, the client record and the handshake, the
subscriptions, ``aggregator.mcp`` and ``aggregator.jsonrpc``; its event handlers also
the packages whose work an upstream's message starts, and ``server_messages`` the client
events (the requests a server listed releases).
"""
