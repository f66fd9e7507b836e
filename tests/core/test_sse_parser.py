"""The SSE parser's resumption state (event ids, ``retry``), and the rules a Streamable HTTP
upstream applies with it: how long to wait before resuming, and which message answers."""

import pytest

from aggregator.transports.sse import SseEvent, SseParser
from aggregator.upstreams.resumption import (
    RESUME_DELAY,
    RESUME_DELAY_CAP,
    RESUME_DELAY_FLOOR,
    answered_id,
    cancelled_request,
)
from aggregator.upstreams.resumption import (
    is_answer as _is_answer,
)
from aggregator.upstreams.resumption import (
    retry_delay as _retry_delay,
)

# What a 2025-11-25 server sends on a POST: a priming event (id, retry, empty data), a
# notification, then the answer; with CRLF and CR line ends mixed in.
STREAM = (
    b"id: s~1\r\nretry: 1500\ndata: \n\n"
    b': a comment\nid: s~2\ndata: {"jsonrpc":"2.0","method":"notifications/progress",\r'
    b'data: "params":{}}\n\n'
    b'event: message\nid: s~3\ndata: {"jsonrpc":"2.0","id":1,"result":{}}\n\n'
)
EVENTS = [
    SseEvent("message", "", "s~1"),
    SseEvent("message", '{"jsonrpc":"2.0","method":"notifications/progress",\n"params":{}}', "s~2"),
    SseEvent("message", '{"jsonrpc":"2.0","id":1,"result":{}}', "s~3"),
]


def test_every_byte_boundary_gives_the_same_events_ids_and_retry():
    for cut in range(len(STREAM) + 1):
        parser = SseParser()
        assert parser.feed(STREAM[:cut]) + parser.feed(STREAM[cut:]) == EVENTS, cut
        assert (parser.last_event_id, parser.retry) == ("s~3", 1500), cut


@pytest.mark.parametrize(
    ("stream", "last_event_id"),
    [
        # The id counts once its event is complete: an event cut off is asked for again.
        (b"id: a\ndata: x\n\nid: b\ndata: y\n", "a"),
        (b"id: a\ndata: x\n\nid: b\n", "a"),
        # A priming event (id, no or empty data) sets it without being a message.
        (b"id: p\n\n", "p"),
        (b"id: p\ndata:\n\n", "p"),
        # An event without an id keeps the last one; an empty id clears it.
        (b"id: a\ndata: x\n\ndata: y\n\n", "a"),
        (b"id: a\ndata: x\n\nid\ndata: y\n\n", None),
        (b"id: a\ndata: x\n\nid: \n\n", None),
        # An id with NUL is ignored.
        (b"id: a\ndata: x\n\nid: b\0c\ndata: y\n\n", "a"),
        (b"data: x\n\n", None),
    ],
)
def test_last_event_id(stream, last_event_id):
    parser = SseParser()
    parser.feed(stream)
    assert parser.last_event_id == last_event_id


@pytest.mark.parametrize(
    ("line", "retry"),
    [
        (b"retry: 2500", 2500),
        (b"retry:0", 0),
        (b"retry: 1.5", None),
        (b"retry: -1", None),
        (b"retry: 10s", None),
        (b"retry: ", None),
        ("retry: \u00b2".encode(), None),  # a digit to str.isdigit, not to int()
        ("retry: \u0661\u0662".encode(), None),  # Arabic-Indic digits: not ASCII
        (b"retry: " + b"9" * 5000, 10**12),  # more digits than int() reads: capped, not an exception
    ],
)
def test_retry_is_ascii_digits_only(line, retry):
    parser = SseParser()
    assert parser.feed(line + b"\n\n") == []
    assert parser.retry == retry


def test_a_later_retry_replaces_an_earlier_one_and_a_bad_one_keeps_it():
    parser = SseParser()
    parser.feed(b"retry: 100\n\nretry: 200\n\nretry: x\n\n")
    assert parser.retry == 200


def test_restart_forgets_the_partial_event_and_keeps_id_and_retry():
    parser = SseParser()
    assert parser.feed(b"retry: 700\nid: a\ndata: whole\n\nid: b\ndata: half") == [SseEvent("message", "whole", "a")]
    parser.restart()
    assert (parser.last_event_id, parser.retry) == ("a", 700)
    assert parser.feed(b"data: next\n\n") == [SseEvent("message", "next", None)]
    assert parser.last_event_id == "a"


def test_an_oversized_event_is_dropped_whole_and_its_id_still_counts():
    parser = SseParser(max_event=10)
    events = parser.feed(b"id: big\ndata: 0123456789abc\ndata: tail\n\nid: next\ndata: ok\n\n")
    assert events == [SseEvent("message", "ok", "next")]  # nothing of the big one, not even its tail
    assert parser.dropped == 1
    parser = SseParser(max_event=10)
    assert parser.feed(b"id: big\ndata: 0123456789abc\ndata: tail\n\n") == []
    assert (parser.last_event_id, parser.dropped) == ("big", 1)  # resuming does not ask for it again


@pytest.mark.parametrize("rest", [b"x\ndata: same event\n\n", b"\n\n", b"xx\r\n\r\n"])
def test_an_oversized_line_is_skipped_to_its_end(rest):
    parser = SseParser(max_event=10)
    assert parser.feed(b"id: big\ndata: " + b"x" * 20) == []
    # The rest of that line, and of its event, is no event of its own.
    assert parser.feed(rest + b"data: after\n\n") == [SseEvent("message", "after", None)]
    assert (parser.dropped, parser.last_event_id) == (1, "big")


@pytest.mark.parametrize(
    ("retry_ms", "seconds"),
    [
        (None, RESUME_DELAY),
        (1500, 1.5),
        (0, RESUME_DELAY_FLOOR),
        (10**12, RESUME_DELAY_CAP),
    ],
)
def test_retry_delay(retry_ms, seconds):
    assert _retry_delay(retry_ms) == seconds


@pytest.mark.parametrize(
    ("data", "answers"),
    [
        ('{"jsonrpc":"2.0","id":7,"result":{}}', True),
        ('{"jsonrpc":"2.0","id":7,"error":{"code":-1,"message":"no"}}', True),
        # Text that mentions a method is still an answer: a quote in a string is escaped.
        ('{"jsonrpc":"2.0","id":7,"result":{"text":"the \\"method\\" field"}}', True),
        # A member named "method" inside the result: parsed, still an answer.
        ('{"jsonrpc":"2.0","id":7,"result":{"method":"x"}}', True),
        ('{"jsonrpc":"2.0","method":"notifications/progress","params":{}}', False),
        ('{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":{}}', False),
        # Unreadable: taken as the request's (refused) answer when delivered.
        ('{"method": not json', True),
        ("[1,2]", True),
    ],
)
def test_is_answer(data, answers):
    assert _is_answer(data) is answers


@pytest.mark.parametrize(
    ("line", "cancelled"),
    [
        (b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}', 7),
        (b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"a"}}', "a"),
        (b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":[7]}', None),
        (b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"requestId":7}}', None),
        (b'{"jsonrpc":"2.0","method":"notifications/cancelled"', None),
    ],
)
def test_which_request_a_cancel_stops(line, cancelled):
    assert cancelled_request(line) == cancelled


@pytest.mark.parametrize(
    ("data", "id"),
    [
        ('{"jsonrpc":"2.0","id":3,"result":{}}', 3),
        ('{"jsonrpc":"2.0","id":"x","error":{}}', "x"),
        ("[1]", None),
        ("{", None),
    ],
)
def test_which_request_an_answer_on_the_get_stream_belongs_to(data, id):
    assert answered_id(data) == id
