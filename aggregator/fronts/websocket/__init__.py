"""The WebSocket front: one MCP session per connection, one message per text frame.

Owns the listener and each connection (``endpoint``), the handshake as the access check
reads it (``handshake``), and what a session sends (``sink``).

Imports of the project's packages: as ``fronts`` (of which it is part).
"""
