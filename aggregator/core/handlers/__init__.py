"""The objects that handle the router's events, just under the router. Sans-IO.

The event handlers, lowest first: an upstream's life (``upstream_events``), a live reload
(``reconfigure``), a client's events (``client_events``) and a server's messages
(``server_messages``); each imports only those before it, and only the router composes
them. Beside them: a client's requests by method (``client_requests``), an answer on its
way to its caller (``answers``), a server's requests routed to their client
(``reverse_requests``) and requests given up on and timed out (``inflight``).

May import: every core package below (``core.era`` and everything under it), never the
router.
"""
