"""The proxy's own requestState: minted, verified, and refused when anything about it is off."""

from __future__ import annotations

import pytest

from aggregator.core.era.request_state import PREFIX, WRAPPED, RequestStates, is_ours, request_digest
from aggregator.core.settings import SigningKeys
from aggregator.jsonrpc import RemoteProtocolError, loads
from aggregator.jsonrpc.errors import INTERNAL_ERROR, INVALID_PARAMS

PARAMS = {"name": "slow", "arguments": {"a": 1, "b": [1, 2]}}
DIGEST = request_digest("tools/call", PARAMS)
NOW = 1000.0


def states(key: SigningKeys | bytes = b"k" * 32, replica: str = "r1") -> RequestStates:
    return RequestStates(30.0, key, replica)


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


# Fields: key id, replica, parked call, expiry, digest, tag.
@pytest.mark.parametrize("field", [0, 1, 2, 3, 4, 5])
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
        PREFIX + "k.r.a.2.3.4",
        PREFIX + "k.r.1.b.3.4",
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


def keys(*names: bytes) -> SigningKeys:
    return SigningKeys(tuple((name[:4], name * 32) for name in names))


def test_the_first_key_signs_and_every_key_verifies():
    old = states(keys(b"old1")).mint(5, 3, NOW + 30, DIGEST)
    rotated = states(keys(b"new1", b"old1"))
    assert rotated.verify(old, 3, NOW, DIGEST) == 5  # signed before the rotation
    new = rotated.mint(6, 3, NOW + 30, DIGEST)
    assert new.split(".")[1] != old.split(".")[1]  # each names the key that signed it
    assert states(keys(b"new1")).verify(new, 3, NOW, DIGEST) == 6
    # The old key removed: refused exactly as a forged state.
    assert refusal(states(keys(b"new1")), old) == refusal(states(keys(b"new1")), old[:-2] + "AA")
    wrapped = states(keys(b"old1")).wrap("upstream's", 3, NOW + 30, DIGEST)
    assert wrapped.startswith(WRAPPED)
    assert rotated.unwrap(wrapped, 3, NOW, DIGEST) == "upstream's"
    with pytest.raises(RemoteProtocolError) as info:
        states(keys(b"new1")).unwrap(wrapped, 3, NOW, DIGEST)
    assert "altered" in info.value.message


def test_a_state_of_a_call_another_replica_holds_is_retryable():
    state = states(replica="a").mint(9, 3, NOW + 30, DIGEST)
    assert states(replica="a").verify(state, 3, NOW, DIGEST) == 9
    with pytest.raises(RemoteProtocolError) as info:
        states(replica="b").verify(state, 3, NOW, DIGEST)
    assert info.value.code == INTERNAL_ERROR
    assert info.value.data == {"source": "aggregator", "reason": "unavailable", "retryable": True, "replica": "a"}
    # Still a forgery first: a state altered to name another replica is refused as altered.
    forged = state.replace(".a.", ".b.")
    assert "altered" in refusal(states(replica="b"), forged)


def test_replicas_read_the_expiry_on_the_wall_clock():
    """Each replica's router clock is its own (trio's starts anywhere): the state carries the
    expiry in wall-clock time, so another replica, whose router clock reads otherwise, reads
    it alike."""
    wall = 1_764_800_000.0
    one = RequestStates(30.0, b"k" * 32, "a", to_wall=lambda at: at - 50.0 + wall)  # its clock reads 50 now
    other = RequestStates(30.0, b"k" * 32, "a", to_wall=lambda at: at - 90_000.0 + wall)  # this one 90000
    state = one.mint(1, 3, 50.0 + 30, DIGEST)
    assert other.verify(state, 3, 90_000.0 + 29.9, DIGEST) == 1
    with pytest.raises(RemoteProtocolError, match="expired"):
        other.verify(state, 3, 90_000.0 + 30.01, DIGEST)
    wrapped = one.wrap("s", 3, 50.0 + 30, DIGEST)
    assert other.unwrap(wrapped, 3, 90_000.0 + 29.9, DIGEST) == "s"
