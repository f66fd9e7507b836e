"""Benchmark: a round trip to the shared store, per GET and SET, against the embedded store.

    python -m tests.bench.store_bench

Starts a redis-server of its own on a free port of 127.0.0.1 (nothing saved), then times,
in microseconds per operation (median of 5 runs of 2,000 operations each, values of 100 bytes):

- ``memory``: the embedded store (``MemoryStore``): what a call costs with no store configured;
- ``redis, one at a time``: each call waits for its answer before the next is sent (a
  round trip per call: what one request's task pays);
- ``redis, pipelined``: 64 tasks calling at once on the one connection (the client writes
  each call as it comes and the replies come back in order: what many requests pay each).

The store is off the proxy's hot path (a call needs it only where a replica must find what
another one holds); the numbers say what such a call adds.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from aggregator.cluster.store import MemoryStore, RedisStore, Store
from aggregator.config.store_url import RedisAddress
from tests.cluster.redis_server import REDIS, redis_server

OPERATIONS = 2_000
RUNS = 5
CONCURRENCY = 64
VALUE = b"x" * 100


async def _one_at_a_time(call: Callable[[int], Awaitable[object]]) -> float:
    start = time.perf_counter()
    for n in range(OPERATIONS):
        await call(n)
    return (time.perf_counter() - start) / OPERATIONS * 1e6


async def _pipelined(call: Callable[[int], Awaitable[object]]) -> float:
    async def worker(first: int) -> None:
        for n in range(first, OPERATIONS, CONCURRENCY):
            await call(n)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for first in range(CONCURRENCY):
            nursery.start_soon(worker, first)
    return (time.perf_counter() - start) / OPERATIONS * 1e6


async def _measure(store: Store, way: Callable[[Callable[[int], Awaitable[object]]], Awaitable[float]]) -> list[str]:
    async def set_one(n: int) -> None:
        await store.set(f"k{n % 100}", VALUE, ttl=60)

    async def get_one(n: int) -> bytes | None:
        return await store.get(f"k{n % 100}")

    rows = []
    for name, call in (("SET", set_one), ("GET", get_one)):
        await way(call)  # warm up
        times = [await way(call) for _ in range(RUNS)]
        rows.append(f"{name} {statistics.median(times):8.1f} us")
    return rows


async def main() -> None:
    memory = MemoryStore(prefix="bench")
    print("memory:               ", "   ".join(await _measure(memory, _one_at_a_time)))
    if REDIS is None:
        print("redis-server is not installed (apt-get install redis-server): only the embedded store was measured")
        return
    with tempfile.TemporaryDirectory() as directory, redis_server(Path(directory)) as server:
        store = RedisStore(RedisAddress.parse(server.url), prefix="bench")
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            with trio.fail_after(10):
                await store.client.wait_connected()
            print("redis, one at a time: ", "   ".join(await _measure(store, _one_at_a_time)))
            print(f"redis, pipelined ({CONCURRENCY}):", "   ".join(await _measure(store, _pipelined)))
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
