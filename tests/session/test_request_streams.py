"""A request's response stream on the Streamable HTTP front: when its client cancels the
request it gets no answer and the id is free at once (the stream ends if it carried nothing
yet, else stays open and idle), and a resumption (GET with Last-Event-ID)
takes it over from a connection still writing it (one writer; every later event once).

Real sockets on 127.0.0.1, the in-memory fake server ``a`` behind the hub. Every wait is
bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import json

import trio

from tests.rawhttp import ResponseReader, read_response_async, request_bytes
from tests.session.fronts import EventStream, running_fronts


async def next_events(stream: EventStream, count: int) -> list[tuple[str, dict]]:
    """The next ``count`` events with data on a stream, as (event id, message)."""
    return [await stream.next_message() for _ in range(count)]


def call(id, name, arguments=None, meta=None):
    params = {"name": name, "arguments": arguments or {}}
    if meta:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}


async def wait_until(predicate, seconds: float = 5.0) -> None:
    with trio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110 - polling the proxy's own state in a test
            await trio.sleep(0.01)


def cancel(id: int) -> dict:
    return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": id, "reason": "no longer"}}


def cancels_seen(fronts) -> list:
    server = fronts.upstreams.latest("a")
    return [m for m in server.seen if m.get("method") == "notifications/cancelled"]


async def test_a_call_its_client_cancels_before_any_answer_ends_its_post_and_frees_its_id():
    async with running_fronts() as fronts:
        session_id = await fronts.initialize()
        with_session = fronts.headers(mcp_session_id=session_id)
        session = fronts.http.sessions.by_id[session_id]
        hang = await fronts.connect()
        await hang.send_all(request_bytes("POST", "/mcp", with_session, json.dumps(call(11, "a__hang")).encode()))
        with trio.fail_after(5):
            server = fronts.upstreams.latest("a")
            await wait_until(lambda: any(m.get("method") == "tools/call" for m in server.seen))
            response = await fronts.request("POST", headers=with_session, body=cancel(11))
            assert response.status == 202
            # The POST ends at once: an event stream with no event, no answer.
            answer = await read_response_async(hang, ResponseReader())
            assert answer.status == 200 and answer.headers["content-type"] == "text/event-stream", answer
            events = EventStream(hang, answer)
            await events.wait_closed()
            assert events.ended and b"data:" not in events.text
        assert 11 not in session.requests
        await wait_until(lambda: len(cancels_seen(fronts)) == 1)  # the server is told too
        # The id is free again.
        response = await fronts.request("POST", headers=with_session, body=call(11, "a__echo", {"again": 1}))
        assert response.status == 200, response
        assert json.loads(response.body)["id"] == 11 and "result" in json.loads(response.body)
        await hang.aclose()


async def test_a_streaming_call_its_client_cancels_keeps_its_stream_open_and_idle():
    """Its client holds a Last-Event-ID: an ended stream would make it resume (and fail), so
    the stream stays open with no answer; the id is free at once; a GET with that
    Last-Event-ID takes the stream over and stays idle; a closed one is forgotten."""
    async with running_fronts(stream_drop_grace=0.3) as fronts:
        session_id = await fronts.initialize()
        with_session = fronts.headers(mcp_session_id=session_id)
        session = fronts.http.sessions.by_id[session_id]
        get = await fronts.connect()
        sse = fronts.headers(mcp_session_id=session_id, accept="text/event-stream")
        assert (await fronts.send(get, "GET", headers=sse)).status == 200  # the session's GET stream
        progress = await fronts.connect()
        response = await fronts.send(
            progress, "POST", headers=with_session, body=call(12, "a__progress_forever", meta={"progressToken": "t"})
        )
        events = EventStream(progress, response)
        with trio.fail_after(10):
            [(last, message)] = await next_events(events, 1)
            assert message["method"] == "notifications/progress"
            stream_id = int(last.split("-")[0])
            response = await fronts.request("POST", headers=with_session, body=cancel(12))
            assert response.status == 202
            await wait_until(lambda: len(cancels_seen(fronts)) == 1)
            assert 12 not in session.requests
            with trio.move_on_after(0.5):  # what was on its way may come; then nothing, and no end
                while True:
                    data = await progress.receive_some(65536)
                    assert data, "the stream of a cancelled request closed"
                    events.raw += data
                    events._dechunk()
            assert not events.ended and b'"id":12' not in bytes(events.text)
            # The id is free again.
            response = await fronts.request("POST", headers=with_session, body=call(12, "a__echo", {"again": 1}))
            assert response.status == 200 and "result" in json.loads(response.body), response
            # A resumption takes the stream over (no 409) and stays idle; the POST's connection ends.
            resume = await fronts.connect()
            headers = fronts.headers(mcp_session_id=session_id, accept="text/event-stream", last_event_id=last)
            response = await fronts.send(resume, "GET", headers=headers)
            assert response.status == 200, response
            while await progress.receive_some(65536):
                pass
            resumed = EventStream(resume, response)
            with trio.move_on_after(0.5):
                assert await resume.receive_some(65536), "the resumed stream closed"
            assert not resumed.ended and stream_id in session.streams
            # Its client closes it: after the grace period it is forgotten.
            await resume.aclose()
            await wait_until(lambda: stream_id not in session.streams)
        assert await fronts.ping(session_id) == {"jsonrpc": "2.0", "id": 2, "result": {}}
        await progress.aclose()
        await get.aclose()


async def test_the_newest_resumption_of_a_request_stream_takes_it_over():
    async with running_fronts(stream_drop_grace=30.0) as fronts:
        session_id = await fronts.initialize()
        with_session = fronts.headers(mcp_session_id=session_id)
        session = fronts.http.sessions.by_id[session_id]
        post = await fronts.connect()
        response = await fronts.send(
            post, "POST", headers=with_session, body=call(13, "a__progress_forever", meta={"progressToken": "p"})
        )
        first = EventStream(post, response)
        with trio.fail_after(10):
            seen = await next_events(first, 2)
            # The client lost the POST's stream after its first event; the server has not noticed.
            resumed = []
            last = seen[0][0]
            for _ in range(2):  # the second resumption comes while the first is still open
                connection = await fronts.connect()
                headers = fronts.headers(mcp_session_id=session_id, accept="text/event-stream", last_event_id=last)
                response = await fronts.send(connection, "GET", headers=headers)
                assert response.status == 200, response
                stream = EventStream(connection, response)
                got = await next_events(stream, 2)
                resumed.append((connection, stream, last, got))
                last = got[-1][0]
            # The connections it took the stream from end.
            await first.wait_closed()
            assert await post.receive_some(1) == b""
            await resumed[0][1].wait_closed()
            assert await resumed[0][0].receive_some(1) == b""

            # The answer arrives on the newest, after every event following its Last-Event-ID, once.
            session.put_message({"jsonrpc": "2.0", "id": 13, "result": {"done": True}})
            connection, stream, last, got = resumed[1]
            while "id" not in got[-1][1]:
                got += await next_events(stream, 1)
            await stream.wait_closed()
        assert stream.ended
        numbers = [int(id.split("-")[1]) for id, _ in got]
        assert numbers == list(range(int(last.split("-")[1]) + 1, numbers[-1] + 1))
        assert got[-1][1] == {"jsonrpc": "2.0", "id": 13, "result": {"done": True}}
        # The first resumption's events were the ones that followed the POST's first event.
        first_numbers = [int(id.split("-")[1]) for id, _ in resumed[0][3]]
        assert first_numbers == [int(seen[0][0].split("-")[1]) + 1, int(seen[0][0].split("-")[1]) + 2]
        assert 13 not in session.requests
        await wait_until(lambda: not session.streams)
        assert await fronts.ping(session_id) == {"jsonrpc": "2.0", "id": 2, "result": {}}
        for connection, *_ in resumed:
            await connection.aclose()
        await post.aclose()


async def test_deleting_a_session_ends_its_idle_streams_and_a_resumption_of_one():
    """Ending a session ends every stream of it: a cancelled request's idle stream, and a
    GET with Last-Event-ID that took another one over, end when DELETE returns."""
    async with running_fronts() as fronts:
        session_id = await fronts.initialize()
        with_session = fronts.headers(mcp_session_id=session_id)
        idle: list[tuple[trio.abc.Stream, EventStream, str]] = []
        with trio.fail_after(10):
            for id in (21, 22):
                connection = await fronts.connect()
                response = await fronts.send(
                    connection,
                    "POST",
                    headers=with_session,
                    body=call(id, "a__progress_forever", meta={"progressToken": id}),
                )
                events = EventStream(connection, response)
                [(last, _)] = await next_events(events, 1)
                assert (await fronts.request("POST", headers=with_session, body=cancel(id))).status == 202
                idle.append((connection, events, last))
            # The second idle stream is taken over by a GET with its Last-Event-ID.
            resume = await fronts.connect()
            headers = fronts.headers(mcp_session_id=session_id, accept="text/event-stream", last_event_id=idle[1][2])
            resumed = EventStream(resume, await fronts.send(resume, "GET", headers=headers))
            await idle[1][1].wait_closed()
            with trio.move_on_after(0.3):
                await idle[0][1].wait_closed()
            assert not idle[0][1].ended  # still open and idle before DELETE
            assert (await fronts.request("DELETE", headers=with_session)).status == 200
        with trio.fail_after(3):
            await idle[0][1].wait_closed()
            await resumed.wait_closed()
        for connection, _, _ in idle:
            await connection.aclose()
        await resume.aclose()
