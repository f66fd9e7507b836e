"""The command line (``aggregator serve | tools | check | approve | import``).

``main`` is the entry point (``aggregator.cli:main``, and ``python -m aggregator``).
The work is split by job: ``main`` turns a command's outcome into an exit code,
``arguments`` builds the parser, ``common`` loads a command's config and starts the hub
for one look, and one module per command (``serve``, ``catalog``, ``check``, ``approve``,
``convert``).

The entry point imports the rest itself: loading the proxy takes a good part of a second,
and Ctrl-C in that time ends the command quietly with status 130, as later.
"""

INTERRUPTED = 130  # as aggregator.cli.common says; not imported from there, which loads trio


def main(argv: list[str] | None = None) -> int:
    """Run the command line (``argv``, else ``sys.argv``); the exit status."""
    try:
        from aggregator.cli.main import main as run  # noqa: PLC0415 - Ctrl-C while it loads is caught here
    except KeyboardInterrupt:
        return INTERRUPTED
    finally:
        # Importing the submodule ``main`` bound this package's name ``main`` to it.
        globals()["main"] = _entry
    return run(argv)


_entry = main

__all__ = ["main"]
