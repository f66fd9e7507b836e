"""The rate limit counted by several replicas together (``aggregator.plugins.bundled.rate_limit``,
its ``shared`` hook): each decides alone, with no store round trip per request, and every
``sync_every`` seconds adds what it admitted to the store's counters and takes what the
others admitted from its own buckets. Two plugins stand for two replicas, on both stores."""

from __future__ import annotations

import logging

import pytest
import trio

from aggregator.cluster.store import MemoryStore, RedisStore, Store
from aggregator.config.store_url import RedisAddress
from aggregator.plugins import Deny, Request
from aggregator.plugins.bundled import rate_limit
from aggregator.plugins.bundled.rate_limit import RateLimit

WALL = 1_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def call(client: int = 1, principal: object = None, tool: str = "git__log", session: str | None = None) -> Request:
    return Request(client, "default", "tools/call", "git", "log", tool, {}, principal=principal, session=session)


def admitted(limit: RateLimit, request: Request) -> bool:
    try:
        limit.request(request)
    except Deny:
        return False
    return True


def replicas(clock: Clock, per: str = "profile", rate: float = 1.0, burst: int = 5) -> list[RateLimit]:
    made = [RateLimit(rate=rate, burst=burst, per=per, clock=clock) for _ in range(2)]
    for limit in made:
        limit.sharing = True  # as its shared hook does while it runs
    return made


async def sync(store: Store, *limits: RateLimit, wall: float = WALL) -> None:
    for limit in limits:
        await limit.sync(store, wall)


async def test_what_one_replica_admitted_is_taken_from_the_others_bucket(store: Store):
    clock = Clock()
    a, b = replicas(clock)
    with trio.fail_after(10):
        await sync(store, a, b)  # both started: the counters as they are
        assert all(admitted(a, call()) for _ in range(5))
        await sync(store, a, b)
        # B heard of A's five: its bucket for the profile is empty too, and refills at the rate.
        assert not admitted(b, call())
        clock.now += 1.0
        assert admitted(b, call()) and not admitted(b, call())
        await sync(store, b, a)
        assert not admitted(a, call())  # and A heard of B's one


async def test_together_they_admit_about_the_rate_within_the_documented_bound(store: Store):
    clock = Clock()
    a, b = replicas(clock, rate=2.0, burst=4)
    interval, seconds = 0.25, 10.0
    total = 0
    with trio.fail_after(30):
        await sync(store, a, b)
        steps = int(seconds / 0.05)
        for step in range(steps):  # a request to each every 50 ms: 40 a second offered
            total += admitted(a, call(1)) + admitted(b, call(2))
            clock.now += 0.05
            if step % int(interval / 0.05) == 0:
                await sync(store, a, b)
    alone = 2 * (4 + 2.0 * seconds)  # what two replicas counting alone would admit
    bound = 4 + 2.0 * seconds + (4 + 2.0 * interval)  # burst + rate x time, and one replica's lag
    assert total <= bound < alone, (total, bound, alone)
    assert total >= 2.0 * seconds  # and the rate is served


@pytest.mark.parametrize("per", ["session", "session+tool", "principal"])
async def test_a_sealed_sessions_bucket_is_counted_together_by_its_name(store: Store, per: str):
    clock = Clock()
    a, b = replicas(clock, per=per, burst=2)
    with trio.fail_after(10):
        await sync(store, a, b)
        # One session, numbered 7 on A and 3 on B, named alike on both (its sealed id's digest).
        assert admitted(a, call(7, session="d1")) and admitted(a, call(7, session="d1"))
        await sync(store, a, b)
        assert not admitted(b, call(3, session="d1"))  # B heard of A's two
        assert admitted(b, call(3, session="d2"))  # another session is another bucket
        assert a.keys and all(len(name) == 24 and "d1" not in name for name in a.keys)  # digests in the store


async def test_a_sessions_own_bucket_is_counted_by_each_replica_for_itself(store: Store):
    clock = Clock()
    a, b = replicas(clock, per="session", burst=2)
    with trio.fail_after(10):
        await sync(store, a, b)
        assert admitted(a, call(7)) and admitted(a, call(7))
        await sync(store, a, b)
        assert admitted(b, call(7))  # session 7 here is not session 7 there
        assert a.unsynced == {} and b.unsynced == {} and a.names == {}


async def test_principals_are_counted_together_and_callers_without_a_token_apart(store: Store):
    clock = Clock()
    a, b = replicas(clock, per="principal", burst=1)
    with trio.fail_after(10):
        await sync(store, a, b)
        assert admitted(a, call(1, principal=3)) and admitted(a, call(1))
        await sync(store, a, b)
        assert not admitted(b, call(9, principal=3))
        assert admitted(b, call(1))  # a caller without a token: its session, on this replica


async def test_a_replica_that_starts_takes_the_counters_as_they_are(store: Store):
    clock = Clock()
    a, b = replicas(clock, per="profile+tool")
    with trio.fail_after(10):
        await sync(store, a)
        assert all(admitted(a, call()) for _ in range(5))
        await sync(store, a)
        await sync(store, b)  # B's first reading: what was counted before is history
        assert admitted(b, call())
        # A bucket B first hears of after that is charged all that was counted in it.
        assert admitted(a, call(tool="git__status"))
        await sync(store, a, b)
        assert [admitted(b, call(tool="git__status")) for _ in range(5)] == [True] * 4 + [False]


async def test_a_new_hour_starts_every_counter_again(store: Store):
    clock = Clock()
    a, b = replicas(clock)
    with trio.fail_after(10):
        await sync(store, a, b)
        admitted(a, call())
        await sync(store, a, b)
        admitted(a, call())
        await sync(store, a, b, wall=WALL + rate_limit.COUNTER_HOURS)
        tokens, _ = b.buckets[a.names["default"]]
        assert tokens == pytest.approx(3.0)  # 5, less A's two: the second one from the new hour's counter


async def test_while_the_store_is_down_each_counts_alone_and_says_so_once(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="aggregator.plugins.bundled.rate_limit")
    down = RedisStore(RedisAddress.parse("redis://127.0.0.1:9/0"), prefix="test", timeout=0.5)
    await nursery.start(down.run)
    clock = Clock()
    a, b = replicas(clock)
    memory = MemoryStore(prefix="test")
    with trio.fail_after(10):
        await sync(memory, a, b)
        admitted(a, call())
        for _ in range(3):
            await sync(down, a)
        assert list(a.unsynced.values()) == [1]  # kept, to be told once the store is back
        await sync(memory, a, b)
        assert a.unsynced == {} and b.buckets[a.names["default"]][0] == pytest.approx(4.0)
    lines = [r.getMessage() for r in caplog.records if r.name == "aggregator.plugins.bundled.rate_limit"]
    assert len(lines) == 2 and "counts alone" in lines[0] and "again" in lines[1]
    nursery.cancel_scope.cancel()


async def test_the_shared_hook_syncs_every_interval_until_cancelled(autojump_clock):
    store = MemoryStore(prefix="test")
    a = RateLimit(rate=1.0, burst=5, per="profile", sync_every=0.5)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a.shared, store)
        await trio.sleep(0.1)
        assert a.sharing and admitted(a, call())
        await trio.sleep(1.0)
        assert a.unsynced == {} and store.stats.calls["count_into"] == 2
        nursery.cancel_scope.cancel()
    assert not a.sharing


def test_sync_every_is_checked():
    with pytest.raises(ValueError):
        RateLimit(rate=1, sync_every=0)
