"""The sans-IO heart of the proxy: naming, URI rewriting, cursors, catalog and routing.

Nothing here imports trio or does I/O (tests/core/test_layering.py checks). Events go in,
commands come out; every rule that is hard to get right lives here and is tested as pure
functions.

Floor 2 (tests/core/test_layering.py). May import ``mcp`` and ``jsonrpc`` only. Its own
packages sit on floors too (the same test lists them): commands, settings and the shared
records low, the event handlers and the router on top, each importing only those below
it. Each ``__init__.py`` says what its package owns and may import.
"""
