"""MCP facts the proxy relies on: protocol revisions and their negotiation. Sans-IO."""
