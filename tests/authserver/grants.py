"""authlib's grants and endpoints bound to the in-memory store, and the one grant authlib lacks.

``TokenIssuer`` makes every access token: an RFC 9068 JWT whose ``aud`` is the RFC 8707
``resource`` of the request (one resource per token), with the user's ``groups``. The grants
below only decide *which* resource, scope and user a token is for, then ask the issuer:

- ``CodeGrant``: authorization code with PKCE, S256 only and required of every client;
  the resource named at ``/authorize`` is bound to the code, and a token request may repeat it
  but not change it.
- ``RefreshGrant``: rotating refresh tokens (each use spends the old one); the new access token
  is for the same resource.
- ``TokenExchangeGrant`` (RFC 8693): a confidential client hands in an access token this
  server issued and gets one for another audience, same ``sub``, with an ``act`` claim naming
  the client (nested when the subject token already had one).

When the server is started with allowed resources, a token for anything else, or for no named
resource, is refused with ``invalid_target``; without them any absolute URI is accepted, and a
request naming none gets a token for the client itself (RFC 9068's default audience).
"""

from __future__ import annotations

import secrets
import time
from typing import Any
from urllib.parse import urlsplit

from authlib.oauth2.rfc6749 import OAuth2Error, grants, list_to_scope, scope_to_list
from authlib.oauth2.rfc6749.errors import (
    InvalidGrantError,
    InvalidRequestError,
    InvalidScopeError,
    UnauthorizedClientError,
)
from authlib.oauth2.rfc6749.grants.base import BaseGrant, TokenEndpointMixin
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7591 import ClientRegistrationEndpoint
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oauth2.rfc7662 import IntrospectionEndpoint
from authlib.oauth2.rfc9207 import IssuerParameter

from .keys import KeyRing
from .store import AuthorizationCode, Client, Store, Token, User, new_secret

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
JWT_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:jwt"
CODE_LIFETIME = 300  # seconds; OAuth 2.1 recommends at most 10 minutes
CONFIDENTIAL_METHODS = ["client_secret_basic", "client_secret_post"]
ANY_METHOD = [*CONFIDENTIAL_METHODS, "none"]


class UsesIssuer:
    """A grant or endpoint reaches the store and the keys through the server's issuer."""

    server: Any

    @property
    def issuer(self) -> TokenIssuer:
        return self.server.issuer  # type: ignore[no-any-return]


class InvalidTargetError(OAuth2Error):
    """RFC 8707 section 2: the resource is not one this server issues tokens for."""

    error = "invalid_target"


def requested_target(request: Any, name: str) -> str | None:
    """The one ``resource`` (or, for token exchange, ``audience``) the request names, if any."""
    values = [v for v in request.payload.datalist.get(name, []) if v]
    if len(values) > 1:
        raise InvalidTargetError(description=f"one '{name}' per request")
    return str(values[0]) if values else None


class TokenIssuer:
    def __init__(
        self,
        *,
        issuer: str,
        keys: KeyRing,
        store: Store,
        resources: frozenset[str],
        access_lifetime: int,
        refresh_lifetime: int,
    ) -> None:
        self.issuer = issuer
        self.keys = keys
        self.store = store
        self.resources = resources
        self.access_lifetime = access_lifetime
        self.refresh_lifetime = refresh_lifetime

    def check_resource(self, resource: str | None, *, logical: bool = False) -> None:
        """Refuse a resource this server does not issue tokens for (``None``: none named).
        A ``logical`` name (RFC 8693's ``audience``) need not be a URI."""
        if resource is None:
            if self.resources:
                raise InvalidTargetError(description="a 'resource' is required")
            return
        parts = urlsplit(resource)
        if not logical and (not parts.scheme or not parts.netloc or "#" in resource):
            raise InvalidTargetError(description="'resource' must be an absolute URI without a fragment")
        if self.resources and resource not in self.resources:
            raise InvalidTargetError(description="that resource is not served by this server")

    def issue(
        self,
        *,
        client: Client,
        user: User,
        scope: str,
        resource: str | None,
        refresh: bool,
        act: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": user.name,
            "aud": resource if resource is not None else client.client_id,
            "exp": now + self.access_lifetime,
            "iat": now,
            "nbf": now,
            "jti": secrets.token_urlsafe(16),
            "client_id": client.client_id,
            "scope": scope,
            "groups": list(user.groups),
        }
        if act is not None:
            claims["act"] = act
        access_token = self.keys.sign(claims)
        record = Token(
            access_token=access_token, claims=claims, client_id=client.client_id, user_name=user.name, resource=resource
        )
        answer: dict[str, Any] = {
            "token_type": "Bearer",
            "access_token": access_token,
            "expires_in": self.access_lifetime,
        }
        if scope:
            answer["scope"] = scope
        if refresh:
            record.refresh_token = new_secret()
            record.refresh_expires_at = now + self.refresh_lifetime
            answer["refresh_token"] = record.refresh_token
        self.store.add_token(record)
        return answer


class S256Challenge(CodeChallenge):
    """PKCE as OAuth 2.1 has it: every authorization request carries an S256 challenge."""

    SUPPORTED_CODE_CHALLENGE_METHOD = ["S256"]

    def validate_code_challenge(self, grant: Any, redirect_uri: str) -> None:
        data = grant.request.payload.data
        if not data.get("code_challenge"):
            raise InvalidRequestError("Missing 'code_challenge'")
        if data.get("code_challenge_method") != "S256":
            raise InvalidRequestError("'code_challenge_method' must be S256")
        super().validate_code_challenge(grant, redirect_uri)

    def get_authorization_code_challenge(self, authorization_code: AuthorizationCode) -> str:
        return authorization_code.code_challenge

    def get_authorization_code_challenge_method(self, authorization_code: AuthorizationCode) -> str:
        return authorization_code.code_challenge_method


class CodeGrant(UsesIssuer, grants.AuthorizationCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ANY_METHOD

    def validate_authorization_request(self) -> str:
        redirect_uri = super().validate_authorization_request()
        try:
            self.issuer.check_resource(requested_target(self.request, "resource"))
        except OAuth2Error as error:
            error.redirect_uri = redirect_uri
            raise
        return str(redirect_uri)

    def save_authorization_code(self, code: str, request: Any) -> None:
        data = request.payload.data
        self.issuer.store.add_code(
            AuthorizationCode(
                code=code,
                client_id=request.client.client_id,
                user_name=request.user.name,
                redirect_uri=request.payload.redirect_uri,  # the token request repeats it if it was sent
                scope=request.scope or "",
                resource=requested_target(request, "resource"),
                code_challenge=data["code_challenge"],
                code_challenge_method=data["code_challenge_method"],
                expires_at=time.time() + CODE_LIFETIME,
            )
        )

    def query_authorization_code(self, code: str, client: Client) -> AuthorizationCode | None:
        return self.issuer.store.take_code(code, client.client_id)

    def delete_authorization_code(self, authorization_code: AuthorizationCode) -> None:
        pass  # spent when it was looked up (single use)

    def authenticate_user(self, authorization_code: AuthorizationCode) -> User | None:
        return self.issuer.store.user(authorization_code.user_name)

    def generate_token(self, user: Any = None, scope: Any = None, **_: Any) -> dict[str, Any]:
        granted = self.request.authorization_code.resource
        requested = requested_target(self.request, "resource")
        if requested is not None and granted is not None and requested != granted:
            raise InvalidTargetError(description="'resource' differs from the authorization request's")
        resource = granted if granted is not None else requested
        self.issuer.check_resource(resource)
        refresh = self.request.client.check_grant_type("refresh_token")
        return self.issuer.issue(
            client=self.request.client, user=user, scope=scope or "", resource=resource, refresh=refresh
        )


class RefreshGrant(UsesIssuer, grants.RefreshTokenGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ANY_METHOD
    INCLUDE_NEW_REFRESH_TOKEN = True

    def authenticate_refresh_token(self, refresh_token: str) -> Token | None:
        token = self.issuer.store.by_refresh_token(refresh_token)
        return token if token is not None and token.refresh_usable() else None

    def authenticate_user(self, refresh_token: Token) -> User | None:
        return self.issuer.store.user(refresh_token.user_name)

    def revoke_old_credential(self, refresh_token: Token) -> None:
        self.issuer.store.revoke(refresh_token, refresh_only=True)

    def generate_token(self, user: Any = None, scope: Any = None, **_: Any) -> dict[str, Any]:
        granted = self.request.refresh_token.resource
        requested = requested_target(self.request, "resource")
        if requested is not None and requested != granted:
            raise InvalidTargetError(description="a refresh token serves the resource it was issued for")
        self.issuer.check_resource(granted)
        return self.issuer.issue(
            client=self.request.client, user=user, scope=scope or "", resource=granted, refresh=True
        )


class TokenExchangeGrant(UsesIssuer, BaseGrant, TokenEndpointMixin):
    """RFC 8693 for one case: an access token of this server in, one for another audience out."""

    GRANT_TYPE = TOKEN_EXCHANGE
    TOKEN_ENDPOINT_AUTH_METHODS = CONFIDENTIAL_METHODS

    def validate_token_request(self) -> None:
        client = self.authenticate_token_endpoint_client()
        if not client.check_grant_type(self.GRANT_TYPE):
            raise UnauthorizedClientError(f"The client is not authorized to use 'grant_type={self.GRANT_TYPE}'")
        form = self.request.form
        if not form.get("subject_token") or not form.get("subject_token_type"):
            raise InvalidRequestError("'subject_token' and 'subject_token_type' are required")
        if form["subject_token_type"] not in (ACCESS_TOKEN_TYPE, JWT_TOKEN_TYPE):
            raise InvalidRequestError("unsupported 'subject_token_type'")
        if form.get("actor_token"):
            raise InvalidRequestError("'actor_token' is not supported")
        if form.get("requested_token_type") not in (None, ACCESS_TOKEN_TYPE):
            raise InvalidRequestError("only access tokens are issued")
        subject = self.issuer.store.by_access_token(form["subject_token"])
        if subject is None or subject.is_expired() or subject.is_revoked():
            raise InvalidGrantError("'subject_token' is not an active access token of this server")
        target = requested_target(self.request, "resource")
        logical = target is None
        if logical:
            target = requested_target(self.request, "audience")
        if target is None:
            raise InvalidTargetError(description="'resource' or 'audience' names the target")
        self.issuer.check_resource(target, logical=logical)
        granted = scope_to_list(subject.get_scope()) or []
        requested = scope_to_list(self.request.payload.scope) if self.request.payload.scope else granted
        if not set(requested) <= set(granted):
            raise InvalidScopeError("the new token cannot have more scope than the subject token")
        self.request.client = client
        self.subject = subject
        self.target = target
        self.scope = list_to_scope(requested)

    def create_token_response(self) -> tuple[int, dict[str, Any], list[tuple[str, str]]]:
        user = self.issuer.store.user(self.subject.user_name)
        if user is None:
            raise InvalidGrantError("the subject token's user is gone")
        act: dict[str, Any] = {"sub": self.request.client.client_id}
        if "act" in self.subject.claims:
            act["act"] = self.subject.claims["act"]
        token = self.issuer.issue(
            client=self.request.client, user=user, scope=self.scope, resource=self.target, refresh=False, act=act
        )
        token["issued_token_type"] = ACCESS_TOKEN_TYPE
        return 200, token, self.TOKEN_RESPONSE_HEADER


def _find(store: Store, token_string: str, hint: str | None) -> tuple[str, Token] | None:
    order = ("refresh_token", "access_token") if hint == "refresh_token" else ("access_token", "refresh_token")
    for kind in order:
        found = store.by_access_token(token_string) if kind == "access_token" else store.by_refresh_token(token_string)
        if found is not None:
            return kind, found
    return None


class Revocation(UsesIssuer, RevocationEndpoint):
    """RFC 7009. Revoking either token of a grant (the access token or the refresh token issued
    beside it) ends both; a token of another client, or one this server never issued, is
    answered 200 and left alone."""

    CLIENT_AUTH_METHODS = ANY_METHOD

    def authenticate_token(self, request: Any, client: Client) -> tuple[str, Token] | None:
        self.check_params(request, client)
        found = _find(self.issuer.store, request.form["token"], request.form.get("token_type_hint"))
        if found is None or not found[1].check_client(client):
            return None
        return found

    def revoke_token(self, token: tuple[str, Token], request: Any) -> None:
        self.issuer.store.revoke(token[1])


class Introspection(UsesIssuer, IntrospectionEndpoint):
    """RFC 7662 for confidential clients (resource servers): any of them may ask about any token."""

    CLIENT_AUTH_METHODS = CONFIDENTIAL_METHODS

    def query_token(self, token_string: str, token_type_hint: str | None) -> tuple[str, Token] | None:
        return _find(self.issuer.store, token_string, token_type_hint)

    def check_permission(self, token: Any, client: Client, request: Any) -> bool:
        return not client.is_public

    def create_introspection_payload(self, token: tuple[str, Token] | None) -> dict[str, Any]:
        if token is None:
            return {"active": False}
        kind, record = token
        if kind == "refresh_token":
            if not record.refresh_usable():
                return {"active": False}
            fields = {k: record.claims[k] for k in ("iss", "sub", "aud", "client_id", "scope")}
            return {"active": True, "token_type": "refresh_token", **fields, "exp": int(record.refresh_expires_at)}
        if record.is_expired() or record.is_revoked():
            return {"active": False}
        return {"active": True, "token_type": "Bearer", "username": record.user_name, **record.claims}


class Registration(UsesIssuer, ClientRegistrationEndpoint):
    """RFC 7591, open (no initial access token). Public clients (``token_endpoint_auth_method``
    ``none``) get no secret; every client that uses the code grant must register redirect URIs."""

    def authenticate_token(self, request: Any) -> bool:
        return True

    def get_server_metadata(self) -> dict[str, Any]:
        return self.server.metadata  # type: ignore[no-any-return]

    def extract_client_metadata(self, request: Any) -> dict[str, Any]:
        metadata: dict[str, Any] = super().extract_client_metadata(request)
        metadata.setdefault("grant_types", ["authorization_code", "refresh_token"])
        metadata.setdefault("response_types", ["code"])
        metadata.setdefault("token_endpoint_auth_method", "client_secret_basic")
        if "authorization_code" in metadata["grant_types"] and not metadata.get("redirect_uris"):
            raise InvalidRequestError("'redirect_uris' are required for the authorization code grant")
        return metadata

    def generate_client_info(self, request: Any) -> dict[str, Any]:
        info: dict[str, Any] = super().generate_client_info(request)
        if (request.payload.data or {}).get("token_endpoint_auth_method") == "none":
            del info["client_secret"], info["client_secret_expires_at"]
        return info

    def save_client(self, client_info: dict[str, Any], client_metadata: dict[str, Any], request: Any) -> Client:
        client = Client(
            client_id=client_info["client_id"], client_secret=client_info.get("client_secret"), metadata=client_metadata
        )
        self.issuer.store.add_client(client)
        return client


class Issuer(IssuerParameter):
    """RFC 9207: every authorization response, errors included, names the issuer."""

    def __init__(self, issuer: str) -> None:
        self.issuer = issuer

    def get_issuer(self) -> str:
        return self.issuer
