"""A session's GET stream resumed with Last-Event-ID while its old connection still looks
open to the server: the new GET takes the stream over (200, the replay of what followed,
exactly once), the old connection ends; a GET without Last-Event-ID still gets 409.

Real sockets on 127.0.0.1; messages are put on the session's GET stream the way the hub
delivers them (``HttpSession.put_message``). Every wait is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import trio

from aggregator.transports.http_server import HttpConnection
from tests.session.fronts import EventStream, running_fronts


def note(n: int) -> dict:
    return {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": n}}


async def events(stream: EventStream, count: int) -> list[tuple[str, int]]:
    """The next ``count`` notes, as (event id, the number the note carries); the hub's own
    list changes are passed over."""
    found: list[tuple[str, int]] = []
    while len(found) < count:
        id, message = await stream.next_message()
        if message["method"] == "notifications/message":
            found.append((id, message["params"]["data"]))
    return found


async def open_get(fronts, session: str, **extra: str) -> tuple[trio.SocketStream, object]:
    connection = await fronts.connect()
    headers = fronts.headers(mcp_session_id=session, accept="text/event-stream", **extra)
    return connection, await fronts.send(connection, "GET", headers=headers)


async def test_a_get_with_last_event_id_takes_over_the_stream_its_client_lost():
    async with running_fronts() as fronts:
        session_id = await fronts.initialize()
        session = fronts.http.sessions.by_id[session_id]
        with trio.fail_after(10):
            first_connection, response = await open_get(fronts, session_id)
            first = EventStream(first_connection, response)
            for n in (1, 2, 3):
                session.put_message(note(n))
            seen = await events(first, 3)
            assert [n for _, n in seen] == [1, 2, 3]
            session.put_message(note(4))  # written to the old connection, never read there
            await trio.sleep(0.05)

            # The client lost the stream after the first event; the server has not noticed.
            second_connection, response = await open_get(fronts, session_id, last_event_id=seen[0][0])
            assert response.status == 200, response
            second = EventStream(second_connection, response)
            replayed = await events(second, 3)
            assert [n for _, n in replayed] == [2, 3, 4]
            assert [id for id, _ in replayed[:2]] == [id for id, _ in seen[1:]]

            await first.wait_closed()  # the old connection ends
            assert await first_connection.receive_some(1) == b""

            # Only one writer on the stream from now on: each new event comes once, here.
            session.put_message(note(5))
            session.put_message(note(6))
            following = await events(second, 2)
            assert [n for _, n in following] == [5, 6]
            with trio.move_on_after(0.3):
                extra = await events(second, 1)
                raise AssertionError(f"an event came twice: {extra}")

            # Without Last-Event-ID a second GET is still a conflict.
            third_connection, response = await open_get(fronts, session_id)
            assert response.status == 409, response
            await third_connection.aclose()
            await first_connection.aclose()
            await second_connection.aclose()


async def test_a_last_event_id_of_another_stream_does_not_take_over_the_get_stream():
    async with running_fronts() as fronts:
        session_id = await fronts.initialize()
        session = fronts.http.sessions.by_id[session_id]
        with trio.fail_after(10):
            first_connection, response = await open_get(fronts, session_id)
            first = EventStream(first_connection, response)
            session.put_message(note(1))
            ((event_id, _),) = await events(first, 1)
            stream = int(event_id.split("-")[0])
            other_connection, response = await open_get(fronts, session_id, last_event_id=f"{stream + 7}-1")
            assert response.status == 409, response
            await other_connection.aclose()
            session.put_message(note(2))
            assert [n for _, n in await events(first, 1)] == [2]  # the first stream goes on
            await first_connection.aclose()


async def test_a_take_over_while_the_old_connection_is_stuck_in_a_write_loses_and_repeats_nothing(monkeypatch):
    """The old connection stops taking bytes in the middle of an event (its client is gone):
    that event is in the stream's history, what came after it waits unwritten. The new GET
    gets the first by the replay and the rest after it, each once, in order, ids rising."""
    stuck = trio.Event()
    send_chunk = HttpConnection.send_chunk

    async def stalling(self, data):
        if b'"data":2}' in data and not stuck.is_set():
            stuck.set()
            await trio.sleep_forever()  # a client that stopped reading
        return await send_chunk(self, data)

    monkeypatch.setattr(HttpConnection, "send_chunk", stalling)
    async with running_fronts() as fronts:
        session_id = await fronts.initialize()
        session = fronts.http.sessions.by_id[session_id]
        with trio.fail_after(10):
            first_connection, response = await open_get(fronts, session_id)
            first = EventStream(first_connection, response)
            session.put_message(note(1))
            ((last_id, _),) = await events(first, 1)
            session.put_message(note(2))
            await stuck.wait()
            session.put_message(note(3))
            session.put_message(note(4))
            assert session.get_stream.waiting >= 2  # they wait behind the stuck write

            second_connection, response = await open_get(fronts, session_id, last_event_id=last_id)
            assert response.status == 200, response
            second = EventStream(second_connection, response)
            got = await events(second, 3)
            assert [n for _, n in got] == [2, 3, 4]
            numbers = [int(id.split("-")[1]) for id, _ in got]
            assert numbers == sorted(set(numbers)) and numbers[0] > int(last_id.split("-")[1])
            await first.wait_closed()
            session.put_message(note(5))
            assert [n for _, n in await events(second, 1)] == [5]
            with trio.move_on_after(0.3):
                extra = await events(second, 1)
                raise AssertionError(f"an event came twice: {extra}")
            await first_connection.aclose()
            await second_connection.aclose()
