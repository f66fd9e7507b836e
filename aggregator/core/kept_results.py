"""The rests of cut tool results, kept for their callers (``core.result_budget``). Sans-IO.

Memory is bounded: at most ``MAX_KEPT_BYTES`` in all and ``MAX_KEPT_PER_OWNER`` per owner,
the oldest dropped first; each rest expires at its own time.
"""

from __future__ import annotations

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


class Kept:
    """One cut result's rest, in pages of at most ``page_bytes`` (cut between characters)."""

    __slots__ = ("owner", "pages", "expires", "size")

    def __init__(self, owner: Any, text: str, page_bytes: int, expires: float) -> None:
        self.owner = owner
        self.pages: list[str] = []
        while text or not self.pages:
            head, text = cut_utf8(text, page_bytes)
            if not head and text:  # (a page smaller than one character: never)
                head, text = text[0], text[1:]
            self.pages.append(head)
        self.expires = expires
        self.size = sum(len(page.encode("utf-8", "surrogatepass")) for page in self.pages)


class KeptResults:
    """The rests of cut results, by token, oldest first."""

    def __init__(self, max_bytes: int = MAX_KEPT_BYTES, per_owner: int = MAX_KEPT_PER_OWNER) -> None:
        self.max_bytes = max_bytes
        self.per_owner = per_owner
        self.items: dict[str, Kept] = {}
        self.bytes = 0

    def keep(self, owner: Any, text: str, page_bytes: int, expires: float, now: float) -> tuple[str, Kept]:
        """Keep ``text`` for ``owner`` until ``expires``: its token, and what was kept (at
        most ``per_owner`` bytes of it; older rests go first to make room)."""
        self.expire(now)
        text, _ = cut_utf8(text, self.per_owner)
        kept = Kept(owner, text, page_bytes, expires)
        for token in [t for t, k in self.items.items() if k.owner == owner]:  # its own oldest first
            if sum(k.size for k in self.items.values() if k.owner == owner) + kept.size <= self.per_owner:
                break
            self._drop(token)
        while self.items and self.bytes + kept.size > self.max_bytes:
            self._drop(next(iter(self.items)))
        token = secrets.token_urlsafe(18)
        self.items[token] = kept
        self.bytes += kept.size
        return token, kept

    def get(self, owner: Any, token: str, now: float) -> Kept | None:
        self.expire(now)
        kept = self.items.get(token)
        return kept if kept is not None and kept.owner == owner else None

    def expire(self, now: float) -> None:
        for token in [t for t, k in self.items.items() if k.expires <= now]:
            self._drop(token)

    def drop_owner(self, owner: Any) -> None:
        for token in [t for t, k in self.items.items() if k.owner == owner]:
            self._drop(token)

    def _drop(self, token: str) -> None:
        self.bytes -= self.items.pop(token).size


def page_of(kept: Kept, uri: str, page: int) -> dict[str, Any]:
    """A ``resources/read`` result: page ``page`` (1-based, in range) of a kept rest."""
    text = kept.pages[page - 1]
    if page < len(kept.pages):
        base = uri.split("?", 1)[0]
        text += f"\n\n[aggregator: page {page} of {len(kept.pages)}; the next is {base}?page={page + 1}]"
    return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": text}]}
