"""The JSON-RPC codec against what breaks naive JSON handling."""

import json

import pytest

from aggregator.jsonrpc import (
    ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    NOTIFICATION,
    PARSE_ERROR,
    REQUEST,
    RESPONSE,
    RemoteProtocolError,
    decode_message,
    dumps,
    loads,
)


def refused(raw: bytes) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        decode_message(raw)
    return info.value


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
        (b"\xff\xfe{}", PARSE_ERROR, None),
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
    "raw",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":NaN}}',
        b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":Infinity}}',
        b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":-Infinity}}',
        b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1e400}}',
        b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":' + b"7" * 5000 + b"}}",
        b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":"\\ud800"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":"\\udc00 and 12345678901234567890"}}',
        b"[" * 100_000,
        b'{"a":' * 2000 + b"1" + b"}" * 2000,
    ],
)
def test_what_breaks_naive_json_is_a_parse_error(raw):
    assert refused(raw).code == PARSE_ERROR


def test_five_thousand_digit_integer_id():
    assert refused(b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"method":"ping"}').code == PARSE_ERROR


@pytest.mark.parametrize("id", [0, "", 2**63 + 1, -(2**63), 2**64 - 1, 10**30, -(10**30), "\u2028"])
def test_ids_are_echoed_exactly(id):
    raw = b'{"jsonrpc":"2.0","id":' + json.dumps(id).encode() + b',"method":"ping"}'
    kind, message = decode_message(raw)
    assert kind == REQUEST
    assert message["id"] == id
    assert type(message["id"]) is type(id)
    assert json.loads(dumps({"id": message["id"]}))["id"] == id


def test_numbers_are_forwarded_exactly():
    raw = (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":'
           b'{"big":123456789012345678901234567890,"neg":-98765432109876543210987,'
           b'"precise":0.1000000000000000055511151231257827,"exp":1.5E+300,"small":1,"f":2.5}}}')
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
