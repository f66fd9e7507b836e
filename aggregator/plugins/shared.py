"""What a plugin's ``shared`` hook gets: the replicas' store, and what the proxy does for
plugins with it.

``SharedStore`` answers every ``cluster.store.Store`` method by name (``get``, ``hset``,
``count_into``, ``publish``, ``subscribe``, ...), and adds:

- ``sign(context, value)`` / ``verify(context, signed)``: values kept with integrity. With
  ``[cluster] keys`` a value is stored as ``h1.<key id>.<HMAC-SHA256>.<value>``, under the
  key ring's ``"plugins"`` subkey (the first key signs, each verifies the values that name
  its id), the MAC over ``context`` (where the value is kept: a value cannot be moved to
  another field) and the value; ``verify`` gives None for a value whose MAC is wrong, that
  names no key here or that is not signed. Without keys, values are kept as they are: the
  store is trusted as a file would be.
- ``catalogs_changed()``: what the plugin's catalog hooks decide changed (a pin approved on
  another replica): every catalog is built again with them, and clients whose lists changed
  hear ``list_changed``.

Must not import the hub (the hub builds one per ``[cluster] store`` and hands it over).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable
from typing import Any

from aggregator.cluster.store import Store
from aggregator.core.settings import KEY_ID_BYTES, SigningKeys, key_id_text

SIGNED = b"h1."


class SharedStore:
    """The store, as plugins get it: its methods, and ``sign``/``verify``/``catalogs_changed``."""

    def __init__(self, store: Store, keys: SigningKeys | None, catalogs_changed: Callable[[], None]) -> None:
        self.store = store
        self._keys = keys
        self._catalogs_changed = catalogs_changed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def catalogs_changed(self) -> None:
        """Build every catalog again with the plugins' catalog hooks (now, synchronously)."""
        self._catalogs_changed()

    def sign(self, context: str, value: bytes) -> bytes:
        """``value`` as kept in the store at ``context`` (signed when there are keys)."""
        if self._keys is None:
            return value
        key_id, key = self._keys.signing
        mac = hmac.new(key, context.encode() + b"\0" + value, hashlib.sha256).digest()
        return SIGNED + key_id_text(key_id).encode() + b"." + base64.urlsafe_b64encode(mac).rstrip(b"=") + b"." + value

    def verify(self, context: str, signed: bytes) -> bytes | None:
        """The value ``sign`` kept at ``context``; None if it cannot be trusted."""
        if self._keys is None:
            return signed.split(b".", 3)[3] if signed.startswith(SIGNED) and signed.count(b".") >= 3 else signed
        if not signed.startswith(SIGNED):
            return None
        parts = signed.split(b".", 3)
        if len(parts) != 4:
            return None
        try:
            key_id = base64.urlsafe_b64decode(parts[1] + b"=" * (-len(parts[1]) % 4))
            mac = base64.urlsafe_b64decode(parts[2] + b"=" * (-len(parts[2]) % 4))
        except ValueError:
            return None
        key = self._keys.verifying(key_id) if len(key_id) == KEY_ID_BYTES else None
        if key is None:
            return None
        expected = hmac.new(key, context.encode() + b"\0" + parts[3], hashlib.sha256).digest()
        return parts[3] if hmac.compare_digest(mac, expected) else None
