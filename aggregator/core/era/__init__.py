"""The two protocol eras, translated at the edges. Sans-IO.

2026-07-28 ("modern") has no session and asks for input by ``input_required`` results;
2025-11-25 and earlier ("legacy") keep sessions and server-to-client requests. The rest of
the core routes one model of a request; this package holds every rule that depends on
an era, decided where a message enters or leaves:

==========================  ================  ========================================
caller (client)             server (link)     who bridges
==========================  ================  ========================================
modern                      any               ``modern_callers``: admission of each
                                              request's ``_meta``, server/discover,
                                              subscriptions/listen; answers stamped
                                              (``modern_results``)
legacy                      modern            ``input_bridge``: the server's
                                              input_required asked as server-to-client
                                              requests, then the call retried
modern                      legacy            ``parked``: the server's requests during
                                              the call asked by an input_required
                                              result, the call parked until the retry
                                              (its state signed by ``request_state``)
modern                      modern            ``modern_input``: input_required passed
                                              through, its state wrapped
legacy (subscribe)          modern            ``listen_acks``: the answer held until
                                              the server acknowledges its listen
==========================  ================  ========================================

The ``Era`` enum and how a connection finds its server's era are the connection's
(``core.lifecycle.upstream_era``); how a modern server acknowledges a listen is the
proxy's own requests' (``core.upstreams.listen_acks``).

May import: the packages below it: the records (``core.records``), ``core.lifecycle``,
``core.catalogs``, ``core.notices``, the request table and forwarding (``core.requests``),
``core.reverse`` for the rules they share, the handshake (``core.clients``), the proxy's
own requests upstream (``core.upstreams``), ``core.commands``, ``core.replies``,
``core.settings``, ``aggregator.mcp`` and ``aggregator.jsonrpc``.
"""
