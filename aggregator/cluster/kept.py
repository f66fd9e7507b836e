"""The rests of cut tool results in the shared store, so that any replica pages them back
(``core.catalogs.result_budget``: the router says ``ShareKept`` when it cuts one and
``FetchKept`` for a read it cannot serve; the hub carries both out here).

Each rest is one value, ``kept:<token>`` (the token is the one in its URI: 18 random bytes,
unguessable), sealed with AES-256-GCM under the key ring's ``"kept"`` key (the first seals,
each opens the values that name its key id; a key since removed: as if expired), with its
store key as associated data, so a value cannot be moved under another token. Inside: the
owner it is bound to (``shared_owner``: a principal, a session's name on every replica),
its page size, when it expires (Unix time, alike on every replica) and its text. The store
expires it when the replica that cut it does. A read opens it and compares the owner: one
that is another caller's is as missing (no oracle).

A cut result's answer is sent once its rest is written (``ShareKept`` carries it): its
caller cannot ask another replica for the rest before the store has it. That costs a cut
call one round trip to the store; a call that cuts nothing costs nothing.

Bounded: a rest is at most ``SHARED_KEPT_BYTES`` (the core cuts it to that); at most
``MAX_WRITES`` writes and ``MAX_READS`` reads are in flight (past them a write is not made,
its answer sent at once and its rest served by its replica alone; a read is answered as
missing); an answer waits at most ``WRITE_SECONDS`` for its write, a read at most
``READ_SECONDS``. A store that is down fails at once: a rest is then served by its
replica alone, and a read of one kept elsewhere gets the answer a missing rest gets. That is
logged once per outage (and once when the store is back), never per call; no text, owner or
token is ever logged. Must not import the hub or anything above it.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable

import orjson
import trio

from aggregator.cluster.store import Store
from aggregator.core.commands import FetchKept, ShareKept
from aggregator.core.settings import KEY_ID_BYTES, SigningKeys
from aggregator.errors import StoreError

log = logging.getLogger(__name__)

MAX_WRITES = 64  # rests being written at once
MAX_READS = 64  # reads of rests kept elsewhere at once
READ_SECONDS = 2.0  # what a read of one waits for the store, at most
WRITE_SECONDS = 2.0  # what the answer of a cut result waits for its rest's write, at most
_NONCE = 12


class SharedKept:
    """Writes and reads the rests of cut results in ``store``, sealed under ``keys``."""

    def __init__(self, store: Store, keys: SigningKeys, wall_clock: Callable[[], float] = time.time) -> None:
        # Imported here: a proxy that shares no rests never loads cryptography.
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self.store = store
        self.keys = keys
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.keys}
        self._unreadable: tuple[type[Exception], ...] = (InvalidTag, ValueError, TypeError, KeyError)
        self.wall_clock = wall_clock
        self.writing = 0
        self.reading = 0
        self.down = False  # the last call failed (logged once until one succeeds)
        self.skipped = 0  # writes not made: too many at once

    @staticmethod
    def key(token: str) -> str:
        return f"kept:{token}"

    def seal(self, command: ShareKept) -> bytes:
        """``command``'s rest as the store keeps it."""
        header = orjson.dumps(
            {"owner": command.owner, "page_bytes": command.page_bytes, "expires": self.wall_clock() + command.ttl}
        )
        plain = header + b"\n" + command.text.encode("utf-8", "surrogatepass")
        key_id, _ = self.keys.signing
        nonce = secrets.token_bytes(_NONCE)
        return key_id + nonce + self._ciphers[key_id].encrypt(nonce, plain, self.key(command.token).encode())

    def open(self, fetch: FetchKept, sealed: bytes | None) -> tuple[str, int, float] | None:
        """What ``sealed`` holds for ``fetch``'s caller: the text, its page size and the
        seconds it is kept for still; None when it is not that caller's, expired, or cannot
        be opened."""
        if sealed is None:
            return None
        cipher = self._ciphers.get(sealed[:KEY_ID_BYTES])
        if cipher is None:
            return None
        nonce, body = sealed[KEY_ID_BYTES : KEY_ID_BYTES + _NONCE], sealed[KEY_ID_BYTES + _NONCE :]
        try:
            plain = cipher.decrypt(nonce, body, self.key(fetch.token).encode())
            line, _, text = plain.partition(b"\n")
            header = orjson.loads(line)
            owner, page_bytes, expires = header["owner"], header["page_bytes"], header["expires"]
        except self._unreadable:
            return None
        left = expires - self.wall_clock() if type(expires) in (int, float) else 0.0
        if owner != fetch.owner or type(page_bytes) is not int or page_bytes <= 0 or left <= 0:
            return None
        return text.decode("utf-8", "surrogatepass"), page_bytes, left

    def start_write(self, nursery: trio.Nursery, command: ShareKept, then: Callable[[], None]) -> None:
        """Write ``command``'s rest in a task of ``nursery``, then call ``then`` (which sends its
        answer): once the store has it, or the write failed or took ``WRITE_SECONDS``; at once
        when too many are being written (that rest is then not written)."""
        if self.writing >= MAX_WRITES:
            self.skipped += 1
            if self.skipped == 1 or self.skipped % 1000 == 0:
                log.warning(
                    "kept results: %d rests not written to the shared store (%d writes in flight, the limit); "
                    "each is served by the replica that cut it alone",
                    self.skipped,
                    MAX_WRITES,
                )
            then()
            return
        self.writing += 1
        nursery.start_soon(self._write, command, then)

    async def _write(self, command: ShareKept, then: Callable[[], None]) -> None:
        try:
            with trio.move_on_after(WRITE_SECONDS):
                await self.store.set(self.key(command.token), self.seal(command), ttl=command.ttl)
                self._worked()
                return
            self._failed(None)
        except StoreError as exc:
            self._failed(exc)
        finally:
            self.writing -= 1
            then()

    async def read(self, fetch: FetchKept) -> tuple[str, int, float] | None:
        """The rest ``fetch`` asks for, if the store has it for its caller, within
        ``READ_SECONDS``; None otherwise (missing, another caller's, the store down or slow)."""
        if self.reading >= MAX_READS:
            return None
        self.reading += 1
        try:
            with trio.move_on_after(READ_SECONDS):
                sealed = await self.store.get(self.key(fetch.token))
                self._worked()
                return self.open(fetch, sealed)
            self._failed(None)
            return None
        except StoreError as exc:
            self._failed(exc)
            return None
        finally:
            self.reading -= 1

    def _failed(self, exc: StoreError | None) -> None:
        if not self.down:
            self.down = True
            why = str(exc) if exc is not None else "no answer in time"
            log.warning(
                "kept results: the shared store cannot be used now (%s); a result cut here is paged back from "
                "this replica alone, and a read of one kept elsewhere is answered as unknown",
                why,
            )

    def _worked(self) -> None:
        if self.down:
            self.down = False
            log.info("kept results: the shared store is used again")
