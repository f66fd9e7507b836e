"""The proxy's own requestState: minted, verified, and refused when anything about it is off."""

from __future__ import annotations

import pytest

from aggregator.core.era.request_state import PREFIX, RequestStates, is_ours, request_digest
from aggregator.jsonrpc import RemoteProtocolError, loads
from aggregator.jsonrpc.errors import INVALID_PARAMS

PARAMS = {"name": "slow", "arguments": {"a": 1, "b": [1, 2]}}
DIGEST = request_digest("tools/call", PARAMS)
NOW = 1000.0


def states(key: bytes = b"k" * 32) -> RequestStates:
    return RequestStates(30.0, key)


def refusal(codec: RequestStates, state: str, **kw) -> str:
    facts = {"principal": 3, "now": NOW, "digest": DIGEST} | kw
    with pytest.raises(RemoteProtocolError) as info:
        codec.verify(state, facts["principal"], facts["now"], facts["digest"])
    assert info.value.code == INVALID_PARAMS
    return info.value.message


def test_a_minted_state_names_its_parked_call():
    codec = states()
    state = codec.mint(42, 3, NOW + 30, DIGEST)
    assert state.startswith(PREFIX) and is_ours(state)
    assert codec.verify(state, 3, NOW, DIGEST) == 42
    assert codec.verify(state, 3, NOW + 29.9, DIGEST) == 42


def test_a_state_expires():
    codec = states()
    state = codec.mint(1, 3, NOW + 30, DIGEST)
    assert "expired" in refusal(codec, state, now=NOW + 30.01)


def test_a_state_belongs_to_its_principal():
    codec = states()
    state = codec.mint(1, 3, NOW + 30, DIGEST)
    assert "another caller" in refusal(codec, state, principal=4)
    assert "another caller" in refusal(codec, state, principal=None)
    unauthenticated = codec.mint(1, None, NOW + 30, DIGEST)
    assert codec.verify(unauthenticated, None, NOW, DIGEST) == 1
    assert "another caller" in refusal(codec, unauthenticated, principal=0)


def test_a_state_is_bound_to_its_request():
    codec = states()
    state = codec.mint(1, 3, NOW + 30, DIGEST)
    other = request_digest("tools/call", {"name": "slow", "arguments": {"a": 2, "b": [1, 2]}})
    assert "another request" in refusal(codec, state, digest=other)
    assert "another request" in refusal(codec, state, digest=request_digest("prompts/get", PARAMS))


@pytest.mark.parametrize("field", [0, 1, 2, 3])
def test_editing_any_field_is_caught(field):
    codec = states()
    state = codec.mint(7, 3, NOW + 30, DIGEST)
    parts = state[len(PREFIX) :].split(".")
    original = parts[field]
    parts[field] = ("8" if original[0] != "8" else "9") + original[1:]  # one character changed
    edited = PREFIX + ".".join(parts)
    message = refusal(codec, edited)
    assert "altered" in message or "not issued" in message


@pytest.mark.parametrize(
    "state",
    [
        PREFIX,
        PREFIX + "x",
        PREFIX + "1.2.3",
        PREFIX + "a.2.3.4",
        PREFIX + "1.2.3.4.5",
        PREFIX + "1." + "9" * 300 + ".3.4",
        PREFIX + "١.2.3.4",  # a digit, but not an ASCII one
        PREFIX + "1.2.3.4é",
    ],
)
def test_what_is_not_a_state_of_ours_is_refused_without_a_traceback(state):
    assert "not issued by this proxy" in refusal(states(), state)


def test_the_conformance_suites_tampering_is_caught():
    codec = states()
    state = codec.mint(1, 3, NOW + 30, DIGEST)
    assert "altered" in refusal(codec, state + "-TAMPERED")


def test_another_process_key_refuses_the_state():
    state = states(b"a" * 32).mint(1, 3, NOW + 30, DIGEST)
    assert "altered" in refusal(states(b"b" * 32), state)
    assert RequestStates(30.0).ttl == 30.0


def test_only_the_proxys_prefix_is_ours():
    assert not is_ours("v1.sealed-by-a-server")
    assert not is_ours(None) and not is_ours(17)
    assert is_ours(PREFIX + "anything")


def test_the_digest_leaves_out_what_a_retry_adds_and_ignores_key_order():
    retry = {
        "arguments": {"b": [1, 2], "a": 1},
        "name": "slow",
        "_meta": {"progressToken": 5},
        "inputResponses": {"x": {}},
        "requestState": "s",
    }
    assert request_digest("tools/call", retry) == DIGEST
    assert request_digest("tools/call", dict(PARAMS, arguments={"a": 1, "b": [2, 1]})) != DIGEST


def test_the_digest_sees_numbers_as_written():
    one = loads(b'{"name": "t", "arguments": {"x": 1.0}}')
    other = loads(b'{"name": "t", "arguments": {"x": 1.00}}')
    same = loads(b'{"arguments": {"x": 1.0}, "name": "t"}')
    assert request_digest("tools/call", one) == request_digest("tools/call", same)
    assert request_digest("tools/call", one) != request_digest("tools/call", other)
    huge = loads(b'{"name": "t", "arguments": {"x": 123456789012345678901234567890}}')
    assert len(request_digest("tools/call", huge)) == 16


def test_the_digest_names_the_server():
    assert request_digest("tools/call", PARAMS, "a") != request_digest("tools/call", PARAMS, "b")
