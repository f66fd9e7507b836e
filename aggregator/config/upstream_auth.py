"""How the proxy authenticates to a server with each user's own credential, and where it
keeps those credentials: the ``auth`` key and ``[servers.NAME.oauth]`` table of a server,
the top-level ``[credentials]`` table, and their checks.

``auth = "static"`` (the default) sends the server's configured ``headers``, the same for
every client. ``"token-exchange"`` asks an authorization server (RFC 8693) for a token for
this server in exchange for the caller's own access token. ``"oauth"`` has the user grant
the proxy access to the server (authorization code with PKCE), and keeps the tokens in the
vault (``[credentials]``). Either credential belongs to one user: such a server is always
per-session (``isolation``), so one user's token never serves another.

The vault's key comes from ``credentials.vault_key`` or the ``AGGREGATOR_VAULT_KEY``
environment variable: 32 random bytes in base64. A config with an ``oauth`` server and no
key is refused, naming the key path. Nothing here reads a file or the network.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Literal, Protocol
from urllib.parse import urlsplit

import attrs

from aggregator.config.masking import SECRET

UpstreamAuth = Literal["static", "token-exchange", "oauth"]
PER_USER: tuple[str, ...] = ("token-exchange", "oauth")
VAULT_KEY_VARIABLE = "AGGREGATOR_VAULT_KEY"
DEFAULT_CALLBACK_PATH = "/oauth/callback"
# The pages served beside the callback, in its directory (``credentials.service.oauth_paths``).
BESIDE_CALLBACK = ("connect", "signed-in")
WELL_KNOWN = "/.well-known/"


def acts_as_users(server: _Authenticated) -> bool:
    """Whether ``server`` acts as each user (``auth`` is one of ``PER_USER``): the proxy
    never connects to it without a user, so it has no shared connection, and each session's
    own connection lists it for that session."""
    return server.auth in PER_USER


class _Authenticated(Protocol):
    @property
    def auth(self) -> str: ...


@attrs.frozen(kw_only=True)
class UpstreamOAuthConfig:
    """A server's OAuth client settings ([servers.NAME.oauth]), for ``auth = "oauth"`` and
    ``auth = "token-exchange"``."""

    # A client registered with the server's authorization server beforehand. Without one,
    # the proxy uses its client ID metadata document (credentials.client_metadata_url) when
    # the authorization server supports them, else dynamic registration (RFC 7591).
    client_id: str | None = None
    client_secret: str | None = attrs.field(default=None, metadata=SECRET)  # best given as ${VAR}
    scopes: tuple[str, ...] = ()  # asked for; empty: what the server's challenge or metadata says
    # token-exchange: the authorization server that exchanges tokens: its issuer (its token
    # endpoint is found in its metadata, RFC 8414) or its token endpoint itself.
    issuer: str | None = None
    token_endpoint: str | None = None
    # token-exchange: the audience asked for (default: the server's url, also sent as resource).
    audience: str | None = None


@attrs.frozen(kw_only=True)
class CredentialsConfig:
    """Where users' tokens for servers are kept, and how the proxy is reached back
    ([credentials])."""

    # The token vault: an SQLite file (relative: beside the config), its values encrypted.
    vault: str = "aggregator-tokens.db"
    # 32 bytes in base64 (best given as ${VAR}); None: the AGGREGATOR_VAULT_KEY variable.
    vault_key: str | None = attrs.field(default=None, metadata=SECRET)
    # Where the authorization server sends the user back: the URL of the callback path on
    # the proxy's HTTP listener as the user's browser reaches it. None: http://LISTEN/PATH.
    redirect_uri: str | None = None
    callback_path: str = DEFAULT_CALLBACK_PATH
    # The HTTPS URL of the proxy's client ID metadata document, if it publishes one.
    client_metadata_url: str | None = None
    # The proxy's own client at its [auth] issuer, where the connect page signs a browser
    # in (redirect URI: the sign-in path beside the callback). None: as for a server
    # (client ID metadata document, else dynamic registration).
    sign_in_client_id: str | None = None
    sign_in_client_secret: str | None = attrs.field(default=None, repr=False, metadata=SECRET)  # best given as ${VAR}
    # Every metadata, registration and token request: its whole time and largest answer.
    fetch_timeout: float = 10.0
    max_response_bytes: int = 256 * 1024
    # How long a user has to grant access once the authorization URL was made.
    consent_timeout: float = 600.0
    # A token is refreshed when it expires within this many seconds.
    refresh_margin: float = 60.0


class ServerConfig(Protocol):
    """What the checks read of a server's table (``model.ServerConfig``, which holds this
    module's tables)."""

    @property
    def auth(self) -> UpstreamAuth: ...
    @property
    def oauth(self) -> UpstreamOAuthConfig: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def enabled(self) -> bool: ...
    @property
    def effective_transport(self) -> str: ...


def vault_key_problem(value: str) -> str | None:
    """What is wrong with a vault key, never quoting it; None if nothing."""
    try:
        key = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return "is not base64 (make one: `openssl rand -base64 32`)"
    if len(key) != 32:
        return f"must be 32 bytes (AES-256) in base64, got {len(key)} bytes"
    return None


def check_upstream_auth(server: ServerConfig, path: str, raw: Mapping[str, object]) -> list[str]:
    """A server's ``auth`` and ``oauth`` keys; ``raw``: its table as written (to tell an
    ``isolation`` given from one defaulted)."""
    problems: list[str] = []
    oauth = server.oauth
    if server.auth == "static":
        if "oauth" in raw:
            problems.append(f'{path}.oauth: only for auth = "oauth" or "token-exchange" (auth is "static")')
        return problems
    if server.effective_transport == "stdio":
        problems.append(
            f'{path}.auth: a stdio server takes its credentials from its environment; auth = "{server.auth}"'
            " is for servers over HTTP"
        )
    elif server.effective_transport != "streamable-http":
        problems.append(
            f'{path}.auth: auth = "{server.auth}" is for servers over Streamable HTTP; this one is reached over'
            f" {server.effective_transport}"
        )
    if raw.get("isolation") == "shared":
        problems.append(
            f'{path}.isolation: a server with auth = "{server.auth}" holds each user\'s own credential, so it is'
            " per-session (one user's token never serves another); remove isolation or make it per-session"
        )
    if server.headers and any(name.lower() == "authorization" for name in server.headers):
        problems.append(f'{path}.headers.Authorization: auth = "{server.auth}" sets Authorization itself')
    if (oauth.client_id is None) and oauth.client_secret is not None:
        problems.append(f"{path}.oauth.client_secret: given without client_id")
    for key in ("issuer", "token_endpoint"):
        value = getattr(oauth, key)
        if value is not None and (problem := endpoint_problem(value)) is not None:
            problems.append(f"{path}.oauth.{key}: {problem}")
    if server.auth == "token-exchange":
        if oauth.issuer is None and oauth.token_endpoint is None:
            problems.append(
                f'{path}.oauth: auth = "token-exchange" needs the authorization server that exchanges tokens:'
                " issuer or token_endpoint"
            )
        if oauth.client_id is None:
            problems.append(f'{path}.oauth.client_id: auth = "token-exchange" needs the proxy\'s client id there')
    elif server.auth == "oauth":
        for key in ("issuer", "token_endpoint", "audience"):
            if getattr(oauth, key) is not None:
                problems.append(f'{path}.oauth.{key}: only for auth = "token-exchange" (found from the server)')
    for index, scope in enumerate(oauth.scopes):
        if not scope or any(char.isspace() or ord(char) < 33 or char in '"\\' for char in scope):
            problems.append(f"{path}.oauth.scopes[{index}]: a scope is printable ASCII without spaces or quotes")
    return problems


def endpoint_problem(url: str) -> str | None:
    """An authorization server URL in the config: https, or http on loopback."""
    lowered = url.lower()
    if lowered.startswith("https://"):
        return None
    if lowered.startswith("http://"):
        host = lowered[len("http://") :].split("/", 1)[0].rsplit("@", 1)[-1]
        host = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
        if host in ("localhost", "127.0.0.1", "[::1]") or host.startswith("127."):
            return None
        return "must be an https URL (http only on loopback)"
    return "must be an https URL"


def check_credentials(
    credentials: CredentialsConfig, servers: Mapping[str, ServerConfig], environ: Mapping[str, str]
) -> list[str]:
    """The [credentials] table, and a vault key whenever a server keeps tokens in the vault."""
    problems: list[str] = []
    if not credentials.callback_path.startswith("/"):
        problems.append("credentials.callback_path: must start with /")
    for key in ("redirect_uri", "client_metadata_url"):
        value = getattr(credentials, key)
        if value is not None and (problem := endpoint_problem(value)) is not None:
            problems.append(f"credentials.{key}: {problem}")
    if credentials.client_metadata_url is not None and not credentials.client_metadata_url.lower().startswith(
        "https://"
    ):
        problems.append("credentials.client_metadata_url: a client ID metadata document is served over https")
    if credentials.sign_in_client_secret is not None and credentials.sign_in_client_id is None:
        problems.append("credentials.sign_in_client_secret: given without sign_in_client_id")
    if not credentials.vault:
        problems.append("credentials.vault: must name a file")
    users = [name for name, server in servers.items() if server.enabled and server.auth == "oauth"]
    if credentials.vault_key is not None:
        if (problem := vault_key_problem(credentials.vault_key)) is not None:
            problems.append(f"credentials.vault_key: {problem}; it is not shown")
    elif users:
        given = environ.get(VAULT_KEY_VARIABLE)
        if given is None:
            problems.append(
                f'credentials.vault_key: required, as servers.{users[0]} (auth = "oauth") keeps users\' tokens in'
                f" the vault: set it, or the {VAULT_KEY_VARIABLE} environment variable, to 32 random bytes in base64"
            )
        elif (problem := vault_key_problem(given)) is not None:
            problems.append(f"credentials.vault_key: the {VAULT_KEY_VARIABLE} variable {problem}; it is not shown")
    return problems


def oauth_path_problems(credentials: CredentialsConfig, taken: Mapping[str, str]) -> list[str]:
    """The callback's path (``callback_path``, and the path of ``redirect_uri``, where
    browsers are sent) and the pages beside it must be paths of their own: ``taken`` holds
    the proxy's other paths on its HTTP listener, each with what serves it."""
    problems: list[str] = []
    uri = credentials.redirect_uri
    for key, path in (
        ("callback_path", credentials.callback_path),
        ("redirect_uri", urlsplit(uri).path if uri is not None and endpoint_problem(uri) is None else ""),
    ):
        if path.startswith("/") and (clash := _path_clash(path, taken)) is not None:
            problems.append(f"credentials.{key}: {clash}; the OAuth callback and its pages need paths of their own")
    return problems


def _path_clash(path: str, taken: Mapping[str, str]) -> str | None:
    directory, _, last = path.rpartition("/")
    if last in BESIDE_CALLBACK:
        return f"its path {path} is where the {last} page beside the callback is served"
    for own in (path, *(f"{directory}/{page}" for page in BESIDE_CALLBACK)):
        what = taken.get(own) or ("the proxy's well-known metadata" if own.startswith(WELL_KNOWN) else None)
        if what is not None:
            shown = f"its path {path}" if own == path else f"its path {path} puts a page at {own}, which"
            return f"{shown} collides with {what}"
    return None


def vault_key_bytes(credentials: CredentialsConfig, environ: Mapping[str, str]) -> bytes | None:
    """The vault key (checked at load), or None when none is given."""
    value = credentials.vault_key if credentials.vault_key is not None else environ.get(VAULT_KEY_VARIABLE)
    if value is None or vault_key_problem(value) is not None:
        return None
    return base64.b64decode(value.strip(), validate=True)
