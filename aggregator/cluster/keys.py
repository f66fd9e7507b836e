"""The key ring: ``[cluster] keys`` turned into one subkey per purpose, once, at start.

Each shared secret gives, with HKDF-SHA256 (RFC 5869; salt ``SALT``, info the purpose),
a 32-byte subkey for each purpose in ``PURPOSES``, and a key id (4 bytes, info
``"key-id"``) that every value it seals or signs carries, so that a replica verifies with
the one key the id names instead of trying each. Replicas with the same secrets derive the
same subkeys and ids; a secret's subkeys tell nothing of it nor of each other. Derivation
happens once, never per session or per request.

Without keys, each purpose gets a key made for this process alone (as before clustering):
nothing this process seals or signs is read elsewhere or after a restart.

HKDF is written here on the stdlib's HMAC (a dozen lines, checked against cryptography's in
the tests), so that a proxy without ``[cluster]`` loads no cryptography at all.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import socket
from collections.abc import Sequence

from aggregator.config.model import ClusterConfig
from aggregator.core.settings import KEY_ID_BYTES, SigningKeys

SESSION = "session"  # AES-GCM sealing of legacy session ids (``cluster.sealing``)
REQUEST_STATE = "request-state"  # HMAC of parked calls' requestState (``core.era.request_state``)
CURSOR = "cursor"  # HMAC of list cursors (``core.catalogs.cursor``)
BROWSER = "browser"  # HMAC of the OAuth pages' browser cookie (``credentials.browser``)
FLOWS = "flows"  # AES-GCM sealing of authorization flows in the store (``credentials.flows``)
KEPT = "kept"  # AES-GCM sealing of the rests of cut results in the store (``cluster.kept``)
PLUGINS = "plugins"  # HMAC of what plugins keep in the store (``plugins.shared``: pinned definitions)
PURPOSES = (SESSION, REQUEST_STATE, CURSOR, BROWSER, FLOWS, KEPT, PLUGINS)
SALT = b"aggregator cluster keys v1"


def hkdf_sha256(secret: bytes, info: bytes, length: int = 32, salt: bytes = SALT) -> bytes:
    """RFC 5869 HKDF with SHA-256: extract a pseudorandom key from ``secret``, expand it
    to ``length`` bytes for ``info``."""
    prk = hmac.new(salt, secret, hashlib.sha256).digest()
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out += block
        counter += 1
    return out[:length]


def default_replica() -> str:
    """This host's name and this process's id, as a replica name (A-Z a-z 0-9 _ -)."""
    host = re.sub(r"[^A-Za-z0-9_-]+", "-", socket.gethostname()).strip("-")[:48] or "host"
    return f"{host}-{os.getpid()}"


class KeyRing:
    """The subkeys of every purpose, and this replica's name. ``shared``: made of
    configured secrets (what one replica seals, another opens), not of this process alone."""

    def __init__(self, secrets: Sequence[str] = (), replica: str | None = None) -> None:
        self.shared = bool(secrets)
        self.replica = replica or default_replica()
        if not secrets:
            self._keys = {purpose: SigningKeys.fresh() for purpose in PURPOSES}
            return
        raw = [secret.encode() for secret in secrets]
        ids = [hkdf_sha256(secret, b"key-id", KEY_ID_BYTES) for secret in raw]
        if len(set(ids)) != len(ids):  # two secrets, one id: 1 in 4 billion; say so rather than mix them up
            raise ValueError("two of cluster.keys have the same key id; replace one of them")
        self._keys = {
            purpose: SigningKeys(
                tuple((key_id, hkdf_sha256(secret, purpose.encode())) for key_id, secret in zip(ids, raw, strict=True))
            )
            for purpose in PURPOSES
        }

    @classmethod
    def of(cls, cluster: ClusterConfig) -> KeyRing:
        return cls(cluster.keys, cluster.replica)

    def keys_for(self, purpose: str) -> SigningKeys:
        """The keys of one of ``PURPOSES``: the first signs, each verifies."""
        return self._keys[purpose]
