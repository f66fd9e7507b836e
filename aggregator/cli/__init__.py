"""The command line (``aggregator serve | tools | check | approve | import``).

``main`` is the entry point (``aggregator.cli:main``, and ``python -m aggregator``).
The work is split by job: ``main`` turns a command's outcome into an exit code,
``arguments`` builds the parser, ``common`` loads a command's config and starts the hub
for one look, and one module per command (``serve``, ``catalog``, ``check``, ``approve``,
``convert``).
"""

from aggregator.cli.main import main

__all__ = ["main"]
