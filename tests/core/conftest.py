"""Fixtures of the core's tests: ``clock`` (a fresh hand-moved clock) and ``router`` (servers
``a`` and ``b``, clients 1 and 2 connected; see ``tests.core.helpers.make_router``). A module
that needs another router defines its own ``router`` fixture, which takes precedence."""

from __future__ import annotations

import pytest

from aggregator.core.router import Router
from tests.core.helpers import Clock, connect, make_router


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def router(clock: Clock) -> Router:
    r = make_router(clock)
    connect(r, 1)
    connect(r, 2)
    return r
