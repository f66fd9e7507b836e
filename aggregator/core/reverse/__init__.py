"""Server-to-client requests (sampling, elicitation, roots). Sans-IO.

Owns the table of those in flight and the open URL-mode elicitations
(``reverse_table.ReverseTable``), the rules of which client a server's message belongs
to (``affinity``, pure functions), what a request needs of a client's capabilities
(``declared``, pure functions) and roots (``roots``). Routing a server's request to its
client is the handlers' (``core.handlers.reverse_requests``).

May import: the records (``core.records``), ``core.lifecycle``, ``core.catalogs``,
``core.notices``, ``core.requests``, ``core.commands``, ``core.replies``,
``core.settings``, ``aggregator.mcp`` and ``aggregator.jsonrpc``.
"""
