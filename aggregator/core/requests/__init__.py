"""Client requests in flight through the proxy. Sans-IO.

Owns the request table (``request_table.RequestTable``: every ``Pending`` by each key it
is found by, its progress token and deadlines, and the one way out of every table),
forwarding a request upstream or holding it for a connection that starts
(``forwarding.Forwarding``), giving up on and timing out requests (``inflight.InFlight``),
what ended how (``tallies``), the deadline heap (``deadlines``) and whose each task is
(``tasks``).

May import: the records of ``core.upstreams.links`` and ``core.clients.clients``, the
catalogs, ``core.commands``, ``core.replies``, ``core.settings``, ``aggregator.mcp`` and
``aggregator.jsonrpc``; ``inflight`` also the objects it is given (of ``core.era``,
``core.notices``, ``core.reverse`` and ``core.upstreams``).
"""
