"""The authorization server against itself: discovery, keys, the code flow with PKCE, refresh,
revocation, introspection, registration, token exchange, the test-only routes and its bounds.

Each token is checked as a resource server would check it: its signature against the
published JWKS, then its claims.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from tests.authserver.harness import (
    AuthServer,
    Registered,
    decode_unverified,
    pkce_pair,
    redirected_query,
    start_authserver,
)

RESOURCE = "http://127.0.0.1:9999/mcp"
OTHER = "http://127.0.0.1:9998/mcp"
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"


def verified(server: AuthServer, token: str) -> dict[str, Any]:
    """The claims of a token whose signature the published JWKS verifies."""
    keys = KeySet.import_key_set(server.jwks())  # type: ignore[arg-type]
    return dict(jwt.decode(token, keys).claims)


def exchanger(server: AuthServer) -> Registered:
    grants = ["authorization_code", "refresh_token", TOKEN_EXCHANGE]
    return server.register(grant_types=grants, redirect_uri="http://127.0.0.1:2/callback")


def test_discovery_documents(authserver: AuthServer) -> None:
    rfc8414 = authserver.metadata()
    oidc = authserver.http.get(authserver.url("/.well-known/openid-configuration")).json()
    assert rfc8414 == oidc
    assert rfc8414["issuer"] == authserver.issuer
    assert rfc8414["code_challenge_methods_supported"] == ["S256"]
    assert rfc8414["authorization_response_iss_parameter_supported"] is True
    assert TOKEN_EXCHANGE in rfc8414["grant_types_supported"]
    for endpoint in ("authorization", "token", "registration", "revocation", "introspection"):
        assert rfc8414[f"{endpoint}_endpoint"].startswith(authserver.issuer + "/")
    assert rfc8414["jwks_uri"] == authserver.url("/jwks")


def test_access_token_is_an_rfc9068_jwt_for_the_resource(authserver: AuthServer) -> None:
    client = authserver.register(public=True)
    answer = authserver.code_flow(client, resource=RESOURCE, scope="tools:read tools:call")
    header, _ = decode_unverified(answer["access_token"])
    assert header["typ"] == "at+jwt" and header["alg"] == "RS256"
    assert header["kid"] in {key["kid"] for key in authserver.jwks()["keys"]}
    claims = verified(authserver, answer["access_token"])
    assert claims["iss"] == authserver.issuer
    assert claims["sub"] == "alice"
    assert claims["aud"] == RESOURCE
    assert claims["client_id"] == client.client_id
    assert claims["scope"] == "tools:read tools:call"
    assert claims["groups"] == ["admins", "dev"]
    assert claims["nbf"] <= claims["iat"] < claims["exp"] and claims["jti"]
    assert answer["token_type"] == "Bearer" and answer["refresh_token"]


def test_confidential_client_authenticates_at_the_token_endpoint(authserver: AuthServer) -> None:
    client = authserver.register()
    assert client.client_secret
    answer = authserver.code_flow(client, user="bob", password="bob-password", resource=RESOURCE)
    assert verified(authserver, answer["access_token"])["groups"] == []
    verifier, challenge = pkce_pair()
    params = authserver.authorize_request(client, challenge=challenge, resource=RESOURCE)
    code = redirected_query(authserver.login(params, user="bob", password="bob-password"))["code"]
    no_secret = Registered(client_id=client.client_id, client_secret=None, redirect_uri=client.redirect_uri)
    refused = authserver.token(
        no_secret, grant_type="authorization_code", code=code, redirect_uri=client.redirect_uri, code_verifier=verifier
    )
    assert refused.status_code in (400, 401) and refused.json()["error"] == "invalid_client"


def test_pkce_is_required_and_s256_only(authserver: AuthServer) -> None:
    client = authserver.register(public=True)
    verifier, challenge = pkce_pair()
    for drop, method in (("code_challenge", "S256"), (None, "plain"), ("code_challenge_method", None)):
        params = authserver.authorize_request(client, challenge=challenge, resource=RESOURCE)
        if drop:
            del params[drop]
        if method:
            params["code_challenge_method"] = method
        answer = authserver.http.get(authserver.url("/authorize"), params=params)
        assert answer.status_code == 302
        query = redirected_query(answer)
        assert query["error"] == "invalid_request" and query["state"] == params["state"]
        assert query["iss"] == authserver.issuer
    params = authserver.authorize_request(client, challenge=challenge, resource=RESOURCE)
    code = redirected_query(authserver.login(params, user="alice", password="alice-password"))["code"]
    wrong = authserver.token(
        client,
        grant_type="authorization_code",
        code=code,
        redirect_uri=client.redirect_uri,
        code_verifier=pkce_pair()[0],
    )
    assert wrong.status_code == 400 and wrong.json()["error"] == "invalid_grant"


def test_codes_are_single_use_and_bound_to_the_exact_redirect_uri(authserver: AuthServer) -> None:
    client = authserver.register(public=True)
    verifier, challenge = pkce_pair()
    for near in (client.redirect_uri + "/", client.redirect_uri + "?x=1", client.redirect_uri.upper()):
        params = authserver.authorize_request(client, challenge=challenge, redirect_uri=near)
        refused = authserver.http.get(authserver.url("/authorize"), params=params)
        assert refused.status_code == 400 and "location" not in refused.headers
    params = authserver.authorize_request(client, challenge=challenge, resource=RESOURCE)
    code = redirected_query(authserver.login(params, user="alice", password="alice-password"))["code"]
    form = {"grant_type": "authorization_code", "code": code, "code_verifier": verifier}
    assert authserver.token(client, **form, redirect_uri=client.redirect_uri + "/").status_code == 400
    params = authserver.authorize_request(client, challenge=challenge, resource=RESOURCE)
    code = redirected_query(authserver.login(params, user="alice", password="alice-password"))["code"]
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "code_verifier": verifier,
        "redirect_uri": client.redirect_uri,
    }
    assert authserver.token(client, **form).status_code == 200
    again = authserver.token(client, **form)
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant"
    # Without a redirect_uri the one registered is used, and the token request need not name it.
    params = authserver.authorize_request(client, challenge=challenge, resource=RESOURCE)
    del params["redirect_uri"]
    approved = authserver.login(params, user="alice", password="alice-password")
    assert approved.headers["location"].startswith(client.redirect_uri + "?")
    form = {"grant_type": "authorization_code", "code": redirected_query(approved)["code"], "code_verifier": verifier}
    assert authserver.token(client, **form).status_code == 200


def test_login_form_refuses_a_wrong_password_and_passes_state_on_deny(authserver: AuthServer) -> None:
    client = authserver.register(public=True)
    params = authserver.authorize_request(client, challenge=pkce_pair()[1], resource=RESOURCE)
    page = authserver.http.get(authserver.url("/authorize"), params=params)
    assert '<form method="post" action="/authorize">' in page.text and 'name="password"' in page.text
    wrong = authserver.login(params, user="alice", password="bob-password")
    assert wrong.status_code == 401 and "Wrong user name or password" in wrong.text
    unknown = authserver.login(params, user="mallory", password="x")
    assert unknown.status_code == 401
    denied = authserver.login(params, user="alice", password="alice-password", decision="deny")
    query = redirected_query(denied)
    assert query == {"error": "access_denied", "state": params["state"], "iss": authserver.issuer} | {
        k: v for k, v in query.items() if k == "error_description"
    }


def test_login_hint_approves_at_once_only_when_enabled(authserver: AuthServer) -> None:
    client = authserver.register(public=True)
    params = authserver.authorize_request(client, challenge=pkce_pair()[1], resource=RESOURCE, login_hint="bob")
    approved = authserver.http.get(authserver.url("/authorize"), params=params)
    assert approved.status_code == 302 and "code" in redirected_query(approved)
    with start_authserver() as strict:
        client = strict.register(public=True)
        params = strict.authorize_request(client, challenge=pkce_pair()[1], login_hint="bob")
        page = strict.http.get(strict.url("/authorize"), params=params)
        assert page.status_code == 200 and 'name="password"' in page.text
        assert strict.http.post(strict.url("/admin/mint"), json={}).status_code == 404
        assert strict.http.post(strict.url("/admin/rotate"), json={}).status_code == 404


def test_allowed_resources_are_enforced() -> None:
    with start_authserver("--resource", RESOURCE) as server:
        client = server.register(public=True)
        verifier, challenge = pkce_pair()
        for resource in (None, OTHER, "not-a-uri", RESOURCE + "#frag"):
            params = server.authorize_request(client, challenge=challenge, resource=resource)
            query = redirected_query(server.http.get(server.url("/authorize"), params=params))
            assert query["error"] == "invalid_target" and query["iss"] == server.issuer
        params = server.authorize_request(client, challenge=challenge, resource=RESOURCE)
        twice = server.http.get(server.url("/authorize"), params=[*params.items(), ("resource", OTHER)])
        assert redirected_query(twice)["error"] == "invalid_target"
        params = server.authorize_request(client, challenge=challenge, resource=RESOURCE)
        code = redirected_query(server.login(params, user="alice", password="alice-password"))["code"]
        form = {"grant_type": "authorization_code", "code": code, "code_verifier": verifier}
        moved = server.token(client, **form, redirect_uri=client.redirect_uri, resource=OTHER)
        assert moved.status_code == 400 and moved.json()["error"] == "invalid_target"
        answer = server.code_flow(client, resource=RESOURCE)
        assert verified(server, answer["access_token"])["aud"] == RESOURCE
        assert server.metadata()["issuer"] == server.issuer


def test_refresh_tokens_rotate(authserver: AuthServer) -> None:
    client = authserver.register(public=True)
    first = authserver.code_flow(client, resource=RESOURCE, scope="a b")
    second = authserver.token(client, grant_type="refresh_token", refresh_token=first["refresh_token"])
    assert second.status_code == 200, second.text
    renewed = second.json()
    assert renewed["refresh_token"] != first["refresh_token"]
    claims = verified(authserver, renewed["access_token"])
    assert claims["aud"] == RESOURCE and claims["sub"] == "alice" and claims["scope"] == "a b"
    reused = authserver.token(client, grant_type="refresh_token", refresh_token=first["refresh_token"])
    assert reused.status_code == 400 and reused.json()["error"] == "invalid_grant"
    narrowed = authserver.token(client, grant_type="refresh_token", refresh_token=renewed["refresh_token"], scope="a")
    assert verified(authserver, narrowed.json()["access_token"])["scope"] == "a"
    wider = authserver.token(
        client, grant_type="refresh_token", refresh_token=narrowed.json()["refresh_token"], scope="c"
    )
    assert wider.status_code == 400 and wider.json()["error"] == "invalid_scope"
    other = authserver.token(
        client, grant_type="refresh_token", refresh_token=narrowed.json()["refresh_token"], resource=OTHER
    )
    assert other.status_code == 400 and other.json()["error"] == "invalid_target"


def introspect(server: AuthServer, resource_server: Registered, token: str) -> dict[str, Any]:
    answer = server.http.post(server.url("/introspect"), data={"token": token}, auth=resource_server.auth)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_introspection_and_revocation(authserver: AuthServer) -> None:
    client = authserver.register(public=True)
    resource_server = authserver.register()
    tokens = authserver.code_flow(client, resource=RESOURCE)
    active = introspect(authserver, resource_server, tokens["access_token"])
    assert active["active"] is True and active["sub"] == "alice" and active["aud"] == RESOURCE
    assert active["groups"] == ["admins", "dev"] and active["client_id"] == client.client_id
    assert introspect(authserver, resource_server, tokens["refresh_token"])["active"] is True
    assert introspect(authserver, resource_server, "no-such-token") == {"active": False}
    assert introspect(authserver, resource_server, authserver.mint({"aud": RESOURCE})) == {"active": False}
    unauthenticated = authserver.http.post(authserver.url("/introspect"), data={"token": tokens["access_token"]})
    assert unauthenticated.status_code == 401
    public = authserver.http.post(
        authserver.url("/introspect"), data={"token": tokens["access_token"], "client_id": client.client_id}
    )
    assert public.status_code in (400, 401)

    revoke = authserver.url("/revoke")
    assert (
        authserver.http.post(revoke, data={"token": "no-such-token", "client_id": client.client_id}).status_code == 200
    )
    # Another client's revocation leaves the token alone.
    assert (
        authserver.http.post(revoke, data={"token": tokens["access_token"]}, auth=resource_server.auth).status_code
        == 200
    )
    assert introspect(authserver, resource_server, tokens["access_token"])["active"] is True
    assert (
        authserver.http.post(revoke, data={"token": tokens["access_token"], "client_id": client.client_id}).status_code
        == 200
    )
    assert introspect(authserver, resource_server, tokens["access_token"]) == {"active": False}
    assert (
        authserver.http.post(revoke, data={"token": tokens["refresh_token"], "client_id": client.client_id}).status_code
        == 200
    )
    assert introspect(authserver, resource_server, tokens["refresh_token"]) == {"active": False}
    refused = authserver.token(client, grant_type="refresh_token", refresh_token=tokens["refresh_token"])
    assert refused.status_code == 400


def test_expired_tokens_are_inactive() -> None:
    with start_authserver("--access-lifetime", "0") as server:
        client = server.register(public=True)
        resource_server = server.register()
        tokens = server.code_flow(client, resource=RESOURCE)
        assert introspect(server, resource_server, tokens["access_token"]) == {"active": False}
        with pytest.raises(JoseError):
            jwt.JWTClaimsRegistry(exp={"essential": True}).validate(verified(server, tokens["access_token"]))


def test_dynamic_registration(authserver: AuthServer) -> None:
    public = authserver.http.post(
        authserver.url("/register"),
        json={"redirect_uris": ["http://127.0.0.1:3/cb"], "token_endpoint_auth_method": "none"},
    )
    assert public.status_code == 201 and "client_secret" not in public.json()
    confidential = authserver.http.post(authserver.url("/register"), json={"redirect_uris": ["http://127.0.0.1:3/cb"]})
    assert confidential.status_code == 201 and confidential.json()["client_secret"]
    for bad in (
        {},
        {"redirect_uris": "http://127.0.0.1:3/cb"},
        {"redirect_uris": ["http://127.0.0.1:3/cb"], "grant_types": ["password"]},
    ):
        assert authserver.http.post(authserver.url("/register"), json=bad).status_code == 400, bad


def test_token_exchange_keeps_the_subject_and_names_the_actor(authserver: AuthServer) -> None:
    client = authserver.register(public=True)
    proxy = exchanger(authserver)
    subject = authserver.code_flow(client, resource=RESOURCE, scope="read write")["access_token"]
    form = {"grant_type": TOKEN_EXCHANGE, "subject_token": subject, "subject_token_type": ACCESS_TOKEN_TYPE}
    answer = authserver.token(proxy, **form, resource=OTHER, scope="read")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["issued_token_type"] == ACCESS_TOKEN_TYPE and "refresh_token" not in body
    claims = verified(authserver, body["access_token"])
    assert claims["sub"] == "alice" and claims["aud"] == OTHER and claims["scope"] == "read"
    assert claims["act"] == {"sub": proxy.client_id} and claims["client_id"] == proxy.client_id
    assert claims["groups"] == ["admins", "dev"]
    by_audience = authserver.token(proxy, **form, audience="urn:example:api")
    assert verified(authserver, by_audience.json()["access_token"])["aud"] == "urn:example:api"
    second = exchanger(authserver)
    chained = authserver.token(second, **{**form, "subject_token": body["access_token"]}, resource=RESOURCE)
    assert verified(authserver, chained.json()["access_token"])["act"] == {
        "sub": second.client_id,
        "act": {"sub": proxy.client_id},
    }


def test_token_exchange_refusals(authserver: AuthServer) -> None:
    client = authserver.register(public=True)
    proxy = exchanger(authserver)
    subject = authserver.code_flow(client, resource=RESOURCE, scope="read")["access_token"]
    form = {"grant_type": TOKEN_EXCHANGE, "subject_token": subject, "subject_token_type": ACCESS_TOKEN_TYPE}
    cases: list[tuple[Registered, dict[str, str], str]] = [
        (proxy, {**form, "resource": OTHER, "scope": "read admin"}, "invalid_scope"),
        (proxy, form, "invalid_target"),
        (proxy, {**form, "subject_token": authserver.mint({"sub": "alice"}), "resource": OTHER}, "invalid_grant"),
        (proxy, {**form, "subject_token_type": "urn:x", "resource": OTHER}, "invalid_request"),
        (authserver.register(), {**form, "resource": OTHER}, "unauthorized_client"),
        (client, {**form, "resource": OTHER}, "invalid_client"),
    ]
    for who, data, error in cases:
        answer = authserver.token(who, **data)
        assert answer.status_code in (400, 401) and answer.json()["error"] == error, (data, answer.text)
    authserver.http.post(authserver.url("/revoke"), data={"token": subject, "client_id": client.client_id})
    revoked = authserver.token(proxy, **form, resource=OTHER)
    assert revoked.json()["error"] == "invalid_grant"


def test_key_rotation_keeps_old_keys_until_dropped(authserver: AuthServer) -> None:
    client = authserver.register(public=True)
    before = authserver.code_flow(client, resource=RESOURCE)["access_token"]
    old_kid = decode_unverified(before)[0]["kid"]
    new_kid = authserver.rotate()
    assert new_kid != old_kid
    after = authserver.code_flow(client, resource=RESOURCE)["access_token"]
    assert decode_unverified(after)[0]["kid"] == new_kid
    assert {old_kid, new_kid} <= {key["kid"] for key in authserver.jwks()["keys"]}
    assert verified(authserver, before)["sub"] == verified(authserver, after)["sub"] == "alice"
    newest = authserver.rotate(drop_old=True)
    assert [key["kid"] for key in authserver.jwks()["keys"]] == [newest]
    with pytest.raises(JoseError):
        verified(authserver, after)
    assert all("d" not in key for key in authserver.jwks()["keys"])  # public halves only


def test_mint_signs_any_claims(authserver: AuthServer) -> None:
    now = int(time.time())
    expired = authserver.mint({"aud": RESOURCE, "exp": now - 60, "iat": now - 120, "nbf": now - 120})
    claims = verified(authserver, expired)
    assert claims["exp"] < now and claims["iss"] == authserver.issuer
    assert "exp" not in verified(authserver, authserver.mint({"exp": None}))
    assert verified(authserver, authserver.mint({"iss": "http://evil.example"}))["iss"] == "http://evil.example"
    assert verified(authserver, authserver.mint({"x": 1}, bare=True)) == {"x": 1}
    hidden = authserver.mint({"aud": RESOURCE}, unpublished=True)
    assert decode_unverified(hidden)[0]["kid"] not in {key["kid"] for key in authserver.jwks()["keys"]}
    with pytest.raises(JoseError):
        verified(authserver, hidden)


def test_es256_and_users_and_clients_from_files(tmp_path: Any) -> None:
    users = tmp_path / "users.json"
    users.write_text('[{"name": "carol", "password": "carol-password", "groups": ["ops"]}]')
    clients = tmp_path / "clients.json"
    redirect = "http://127.0.0.1:4/callback"
    clients.write_text(f'[{{"client_id": "proxy", "client_secret": "proxy-secret", "redirect_uris": ["{redirect}"]}}]')
    options = ("--alg", "ES256", "--users", str(users), "--clients", str(clients))
    with start_authserver(*options, users=()) as server:
        client = Registered(client_id="proxy", client_secret="proxy-secret", redirect_uri=redirect)
        answer = server.code_flow(client, user="carol", password="carol-password", resource=RESOURCE)
        assert decode_unverified(answer["access_token"])[0]["alg"] == "ES256"
        claims = verified(server, answer["access_token"])
        assert claims["groups"] == ["ops"] and claims["client_id"] == "proxy"
        wrong = Registered(client_id="proxy", client_secret="guess", redirect_uri=redirect)
        assert server.token(wrong, grant_type="refresh_token", refresh_token=answer["refresh_token"]).status_code == 401


def test_bounded_requests_and_no_secrets_in_the_log(authserver: AuthServer) -> None:
    big = authserver.http.post(authserver.url("/token"), data={"grant_type": "x" * (128 * 1024)})
    assert big.status_code == 413
    big_json = authserver.http.post(authserver.url("/register"), json={"client_name": "x" * (128 * 1024)})
    assert big_json.status_code == 413
    client = authserver.register()
    tokens = authserver.code_flow(client, resource=RESOURCE)
    params = authserver.authorize_request(client, challenge=pkce_pair()[1], login_hint="alice")
    code = redirected_query(authserver.http.get(authserver.url("/authorize"), params=params))["code"]
    # werkzeug writes a request's access log line before its answer: nothing to wait for.
    log = authserver.log()
    assert "POST /token" in log
    assert client.client_secret is not None
    for secret in ("alice-password", client.client_secret, tokens["access_token"], tokens["refresh_token"], code):
        assert secret not in log


def test_unknown_client_and_malformed_requests(authserver: AuthServer) -> None:
    page = authserver.http.get(authserver.url("/authorize"), params={"response_type": "code", "client_id": "nobody"})
    assert page.status_code == 400 and "location" not in page.headers
    assert authserver.http.post(authserver.url("/token"), data={"grant_type": "password"}).status_code == 400
    assert authserver.http.get(authserver.url("/token")).status_code == 405
    assert isinstance(authserver.http, httpx.Client)


def test_the_shipped_package_does_not_use_it() -> None:
    """authlib and Flask are test dependencies: nothing under ``aggregator/`` imports them or
    this package (joserfc is the proxy's own dependency: it checks access tokens with it)."""
    import ast
    from pathlib import Path

    test_only = ("authlib", "flask", "werkzeug", "tests")
    offenders = []
    for path in sorted((Path(__file__).parents[2] / "aggregator").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in test_only]
    assert offenders == []
