from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
