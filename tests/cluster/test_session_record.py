"""A legacy session's record, events and lease in the store (``cluster.session_record``),
on both stores: the embedded one and a real redis-server."""

from __future__ import annotations

import orjson
import trio

from aggregator.cluster.session_record import SessionRecord, SessionRecords, channel, digest, later
from aggregator.cluster.store import Store

SESSION = "ag1.k1.some-sealed-session-id"


async def test_the_record_holds_the_level_and_subscriptions_and_announces_each_change(store: Store):
    records = SessionRecords(store, lifetime=60)
    notes = await store.subscribe(channel(SESSION))
    with trio.fail_after(10):
        await trio.sleep(0.1)  # (Redis: the subscription is made)
        assert await records.read(SESSION) == SessionRecord()
        await records.set_level(SESSION, "warning")
        await records.subscribed(SESSION, "a+file:///x")
        await records.subscribed(SESSION, "a+file:///y")
        await records.unsubscribed(SESSION, "a+file:///x")
        await records.unsubscribed(SESSION, "a+file:///never")  # nothing changed: no note
        await records.mark_seen(SESSION, "17-2")
        record = await records.read(SESSION)
        assert record == SessionRecord(level="warning", subscriptions=frozenset({"a+file:///y"}), seen="17-2")
        heard = [await notes.receive() for _ in range(4)]
        assert heard == [b'{"state":1}'] * 4
        with trio.move_on_after(0.2):
            assert await notes.receive() is None  # nothing more
    store.unsubscribe(channel(SESSION))


async def test_events_append_in_order_and_read_after_a_position(store: Store):
    records = SessionRecords(store, lifetime=60, max_events=5)
    notes = await store.subscribe(channel(SESSION))
    with trio.fail_after(10):
        await trio.sleep(0.1)
        ids = [await records.append(SESSION, b'{"n":%d}' % n) for n in range(8)]
        assert all(later(b, a) for a, b in zip(ids, ids[1:], strict=False))
        heard = [orjson.loads(await notes.receive())["event"] for _ in range(8)]
        assert heard == ids
        after = await records.events(SESSION, ids[5])
        assert [fields["m"] for _, fields in after] == [b'{"n":6}', b'{"n":7}']
        assert await records.events(SESSION, ids[-1]) == []
        assert len(await records.events(SESSION, "0", count=2)) == 2
        # Bounded: about the last five are kept (Redis trims whole nodes of 100, hence "about").
        for _ in range(250):
            await records.append(SESSION, b"{}")
        kept = await records.events(SESSION, "0", count=1000)
        assert 5 <= len(kept) <= 150
    store.unsubscribe(channel(SESSION))


async def test_a_batch_of_events_of_several_sessions_is_written_at_once_with_one_note_each(store: Store):
    records = SessionRecords(store, lifetime=60)
    other = SESSION + "-other"
    notes = await store.subscribe(channel(SESSION))
    with trio.fail_after(10):
        await trio.sleep(0.1)
        batch = [(SESSION, b'{"n":1}'), (other, b'{"n":2}'), (SESSION, b'{"n":3}')]
        ids = await records.append_many(batch)
        assert len(ids) == 3 and later(ids[2], ids[0])
        assert orjson.loads(await notes.receive()) == {"event": ids[2]}  # one note, naming its last
        with trio.move_on_after(0.2):
            assert await notes.receive() is None
        assert [fields["m"] for _, fields in await records.events(SESSION, "0")] == [b'{"n":1}', b'{"n":3}']
        assert [(entry, fields["m"]) for entry, fields in await records.events(other, "0")] == [(ids[1], b'{"n":2}')]
        assert await records.append_many([]) == []
    store.unsubscribe(channel(SESSION))


async def test_a_lease_is_held_by_one_replica_renewed_and_taken_over_when_it_lapses(store: Store):
    records = SessionRecords(store, lifetime=60)
    with trio.fail_after(10):
        assert await records.hold_lease(SESSION, "a", 0.3) == (True, True)  # taken
        assert await records.hold_lease(SESSION, "b", 0.3) == (False, False)  # held by a
        await trio.sleep(0.2)
        assert await records.hold_lease(SESSION, "a", 0.3) == (True, False)  # renewed
        await trio.sleep(0.2)
        assert await records.hold_lease(SESSION, "b", 0.3) == (False, False)  # still a's
        await trio.sleep(0.4)  # a stopped renewing
        assert await records.hold_lease(SESSION, "b", 0.3) == (True, True)


async def test_forget_removes_the_record_events_and_lease(store: Store):
    records = SessionRecords(store, lifetime=60)
    with trio.fail_after(10):
        await records.set_level(SESSION, "debug")
        await records.append(SESSION, b"{}")
        await records.hold_lease(SESSION, "a")
        await records.forget(SESSION)
        assert await records.read(SESSION) == SessionRecord()
        assert await records.events(SESSION, "0") == []
        assert await records.hold_lease(SESSION, "b") == (True, True)


async def test_everything_expires_with_the_session_lifetime(store: Store):
    records = SessionRecords(store, lifetime=0.1)
    with trio.fail_after(10):
        await records.set_level(SESSION, "debug")
        await records.append(SESSION, b"{}")
        await trio.sleep(0.3)
        assert await records.read(SESSION) == SessionRecord()
        assert await records.events(SESSION, "0") == []


def test_keys_name_a_digest_of_the_session_id_never_the_id():
    assert SESSION not in channel(SESSION) and digest(SESSION) in channel(SESSION)
    assert digest(SESSION) != digest(SESSION + "x") and len(digest(SESSION)) == 32
    assert later("2-0", "1-9") and later("1-10", "1-9") and not later("1-1", "1-1")
