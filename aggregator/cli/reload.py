"""``aggregator reload``: tell a running proxy to read its config file again.

With ``--pid-file PATH`` (the file ``serve --pid-file PATH`` writes) it sends the proxy
SIGHUP; the proxy's log says what changed. With ``--admin URL`` it posts to the admin
listener's ``/reload`` (with ``$AGGREGATOR_ADMIN_TOKEN`` as its bearer token, if set)
and prints what the proxy answers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from aggregator.cli.terminal import admin_base, bearer, printable
from aggregator.errors import AggregatorError
from aggregator.hub.reload import signal_reload

TOKEN_VARIABLE = "AGGREGATOR_ADMIN_TOKEN"
TIMEOUT = 60.0  # a reload waits for stopped servers to end: seconds, not minutes


def run_reload(args: argparse.Namespace) -> int:
    if args.admin:
        return _reload_by_admin(args.admin)
    if not args.pid_file:
        raise AggregatorError("say which proxy: --pid-file PATH (as given to serve) or --admin URL")
    pid = signal_reload(Path(args.pid_file))
    print(f"sent SIGHUP to the aggregator (pid {pid}); its log says what changed", file=sys.stderr)
    return 0


def _reload_by_admin(url: str) -> int:
    target = admin_base(url) + "/reload"
    request = urllib.request.Request(target, data=b"", method="POST")
    token = os.environ.get(TOKEN_VARIABLE)
    if token:  # from the environment, never the command line (which `ps` shows)
        request.add_header("Authorization", bearer(token, TOKEN_VARIABLE))
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:  # noqa: S310 - the scheme is checked
            body = response.read()
    except urllib.error.HTTPError as exc:
        # A refused config is answered 422 with the same JSON as an applied one: its errors.
        body = _error_body(exc)
        if _reload_answer(body) is None:
            raise AggregatorError(f"{target}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AggregatorError(f"{target}: {reason}") from None
    answer = _reload_answer(body)
    if answer is None:
        raise AggregatorError(f"{target}: not a reload answer: {body[:200]!r}")
    ok, errors, changes = answer
    for line in changes:
        print(printable(str(line)))
    for line in errors:
        print(f"error: {printable(str(line))}", file=sys.stderr)
    if not ok:
        print("the config was rejected; the running one stays", file=sys.stderr)
        return 1
    if not changes:
        print("nothing changed")
    return 0


def _error_body(error: urllib.error.HTTPError) -> bytes:
    """What an error answer says (empty when it cannot be read)."""
    try:
        return error.read(65536)
    except (OSError, ValueError):
        return b""


def _reload_answer(body: bytes) -> tuple[bool, list[Any], list[Any]] | None:
    """``(ok, errors, changes)`` of a POST /reload answer; None when ``body`` is not one."""
    try:
        answer: Any = json.loads(body)
        return bool(answer["ok"]), list(answer["errors"]), list(answer["changes"])
    except (ValueError, KeyError, TypeError):
        return None
