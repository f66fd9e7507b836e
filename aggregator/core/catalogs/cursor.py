"""Opaque pagination cursors over the merged catalog.

A cursor names a list kind, the catalog generation it was made for, and an offset, and
carries the id of the key that signed it and an HMAC tag under that key: the cursor keys of
``[cluster] keys`` (``aggregator.cluster.keys``), so that every replica with the same keys
reads the cursors of the others, or else a key made fresh for each proxy process. So a
cursor cannot be forged or edited, a cursor of a proxy with other keys (or signed with a
key since removed) or of an older catalog is refused, and the proxy keeps no per-client
pagination state. Refusal is -32602 (the spec's "Invalid cursor SHOULD be -32602"); the
client lists again from the start.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from aggregator.core.settings import KEY_ID_BYTES, SigningKeys
from aggregator.jsonrpc.errors import INVALID_PARAMS, RemoteProtocolError

_TAG = 12


class CursorCodec:
    def __init__(self, key: SigningKeys | bytes | None = None) -> None:
        self._keys = SigningKeys.of(key)

    def encode(self, kind: str, generation: int | str, offset: int) -> str:
        key_id, key = self._keys.signing
        body = f"{kind}:{generation}:{offset}".encode()
        tag = hmac.new(key, body, hashlib.sha256).digest()[:_TAG]
        return base64.urlsafe_b64encode(key_id + tag + body).decode().rstrip("=")

    def decode(self, cursor: object, kind: str, generation: int | str) -> int:
        """The offset a cursor names; RemoteProtocolError(-32602) if it is not valid now."""
        if type(cursor) is not str or len(cursor) > 200:
            raise _invalid("a cursor must be a string this proxy returned")
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        except ValueError:
            raise _invalid("this cursor was not made by this proxy") from None
        key = self._keys.verifying(raw[:KEY_ID_BYTES])
        tag, body = raw[KEY_ID_BYTES : KEY_ID_BYTES + _TAG], raw[KEY_ID_BYTES + _TAG :]
        expected = hmac.new(key or b"", body, hashlib.sha256).digest()[:_TAG]
        if key is None or len(tag) != _TAG or not hmac.compare_digest(tag, expected):
            raise _invalid("this cursor was not made by this proxy")
        cursor_kind, cursor_generation, offset = body.decode().split(":")
        if cursor_kind != kind:
            raise _invalid(f"this cursor belongs to another list ({cursor_kind})")
        if cursor_generation != str(generation):
            raise _invalid("the list changed since this cursor was made; list again from the start")
        return int(offset)


def _invalid(reason: str) -> RemoteProtocolError:
    return RemoteProtocolError(INVALID_PARAMS, f"Invalid cursor: {reason}")
