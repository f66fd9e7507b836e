"""Sealed session ids: a legacy session's immutable state inside its ``Mcp-Session-Id``.

A replica that never saw a session, or this one after a restart, can serve it if the id
itself says what the handshake settled: the protocol revision agreed, the client's
capabilities and clientInfo, the profile, the principal the session is bound to, when it
was issued, and 16 random bytes (so that two sessions of the same client never share an
id). That state is **sealed**, never only signed: AES-256-GCM under the session subkey of
``[cluster] keys`` (``cluster.keys``), so a client can neither read nor alter it, and an
id is opened with the one key its id names.

Shape: ``ag1.<key id>.<base64url of nonce (12 bytes), ciphertext and tag>``; the plaintext
is compact JSON, zlib-compressed; the additional data is ``ag1.<key id>``. An id is at
most ``MAX_ID`` characters: past that, clientInfo is cut to its name and version and the
experimental capabilities are dropped (logged); a state that still does not fit is not
sealed (``seal`` returns None and the session gets a random id, served by this replica
alone).

``unseal`` never raises on what a client sends: a tampered id, one sealed with a key since
removed, one of another deployment or not of this shape at all is None, as an unknown id.
Checking the principal is the caller's: ``binding`` says what a state is bound to.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import zlib
from typing import Any

import attrs
import orjson

from aggregator.core.settings import SigningKeys, key_id_of, key_id_text

log = logging.getLogger(__name__)

PREFIX = "ag1."
MAX_ID = 1024  # characters of a sealed session id
_NONCE = 12
_MAX_PLAIN = 16 * 1024  # what a sealed state may inflate to (an id of 1024 characters holds far less)


@attrs.frozen(kw_only=True)
class SessionState:
    """What a legacy session's id carries: its handshake, profile and principal."""

    protocol_version: str
    capabilities: dict[str, Any]
    client_info: dict[str, Any]
    profile: str
    # Who opened it (``binding``): None, a static token's index, or [issuer, subject].
    principal: Any
    issued_at: float  # Unix time
    nonce: bytes = attrs.field(factory=lambda: os.urandom(16), repr=False)


def shared_name(session_id: str) -> str | None:
    """A session's name on every replica, for what is kept for it in the shared store (the
    rests of its cut results): a digest of its sealed id, never the id itself (which opens
    the session). None for an id that is not sealed: that session lives on one replica."""
    if not session_id.startswith(PREFIX):
        return None
    return hashlib.sha256(session_id.encode()).hexdigest()[:32]


def binding(principal: object) -> Any:
    """What a session is bound to of its principal: None (no token), a static token's index,
    or an access token's [issuer, subject] (``fronts.authorization.Principal``)."""
    if principal is None or type(principal) is int:
        return principal
    return [getattr(principal, "issuer", None), getattr(principal, "subject", None)]


class SessionSealer:
    """Seals session states into ids and opens them, under the session keys: the first
    seals, each opens the ids that name it."""

    def __init__(self, keys: SigningKeys) -> None:
        # Imported here: a proxy that seals nothing never loads cryptography.
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.keys}
        self._sealing = keys.signing[0]
        self._refused: tuple[type[Exception], ...] = (ValueError, InvalidTag, zlib.error)

    def seal(self, state: SessionState) -> str | None:
        """The id that carries ``state``; None when it cannot fit in ``MAX_ID`` characters
        even trimmed."""
        sealed = self._seal(state)
        if len(sealed) <= MAX_ID:
            return sealed
        trimmed = attrs.evolve(
            state,
            client_info={k: v for k, v in state.client_info.items() if k in ("name", "version") and type(v) is str},
            capabilities={k: v for k, v in state.capabilities.items() if k != "experimental"},
        )
        sealed = self._seal(trimmed)
        fits = len(sealed) <= MAX_ID
        log.warning(
            "session id: the client's clientInfo and capabilities do not fit in a sealed id of %d characters; %s",
            MAX_ID,
            "its clientInfo was cut to name and version and its experimental capabilities dropped"
            if fits
            else "the session gets an id only this replica knows",
        )
        return sealed if fits else None

    def _seal(self, state: SessionState) -> str:
        plain = orjson.dumps(
            [
                state.protocol_version,
                state.capabilities,
                state.client_info,
                state.profile,
                state.principal,
                round(state.issued_at, 3),
                base64.b64encode(state.nonce).decode(),
            ]
        )
        key_id = key_id_text(self._sealing)
        nonce = os.urandom(_NONCE)
        head = f"{PREFIX}{key_id}."
        sealed = self._ciphers[self._sealing].encrypt(nonce, zlib.compress(plain, 6), head.encode())
        return head + base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")

    def unseal(self, session_id: str) -> SessionState | None:
        """The state an id carries; None for anything else (never raises)."""
        if not session_id.startswith(PREFIX) or len(session_id) > MAX_ID or not session_id.isascii():
            return None
        _, key_text, body = session_id.split(".", 2) if session_id.count(".") == 2 else ("", "", "")
        key_id = key_id_of(key_text)
        cipher = self._ciphers.get(key_id) if key_id is not None else None
        if cipher is None:
            return None
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            if len(raw) < _NONCE + 16:
                return None
            packed = cipher.decrypt(raw[:_NONCE], raw[_NONCE:], f"{PREFIX}{key_text}.".encode())
            inflate = zlib.decompressobj()
            plain = inflate.decompress(packed, _MAX_PLAIN)
            if inflate.unconsumed_tail:
                return None
            return _state_of(orjson.loads(plain))
        except self._refused:  # orjson.JSONDecodeError is a ValueError
            return None


def _state_of(fields: Any) -> SessionState | None:
    """A decrypted state's fields, checked: only what this module seals is accepted."""
    if type(fields) is not list or len(fields) != 7:
        return None
    version, capabilities, info, profile, principal, issued, nonce = fields
    if not (
        type(version) is str
        and type(capabilities) is dict
        and type(info) is dict
        and type(profile) is str
        and (principal is None or type(principal) is int or _pair(principal))
        and type(issued) in (int, float)
        and type(nonce) is str
    ):
        return None
    return SessionState(
        protocol_version=version,
        capabilities=capabilities,
        client_info=info,
        profile=profile,
        principal=principal,
        issued_at=float(issued),
        nonce=base64.b64decode(nonce, validate=True),
    )


def _pair(value: Any) -> bool:
    return type(value) is list and len(value) == 2 and all(type(item) is str for item in value)
