"""Call a tool many times through a balancer with the official Python SDK 2.x client:
``python cluster_load_client.py URL MODE COUNT CONCURRENCY SECONDS``.

MODE is ``2026-07-28`` (stateless) or ``legacy`` (one session per client). ``COUNT``
calls of ``a__pid`` (the fake server's pid: which replica's server answered),
``CONCURRENCY`` at a time (each worker with a client of its own), for at most
``SECONDS``. Prints ``{"done": N}`` after every 25 calls ended, then one last line: how
many succeeded, the errors by kind, the calls never made (time ran out), how many answers
each server pid gave, and how many times a client had to connect again. Every call is
bounded by its own timeout, so none can hang the run; every call ends counted as a
success or an error.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from typing import Any

import anyio
from mcp.client import Client

CALL_TIMEOUT = 15.0


def kind_of(error: BaseException) -> str:
    """A short name for what a failed call saw (the first of a group's)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    message = str(error).splitlines()[0][:80] if str(error) else ""
    return f"{type(error).__name__}: {message}"


async def main(url: str, mode: str, count: int, concurrency: int, seconds: float) -> dict[str, Any]:
    ok = 0
    errors: Counter[str] = Counter()
    pids: Counter[str] = Counter()
    started = 0
    ended = 0
    reconnects = 0
    deadline = time.monotonic() + seconds

    def end(error: BaseException | str | None, pid: str = "") -> None:
        nonlocal ok, ended
        if error is None:
            ok += 1
            pids[pid] += 1
        else:
            errors[error if isinstance(error, str) else kind_of(error)] += 1
        ended += 1
        if ended % 25 == 0:
            print(json.dumps({"done": ended}), flush=True)

    def more() -> bool:
        return started < count and time.monotonic() < deadline

    async def worker() -> None:
        """Calls one at a time on a client of its own. The SDK's Streamable HTTP client ends
        as a whole when one POST's connection closes without a response (as a balancer's
        does when the replica serving it dies): the call it had in flight is counted as
        failed, and the worker connects again, as an application would."""
        nonlocal started, reconnects
        while more():
            calling = False
            try:
                async with Client(url, mode=mode, cache=None) as client:  # type: ignore[arg-type]
                    while more():
                        started += 1
                        calling = True
                        try:
                            with anyio.fail_after(CALL_TIMEOUT):
                                result = await client.call_tool("a__pid", {})
                        except Exception as error:  # noqa: BLE001 - every failure is counted, by kind
                            calling = False
                            end(error)
                            continue
                        calling = False
                        said = str(getattr(result.content[0], "text", ""))
                        end("tool error: " + said[:80] if result.is_error else None, said)
            except Exception as error:  # noqa: BLE001 - the client ended: so did its call in flight
                if calling:
                    end(error)
                reconnects += 1

    async with anyio.create_task_group() as group:
        for _ in range(concurrency):
            group.start_soon(worker)
    return {"ok": ok, "errors": dict(errors), "not_made": count - started, "pids": dict(pids), "reconnects": reconnects}


if __name__ == "__main__":
    url, mode, count, concurrency, seconds = sys.argv[1:6]
    tally = anyio.run(main, url, mode, int(count), int(concurrency), float(seconds))
    print(json.dumps(tally), flush=True)
