"""Sealed session ids (``aggregator.cluster.sealing``): what one replica seals another with
the same keys opens; anything else opens to nothing, never to an exception."""

from __future__ import annotations

import base64
import os

import pytest

from aggregator.cluster.keys import SESSION, KeyRing
from aggregator.cluster.sealing import MAX_ID, PREFIX, SessionSealer, SessionState, binding

ONE, TWO = "a" * 32, "b" * 40
CAPS = {"sampling": {}, "elicitation": {"form": {}, "url": {}}, "roots": {"listChanged": True}}


def sealer(*secrets: str) -> SessionSealer:
    return SessionSealer(KeyRing(secrets).keys_for(SESSION))


def state(**kw) -> SessionState:
    facts = {
        "protocol_version": "2025-11-25",
        "capabilities": CAPS,
        "client_info": {"name": "mcp", "version": "1.30.0"},
        "profile": "default",
        "principal": None,
        "issued_at": 1764800000.5,
    }
    return SessionState(**(facts | kw))


def test_a_sealed_id_opens_on_another_replica_with_the_same_keys():
    sealed = sealer(ONE).seal(state(principal=["https://as.example", "alice"]))
    assert sealed is not None and sealed.startswith(PREFIX) and len(sealed) < 400
    assert sealer(ONE).unseal(sealed) == state(principal=["https://as.example", "alice"], nonce=sealer_nonce(sealed))


def sealer_nonce(sealed: str) -> bytes:
    opened = sealer(ONE).unseal(sealed)
    assert opened is not None
    return opened.nonce


def test_nothing_of_it_is_readable():
    sealed = sealer(ONE).seal(state(client_info={"name": "very-visible-client"}, profile="secret-profile"))
    assert sealed is not None
    raw = base64.urlsafe_b64decode(sealed.split(".")[2] + "==")
    assert b"visible" not in raw and b"profile" not in raw and b"2025" not in raw
    assert sealer(ONE).seal(state()) != sealer(ONE).seal(state())  # a fresh nonce each time


def test_rotation():
    old = sealer(ONE).seal(state())
    assert sealer(TWO, ONE).unseal(old) is not None  # the new key first, the old one kept
    new = sealer(TWO, ONE).seal(state())
    assert new is not None and new.split(".")[1] != old.split(".")[1]  # sealed with the new key
    assert sealer(TWO).unseal(new) is not None
    assert sealer(TWO).unseal(old) is None  # the old key removed


def tampered(sealed: str) -> list[str]:
    head, key_id, body = sealed.split(".")
    flipped = body[:10] + ("A" if body[10] != "A" else "B") + body[11:]
    return [
        f"{head}.{key_id}.{flipped}",
        f"{head}.{key_id}.{body[:-1]}",
        f"{head}.{key_id}.{body}A",
        f"{head}.AAAAAA.{body}",
        f"{head}.{key_id[:-1]}.{body}",
        f"ag2.{key_id}.{body}",
        f"{head}.{key_id}.{body}.x",
        f"{head}.{key_id}",
        f"{head}.{key_id}.",
        f"{head}.{key_id}.!!!!",
        PREFIX + "x" * (MAX_ID + 1),
        f"{head}.{key_id}.{body[:20]}",
    ]


def test_anything_altered_opens_to_nothing():
    sealed = sealer(ONE).seal(state())
    assert sealed is not None
    for bad in tampered(sealed):
        assert sealer(ONE).unseal(bad) is None, bad
    assert sealer(TWO).unseal(sealed) is None  # another deployment's keys


def test_a_state_too_large_is_trimmed_then_not_sealed(caplog):
    noise = base64.b64encode(os.urandom(600)).decode()  # random: zlib does not shrink it
    big_info = {"name": "n", "version": "1", "extra": noise}
    big_caps = {**CAPS, "experimental": {"x": noise}}
    sealed = sealer(ONE).seal(state(client_info=big_info, capabilities=big_caps))
    assert sealed is not None and len(sealed) <= MAX_ID
    opened = sealer(ONE).unseal(sealed)
    assert opened is not None
    assert opened.client_info == {"name": "n", "version": "1"} and opened.capabilities == CAPS
    assert "cut to name and version" in caplog.text
    # What cannot be trimmed (random, so that it does not compress): not sealed at all.
    huge = base64.b64encode(os.urandom(1000)).decode()
    assert sealer(ONE).seal(state(profile=huge)) is None
    assert "only this replica knows" in caplog.text


@pytest.mark.parametrize(
    ("principal", "bound"),
    [(None, None), (3, 3), (type("P", (), {"issuer": "i", "subject": "s"})(), ["i", "s"])],
)
def test_what_a_session_is_bound_to(principal, bound):
    assert binding(principal) == bound


def test_seal_and_unseal_cost_microseconds():
    """Cheap enough to do per session: well under a millisecond each (measured in
    tests/bench/seal_bench.py; docs/cluster.md gives the figures)."""
    import time

    one = sealer(ONE)
    sealed = one.seal(state())
    assert sealed is not None
    start = time.perf_counter()
    for _ in range(200):
        one.seal(state())
        one.unseal(sealed)
    assert (time.perf_counter() - start) / 200 < 0.002
