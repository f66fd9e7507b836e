"""The entry point: parse the arguments, set up logging, run the command, and turn its
outcome into an exit code (a user mistake is one line on stderr, never a traceback)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

from aggregator.cli.arguments import build_parser
from aggregator.errors import AggregatorError, ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.log_level != "debug":
        # httpx logs every request it makes at info: one line per message to an HTTP server.
        logging.getLogger("httpx").setLevel(logging.WARNING)
    # httpcore's traces (debug) quote a failed request's exception, which may hold a header's
    # value; what failed is logged by the proxy itself, its secrets masked.
    logging.getLogger("httpcore").setLevel(logging.INFO)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except ConfigError as exc:
        print(f"aggregator: {exc}", file=sys.stderr)
        return 2
    except AggregatorError as exc:  # the proxy could not start: one line, no traceback
        print(f"aggregator: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `aggregator tools | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
