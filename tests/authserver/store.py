"""The server's state, in memory: users, registered clients, authorization codes and tokens.

Every table is bounded (``limit`` rows): a full table refuses new rows rather than growing, and
expired codes and tokens are dropped before a new row is refused. One lock guards all tables,
since the HTTP server answers each request on its own thread. This module knows nothing of
HTTP or of authlib's request objects; the records implement authlib's model mixins.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from typing import Any

import attrs
from authlib.oauth2.rfc6749 import AuthorizationCodeMixin, ClientMixin, TokenMixin, list_to_scope, scope_to_list


class StoreFull(Exception):
    """A table is at its limit."""


@attrs.frozen(kw_only=True)
class User:
    name: str
    password: str = attrs.field(repr=False)
    groups: tuple[str, ...] = ()

    def get_user_id(self) -> str:
        return self.name

    def check_password(self, password: str) -> bool:
        return hmac.compare_digest(self.password.encode(), password.encode())


@attrs.define(eq=False)
class Client(ClientMixin):
    """A client as RFC 7591 describes it: ``metadata`` holds its registered fields."""

    client_id: str
    client_secret: str | None = attrs.field(default=None, repr=False)
    metadata: dict[str, Any] = attrs.Factory(dict)

    @property
    def auth_method(self) -> str:
        default = "client_secret_basic" if self.client_secret else "none"
        return str(self.metadata.get("token_endpoint_auth_method", default))

    @property
    def is_public(self) -> bool:
        return self.auth_method == "none"

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        uris = self.metadata.get("redirect_uris") or []
        return uris[0] if len(uris) == 1 else None

    def get_allowed_scope(self, scope: str | None) -> str:
        if not scope:
            return ""
        registered = self.metadata.get("scope")
        if registered is None:
            return list_to_scope(scope_to_list(scope))
        allowed = set(scope_to_list(registered))
        return list_to_scope([s for s in scope_to_list(scope) if s in allowed])

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        # Exact string matching (OAuth 2.1 section 4.1.1): no prefixes, no normalisation.
        return redirect_uri in (self.metadata.get("redirect_uris") or [])

    def check_client_secret(self, client_secret: str) -> bool:
        if not self.client_secret:
            return False
        return hmac.compare_digest(self.client_secret.encode(), client_secret.encode())

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        if endpoint == "token":
            return method == self.auth_method
        # Revocation and introspection: a confidential client may use either secret method.
        if self.is_public:
            return method == "none"
        return method in ("client_secret_basic", "client_secret_post")

    def check_response_type(self, response_type: str) -> bool:
        return response_type in self.metadata.get("response_types", ["code"])

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type in self.metadata.get("grant_types", ["authorization_code", "refresh_token"])


@attrs.define(eq=False)
class AuthorizationCode(AuthorizationCodeMixin):
    code: str = attrs.field(repr=False)
    client_id: str
    user_name: str
    redirect_uri: str | None
    scope: str
    resource: str | None
    code_challenge: str
    code_challenge_method: str
    expires_at: float

    def get_redirect_uri(self) -> str | None:
        return self.redirect_uri

    def get_scope(self) -> str:
        return self.scope

    def is_expired(self) -> bool:
        return time.time() >= self.expires_at


@attrs.define(eq=False)
class Token(TokenMixin):
    """An issued access token, with the refresh token issued beside it, if any."""

    access_token: str = attrs.field(repr=False)
    claims: dict[str, Any]
    client_id: str
    user_name: str
    resource: str | None  # the RFC 8707 resource the token is for (its ``aud``), if one was named
    refresh_token: str | None = attrs.field(default=None, repr=False)
    refresh_expires_at: float = 0.0
    access_revoked: bool = False
    refresh_revoked: bool = False

    @property
    def jti(self) -> str:
        return str(self.claims["jti"])

    def check_client(self, client: ClientMixin) -> bool:
        return self.client_id == client.get_client_id()

    def get_scope(self) -> str:
        return str(self.claims.get("scope", ""))

    def get_expires_in(self) -> int:
        return int(self.claims["exp"]) - int(self.claims["iat"])

    def is_expired(self) -> bool:
        return time.time() >= float(self.claims["exp"])

    def is_revoked(self) -> bool:
        return self.access_revoked

    def refresh_usable(self) -> bool:
        return not self.refresh_revoked and time.time() < self.refresh_expires_at


@attrs.define(eq=False)
class Store:
    users: dict[str, User]
    limit: int = 10_000
    clients: dict[str, Client] = attrs.Factory(dict)
    codes: dict[str, AuthorizationCode] = attrs.Factory(dict)
    tokens: dict[str, Token] = attrs.Factory(dict)  # by access token
    refresh: dict[str, Token] = attrs.Factory(dict)  # by refresh token
    lock: threading.Lock = attrs.Factory(threading.Lock)

    def user(self, name: str) -> User | None:
        return self.users.get(name)

    def client(self, client_id: str) -> Client | None:
        with self.lock:
            return self.clients.get(client_id)

    def add_client(self, client: Client) -> None:
        with self.lock:
            if len(self.clients) >= self.limit:
                raise StoreFull("clients")
            self.clients[client.client_id] = client

    def add_code(self, code: AuthorizationCode) -> None:
        with self.lock:
            self._drop_expired()
            if len(self.codes) >= self.limit:
                raise StoreFull("codes")
            self.codes[code.code] = code

    def take_code(self, code: str, client_id: str) -> AuthorizationCode | None:
        """The code if it is live and was issued to ``client_id``; it is spent by being looked at
        for its own client (single use: a second exchange of the same code finds nothing)."""
        with self.lock:
            found = self.codes.get(code)
            if found is None or found.client_id != client_id:
                return None
            del self.codes[code]
            return None if found.is_expired() else found

    def add_token(self, token: Token) -> None:
        with self.lock:
            self._drop_expired()
            if len(self.tokens) >= self.limit:
                raise StoreFull("tokens")
            self.tokens[token.access_token] = token
            if token.refresh_token:
                self.refresh[token.refresh_token] = token

    def by_access_token(self, access_token: str) -> Token | None:
        with self.lock:
            return self.tokens.get(access_token)

    def by_refresh_token(self, refresh_token: str) -> Token | None:
        with self.lock:
            return self.refresh.get(refresh_token)

    def revoke(self, token: Token, *, refresh_only: bool = False) -> None:
        """End the refresh token, and unless ``refresh_only`` (a rotation) the access token."""
        with self.lock:
            token.refresh_revoked = True
            if not refresh_only:
                token.access_revoked = True

    def _drop_expired(self) -> None:
        now = time.time()
        for code in [c for c, row in self.codes.items() if row.expires_at <= now]:
            del self.codes[code]
        for access, row in list(self.tokens.items()):
            if float(row.claims["exp"]) <= now and not row.refresh_usable():
                del self.tokens[access]
                if row.refresh_token:
                    self.refresh.pop(row.refresh_token, None)


def new_secret(nbytes: int = 32) -> str:
    return secrets.token_urlsafe(nbytes)
