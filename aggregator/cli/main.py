"""The entry point: parse the arguments, set up logging, run the command, and turn its
outcome into an exit code (a user mistake is one line on stderr, never a traceback;
Ctrl-C is exit status 130 whatever the command was doing)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from aggregator.cli.arguments import build_parser
from aggregator.cli.common import INTERRUPTED
from aggregator.cli.logs import setup_logging
from aggregator.cli.terminal import printable
from aggregator.errors import AggregatorError, ConfigError


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return INTERRUPTED
    except BaseExceptionGroup as group:
        # Ctrl-C while trio runs arrives inside the group of the nursery it interrupted.
        if group.subgroup(KeyboardInterrupt) is not None:
            return INTERRUPTED
        raise


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse would name them with the usage of `aggregator`, not the command's
        (getattr(args, "parser", None) or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    setup_logging(args.log_level, args.log_format)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except ConfigError as exc:
        print(f"aggregator: {_shown(exc)}", file=sys.stderr)
        return 2
    except AggregatorError as exc:  # the proxy could not start: one line, no traceback
        print(f"aggregator: {_shown(exc)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `aggregator tools | head`: the reader has seen enough
        _drop_stdout()
        return 0
    except OSError as exc:  # the output could not be written (`> /dev/full`, a full disk)
        _drop_stdout()
        where = f"{exc.filename}: " if exc.filename else "cannot write the output: "
        print(f"aggregator: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1


def _shown(exc: AggregatorError) -> str:
    """The message of ``exc`` for a terminal: a control character that came from a key
    name, a path or an answer is shown as ``\\x1b``; a config error keeps one problem a line."""
    if isinstance(exc, ConfigError):
        head = f"invalid configuration in {printable(exc.source)}" if exc.source else "invalid configuration"
        return head + ":\n" + "\n".join(f"  {printable(problem)}" for problem in exc.problems)
    return "\n".join(printable(line) for line in str(exc).split("\n"))


def _drop_stdout() -> None:
    """Send what is left for stdout nowhere, so that exiting does not fail on it again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
