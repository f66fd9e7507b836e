"""Benchmark: what sharing a cut result's rest costs (``aggregator.cluster.kept``).

    python -m tests.bench.kept_bench

Starts a redis-server of its own on a free port of 127.0.0.1 (nothing saved), then times,
in microseconds (median of 5 runs of 200 each, one at a time), for rests of 8 KiB, 64 KiB
and 1 MiB of text:

- ``seal``: sealing a rest (AES-256-GCM), in the task that writes it: the answer does not
  wait for it;
- ``write``: sealing and the one ``SET`` made when a result is cut (in a task of its own;
  the answer to the call leaves meanwhile);
- ``remote read``: the one ``GET`` and opening it, what a ``resources/read`` answered by
  another replica waits for once (its other pages are then served from that replica's
  memory).

A call whose result is not cut asks nothing of the store and is not measured: it pays one
``is None`` check. The core's own part (cutting, paging) is the same with or without a store.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from aggregator.cluster.kept import SharedKept
from aggregator.cluster.keys import KEPT, KeyRing
from aggregator.cluster.store import RedisStore
from aggregator.config.store_url import RedisAddress
from aggregator.core.commands import FetchKept, ShareKept
from tests.cluster.redis_server import REDIS, redis_server

COUNT = 200
RUNS = 5
SIZES = (8 * 1024, 64 * 1024, 1024 * 1024)


async def _timed(call: Callable[[int], Awaitable[object]]) -> float:
    runs = []
    for _ in range(RUNS + 1):  # the first warms up
        start = time.perf_counter()
        for n in range(COUNT):
            await call(n)
        runs.append((time.perf_counter() - start) / COUNT * 1e6)
    return statistics.median(runs[1:])


async def main() -> None:
    if REDIS is None:
        print("redis-server is not installed (apt-get install redis-server)")
        return
    keys = KeyRing(["b" * 40]).keys_for(KEPT)
    with tempfile.TemporaryDirectory() as directory, redis_server(Path(directory)) as server:
        store = RedisStore(RedisAddress.parse(server.url), prefix="bench")
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            await store.client.wait_connected()
            kept = SharedKept(store, keys)
            for size in SIZES:
                text = ("word " * (size // 5 + 1))[:size]

                def share(n: int, text: str = text) -> ShareKept:
                    return ShareKept(f"{n % 10:024d}", "session:bench", text, 2000, 60.0)

                async def seal(n: int) -> None:
                    kept.seal(share(n))
                    await trio.lowlevel.checkpoint()

                async def write(n: int) -> None:
                    command = share(n)
                    await store.set(kept.key(command.token), kept.seal(command), ttl=command.ttl)

                async def read(n: int) -> None:
                    fetch = FetchKept(1, 1, f"{n % 10:024d}", "session:bench", "aggregator://results/x", 1)
                    assert await kept.read(fetch) is not None

                times = [await _timed(seal), await _timed(write), await _timed(read)]
                print(
                    f"{size // 1024:5d} KiB:  seal {times[0]:8.1f} us   write {times[1]:8.1f} us"
                    f"   remote read {times[2]:8.1f} us"
                )
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
