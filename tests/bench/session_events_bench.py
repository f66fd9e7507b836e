"""Benchmark: what a legacy session's GET stream costs through the shared store.

    python -m tests.bench.session_events_bench

Starts a redis-server of its own on a free port of 127.0.0.1 (nothing saved), then times
(median of 5 runs of 1,000 messages each, messages of 200 bytes, a
``notifications/resources/updated``'s size):

- ``write``: one message appended to the session's events (``SessionRecords.append``: XADD
  with MAXLEN and the key's expiry, then a PUBLISH of the note), one at a time: what the
  writer task pays per message;
- ``batch``: the same messages written as the writer task writes a backlog, ``BATCH`` at
  once (``SessionRecords.append_many``: one pipeline of XADD, one of PUBLISH), per message;
- ``read``: a GET stream's read of what follows its position (XREAD of one new entry), as
  it does once the session's channel wakes it;

on the embedded store, then on Redis. A call never waits for either: the router hands the
message to the writer task and goes on.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import trio

from aggregator.cluster.session_record import SessionRecords
from aggregator.cluster.store import MemoryStore, RedisStore, Store
from aggregator.config.store_url import RedisAddress
from aggregator.fronts.http.shared_sessions import BATCH
from tests.cluster.redis_server import REDIS, redis_server

MESSAGES = 1_000
RUNS = 5
MESSAGE = b'{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"' + b"x" * 120 + b'"}}'
SESSION = "ag1.bench.session"


async def _write(records: SessionRecords) -> float:
    start = time.perf_counter()
    for _ in range(MESSAGES):
        await records.append(SESSION, MESSAGE)
    return (time.perf_counter() - start) / MESSAGES * 1e6


async def _write_batched(records: SessionRecords) -> float:
    start = time.perf_counter()
    for _ in range(MESSAGES // BATCH + 1):
        await records.append_many([(SESSION, MESSAGE)] * BATCH)
    return (time.perf_counter() - start) / ((MESSAGES // BATCH + 1) * BATCH) * 1e6


async def _read(records: SessionRecords) -> float:
    """Append, then read what followed the previous entry (XREAD): the GET stream's read
    once the session's channel woke it (the note itself is one PUBLISH, timed in ``write``)."""
    position = await records.append(SESSION, MESSAGE)
    waits = []
    for _ in range(MESSAGES // 10):
        await records.append(SESSION, MESSAGE)
        start = time.perf_counter()
        entries = await records.events(SESSION, position)
        waits.append(time.perf_counter() - start)
        position = entries[-1][0]
    return statistics.median(waits) * 1e6


async def _measure(store: Store) -> str:
    records = SessionRecords(store, lifetime=60)
    await _write(records)  # warm up
    writes = [await _write(records) for _ in range(RUNS)]
    batched = [await _write_batched(records) for _ in range(RUNS)]
    reads = [await _read(records) for _ in range(RUNS)]
    return (
        f"write {statistics.median(writes):7.1f} us   batch {statistics.median(batched):7.1f} us"
        f"   read {statistics.median(reads):7.1f} us"
    )


async def main() -> None:
    async with trio.open_nursery() as nursery:
        memory = MemoryStore(prefix="bench")
        await nursery.start(memory.run)
        print("memory:", await _measure(memory))
        nursery.cancel_scope.cancel()
    if REDIS is None:
        print("redis-server is not installed (apt-get install redis-server): only the embedded store was measured")
        return
    with tempfile.TemporaryDirectory() as directory, redis_server(Path(directory)) as server:
        store = RedisStore(RedisAddress.parse(server.url), prefix="bench")
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            with trio.fail_after(10):
                await store.client.wait_connected()
            print("redis: ", await _measure(store))
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
