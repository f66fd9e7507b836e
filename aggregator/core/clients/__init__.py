"""What the proxy says of itself to a client. Sans-IO.

Owns the legacy handshake and what the proxy declares (``handshake.Handshake``: the
merged capabilities and instructions, what it declares upstream, the log levels to set).
A client's events and its requests are handled above (``core.handlers``); the client
record is in ``core.records``.

May import: the packages below it: the records, ``core.lifecycle``, ``core.catalogs``,
``core.notices``, ``core.requests``, ``core.reverse``, ``core.commands``,
``core.replies``, ``aggregator.mcp`` and ``aggregator.jsonrpc``.
"""
