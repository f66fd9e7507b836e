"""The command line (``aggregator serve | tools | check | approve | import | search | add | ...``).

``main`` is the entry point (``aggregator.cli:main``, and ``python -m aggregator``).
The work is split by job: ``main`` turns a command's outcome into an exit code,
``arguments`` builds the parser, ``common`` loads a command's config and starts the hub
for one look, and one module per command (``serve``, ``catalog``, ``check``, ``approve``,
``convert``, ``registry`` for ``search`` and ``add``).

Floor 9, the top (tests/core/test_layering.py): it may import every package, and none
imports it.

The entry point imports the rest itself: loading the proxy takes a good part of a second,
and Ctrl-C in that time ends the command quietly with status 130, as later.

Ctrl-C stops every command however it was started: a shell starts a background job
(``aggregator check &``) with SIGINT ignored, and Python then leaves it ignored, so ``main``
puts back Python's own handler (``KeyboardInterrupt``, which trio also needs to see to
stop a run) before anything else.
"""

import signal

INTERRUPTED = 130  # as aggregator.cli.common says; not imported from there, which loads trio


def main(argv: list[str] | None = None) -> int:
    """Run the command line (``argv``, else ``sys.argv``); the exit status."""
    _stop_on_ctrl_c()
    try:
        from aggregator.cli.main import main as run  # noqa: PLC0415 - Ctrl-C while it loads is caught here
    except KeyboardInterrupt:
        return INTERRUPTED
    finally:
        # Importing the submodule ``main`` bound this package's name ``main`` to it.
        globals()["main"] = _entry
    return run(argv)


def _stop_on_ctrl_c() -> None:
    """Make SIGINT raise ``KeyboardInterrupt``, even if this process was started with it
    ignored (a background job). Only the main thread may set a handler; elsewhere (a caller
    running the command line in a thread) the caller's handling stays."""
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread
        pass


_entry = main

__all__ = ["main"]
