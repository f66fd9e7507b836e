"""The sans-IO heart of the proxy: naming, URI rewriting, cursors, catalog and routing.

Nothing here imports trio or does I/O (tests/core/test_layering.py checks). Events go in,
commands come out; every rule that is hard to get right lives here and is tested as pure
functions.

Floor 2 (tests/core/test_layering.py). May import ``mcp`` and ``jsonrpc`` only.
"""
