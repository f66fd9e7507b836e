"""The key ring (``aggregator.cluster.keys``): one subkey per purpose, derived once from the
shared secrets, the same on every replica; key ids; and the config table that gives them."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from aggregator.cluster.keys import CURSOR, PURPOSES, REQUEST_STATE, SALT, SESSION, KeyRing, hkdf_sha256
from aggregator.config import structure_config
from aggregator.errors import ConfigError

ONE, TWO = "a" * 32, "b" * 40


def test_hkdf_is_rfc_5869():
    # RFC 5869, test case 1.
    ikm, salt = bytes.fromhex("0b" * 22), bytes.fromhex("000102030405060708090a0b0c")
    info = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9")
    expected = "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    assert hkdf_sha256(ikm, info, 42, salt).hex() == expected
    # ... and as cryptography derives it, with this ring's salt.
    theirs = HKDF(algorithm=hashes.SHA256(), length=32, salt=SALT, info=b"cursor").derive(ONE.encode())
    assert hkdf_sha256(ONE.encode(), b"cursor") == theirs


def test_replicas_with_the_same_secrets_derive_the_same_keys():
    assert PURPOSES == ("session", "request-state", "cursor", "browser", "flows", "kept", "plugins")
    one, other = KeyRing([ONE, TWO], "r1"), KeyRing([ONE, TWO], "r2")
    assert one.shared and (one.replica, other.replica) == ("r1", "r2")
    for purpose in PURPOSES:
        assert one.keys_for(purpose) == other.keys_for(purpose)
    # A subkey per purpose, none of them the secret; the key ids are the same for every purpose.
    derived = {key for purpose in PURPOSES for _, key in one.keys_for(purpose).keys}
    assert len(derived) == 2 * 7 and ONE.encode() not in derived
    ids = [[kid for kid, _ in one.keys_for(purpose).keys] for purpose in PURPOSES]
    assert all(kids == ids[0] for kids in ids) and len(set(ids[0])) == 2 and all(len(kid) == 4 for kid in ids[0])


def test_the_first_secret_signs():
    rotated = KeyRing([TWO, ONE])
    assert rotated.keys_for(SESSION).signing == KeyRing([TWO]).keys_for(SESSION).signing
    old_id, old_key = KeyRing([ONE]).keys_for(CURSOR).signing
    assert rotated.keys_for(CURSOR).verifying(old_id) == old_key
    assert KeyRing([TWO]).keys_for(CURSOR).verifying(old_id) is None


def test_without_secrets_each_process_has_its_own_keys():
    one, other = KeyRing(), KeyRing()
    assert not one.shared
    assert one.keys_for(REQUEST_STATE) != other.keys_for(REQUEST_STATE)
    assert one.replica and one.replica.replace("-", "").replace("_", "").isalnum()


def test_no_key_is_shown():
    assert ONE not in repr(KeyRing([ONE]).keys_for(SESSION))
    config = structure_config({"cluster": {"keys": ["${K}"]}}, environ={"K": ONE})
    assert config.cluster.keys == (ONE,) and ONE not in repr(config)


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ({"keys": ["short"]}, "cluster.keys[0]: at least 32 characters, got 5"),
        ({"keys": [ONE, ONE]}, "cluster.keys[1]: the same key as an earlier one"),
        ({"keys": ONE}, "cluster.keys"),
        ({"replica": "a.b"}, "cluster.replica: 1 to 64 of A-Z a-z 0-9 _ -"),
        ({"store": "http://127.0.0.1"}, "cluster.store: a redis:// URL"),
        ({"prefix": ""}, "cluster.prefix"),
        ({"other": 1}, "cluster.other: unknown key"),
        ({"session_lifetime": 10}, "cluster.session_lifetime: must be a finite number of seconds from 60 to"),
        ({"session_lifetime": float("inf")}, "cluster.session_lifetime: must be a finite number"),
    ],
)
def test_a_bad_cluster_table_is_named_by_its_key_path(table, problem):
    with pytest.raises(ConfigError) as info:
        structure_config({"cluster": table}, environ={})
    assert any(line.startswith(problem) for line in info.value.problems), info.value.problems
    assert "short" not in str(info.value)


def test_a_good_cluster_table():
    cluster = structure_config(
        {"cluster": {"keys": [ONE], "replica": "eu-1", "store": "redis://127.0.0.1:6379/0", "prefix": "agg"}},
        environ={},
    ).cluster
    assert (cluster.replica, cluster.store, cluster.prefix, cluster.enabled) == (
        "eu-1",
        "redis://127.0.0.1:6379/0",
        "agg",
        True,
    )
    assert not structure_config({}, environ={}).cluster.enabled
