from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio

from aggregator.cluster.store import MemoryStore, RedisStore, Store
from aggregator.config.store_url import RedisAddress
from tests.cluster.redis_server import REDIS, RedisServer, redis_server
from tests.required import missing


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own (skipped, saying why, where the binary is missing)."""
    if REDIS is None:
        missing("redis-server", "apt-get install redis-server")
    with redis_server(tmp_path) as server:
        yield server


@pytest.fixture
def redis_unix(tmp_path: Path) -> Iterator[RedisServer]:
    """The same, listening on a unix socket too (``socket``)."""
    if REDIS is None:
        missing("redis-server", "apt-get install redis-server")
    with redis_server(tmp_path, unix=True) as server:
        yield server


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, nursery: trio.Nursery) -> AsyncIterator[Store]:
    """Each store in turn: the embedded one, and a real redis-server of this test's own."""
    if request.param == "memory":
        made: Store = MemoryStore(prefix="test")
        await nursery.start(made.run)
    else:
        if REDIS is None:
            missing("redis-server", "apt-get install redis-server")
        server: RedisServer = request.getfixturevalue("redis")
        redis_store = RedisStore(RedisAddress.parse(server.url), prefix="test")
        await nursery.start(redis_store.run)
        with trio.fail_after(10):
            await redis_store.client.wait_connected()
        made = redis_store
    yield made
    nursery.cancel_scope.cancel()
