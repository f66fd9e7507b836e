"""Client requests in flight through the proxy. Sans-IO.

Owns the request table (``request_table.RequestTable``: every ``Pending`` by each key it
is found by, its progress token, the deadline heap (``Deadlines``), the one way out of every
table, and what ended how (``Tallies``)), forwarding a request upstream or holding it for a
connection that starts (``forwarding.Forwarding``) and whose each task is (``tasks``).
Giving up on and timing out requests is the handlers' (``core.handlers.inflight``).

May import: the records (``core.records``), ``core.lifecycle``, ``core.catalogs``,
``core.notices`` (a subscribe that fails is undone), ``core.commands``, ``core.replies``,
``core.settings``, ``aggregator.mcp`` and ``aggregator.jsonrpc``.
"""
