"""MCP facts the proxy relies on: protocol revisions and their negotiation, and the names of
methods, kinds and capabilities its rules are written in (``constants``). Sans-IO.

Floor 1 (tests/core/test_layering.py). May import ``jsonrpc`` only.
"""
