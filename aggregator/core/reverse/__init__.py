"""Server-to-client requests (sampling, elicitation, roots). Sans-IO.

Owns the table of those in flight and the open URL-mode elicitations
(``reverse_table.ReverseTable``), the rules of which client a server's message belongs
to (``affinity``, pure functions), what a request needs of a client's capabilities
(``declared``, pure functions), routing a server's request (``reverse_requests``) and
roots (``roots``).

May import: the records of ``core.upstreams.links`` and ``core.clients.clients``,
``core.era`` (a modern caller is asked by its call's result), ``core.commands``,
``aggregator.mcp`` and ``aggregator.jsonrpc``.
"""
