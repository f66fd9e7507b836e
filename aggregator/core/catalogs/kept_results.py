"""The rests of cut tool results, kept for their callers (``core.catalogs.result_budget``). Sans-IO.

Memory is bounded: at most ``MAX_KEPT_BYTES`` in all and ``MAX_KEPT_PER_OWNER`` per owner,
the oldest dropped first; each rest expires at its own time.
"""

from __future__ import annotations

import heapq
import secrets
from typing import Any

MAX_KEPT_BYTES = 64 * 1024 * 1024
MAX_KEPT_PER_OWNER = 16 * 1024 * 1024


def cut_utf8(text: str, size: int) -> tuple[str, str]:
    """``text`` split after at most ``size`` UTF-8 bytes, never inside a character."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= size:
        return text, ""
    head = data[:size].decode("utf-8", "ignore")
    return head, text[len(head) :]


def _pages(text: str, size: int) -> list[str]:
    """``text`` in pages of at most ``size`` UTF-8 bytes, cut between characters (a
    character larger than a page is a page of its own); one pass over its bytes."""
    data = text.encode("utf-8", "surrogatepass")
    pages: list[str] = []
    start, total = 0, len(data)
    while start < total:
        end = min(start + size, total)
        while start < end < total and data[end] & 0xC0 == 0x80:  # inside a character: back to its start
            end -= 1
        if end == start:
            end = start + 1
            while end < total and data[end] & 0xC0 == 0x80:
                end += 1
        pages.append(data[start:end].decode("utf-8", "surrogatepass"))
        start = end
    return pages or [""]


class Kept:
    """One cut result's rest, in pages of at most ``page_bytes`` (cut between characters)."""

    __slots__ = ("owner", "pages", "expires", "size")

    def __init__(self, owner: Any, text: str, page_bytes: int, expires: float) -> None:
        self.owner = owner
        self.pages = _pages(text, page_bytes)
        self.expires = expires
        self.size = sum(len(page.encode("utf-8", "surrogatepass")) for page in self.pages)


class KeptResults:
    """The rests of cut results, by token, oldest first; per owner; by expiry. Each
    operation costs in proportion to what it drops, never to what is kept."""

    def __init__(self, max_bytes: int = MAX_KEPT_BYTES, per_owner: int = MAX_KEPT_PER_OWNER) -> None:
        self.max_bytes = max_bytes
        self.per_owner = per_owner
        self.items: dict[str, Kept] = {}  # oldest first
        self.bytes = 0
        self._owned: dict[Any, dict[str, None]] = {}  # owner -> its tokens, oldest first
        self._owner_bytes: dict[Any, int] = {}
        self._expiry: list[tuple[float, int, str]] = []  # a heap; dropped tokens are skipped
        self._seq = 0

    def keep(
        self, owner: Any, text: str, page_bytes: int, expires: float, now: float, token: str | None = None
    ) -> tuple[str, Kept]:
        """Keep ``text`` for ``owner`` until ``expires``: its token (a new one, or ``token``:
        a rest read back from the shared store), and what was kept (at most ``per_owner``
        bytes of it; older rests go first to make room)."""
        self.expire(now)
        if token is not None and token in self.items:
            self._drop(token)
        text, _ = cut_utf8(text, self.per_owner)
        kept = Kept(owner, text, page_bytes, expires)
        mine = self._owned.get(owner)
        while mine and self._owner_bytes[owner] + kept.size > self.per_owner:  # its own oldest first
            self._drop(next(iter(mine)))
            mine = self._owned.get(owner)
        while self.items and self.bytes + kept.size > self.max_bytes:
            self._drop(next(iter(self.items)))
        if token is None:
            token = secrets.token_urlsafe(18)
        self.items[token] = kept
        self.bytes += kept.size
        self._owned.setdefault(owner, {})[token] = None
        self._owner_bytes[owner] = self._owner_bytes.get(owner, 0) + kept.size
        self._seq += 1
        heapq.heappush(self._expiry, (expires, self._seq, token))
        return token, kept

    def get(self, owner: Any, token: str, now: float) -> Kept | None:
        self.expire(now)
        kept = self.items.get(token)
        return kept if kept is not None and kept.owner == owner else None

    def expire(self, now: float) -> None:
        expiry = self._expiry
        while expiry and expiry[0][0] <= now:
            _, _, token = heapq.heappop(expiry)
            if token in self.items:
                self._drop(token)
        if len(expiry) > 2 * len(self.items) + 64:  # mostly dropped ones: rebuilt
            self._expiry = [entry for entry in expiry if entry[2] in self.items]
            heapq.heapify(self._expiry)

    def drop_owner(self, owner: Any) -> None:
        for token in list(self._owned.get(owner, ())):
            self._drop(token)

    def _drop(self, token: str) -> None:
        kept = self.items.pop(token)
        self.bytes -= kept.size
        mine = self._owned[kept.owner]
        del mine[token]
        self._owner_bytes[kept.owner] -= kept.size
        if not mine:
            del self._owned[kept.owner], self._owner_bytes[kept.owner]


def page_of(kept: Kept, uri: str, page: int) -> dict[str, Any]:
    """A ``resources/read`` result: page ``page`` (1-based, in range) of a kept rest."""
    text = kept.pages[page - 1]
    if page < len(kept.pages):
        base = uri.split("?", 1)[0]
        text += f"\n\n[aggregator: page {page} of {len(kept.pages)}; the next is {base}?page={page + 1}]"
    return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": text}]}
