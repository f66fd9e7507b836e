"""Client sessions as the router knows them. Sans-IO.

Owns the client record (``clients.ClientState``, ``SessionInfo``), a client's messages
from connect to disconnect (``client_events``), the handlers of its requests by method
(``client_requests``), the legacy handshake and what the proxy says of itself
(``handshake.Handshake``) and log levels (``log_levels``).

May import: ``core.upstreams.links`` (records), ``core.notices``, the catalogs,
``core.era`` for a modern caller's rules, ``core.commands``, ``aggregator.mcp`` and
``aggregator.jsonrpc``; its client events also ``core.upstreams`` (a leaving
client's own connections are lost through the upstream events; held requests released).
"""
