"""The loop guard: an aggregator must not end up serving itself. Pure functions.

A config can list the aggregator as one of its servers, directly or through a client
file (Claude Desktop, Cursor, VS Code) that the aggregator serves and that itself starts
the aggregator. Each copy would start the next without end. The guard:

- Every aggregator that starts servers puts the chain of config paths it serves under,
  its own last, into the environment of each child it starts (``CHAIN_VARIABLE``, a JSON
  array of absolute, symlink-resolved paths). Only the aggregator writes it: a server's
  configured ``env`` may not name it, and the aggregator sets it after a server's ``env``.
- An aggregator that is asked to serve a config already in the chain refuses to start,
  naming the chain last (a parent shows a server's stderr cut at 300 characters). Paths
  are compared after resolving symlinks; a copy of a file under another name is a
  different config, so a chain is also cut at ``MAX_DEPTH`` aggregators, whatever their
  configs.
- A marker that cannot be read is refused too: it was not written by an aggregator, and
  ignoring it would switch the guard off.

The caller resolves paths and reads and writes the environment; nothing here does I/O.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

CHAIN_VARIABLE = "AGGREGATOR_CONFIG_CHAIN"
# Aggregators above this one, at most. Nesting a few on purpose (a team proxy inside a
# personal one) is fine; eight is more than anyone needs and few enough to stop at once.
MAX_DEPTH = 8


class NestingRefused(Exception):
    """This aggregator must not start: the message says why, in one line."""


def parse_chain(value: str | None) -> tuple[str, ...]:
    """The config paths of the aggregators above this one, outermost first."""
    if value is None:
        return ()
    try:
        chain = json.loads(value)
    except ValueError:
        chain = None
    if not isinstance(chain, list) or not all(isinstance(path, str) and path for path in chain):
        shown = value if len(value) <= 80 else value[:77] + "..."
        raise NestingRefused(
            f"{CHAIN_VARIABLE} is set to {shown!r}, which is not a chain of config paths written by an"
            " aggregator; unset it"
        )
    return tuple(chain)


def enter(chain: Sequence[str], config: str, max_depth: int = MAX_DEPTH) -> tuple[str, ...]:
    """The chain for the children of an aggregator serving ``config`` (a resolved path)
    below ``chain``; NestingRefused if that aggregator must not start."""
    if config in chain:
        raise NestingRefused(
            f"config {config} is already being served by a parent aggregator, and a config must not list"
            f" the aggregator serving it (chain: {format_chain([*chain, config])})"
        )
    if len(chain) >= max_depth:
        raise NestingRefused(
            f"{len(chain)} aggregators are already running one inside the other, and a config must not list,"
            f" directly or through other configs, the aggregator serving it (chain: {format_chain([*chain, config])})"
        )
    return (*chain, config)


def chain_value(chain: Sequence[str]) -> str:
    """The environment value that carries ``chain`` to a child."""
    return json.dumps(list(chain))


def format_chain(chain: Sequence[str]) -> str:
    return " -> ".join(chain)
