"""The envelope of a message no parser can read: ``salvage_envelope`` finds the message's
own id and whether it is a request or an answer, so the refusal reaches the party that
waits for it (a client's request past 1,024 levels gets its id; a server's answer fails
the request it answers at once)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.core.events import ClientMessage, ServerMessage
from aggregator.jsonrpc import dumps
from aggregator.jsonrpc.codec import NOTIFICATION, REQUEST, RESPONSE, nameless_refusal, oversized
from aggregator.jsonrpc.codec import envelope as _envelope
from aggregator.jsonrpc.errors import PARSE_ERROR
from aggregator.jsonrpc.salvage import salvage_envelope
from tests.core.helpers import make_depth_limited_router, refused, still_serves, unpack

DEEP = '{"d":' * 1030 + "1" + "}" * 1030  # past orjson's 1024 levels and Python's stack
OPEN = "[" * 100_000  # never closed


def deep(text: str) -> str:
    return text.replace("@", DEEP)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # The id before or after the part no parser reads.
        (deep('{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"arguments":@}}'), (REQUEST, 7)),
        (deep('{"jsonrpc":"2.0","params":{"x":@},"id":9,"method":"ping"}'), (REQUEST, 9)),
        ('{"jsonrpc":"2.0","id":10,"method":"ping","params":' + OPEN, (REQUEST, 10)),
        (deep('{"jsonrpc":"2.0","id":3,"result":{"x":@}}'), (RESPONSE, 3)),
        ('{"jsonrpc":"2.0","id":3,"error":{"code":1,"message":"m","data":' + OPEN, (RESPONSE, 3)),
        (deep('{"result":{"x":@},"jsonrpc":"2.0","id":4}'), (RESPONSE, 4)),  # the TypeScript SDK's order
        (deep('{"jsonrpc":"2.0","method":"notifications/message","params":{"data":@}}'), (NOTIFICATION, None)),
        # An id inside a nested object is not the message's.
        (deep('{"jsonrpc":"2.0","method":"x","params":{"id":5,"a":@}}'), (NOTIFICATION, None)),
        (deep('{"jsonrpc":"2.0","result":{"id":5,"a":@},"x":1}'), (None, None)),
        ('{"jsonrpc":"2.0","params":[{"id":5},{"method":"m"}],"more":' + OPEN, (None, None)),
        # Strings: escaped quotes, brackets and keys inside them are text, not structure.
        ('{"jsonrpc":"2.0","method":"a\\"}]\\"","id":"x\\"y","params":' + OPEN, (REQUEST, 'x"y')),
        ('{"jsonrpc":"2.0","method":"m","params":{"s":"\\",\\"id\\":9,\\""},"q":' + OPEN, (None, None)),
        ('{"jsonrpc":"2.0","s":"\\\\","id":11,"result":' + OPEN, (RESPONSE, 11)),
        ('{"jsonrpc":"2.0","\\u0069d":12,"\\u006dethod":"m","params":' + OPEN, (REQUEST, 12)),
        # Cut short: inside a string nothing more is read; an id must be ended to be taken.
        ('{"jsonrpc":"2.0","method":"m","params":{"s":"abc\\"}, \\"id\\":3', (None, None)),
        ('{"jsonrpc":"2.0","method":"m","id":12', (REQUEST, None)),
        ('{"jsonrpc":"2.0","result":{},"id":12', (RESPONSE, None)),
        ('{"jsonrpc":"2.0","id":12,"x":' + OPEN, (None, 12)),  # an id, but a request or an answer?
        # Not an object at all.
        ("[" + OPEN, (None, None)),
        (b'\xff\xfe{"jsonrpc":"2.0","id":1,"result":{}}', (None, None)),
        (b'{"jsonrpc":"2.0","s":"\xff\xfe","id":1,"result":' + OPEN.encode(), (RESPONSE, 1)),  # bytes are not read
        ("", (None, None)),
        # Whitespace anywhere JSON allows it.
        ('\r\n { "jsonrpc" : "2.0" ,\t"id" : 13 , "method" : "m", "params" : ' + OPEN, (REQUEST, 13)),
    ],
)
def test_salvages_the_envelope(text, expected):
    assert salvage_envelope(text if type(text) is bytes else text.encode()) == expected


@pytest.mark.parametrize(
    ("id", "expected"),
    [
        ("0", 0),
        ("-5", -5),
        ("9" * 100, int("9" * 100)),
        ("-" + "9" * 100, -int("9" * 100)),
        ('""', ""),
        ('"\\u00e9\\u2028"', "\u00e9\u2028"),
        ('"\u00e9"', "\u00e9"),
        ('"a\\nb"', "a\nb"),
        # Not ids an answer can echo: read as present, not as an id.
        ("9" * 101, None),
        ("-0", None),
        ("1.5", None),
        ("1e3", None),
        ("true", None),
        ("null", None),
        ("{}", None),
        ('{"id":1}', None),
        ("[1]", None),
        ('"\\ud800"', None),
        ('"\\x"', None),
        ("01", None),
    ],
)
def test_ids_of_every_type(id, expected):
    raw = ('{"jsonrpc":"2.0","id":' + id + ',"result":' + OPEN).encode()
    assert salvage_envelope(raw) == (RESPONSE, expected)
    raw = ('{"jsonrpc":"2.0","method":"m","id":' + id + ',"params":' + OPEN).encode()
    assert salvage_envelope(raw) == (REQUEST, expected)


def test_the_scan_is_bounded():
    late = ('{"jsonrpc":"2.0","params":{"x":' + "[" * 70_000 + "]" * 70_000 + '},"id":1,"method":"m"}').encode()
    assert salvage_envelope(late) == (None, None)
    early = ('{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":"' + "y" * 100_000 + '"}').encode()
    assert salvage_envelope(early) == (REQUEST, 1)


ids = st.one_of(
    st.integers(-(10**100) + 1, 10**100 - 1),
    st.text(max_size=8),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.just({}),
    st.just([1]),
)
values = st.recursive(
    st.none() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["id", "method", "result", "error", "x", 'q"}']), inner, max_size=3)
    ),
    max_leaves=12,
)
envelopes = st.dictionaries(st.sampled_from(["jsonrpc", "params", "x", "result", "error"]), values, max_size=3).flatmap(
    lambda body: st.fixed_dictionaries({}, optional={"id": ids, "method": st.text(max_size=5)}).map(
        lambda head: {**body, **head}
    )
)


@settings(deadline=None)
@given(envelopes, st.booleans())
def test_agrees_with_the_parser_on_what_it_can_read(message, spaced):
    """On any message a parser can read, the scan finds what the parsed value says."""
    raw = json.dumps(message, indent=1).encode() if spaced else dumps(message)
    assert salvage_envelope(raw) == _envelope(message)


def test_a_client_request_past_every_parser_is_refused_with_its_id():
    error = refused(deep('{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"arguments":@}}').encode())
    assert (error.id, error.kind, error.answer, error.data["reason"]) == (7, REQUEST, True, "too_large")
    assert error.to_response()["id"] == 7
    error = refused(b'{"jsonrpc":"2.0","id":"s","method":"ping","params":' + OPEN.encode())
    assert (error.id, error.kind, error.data["reason"]) == ("s", REQUEST, "too_large")
    error = refused(b'{"jsonrpc":"2.0","id":8,"method":"ping","params":{"a":[1,}}')  # no parser reads it
    assert (error.code, error.id, error.kind) == (PARSE_ERROR, 8, REQUEST)


def test_a_server_answer_past_every_parser_names_the_request_it_answers():
    error = refused(deep('{"jsonrpc":"2.0","id":3,"result":{"structuredContent":@}}').encode())
    assert (error.kind, error.answer, error.response_to, error.data["reason"]) == (RESPONSE, False, 3, "too_large")
    error = refused(b'{"jsonrpc":"2.0","id":4,"result":{"x":"\xff",' + OPEN.encode())
    assert (error.kind, error.answer, error.response_to) == (RESPONSE, False, 4)


@pytest.mark.parametrize(
    "tail", [(DEEP + "}}").encode(), b"[" * 5000 + b"]" * 5000 + b"}}", OPEN.encode(), b'"\xff"}}']
)
def test_the_router_fails_the_request_at_once_and_the_server_stays(tail):
    router = make_depth_limited_router()
    [(_, _, sent)] = unpack(
        router.handle(
            ClientMessage(
                1,
                dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": "q",
                        "method": "tools/call",
                        "params": {"name": "a__echo", "arguments": {}},
                    }
                ),
            )
        )
    )
    raw = b'{"jsonrpc":"2.0","id":' + str(sent["id"]).encode() + b',"result":{"content":[],"structuredContent":' + tail
    [(kind, session, error)] = unpack(router.handle(ServerMessage("a", raw)))
    assert (kind, session, error["id"]) == ("ToClient", 1, "q")
    assert error["error"]["data"]["reason"] == ("malformed" if b"\xff" in tail else "too_large")
    assert error["error"]["data"]["server"] == "a" and router.links["a"].pending == {}
    still_serves(router)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        # Read, or refused naming whom it answers: the router deals with it.
        (b'{"jsonrpc":"2.0","id":1,"result":{}}', None),
        (b'{"jsonrpc":"2.0","id":1,"result":{"n":1e400000000000000000000}}', None),
        (b'{"jsonrpc":"2.0","id":1,"result":{"n":NaN}}', None),
        (deep('{"jsonrpc":"2.0","id":1,"result":@}').encode(), None),
        (deep('{"jsonrpc":"2.0","method":"notifications/message","params":@}').encode(), None),
        (deep('{"jsonrpc":"2.0","id":"s","method":"sampling/createMessage","params":@}').encode(), None),
        # Names no one: it answers the request whose POST it came back on.
        (b'\xff\xfe{"jsonrpc"', "malformed"),
        (b"[1,2,3]", "malformed"),
        (b'{"jsonrpc":"2.0","result":{}}', "malformed"),
        (b'{"jsonrpc":"2.0","id":null,"result":{"x":NaN}}', "malformed"),
        (b'{"jsonrpc":"2.0","result":{"x":' + b"[" * 40_000 + b"]" * 40_000 + b'},"id":1}', "too_large"),
    ],
)
def test_a_refusal_that_names_no_one(raw, reason):
    refusal = nameless_refusal(raw)
    named = None if refusal is None else (refusal.data or {}).get("reason", "malformed")
    assert named == reason


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b'{"jsonrpc":"2.0","id":"big","method":"tools/call","params":{"x":"aaa', (REQUEST, "big")),
        (b'{"jsonrpc":"2.0","id":"big","params":{"x":"aaa', (None, "big")),  # answered under its id
        (b'{"jsonrpc":"2.0","method":"notifications/message","params":{"x":"aaa', (NOTIFICATION, None)),
        (b'{"jsonrpc":"2.0","result":{"x":"aaa', (RESPONSE, None)),
        (b'{"jsonrpc":"2.0","params":{"x":"aaa', (None, None)),
    ],
)
def test_the_head_of_a_message_too_large_to_keep_is_taken_for_the_whole(head, expected):
    assert salvage_envelope(head, whole=False) == expected
    if expected[0] in (NOTIFICATION, RESPONSE) and expected[1] is None:
        assert salvage_envelope(head) == (None, None)  # a cut-short message proves nothing


HEAD = b'{"method":"tools/call","params":{"x":"aaaa'


@pytest.mark.parametrize(
    ("tail", "kind", "id", "answered"),
    [
        (b'aa"},"jsonrpc":"2.0","id":5}', REQUEST, 5, True),  # as the official SDKs write it
        (b'aa"},"jsonrpc":"2.0","id" : "a\\"b" }\r\n', REQUEST, 'a"b', True),
        (b'aa"},"id":"' + b"q" * 300 + b'"}', REQUEST, "q" * 300, True),
        (b'aa"},"id":5.5}', REQUEST, None, True),  # an id no answer can carry: id null
        (b'aa"},"id":' + b"9" * 150 + b"}", REQUEST, None, True),
        (b'aa","id":5}}', NOTIFICATION, None, False),  # params' own id: not the message's
        (b'aa"}}', NOTIFICATION, None, False),
    ],
)
def test_an_oversized_message_is_answered_by_the_id_it_ends_with(tail, kind, id, answered):
    error = oversized(HEAD, 10**7, 65536, tail)
    assert (error.kind, error.id, error.answer) == (kind, id, answered)
