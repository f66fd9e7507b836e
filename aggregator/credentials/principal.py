"""Who a credential belongs to: a user, named by the authorization server that vouches for
them (its issuer) and the subject it names them by. A subject is unique only at its issuer,
so both together are the key of everything kept per user."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class Principal:
    issuer: str
    subject: str

    def __str__(self) -> str:
        return f"{self.subject} ({self.issuer})"
