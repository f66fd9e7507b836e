"""Thin trio transports: bytes in and out of pipes and sockets. No MCP semantics here."""
