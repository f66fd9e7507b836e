"""The byte-level pieces both sides share: bytes in and out of pipes and sockets, and the
queues in front of them. No MCP semantics here.

Owns what a client's and a server's connection alike are built from: write queues with
byte budgets, their compact storage and direct socket reads and writes (``outbox``),
``budget``, the hub's view of a client's queue (``sink``), an in-memory pipe to a network
server's connection (``pipe``: each line with the message it encodes) and an upstream
session's ``channel``, the HTTP/1.1 server connection and its request
reader (``http_server``, with what it writes in ``http_wire``) and Server-Sent Events
parsing (``sse``).

Floor 3 (tests/core/test_layering.py). May import ``jsonrpc`` only.
"""
