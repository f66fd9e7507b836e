"""The HTTP face of the server: a Flask app wiring authlib's AuthorizationServer to its routes.

Routes: RFC 8414 metadata (``/.well-known/oauth-authorization-server``, the same document at
``/.well-known/openid-configuration``), ``/jwks``, ``/authorize`` (a plain HTML form: user name,
password, approve or deny), ``/token``, ``/revoke``, ``/introspect``, ``/register``. With
``test_admin``, two routes for tests, answered on loopback only: ``POST /admin/rotate`` (a new
signing key; ``drop_old`` unpublishes the others) and ``POST /admin/mint`` (signs any claims with
the current key, or with a key that is never published). With ``auto_approve``, an authorization
request whose ``login_hint`` names a user is approved at once, so an SDK's flow completes
without a page.

Requests are bounded (``MAX_BODY`` bytes of body, werkzeug's limits on the request line and
headers) and nothing secret is logged: the access log has the method and path only.
"""

from __future__ import annotations

import html
import ipaddress
import secrets
import time
from typing import Any

import attrs
from authlib.common.urls import add_params_to_uri
from authlib.integrations.flask_oauth2 import AuthorizationServer
from authlib.oauth2 import OAuth2Error
from flask import Flask, Response, jsonify, request

from .grants import (
    ANY_METHOD,
    CONFIDENTIAL_METHODS,
    TOKEN_EXCHANGE,
    CodeGrant,
    Introspection,
    Issuer,
    RefreshGrant,
    Registration,
    Revocation,
    S256Challenge,
    TokenExchangeGrant,
    TokenIssuer,
)
from .keys import KeyRing
from .store import Client, Store, StoreFull, User

MAX_BODY = 64 * 1024


@attrs.frozen(kw_only=True)
class Settings:
    users: tuple[User, ...]
    clients: tuple[Client, ...] = ()
    resources: frozenset[str] = frozenset()  # empty: any absolute URI
    scopes: tuple[str, ...] = ()  # empty: any scope
    alg: str = "RS256"
    access_lifetime: int = 300
    refresh_lifetime: int = 3600
    auto_approve: bool = False
    test_admin: bool = False
    limit: int = 10_000


class Server(AuthorizationServer):
    """authlib's Flask AuthorizationServer with its issuer and metadata at hand."""

    issuer: TokenIssuer
    metadata: dict[str, Any]

    def save_token(self, token: dict[str, Any], request: Any) -> None:
        pass  # the issuer stores every token it makes


def metadata(issuer: str, settings: Settings) -> dict[str, Any]:
    document: dict[str, Any] = {
        "issuer": issuer,
        "authorization_endpoint": f"{issuer}/authorize",
        "token_endpoint": f"{issuer}/token",
        "jwks_uri": f"{issuer}/jwks",
        "registration_endpoint": f"{issuer}/register",
        "revocation_endpoint": f"{issuer}/revoke",
        "introspection_endpoint": f"{issuer}/introspect",
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": ["authorization_code", "refresh_token", TOKEN_EXCHANGE],
        "token_endpoint_auth_methods_supported": ANY_METHOD,
        "revocation_endpoint_auth_methods_supported": ANY_METHOD,
        "introspection_endpoint_auth_methods_supported": CONFIDENTIAL_METHODS,
        "code_challenge_methods_supported": ["S256"],
        "authorization_response_iss_parameter_supported": True,
        # OpenID discovery requires these two; no ID token is ever issued.
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": [settings.alg],
    }
    if settings.scopes:
        document["scopes_supported"] = list(settings.scopes)
    return document


def _is_loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def login_page(fields: dict[str, str], *, error: str = "") -> str:
    hidden = "".join(
        f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
        for k, v in fields.items()
        if k not in ("username", "password", "decision")
    )
    client = html.escape(fields.get("client_id", ""))
    resource = html.escape(fields.get("resource", "(none named)"))
    scope = html.escape(fields.get("scope", ""))
    problem = f'<p role="alert" id="error">{html.escape(error)}</p>' if error else ""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Sign in</title></head><body>
<h1>Sign in</h1>
<p>Client <code id="client">{client}</code> asks for <code id="scope">{scope}</code>
on <code id="resource">{resource}</code>.</p>
{problem}
<form method="post" action="/authorize">{hidden}
<label>User <input name="username" id="username" autocomplete="username"></label>
<label>Password <input name="password" id="password" type="password" autocomplete="current-password"></label>
<button type="submit" name="decision" value="approve" id="approve">Approve</button>
<button type="submit" name="decision" value="deny" id="deny">Deny</button>
</form></body></html>
"""


def create_app(issuer: str, settings: Settings) -> Flask:
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY
    app.config["MAX_FORM_MEMORY_SIZE"] = MAX_BODY
    app.config["MAX_FORM_PARTS"] = 100
    store = Store(users={user.name: user for user in settings.users}, limit=settings.limit)
    for client in settings.clients:
        store.add_client(client)
    keys = KeyRing(settings.alg)
    server = Server(app, query_client=store.client)
    server.issuer = TokenIssuer(
        issuer=issuer,
        keys=keys,
        store=store,
        resources=settings.resources,
        access_lifetime=settings.access_lifetime,
        refresh_lifetime=settings.refresh_lifetime,
    )
    server.metadata = metadata(issuer, settings)
    server.scopes_supported = list(settings.scopes) or None
    server.register_grant(CodeGrant, [S256Challenge(required=True)])
    server.register_grant(RefreshGrant)
    server.register_grant(TokenExchangeGrant)
    server.register_endpoint(Revocation)
    server.register_endpoint(Introspection)
    server.register_endpoint(Registration(server))
    server.register_extension(Issuer(issuer))

    @app.errorhandler(StoreFull)
    def full(_: StoreFull) -> tuple[Response, int]:
        return jsonify(error="temporarily_unavailable", error_description="the server's tables are full"), 503

    @app.get("/.well-known/oauth-authorization-server")
    @app.get("/.well-known/openid-configuration")
    def discovery() -> Response:
        return jsonify(server.metadata)

    @app.get("/jwks")
    def jwks() -> Response:
        return jsonify(keys.jwks())

    @app.route("/authorize", methods=["GET", "POST"])
    def authorize() -> Any:
        try:
            grant = server.get_consent_grant(end_user=None)
        except OAuth2Error as error:
            if error.redirect_uri:
                # RFC 9207: error responses name the issuer too.
                error.redirect_uri = add_params_to_uri(error.redirect_uri, {"iss": issuer})
                return server.handle_error_response(None, error)
            return Response(f"<p>{html.escape(error.error)}: {html.escape(error.description or '')}</p>", 400)
        fields = {k: str(v) for k, v in request.values.items()}
        if request.method == "GET":
            hinted = store.user(request.args.get("login_hint", ""))
            if settings.auto_approve and hinted is not None:
                return server.create_authorization_response(grant_user=hinted, grant=grant)
            return login_page(fields)
        if request.form.get("decision") != "approve":
            return server.create_authorization_response(grant_user=None, grant=grant)
        user = store.user(request.form.get("username", ""))
        if user is None or not user.check_password(request.form.get("password", "")):
            return Response(login_page(fields, error="Wrong user name or password."), 401)
        return server.create_authorization_response(grant_user=user, grant=grant)

    @app.post("/token")
    def token() -> Any:
        return server.create_token_response()

    @app.post("/revoke")
    def revoke() -> Any:
        return server.create_endpoint_response(Revocation.ENDPOINT_NAME)

    @app.post("/introspect")
    def introspect() -> Any:
        return server.create_endpoint_response(Introspection.ENDPOINT_NAME)

    @app.post("/register")
    def register() -> Any:
        return server.create_endpoint_response(Registration.ENDPOINT_NAME)

    if settings.test_admin:
        add_admin_routes(app, issuer, keys)
    return app


def add_admin_routes(app: Flask, issuer: str, keys: KeyRing) -> None:
    @app.before_request
    def loopback_only() -> Any:
        if request.path.startswith("/admin/") and not _is_loopback(request.remote_addr):
            return jsonify(error="forbidden"), 403
        return None

    @app.post("/admin/rotate")
    def rotate() -> Response:
        body = request.get_json(silent=True) or {}
        kid = keys.rotate(drop_old=bool(body.get("drop_old")))
        return jsonify(kid=kid, jwks=keys.jwks())

    @app.post("/admin/mint")
    def mint() -> Response:
        """Sign ``claims`` laid over a valid default set (``null`` removes a claim); ``bare``
        signs ``claims`` alone; ``unpublished`` signs with the key the JWKS never shows."""
        body = request.get_json(silent=True) or {}
        now = int(time.time())
        claims: dict[str, Any] = (
            {}
            if body.get("bare")
            else {
                "iss": issuer,
                "sub": "minted",
                "aud": "urn:example:resource",
                "exp": now + 300,
                "iat": now,
                "nbf": now,
                "jti": secrets.token_urlsafe(16),
                "client_id": "minted",
                "scope": "",
                "groups": [],
            }
        )
        claims.update(body.get("claims") or {})
        claims = {k: v for k, v in claims.items() if v is not None}
        token = keys.sign(claims, unpublished=bool(body.get("unpublished")), header=body.get("header"))
        return jsonify(token=token, claims=claims)
