"""Masking a server's secrets, the values of its ``env`` and ``headers`` (tokens, keys), in
text that others see: its stderr lines, and why its connection failed (the log, ``check``,
the ``lastError`` its callers are told, the error a request gets when the server cannot be
reached). The one rule for all of them: every value of at least ``MIN_SECRET`` characters
becomes ``***``, as it is and as an exception's text shows it (escaped, or a line of it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

MIN_SECRET = 4
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


class SecretMask:
    """Replaces the given secrets in a text by ***."""

    __slots__ = ("forms",)

    def __init__(self, secrets: Iterable[str]) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if len(secret) < MIN_SECRET:
                continue
            forms.add(secret)
            forms.add(repr(secret)[1:-1])  # as an exception shows a str ('...\n')
            forms.add(repr(secret.encode("utf-8", "replace"))[2:-1])  # ... or bytes (b'...\n')
            # A line of it (a message cut at its first line break, a value with a stray newline).
            forms.update(part for part in _CONTROL.split(secret) if len(part) >= MIN_SECRET)
        # Longest first: a form that holds another is replaced whole.
        self.forms = tuple(sorted(forms, key=len, reverse=True))

    @classmethod
    def of(cls, config: Any) -> SecretMask:
        """The secrets of a server's config: the values of its ``env`` and ``headers``."""
        return cls((*config.env.values(), *config.headers.values()))

    def __call__(self, text: str) -> str:
        for form in self.forms:
            if form in text:
                text = text.replace(form, "***")
        return text
