"""The signing keys: the current one signs, older ones stay published until dropped.

``rotate`` makes a new key current (a new ``kid``); the previous keys stay in the JWKS so that
tokens they signed still verify, unless ``drop_old`` is asked for. ``unpublished`` is a key of
the same algorithm that never appears in the JWKS: tokens it signs look right and verify
against nothing a resource server can fetch.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

from joserfc import jwt
from joserfc.jwk import ECKey, KeySet, RSAKey

ALGORITHMS = ("RS256", "ES256")


def _generate(alg: str) -> RSAKey | ECKey:
    parameters = {"kid": secrets.token_urlsafe(8), "use": "sig", "alg": alg}
    if alg == "RS256":
        return RSAKey.generate_key(2048, parameters=parameters)
    if alg == "ES256":
        return ECKey.generate_key("P-256", parameters=parameters)
    raise ValueError(f"unsupported signing algorithm {alg!r} (one of {', '.join(ALGORITHMS)})")


class KeyRing:
    def __init__(self, alg: str) -> None:
        self.alg = alg
        self._lock = threading.Lock()
        self._published: list[RSAKey | ECKey] = [_generate(alg)]  # the last one signs
        self._unpublished = _generate(alg)

    @property
    def current_kid(self) -> str:
        with self._lock:
            return str(self._published[-1].kid)

    def jwks(self) -> dict[str, Any]:
        with self._lock:
            return {"keys": [key.as_dict(private=False) for key in self._published]}

    def public_keys(self) -> KeySet:
        with self._lock:
            return KeySet(list(self._published))

    def rotate(self, *, drop_old: bool = False) -> str:
        key = _generate(self.alg)
        with self._lock:
            self._published = [key] if drop_old else [*self._published, key]
        return str(key.kid)

    def sign(self, claims: dict[str, Any], *, unpublished: bool = False, header: dict[str, Any] | None = None) -> str:
        with self._lock:
            key = self._unpublished if unpublished else self._published[-1]
        fields = {"alg": self.alg, "typ": "at+jwt", "kid": key.kid, **(header or {})}
        return jwt.encode(fields, claims, key)
