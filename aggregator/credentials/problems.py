"""What can go wrong getting a user's credential for a server, as errors that say what to
tell the user and never quote a token, a code or a secret."""

from __future__ import annotations

import secrets

from aggregator.errors import AggregatorError


class CredentialError(AggregatorError):
    """No credential could be had for a server: metadata, registration or a token request
    failed, or what an authorization server said cannot be used."""


class UnsafeUrl(CredentialError):
    """A URL from a server's or authorization server's metadata (or a challenge) that the
    proxy refuses to fetch or to hand to a user: not http(s), plain http off loopback, or a
    private, link-local or metadata address. Refused before any connection is made."""


class ConsentRequired(CredentialError):
    """The user must grant the proxy access to ``server`` first, at ``url`` (an http(s)
    authorization URL, already checked). Whoever serves the user says so: a URL-mode
    elicitation, error -32042, or an error naming the URL."""

    def __init__(self, server: str, url: str, elicitation_id: str | None = None) -> None:
        super().__init__(f"server {server!r} needs your permission first: open {url}")
        self.server = server
        self.url = url
        # Names it to a client as a URL-mode elicitation (opaque, unique; not the state).
        self.elicitation_id = elicitation_id or secrets.token_urlsafe(16)
