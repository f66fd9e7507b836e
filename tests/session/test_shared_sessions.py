"""A legacy session's state and GET stream kept in the store (``fronts.http.shared_sessions``),
in one process on the embedded store: what another replica would write is written straight
to the store (``cluster.session_record``), and what this one writes is read back there."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import trio

from aggregator.cluster.session_record import SessionRecord, SessionRecords
from aggregator.errors import StoreError
from aggregator.fronts.http.sessions import HttpSession
from aggregator.fronts.http.shared_sessions import OUTGOING, OUTGOING_PER_SESSION, RETRY_SECONDS
from tests.session.fronts import EventStream, Fronts, running_fronts

KEYS = {"keys": ["k" * 32], "replica": "here"}
CHANGED = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}


def records(fronts: Fronts) -> SessionRecords:
    return SessionRecords(fronts.hub.store, lifetime=60)


def the_session(fronts: Fronts) -> HttpSession:
    [session] = fronts.http.sessions.by_id.values()
    return session


async def call(fronts: Fronts, session: str, id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": id, "method": method, "params": params}
    response = await fronts.request("POST", headers=fronts.headers(mcp_session_id=session), body=body)
    assert response.status == 200, response
    return json.loads(response.body)


async def open_get(fronts: Fronts, session: str, last_event_id: str | None = None) -> EventStream:
    headers = fronts.headers(mcp_session_id=session, accept="text/event-stream")
    if last_event_id is not None:
        headers["last-event-id"] = last_event_id
    stream = await fronts.connect()
    return EventStream(stream, await fronts.send(stream, "GET", headers=headers))


async def until(done: Callable[[], bool]) -> None:
    """Until ``done()`` (within 5 seconds): what another task changes, seen."""
    with trio.fail_after(5):
        while not done():  # noqa: ASYNC110 - nothing to wait on but the state itself
            await trio.sleep(0.01)


async def next_change(stream: EventStream) -> str:
    """The id of the next event carrying a message (the priming event carries none)."""
    with trio.fail_after(5):
        id, message = await stream.next_message()
    assert message == CHANGED, message
    return id


async def test_what_a_get_stream_carries_goes_through_the_store_and_replays_from_there():
    async with running_fronts(cluster=KEYS, share_sessions=True) as fronts:
        session_id = await fronts.initialize()
        session = the_session(fronts)
        session.put_message(CHANGED)  # while no GET stream is open: kept in the store
        stream = await open_get(fronts, session_id)
        first = await next_change(stream)
        assert first.startswith("@")  # its position in the store's stream
        session.put_message(CHANGED)
        second = await next_change(stream)
        stored = await records(fronts).events(session_id, "0")
        assert ["@" + entry for entry, _ in stored] == [first, second]
        await stream.stream.aclose()
        await until(lambda: session.get_stream is None)  # (this end notices the client left)
        # Resumed after the first event: the second again, then what comes next.
        resumed = await open_get(fronts, session_id, first)
        assert await next_change(resumed) == second
        session.put_message(CHANGED)
        third = await next_change(resumed)
        await resumed.stream.aclose()
        await until(lambda: session.get_stream is None)
        # A GET without Last-Event-ID starts after what a GET stream last wrote.
        session.put_message(CHANGED)
        fourth_stream = await open_get(fronts, session_id)
        fourth = await next_change(fourth_stream)
        assert fourth not in (first, second, third)
        await fourth_stream.stream.aclose()
        assert fronts.http.shared is not None and fronts.http.shared.written == 4


async def test_a_level_and_subscriptions_set_here_are_written_to_the_store():
    async with running_fronts(cluster=KEYS, share_sessions=True) as fronts:
        session_id = await fronts.initialize()
        assert (await call(fronts, session_id, 2, "logging/setLevel", {"level": "error"}))["result"] == {}
        record = await records(fronts).read(session_id)
        assert record.level == "error" and record.subscriptions == frozenset()
        # A level the router refuses is not written.
        refused = await call(fronts, session_id, 3, "logging/setLevel", {"level": "loud"})
        assert "error" in refused
        assert (await records(fronts).read(session_id)).level == "error"


async def test_a_level_set_on_another_replica_reaches_this_ones_router():
    async with running_fronts(cluster=KEYS, share_sessions=True) as fronts:
        session_id = await fronts.initialize()
        key = the_session(fronts).key
        assert fronts.hub.router.clients[key].log_level is None
        await records(fronts).set_level(session_id, "warning")  # as another replica does
        await until(lambda: fronts.hub.router.clients[key].log_level == "warning")


async def test_a_replica_adopting_a_session_takes_its_state_from_the_store():
    async with (
        running_fronts(cluster=KEYS, share_sessions=True) as a,
        running_fronts(cluster={**KEYS, "replica": "b"}, share_sessions=True) as b,
    ):
        session_id = await a.initialize()
        await records(b).set_level(session_id, "debug")  # (each has a store of its own here)
        assert (await b.ping(session_id))["result"] == {}
        key = the_session(b).key
        await until(lambda: b.hub.router.clients[key].log_level == "debug")


async def test_a_session_adopted_while_the_store_is_down_reads_its_state_once_it_is_back():
    async with (
        running_fronts(cluster=KEYS, share_sessions=True) as a,
        running_fronts(cluster={**KEYS, "replica": "b"}, share_sessions=True) as b,
    ):
        session_id = await a.initialize()
        await records(b).set_level(session_id, "debug")
        await records(b).subscribed(session_id, "a://r")
        shared = b.http.shared
        assert shared is not None
        read = shared.records.read

        async def down(session_id: str) -> SessionRecord:
            raise StoreError("the store is down")

        shared.records.read = down  # type: ignore[method-assign]
        assert (await b.ping(session_id))["result"] == {}
        key = the_session(b).key
        share = the_session(b).share
        assert share is not None and b.hub.router.clients[key].log_level is None and not share.subscribed
        shared.records.read = read  # type: ignore[method-assign]
        await trio.sleep(RETRY_SECONDS)
        assert (await b.ping(session_id))["result"] == {}  # its next use reads it
        await until(lambda: b.hub.router.clients[key].log_level == "debug")
        assert share.subscribed == {"a://r"} and share.leased and not share.unread


async def test_a_burst_of_one_session_leaves_room_for_the_events_of_others():
    async with running_fronts(cluster=KEYS, share_sessions=True) as fronts:
        hot_id = await fronts.initialize()
        quiet_id = await fronts.initialize()
        shared = fronts.http.shared
        assert shared is not None
        hot, quiet = (fronts.http.sessions.by_id[id] for id in (hot_id, quiet_id))
        for _ in range(OUTGOING + 10):  # faster than any writer: nothing written meanwhile
            shared.send(hot, json.dumps(CHANGED).encode())
        shared.send(quiet, json.dumps(CHANGED).encode())
        assert shared.dropped == OUTGOING + 10 - OUTGOING_PER_SESSION
        await until(lambda: shared.written == OUTGOING_PER_SESSION + 1)
        assert len(await records(fronts).events(quiet_id, "0")) == 1


async def test_a_last_event_id_not_sent_yet_is_a_bad_request_naming_the_real_form():
    async with running_fronts(cluster=KEYS, share_sessions=True) as fronts:
        session_id = await fronts.initialize()
        headers = fronts.headers(mcp_session_id=session_id, accept="text/event-stream")
        for last_event_id, said in (("@99999999999999-0", "not sent yet"), ("3.x", "like @1764900000000-0")):
            response = await fronts.request("GET", headers={**headers, "last-event-id": last_event_id})
            assert response.status == 400, response
            assert said in json.loads(response.body)["error"]["message"]
        the_session(fronts).put_message(CHANGED)
        stream = await open_get(fronts, session_id, "@0-0")  # (one in the past: replayed from there)
        await next_change(stream)
        await stream.stream.aclose()


async def test_without_a_shared_store_the_get_stream_is_this_replicas_own():
    async with running_fronts(cluster=KEYS) as fronts:
        assert fronts.http.shared is None
        session_id = await fronts.initialize()
        the_session(fronts).put_message(CHANGED)
        stream = await open_get(fronts, session_id)
        with trio.fail_after(5):
            id, message = await stream.next_message()
        assert message == CHANGED and not id.startswith("@")
        assert await records(fronts).events(session_id, "0") == []
        await stream.stream.aclose()
