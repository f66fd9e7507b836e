"""The proxy as an OAuth 2.1 resource server: who is calling, from an access token.

The MCP authorization spec (2025-06-18 and later, ``basic/authorization``) makes an MCP
server behind HTTP a resource server: it validates the access tokens an authorization
server issued for it, tells clients where that server is (RFC 9728 metadata, and the
``WWW-Authenticate`` challenge that points at it), and refuses tokens meant for another
resource (RFC 8707 audience). Configured in ``[auth]`` (``config.model.AuthConfig``).

- ``principal``: who a token names (``Principal``: issuer and subject, its scopes, the
  profiles its claims match); the identity a session and its limits key on;
- ``keys``: an issuer's signing keys (JWKS), discovered, fetched with bounds, cached and
  refreshed on an unknown key id at most once per interval;
- ``tokens``: ``TokenVerifier``, a JWT checked locally (joserfc) or an opaque token
  introspected (RFC 7662), each result cached by the token's hash until it expires;
- ``metadata``: the protected resource metadata document and the challenges.

The fronts ask ``fronts.access.AccessPolicy``, which asks the verifier; nothing here knows
of a front. Tokens are never logged, never kept in clear (their SHA-256 keys the cache),
never sent upstream.

Floor 7 with the fronts (tests/core/test_layering.py): may import ``config``,
``transports``, ``errors`` and ``credentials.urls`` (the rules for a URL a stranger's
metadata names, the same as the OAuth client's); fetches with httpx, on trio.
"""

from __future__ import annotations

from aggregator.fronts.authorization.metadata import challenge, metadata_document, metadata_paths, metadata_url
from aggregator.fronts.authorization.principal import Principal, Rejection, who

# ``tokens`` (the verifier: joserfc, cryptography, httpx) is imported where an ``[auth]``
# table builds one, never at start-up: a proxy without it does not load them.

__all__ = [
    "Principal",
    "Rejection",
    "challenge",
    "metadata_document",
    "metadata_paths",
    "metadata_url",
    "who",
]
