"""What the proxy tells clients of its authorization: the protected resource metadata
(RFC 9728) and the ``WWW-Authenticate`` challenges (RFC 6750 section 3, RFC 9728 section 5.1).

The metadata is served at ``/.well-known/oauth-protected-resource`` and, path-suffixed, at
``/.well-known/oauth-protected-resource<path>`` for the resource's path and the MCP
endpoint's (RFC 9728 section 3.1); a 401 names its URL (``resource_metadata``), so a client
finds the authorization server from its first refused request.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from aggregator.config.model import AuthConfig

WELL_KNOWN = "/.well-known/oauth-protected-resource"


def metadata_url(auth: AuthConfig) -> str:
    """Where the metadata of ``auth.resource`` is: its origin, the well-known path, its path."""
    parts = urlsplit(auth.resource)
    path = parts.path.rstrip("/")
    return f"{parts.scheme}://{parts.netloc}{WELL_KNOWN}{path}"


def metadata_paths(auth: AuthConfig, endpoint: str) -> frozenset[str]:
    """The paths the metadata is served at on the HTTP listener (``endpoint``: ``http.path``)."""
    resource_path = urlsplit(auth.resource).path.rstrip("/")
    return frozenset({WELL_KNOWN, WELL_KNOWN + resource_path, WELL_KNOWN + endpoint.rstrip("/")})


def metadata_document(auth: AuthConfig) -> dict[str, Any]:
    document: dict[str, Any] = {
        "resource": auth.resource,
        "authorization_servers": [issuer.issuer for issuer in auth.issuers],
        "bearer_methods_supported": ["header"],
    }
    if auth.scopes_supported:
        document["scopes_supported"] = list(auth.scopes_supported)
    return document


def challenge(
    auth: AuthConfig,
    error: str | None = None,
    description: str | None = None,
    *,
    scopes: tuple[str, ...] | None = None,
) -> str:
    """A ``WWW-Authenticate`` value: ``Bearer resource_metadata="...", scope="..."``, with
    ``error`` (``invalid_token``, ``insufficient_scope``, ``invalid_request``) and its
    description when a token was given. ``scope`` names ``scopes`` when given (what a
    path needs beyond the required ones, so a client can ask for them), else the required."""
    params = [f'resource_metadata="{metadata_url(auth)}"']
    wanted = auth.required_scopes if scopes is None else scopes
    if wanted:
        params.append(f'scope="{" ".join(wanted)}"')
    if error is not None:
        params.append(f'error="{error}"')
        if description:
            params.append(f'error_description="{_quotable(description)}"')
    return "Bearer " + ", ".join(params)


def _quotable(text: str) -> str:
    """Text for a quoted-string: visible ASCII and spaces, no quote or backslash (RFC 6750 3)."""
    return "".join(char if 32 <= ord(char) <= 126 and char not in '"\\' else "?" for char in text[:200])
