"""Who may use the network endpoints: Host and Origin allowlists, bearer tokens.

Shared by the Streamable HTTP, legacy SSE and WebSocket endpoints, so every way in is
checked the same way, before anything else happens. DNS rebinding makes a hostile page's
Origin and Host name the attacker's domain, so "Origin equals Host" proves nothing: both
are checked against allowlists (by default loopback names, any port). Tokens are compared
in constant time, never taken from a URL, never logged.

Also owns the rule applied before any listener opens (``check_exposure``): no listening
beyond loopback without tokens, unless the config says the network is trusted.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable, Mapping
from typing import Any

from aggregator.config import HttpConfig, parse_listen
from aggregator.errors import ConfigError


def check_exposure(
    config: HttpConfig, listen: str, option: str = "--http", token_keys: str = "http.auth_tokens"
) -> None:
    """Refuse to serve beyond loopback without authentication, unless told to.

    ``option`` names where ``listen`` came from (``--http``, ``http.listen``) for the
    message, ``token_keys`` the keys that would set tokens for it; raises ConfigError for
    an address that cannot be parsed or may not be used.
    """
    try:
        host, _ = parse_listen(listen)
    except ValueError as exc:
        raise ConfigError(f"{option}: {exc}") from None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not config.auth_tokens and not config.allow_unauthenticated_remote:
        raise ConfigError(
            f"refusing to serve on {host} without authentication: set {token_keys}, or"
            " http.allow_unauthenticated_remote = true if the network is trusted"
        )


class AccessPolicy:
    def __init__(self, config: HttpConfig, profiles: Mapping[str, Any] | None = None) -> None:
        # Every accepted token, and the profile it selects ("default" for http.auth_tokens).
        pairs = [(token, "default") for token in config.auth_tokens]
        pairs += [(token, name) for name, profile in (profiles or {}).items() for token in profile.tokens]
        self._tokens = [token.encode() for token, _ in pairs]
        self._profiles = [profile for _, profile in pairs]
        # Entries may name a port; the match is on the host name, any port.
        self._hosts = {_hostname(host) for host in config.allowed_hosts}
        self._origins = {_origin(origin) for origin in config.allowed_origins}
        self.endpoint = config.path  # the MCP endpoint's path, under which profiles have theirs
        self._profile_names = frozenset(profiles or ())
        self._seen: dict[tuple[str, Callable[[str], str]], bool] = {}  # (value, its check) -> allowed

    def refusal(self, headers: Mapping[str, str]) -> tuple[int, str, list[tuple[str, str]]] | None:
        """Why a request may not proceed (status, reason, extra headers), or None."""
        host = headers.get("host", "")
        if not self._allowed(host, self._hosts, _hostname):
            return 421, f"this Host is not served here: {host[:100]!r}", []
        origin = headers.get("origin")
        if origin is not None:
            if not self._allowed(origin, self._origins, _origin):
                return 403, f"this Origin may not use this server: {origin[:100]!r}", []
        if self._tokens and self.principal(headers) is None:
            return 401, "a valid bearer token is required", [("www-authenticate", 'Bearer realm="aggregator"')]
        return None

    def _allowed(self, value: str, allowed: Any, normal: Callable[[str], str]) -> bool:
        """Whether ``value`` (a Host or Origin) is allowed; the answers for the last few
        values seen are kept (a client sends the same ones with every request)."""
        seen = self._seen
        key = (value, normal)  # (a Host and an Origin of the same spelling are not the same)
        known = seen.get(key)
        if known is None:
            known = normal(value) in allowed
            if len(seen) >= 64:
                seen.clear()
            seen[key] = known
        return known

    def principal(self, headers: Mapping[str, str]) -> int | None:
        """Which configured token the request carries, or None (also when none are set)."""
        if not self._tokens:
            return None
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        found = None
        candidate = token.strip().encode()
        for index, expected in enumerate(self._tokens):
            if hmac.compare_digest(candidate, expected):
                found = index
        return found

    def named_profile(self, target: str) -> str | None:
        """The profile a request's path names: "" for the MCP endpoint itself (``/mcp``), the
        name for ``/mcp/<profile>`` when that profile is configured, None for any other path.
        A query (``?...``) is ignored."""
        path = target.partition("?")[0]
        endpoint = self.endpoint
        if path == endpoint:
            return ""
        if path.startswith(endpoint) and path[len(endpoint) : len(endpoint) + 1] == "/":
            name = path[len(endpoint) + 1 :]
            if name in self._profile_names:
                return name
        return None

    def profile(self, principal: int | None) -> str:
        """The profile a request's token selects ("default" without tokens)."""
        return "default" if principal is None else self._profiles[principal]


def _origin(origin: str) -> str:
    """ "HTTP://Example.com:8000/" -> "http://example.com"."""
    scheme, _, rest = origin.lower().partition("://")
    return f"{scheme}://{_hostname(rest)}"


def _hostname(host_and_port: str) -> str:
    """ "[::1]:8000" -> "[::1]", "Example.com:80" -> "example.com"."""
    value = host_and_port.strip().lower().split("/", 1)[0]
    if value.startswith("["):
        end = value.find("]")
        if end == -1:
            return value
        host, rest = value[: end + 1], value[end + 1 :]
    else:
        host, colon, port = value.partition(":")
        rest = colon + port
    # A port is one to five ASCII digits; anything else ("127.0.0.1:²") is no host of ours:
    # the value as it is matches no allowlist entry.
    if rest and not (rest[0] == ":" and 1 < len(rest) <= 6 and rest[1:].isascii() and rest[1:].isdigit()):
        return value
    return host
