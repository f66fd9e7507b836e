"""The store's operations, one table of tests run against both stores: the embedded one and
a real redis-server (``tests/cluster/redis_server.py``)."""

from __future__ import annotations

import pytest
import trio

from aggregator.cluster.store import MemoryStore, RedisStore, Store, open_store


async def test_get_set_delete(store: Store):
    with trio.fail_after(10):
        assert await store.get("missing") is None
        await store.set("a", b"1", ttl=60)
        assert await store.get("a") == b"1"
        await store.delete("a")
        assert await store.get("a") is None
        assert store.stats.calls["get"] == 3 and store.stats.calls["set"] == 1


async def test_keys_expire(store: Store):
    with trio.fail_after(10):
        await store.set("short", b"x", ttl=0.05)
        await store.hset("hash", {"f": b"v"}, ttl=0.05)
        await store.append("stream", {"f": b"v"}, maxlen=10, ttl=0.05)
        assert await store.get("short") == b"x"
        await trio.sleep(0.2)
        assert await store.get("short") is None
        assert await store.hgetall("hash") == {}
        assert await store.read("stream") == []


async def test_a_key_without_expiry_is_refused(store: Store):
    with pytest.raises(ValueError, match="every key expires"):
        await store.set("forever", b"x", ttl=0)


async def test_incrby_keeps_the_first_expiry(store: Store):
    with trio.fail_after(10):
        assert await store.incrby("count", 2, ttl=0.3) == 2
        await trio.sleep(0.15)
        assert await store.incrby("count", 3, ttl=0.3) == 5  # the expiry is not pushed back
        await trio.sleep(0.25)
        assert await store.incrby("count", 1, ttl=0.3) == 1


async def test_hashes(store: Store):
    with trio.fail_after(10):
        await store.hset("h", {"level": b"debug", "profile": b"dev"}, ttl=60)
        await store.hset("h", {"level": b"info"}, ttl=60)
        assert await store.hget("h", "level") == b"info"
        assert await store.hget("h", "missing") is None
        assert await store.hgetall("h") == {"level": b"info", "profile": b"dev"}


async def test_count_into_adds_to_fields_and_reads_them_all_in_one_call(store: Store):
    with trio.fail_after(10):
        assert await store.count_into("none", {}, ttl=60) == {}
        assert await store.count_into("c", {"a": 2, "b": 0}, ttl=60) == {"a": 2}
        assert await store.count_into("c", {"b": 3, "a": 1}, ttl=60) == {"a": 3, "b": 3}
        assert await store.count_into("c", {}, ttl=0.1) == {"a": 3, "b": 3}  # the expiry renewed
        assert store.stats.calls["count_into"] == 4
        await trio.sleep(0.3)
        assert await store.count_into("c", {}, ttl=60) == {}


async def test_set_new_is_a_lock_that_expires(store: Store):
    with trio.fail_after(10):
        assert await store.set_new("lock", b"a", ttl=0.2) is True
        assert await store.set_new("lock", b"b", ttl=0.2) is False  # held: the other loses
        assert await store.get("lock") == b"a"
        await trio.sleep(0.3)
        assert await store.set_new("lock", b"b", ttl=60) is True  # expired: free again
        assert await store.get("lock") == b"b"


async def test_take_gets_a_value_once(store: Store):
    with trio.fail_after(10):
        await store.set("once", b"v", ttl=60)
        taken: list[bytes | None] = []

        async def take() -> None:
            taken.append(await store.take("once"))

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(take)
        assert sorted(taken, key=lambda value: value is None) == [b"v", None, None, None, None]
        assert await store.get("once") is None


async def test_hdel_removes_fields(store: Store):
    with trio.fail_after(10):
        await store.hset("h", {"a": b"1", "b": b"2"}, ttl=60)
        assert await store.hdel("h", ["a", "missing"]) == 1
        assert await store.hgetall("h") == {"b": b"2"}
        assert await store.hdel("h", ["b"]) == 1
        assert await store.hgetall("h") == {}
        assert await store.hdel("h", []) == 0


async def test_streams_append_and_read_after_an_id(store: Store):
    with trio.fail_after(10):
        ids = [await store.append("events", {"data": b"%d" % n}, maxlen=1000, ttl=60) for n in range(5)]
        assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
        entries = await store.read("events")
        assert [fields["data"] for _, fields in entries] == [b"0", b"1", b"2", b"3", b"4"]
        after = await store.read("events", ids[2], count=1)
        assert after == [(ids[3], {"data": b"3"})]
        assert await store.read("events", ids[4]) == []
        assert await store.read("nothing") == []


async def test_streams_are_bounded(store: Store):
    with trio.fail_after(10):
        for n in range(300):
            await store.append("bounded", {"n": b"%d" % n}, maxlen=10, ttl=60)
        kept = await store.read("bounded", count=1000)
        # MAXLEN ~ trims whole nodes: about the last 10, never everything.
        assert 10 <= len(kept) <= 200
        assert kept[-1][1]["n"] == b"299"


async def test_publish_reaches_the_subscriber(store: Store):
    with trio.fail_after(10):
        messages = await store.subscribe("replica-a")
        # Confirmed by the store once subscribe returns: published right after, it is heard.
        assert await store.publish("replica-a", b"hello") == 1
        assert await messages.receive() == b"hello"
        assert await store.publish("replica-b", b"nobody") == 0
        store.unsubscribe("replica-a")


async def test_a_subscription_is_confirmed_before_subscribe_returns(store: Store):
    """A replica that asks another for an answer subscribes to the answer's channel, then
    asks: each subscription is heard as soon as subscribe returns, however many at once."""
    with trio.fail_after(10):
        for n in range(20):
            replies = await store.subscribe(f"call:{n}")
            assert await store.publish(f"call:{n}", b"answer %d" % n) == 1, n
            assert await replies.receive() == b"answer %d" % n
            store.unsubscribe(f"call:{n}")
        store.unsubscribe("call:none")  # one never subscribed: nothing to do


async def test_keys_are_under_the_prefix(store: Store, request: pytest.FixtureRequest):
    with trio.fail_after(10):
        await store.set("k", b"v", ttl=60)
        if isinstance(store, RedisStore):
            assert await store.client.execute("GET", "test:k") == b"v"
        else:
            assert isinstance(store, MemoryStore)
            assert "test:k" in store._values


def test_open_store_picks_by_the_url():
    assert isinstance(open_store(None, prefix="p"), MemoryStore)
    redis = open_store("redis://:pw@127.0.0.1:1/3", prefix="p")
    assert isinstance(redis, RedisStore)
    assert redis.status().address == "redis://:***@127.0.0.1:1/3"
    assert "pw" not in repr(redis.address)
