"""The JSON-RPC codec against what breaks naive JSON handling."""

import json
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.jsonrpc import (
    ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    NOTIFICATION,
    PARSE_ERROR,
    REQUEST,
    RESPONSE,
    JsonNumber,
    RemoteProtocolError,
    decode_message,
    dumps,
    loads,
)
from tests.core.helpers import AWKWARD_LITERALS, refused


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"ping"}', REQUEST),
        (b'{"jsonrpc":"2.0","id":"a","method":"ping","params":{}}', REQUEST),
        (b'{"jsonrpc":"2.0","method":"notifications/initialized"}', NOTIFICATION),
        (b'{"jsonrpc":"2.0","id":1,"result":{}}', RESPONSE),
        (b'{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"x"}}', ERROR),
        (b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}', ERROR),
    ],
)
def test_classifies_by_key_presence(raw, kind):
    assert decode_message(raw)[0] == kind


@pytest.mark.parametrize(
    ("raw", "code", "id"),
    [
        (b'{"jsonrpc":"2.0","method":', PARSE_ERROR, None),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1e400,}}', PARSE_ERROR, 1),  # id salvaged
        (b"\xff\xfe{}", PARSE_ERROR, None),
        (b'{"jsonrpc":"2.0","id":"a\xffb","method":"ping"}', PARSE_ERROR, None),  # not "a\ufffdb"
        (b'{"jsonrpc":"2.0","id":"a\xef\xbf\xbdb","method":"ping","x":"\xff"}', PARSE_ERROR, "a\ufffdb"),  # sent
        (b"42", INVALID_REQUEST, None),
        (b"null", INVALID_REQUEST, None),
        (b'"x"', INVALID_REQUEST, None),
        (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', INVALID_REQUEST, None),
        (b"[]", INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":1,"method":1}', INVALID_REQUEST, 1),
        (b'{"jsonrpc":"1.0","id":1,"method":"ping"}', INVALID_REQUEST, 1),
        (b'{"id":1,"method":"ping"}', INVALID_REQUEST, 1),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":"bar"}', INVALID_REQUEST, 1),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":[1]}', INVALID_PARAMS, 1),
        (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":{},"method":"ping"}', INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":[],"method":"ping"}', INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":null,"method":"ping"}', INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":1}', INVALID_REQUEST, 1),
        (b'{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":""}}', INVALID_REQUEST, 1),
        (b'{"jsonrpc":"2.0","id":1,"error":"bad"}', INVALID_REQUEST, None),
    ],
)
def test_refuses_with_the_right_code_and_id(raw, code, id):
    error = refused(raw)
    assert (error.code, error.id) == (code, id)
    response = error.to_response()
    assert response["id"] == id and response["error"]["code"] == code
    assert response["error"]["message"]


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":NaN}}', "NaN"),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":Infinity}}', "Infinity"),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":-Infinity}}', "Infinity"),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1e99999999999999999999}}', "1e99999999999999999999"),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":"\\ud800"}}', "surrogate"),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":"\\udc00 and 12345678901234567890"}}', "surrogate"),
        # orjson stops at the number it cannot hold; what comes after is still checked.
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1e400,"b":"\\ud800"}}', "surrogate"),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1e400,"b":NaN}}', "NaN"),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1e400,"b":"\xff"}}', "UTF-8"),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":"\xed\xa0\x80"}}', "UTF-8"),
    ],
)
def test_what_breaks_naive_json_is_a_parse_error_that_names_it_and_the_request(raw, named):
    error = refused(raw)
    assert (error.code, error.id, error.kind, error.answer) == (PARSE_ERROR, 1, REQUEST, True)
    assert named in error.message


def test_an_unreadable_notification_is_not_answered_and_a_response_names_its_request():
    notification = refused(b'{"jsonrpc":"2.0","method":"notifications/x","params":{"a":NaN}}')
    assert (notification.kind, notification.answer) == (NOTIFICATION, False)
    response = refused(b'{"jsonrpc":"2.0","id":7,"result":{"a":"\\ud800"}}')
    assert (response.kind, response.answer, response.response_to, response.to_response()["id"]) == (
        RESPONSE,
        False,
        7,
        None,
    )


def test_huge_integer_ids_are_refused_by_name():
    error = refused(b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"method":"ping"}')
    assert (error.code, error.id) == (INVALID_REQUEST, None)
    assert "5000 digits" in error.message
    error = refused(b'{"jsonrpc":"2.0","id":-0,"method":"ping"}')
    assert (error.code, error.id) == (INVALID_REQUEST, None) and "-0" in error.message


@pytest.mark.parametrize("id", [0, "", 2**63 + 1, -(2**63), 2**64 - 1, 10**30, -(10**30), "\u2028"])
def test_ids_are_echoed_exactly(id):
    raw = b'{"jsonrpc":"2.0","id":' + json.dumps(id).encode() + b',"method":"ping"}'
    kind, message = decode_message(raw)
    assert kind == REQUEST
    assert message["id"] == id
    assert type(message["id"]) is type(id)
    assert json.loads(dumps({"id": message["id"]}))["id"] == id


def test_numbers_are_forwarded_exactly():
    raw = (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":'
        b'{"big":123456789012345678901234567890,"neg":-98765432109876543210987,'
        b'"precise":0.1000000000000000055511151231257827,"exp":1.5E+300,"small":1,"f":2.5}}}'
    )
    _, message = decode_message(raw)
    out = dumps(message)
    assert b"123456789012345678901234567890" in out
    assert b"-98765432109876543210987" in out
    assert b"0.1000000000000000055511151231257827" in out
    again = json.loads(out)
    assert again["params"]["arguments"]["big"] == 123456789012345678901234567890
    assert again["params"]["arguments"]["f"] == 2.5


def test_exact_writer_escapes_strings_like_json():
    value = {"s": 'quote " backslash \\ nl \n tab \t \u2028 \u0000 é 😀', "n": 10**20, "l": [None, True, False]}
    out = dumps(value)
    assert json.loads(out) == value
    assert loads(out) == value


def test_line_separators_inside_strings_survive():
    raw = '{"jsonrpc":"2.0","id":1,"method":"x","params":{"t":"a\u2028b\u0085c\\rd"}}'.encode()
    _, message = decode_message(raw)
    assert message["params"]["t"] == "a\u2028b\u0085c\rd"
    assert decode_message(dumps(message))[1] == message


# --- numbers: every literal is forwarded as it was written -------------------------------


@pytest.mark.parametrize("literal", AWKWARD_LITERALS)
@pytest.mark.parametrize("spaced", [False, True], ids=["compact", "spaced"])
def test_number_literals_survive_both_directions(literal, spaced):
    request = (
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":'
        '{"x":@,"list":[@,"2.0",@],"v":"2.0"}}}'
    ).replace("@", literal)
    response = '{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"x":@},"content":[]}}'.replace("@", literal)
    for compact in (request, response):
        raw = compact.replace(",", ", ").replace(":", ": ").encode() if spaced else compact.encode()
        _, message = decode_message(raw)
        assert dumps(message) == compact.encode()
    _, message = decode_message(request.encode())
    value = message["params"]["arguments"]["x"]
    # Whatever type carries it, the value is the literal's exact value.
    assert type(value) in (int, float, JsonNumber)
    assert Decimal(literal) == (value if type(value) is JsonNumber else Decimal(repr(value)))


def test_json_numbers_are_exact_decimals_that_remember_their_text():
    _, message = decode_message(b'{"jsonrpc":"2.0","id":1,"result":{"a":1e2,"b":0.10000000000000001,"c":-0}}')
    a, b, c = (message["result"][k] for k in "abc")
    assert (type(a), a, a.text) == (JsonNumber, 100, "1e2")
    assert b == Decimal("0.10000000000000001") and b.text == "0.10000000000000001"
    assert c == 0 and c.text == "-0"
    # A plugin may put plain Decimals in; finite ones are written exactly, others refused.
    assert dumps({"d": Decimal("1.50"), "n": a}) == b'{"d":1.50,"n":1e2}'
    with pytest.raises(TypeError):
        dumps({"d": Decimal("NaN")})


def test_plain_messages_keep_plain_types():
    raw = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{"t":0.7,"n":5,"v":"2.0.1"}}}'
    _, message = decode_message(raw)
    assert [type(v) for v in message["params"]["arguments"].values()] == [float, int, str]
    assert dumps(message) == raw


# --- depth: nothing nests deeper than the limit ------------------------------------------


def nested(depth: int, kind: str = "mixed", leaf: str = "1") -> bytes:
    """A request whose whole message nests exactly ``depth`` levels (the envelope is 1)."""
    inner = depth - 2  # the envelope and params
    if kind == "mixed":
        body = "".join('{"k":' if i % 2 else "[" for i in range(inner)) + leaf
        body += "".join("}" if i % 2 else "]" for i in reversed(range(inner)))
    else:
        body = ("[" if kind == "list" else '{"k":') * inner + leaf + ("]" if kind == "list" else "}") * inner
    return ('{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"arguments":' + body + "}}").encode()


@pytest.mark.parametrize("limit", [16, 64, 128, 200, 253, 254, 300, 512])
@pytest.mark.parametrize("kind", ["list", "dict", "mixed"])
@pytest.mark.parametrize("leaf", ["1", "1e2"])  # 1e2 takes the exact path, which checks depth too
def test_depth_limit_is_exact(limit, kind, leaf):
    _, message = decode_message(nested(limit, kind, leaf), limit)
    assert dumps(message) == nested(limit, kind, leaf)  # bytes: == on the values would recurse
    error = refused_at(nested(limit + 1, kind, leaf), limit)
    assert (error.code, error.id, error.answer) == (INVALID_REQUEST, 5, True)
    assert error.data == {"source": "aggregator", "reason": "too_large", "max_depth": limit}
    assert f"deeper than {limit} levels" in error.message


def refused_at(raw: bytes, limit: int) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        decode_message(raw, limit)
    return info.value


@pytest.mark.parametrize(
    ("raw", "id", "kind"),
    [
        (nested(990), 5, REQUEST),  # under orjson's own limit: refused by ours, with the id
        (
            b'{"jsonrpc":"2.0","id":"m","method":"ping","params":{"_meta":' + b"[" * 200 + b"]" * 200 + b"}}",
            "m",
            REQUEST,
        ),
        (
            b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"reason":'
            + b"[" * 300
            + b"]" * 300
            + b"}}",
            None,
            NOTIFICATION,
        ),
        (b'{"jsonrpc":"2.0","id":9,"result":{"content":' + b"[" * 500 + b"]" * 500 + b"}}", None, RESPONSE),
        (b"[" * 100_000, None, None),  # beyond orjson's 1024: nothing readable
        (b'{"a":' * 2000 + b"1" + b"}" * 2000, None, None),
        # deep and with a number orjson cannot hold: the exact path checks depth too
        (
            b'{"jsonrpc":"2.0","id":6,"method":"x","params":{"n":1e400,"d":' + b"[" * 600 + b"]" * 600 + b"}}",
            6,
            REQUEST,
        ),
    ],
)
def test_too_deep_is_refused_with_what_can_be_read(raw, id, kind):
    error = refused(raw)
    assert error.code == INVALID_REQUEST and "nested deeper than 128 levels" in error.message
    assert (error.id, error.kind) == (id, kind)
    assert error.answer is (kind in (REQUEST, None))
    if kind == RESPONSE:
        assert error.response_to == 9


def test_deep_but_wide_messages_pass_the_cheap_check():
    items = [
        {"name": f"t{i}", "inputSchema": {"type": "object", "properties": {"a": {"type": "array"}}}} for i in range(500)
    ]
    raw = dumps({"jsonrpc": "2.0", "id": 1, "result": {"tools": items}})
    assert raw.count(b"{") > 128
    assert decode_message(raw)[1]["result"]["tools"] == items


def test_the_exact_writer_has_no_recursion_limit():
    value: list = [2**70]
    for _ in range(3000):
        value = [value]
    out = dumps({"v": value})
    assert out == b'{"v":' + b"[" * 3001 + b"1180591620717411303424" + b"]" * 3001 + b"}"
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="nested deeper"):
        dumps(cyclic)


# --- fuzz: the exact path is never laxer than orjson, apart from number range ------------

TOKENS = [
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b" ",
    b'"a"',
    b'"\\ud800"',
    b'"\\ud83d\\ude00"',
    b'"\\u00e9"',
    b'"\xff"',
    b'"\xed\xa0\x80"',
    b'"x\x01"',
    b"\xef\xbb\xbf",
    b"1e400",
    b"-0",
    b"1.50",
    b"0.1",
    b"12",
    b"NaN",
    b"-Infinity",
    b"1" * 400,
    b"true",
    b"null",
    b"-",
    b".5",
    b"01",
    b"1e99999999999999999999",
]


def strings_of(value):
    stack = [value]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            stack += list(node)
            stack += list(node.values())
        elif type(node) is list:
            stack += node
        elif type(node) is str:
            yield node


@settings(deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=14).map(b"".join))
def test_fuzz_loads_accepts_only_strict_json(raw):
    try:
        value = loads(raw)
    except ValueError:
        return  # what it refuses it refuses with a ValueError, never anything else
    text = raw.decode("utf-8")  # valid UTF-8 ...
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} accepted"))  # ... and JSON
    for string in strings_of(value):
        string.encode("utf-8")  # no lone surrogate
    written = dumps(value)
    assert dumps(loads(written)) == written


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b'{"jsonrpc":"2.0","id":11,"method":"ping"\xff\xfe}', "invalid start byte at byte 40"),
        (b'{"jsonrpc":"2.0","id":12,"method":"ping","params":{"s":"\xc3\x28"}}', "invalid continuation byte"),
    ],
)
def test_invalid_utf8_is_called_that(raw, where):
    """Not orjson's words (which speak of surrogates): what is wrong, where, and the id."""
    with pytest.raises(RemoteProtocolError) as caught:
        decode_message(raw, 64)
    assert caught.value.code == -32700
    assert "not valid UTF-8" in caught.value.message and where in caught.value.message
    assert "surrogate" not in caught.value.message
    assert caught.value.id in (11, 12)
