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

``upstream_era`` holds the ``Era`` enum and how a connection finds its server's era.

May import: the records of ``core.upstreams.links`` and ``core.clients.clients``,
``core.reverse`` and ``core.catalogs`` for the rules they share, the request table and
forwarding (``core.requests``), the proxy's own requests upstream
(``core.upstreams.upstream_control``), the handshake, the notices, ``core.commands``, ``core.replies``,
``aggregator.mcp`` and ``aggregator.jsonrpc``.
"""
