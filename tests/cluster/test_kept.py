"""The rests of cut results in the shared store (``aggregator.cluster.kept``): sealed, bound to
their owner and their token, expiring, bounded; a store that is down is a missing rest and
one log line per outage. Run against both stores."""

from __future__ import annotations

import logging

import pytest
import trio

from aggregator.cluster import kept as kept_module
from aggregator.cluster.kept import SharedKept
from aggregator.cluster.keys import KEPT, KeyRing
from aggregator.cluster.store import MemoryStore, RedisStore, Store
from aggregator.config.store_url import RedisAddress
from aggregator.core.commands import FetchKept, ShareKept, ToClient

SECRET = "k" * 40
TOKEN = "T" * 24


def shared(store: Store, *secrets: str, clock=None) -> SharedKept:
    keys = KeyRing(secrets or (SECRET,)).keys_for(KEPT)
    return SharedKept(store, keys) if clock is None else SharedKept(store, keys, clock)


def share(text: str = "the rest \ud800 \u00e9", owner: str = "session:abc", token: str = TOKEN) -> ShareKept:
    return ShareKept(token, owner, text, 2000, 60.0, ToClient(1, {}))


def fetch(owner: str = "session:abc", token: str = TOKEN) -> FetchKept:
    return FetchKept(1, "r", token, owner, "aggregator://results/" + token, 1)


async def write(kept: SharedKept, command: ShareKept) -> None:
    """Write ``command``'s rest; its answer is let go once, after the write."""
    sent = []
    async with trio.open_nursery() as nursery:
        kept.start_write(nursery, command, lambda: sent.append(kept.writing))
        assert sent == []
    assert sent == [0]


async def test_a_rest_written_by_one_replica_is_read_by_another(store: Store):
    with trio.fail_after(10):
        await write(shared(store), share())
        found = await shared(store).read(fetch())  # another replica: the same keys
        assert found is not None
        text, page_bytes, left = found
        assert text == "the rest \ud800 \u00e9" and page_bytes == 2000 and 59 < left <= 60
        assert store.stats.calls == {"set": 1, "get": 1}  # one write when cut, one read on a miss


async def test_it_is_sealed_and_bound_to_its_owner_its_token_and_its_keys(store: Store):
    with trio.fail_after(10):
        await write(shared(store), share("a secret result"))
        raw = await store.get("kept:" + TOKEN)
        assert raw is not None and b"secret" not in raw and b"session:abc" not in raw
        assert await shared(store).read(fetch(owner="session:other")) is None
        assert await shared(store, "x" * 40).read(fetch()) is None  # other keys: as missing
        assert await shared(store, "x" * 40, SECRET).read(fetch()) is not None  # rotation: the old key opens
        await store.set("kept:" + "U" * 24, raw, ttl=60)  # moved under another token
        assert await shared(store).read(fetch(token="U" * 24)) is None
        await store.set("kept:" + TOKEN, raw[:-1] + bytes([raw[-1] ^ 1]), ttl=60)  # tampered
        assert await shared(store).read(fetch()) is None
        assert await shared(store).read(fetch(token="V" * 24)) is None  # never written


async def test_it_expires_when_its_replica_lets_it_go(store: Store):
    with trio.fail_after(10):
        await write(shared(store), ShareKept(TOKEN, "anonymous", "text", 100, 0.1, ToClient(1, {})))
        assert await shared(store).read(fetch(owner="anonymous")) is not None
        await trio.sleep(0.3)
        assert await store.get("kept:" + TOKEN) is None
        # What a store still holds past the time it carries is not served either.
        now = [1000.0]
        await write(shared(store, clock=lambda: now[0]), share())
        now[0] += 61
        assert await shared(store, clock=lambda: now[0]).read(fetch()) is None


async def test_writes_in_flight_are_bounded(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    monkeypatch.setattr(kept_module, "MAX_WRITES", 2)
    store = MemoryStore(prefix="test")
    kept = shared(store)
    sent: list[int] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for n in range(5):
                kept.start_write(nursery, share(token=f"{n}" * 24), lambda n=n: sent.append(n))
            assert kept.writing == 2 and kept.skipped == 3
            assert sent == [2, 3, 4]  # not written: answered at once
    assert kept.writing == 0 and store.stats.calls["set"] == 2 and sorted(sent) == [0, 1, 2, 3, 4]
    assert sum("not written" in r.getMessage() for r in caplog.records) == 1


async def test_a_store_that_is_down_is_a_missing_rest_and_one_line_per_outage(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="aggregator.cluster.kept")
    store = RedisStore(RedisAddress.parse("redis://127.0.0.1:9/0"), prefix="test", timeout=0.5)
    await nursery.start(store.run)
    kept = shared(store)
    with trio.fail_after(10):
        for _ in range(3):
            await write(kept, share())
            assert await kept.read(fetch()) is None
    lines = [r.getMessage() for r in caplog.records if r.name == "aggregator.cluster.kept"]
    assert len(lines) == 1 and "cannot be used now" in lines[0]
    assert "session:abc" not in caplog.text and TOKEN not in caplog.text
    memory = MemoryStore(prefix="test")
    kept.store = memory  # back: the end of the outage is said once
    with trio.fail_after(10):
        await write(kept, share())
        assert await kept.read(fetch()) is not None
    lines = [r.getMessage() for r in caplog.records if r.name == "aggregator.cluster.kept"]
    assert len(lines) == 2 and "used again" in lines[1]
    nursery.cancel_scope.cancel()


class Stuck(MemoryStore):
    async def get(self, key: str) -> bytes | None:
        await trio.sleep_forever()
        raise AssertionError

    async def set(self, key: str, value: bytes, *, ttl: float) -> None:
        await trio.sleep_forever()


async def test_an_answer_waits_for_its_write_no_longer_than_its_deadline(
    monkeypatch: pytest.MonkeyPatch, autojump_clock
):
    monkeypatch.setattr(kept_module, "WRITE_SECONDS", 2.0)
    kept = shared(Stuck(prefix="test"))
    started = trio.current_time()
    await write(kept, share())
    assert trio.current_time() - started == pytest.approx(2.0) and kept.down


async def test_a_read_waits_no_longer_than_its_deadline(monkeypatch: pytest.MonkeyPatch, autojump_clock):

    monkeypatch.setattr(kept_module, "READ_SECONDS", 2.0)
    kept = shared(Stuck(prefix="test"))
    started = trio.current_time()
    assert await kept.read(fetch()) is None
    assert trio.current_time() - started == pytest.approx(2.0) and kept.down and kept.reading == 0
