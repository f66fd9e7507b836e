"""The records the core's objects share, and nothing that acts on them. Sans-IO.

Holds an upstream as the router sees it and a client request in flight (``links``:
``UpstreamLink``, ``Pending`` in its ``Phase``, a parked call, an input bridge), a client
session (``clients``: ``ClientState``, ``SessionInfo``) and the log levels both carry
(``log_levels``). Whoever keeps a table of them owns the rules; the records are plain.

May import: ``core.lifecycle`` (a link holds its connection's lifecycle and own requests),
``core.settings``, ``core.defaults``, ``aggregator.mcp`` and ``aggregator.jsonrpc``.
"""
