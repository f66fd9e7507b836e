"""The same flows against the in-repo authorization server (``tests/authserver``, authlib):
the user's grant through its login form, refresh with rotation, revocation, and token
exchange, each token reaching the protected server with the audience it names."""

from __future__ import annotations

import sqlite3
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest

from aggregator.credentials import ConsentRequired, Principal
from tests.authserver.harness import decode_unverified
from tests.credentials.harness import INITIALIZE, make_config, opened, proxy_listener, through_connect, upstream
from tests.credentials.peers import JwtIssuer, ProtectedMcp

EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"


@pytest.fixture
def protected(authserver):
    server = ProtectedMcp(JwtIssuer(authserver.issuer))
    yield server
    server.close()


async def _sign_in(url: str, issuer: str) -> httpx.Response:
    """The proxy's connect page, then the login form of the in-repo server, filled as a
    browser would; the callback's answer."""
    async with httpx.AsyncClient() as browser:
        url = await through_connect(browser, url)
        params = dict(parse_qsl(urlsplit(url).query))
        page = await browser.get(url)
        assert page.status_code == 200, page.text
        form = {**params, "username": "alice", "password": "alice-password", "decision": "approve"}
        redirect = await browser.post(f"{issuer}/authorize", data=form)
        assert redirect.status_code == 302, redirect.text
        return await browser.get(redirect.headers["location"])


async def test_the_users_grant_refresh_and_revocation(tmp_path, authserver, protected):
    alice = Principal(issuer=authserver.issuer, subject="alice")
    config = make_config(tmp_path, {"docs": {"url": protected.url, "auth": "oauth"}})
    server = config.servers["docs"]
    async with opened(config) as credentials, proxy_listener(config, credentials):
        with pytest.raises(ConsentRequired) as asked:
            await credentials.authorization(alice, server)
        done = await _sign_in(asked.value.url, authserver.issuer)
        assert done.status_code == 200, done.text
        async with upstream(server, credentials.bearer(alice, server)) as connection:
            assert "result" in await connection.request("initialize", INITIALIZE)
            called = await connection.request("tools/call", {"name": "whoami", "arguments": {}})
        token = called["result"]["content"][0]["text"]
        claims = decode_unverified(token)[1]
        assert claims["sub"] == "alice" and claims["aud"] == protected.url and claims["iss"] == authserver.issuer

        # Expired in the vault: the next use refreshes it (the server rotates the refresh token).
        grant = await credentials.vault.get(alice, "docs")
        with sqlite3.connect(config.credentials.vault) as db:
            db.execute("UPDATE grants SET expires_at = 0")
        renewed = await credentials.tokens.access_token(alice, "docs")
        assert renewed is not None and renewed != token and decode_unverified(renewed)[1]["aud"] == protected.url
        kept = await credentials.vault.get(alice, "docs")
        assert kept.tokens.refresh_token != grant.tokens.refresh_token

        done = await credentials.tokens.revoke("alice", "docs")
        assert [outcome for _, outcome in done] == ["removed and revoked"]
        again = authserver.token(
            authserver.register(public=True), grant_type="refresh_token", refresh_token=kept.tokens.refresh_token
        )
        assert again.status_code == 400


async def test_token_exchange_names_the_server_as_audience(tmp_path, authserver, protected):
    alice = Principal(issuer=authserver.issuer, subject="alice")
    own = authserver.code_flow(authserver.register(public=True), resource="https://proxy.example/mcp")["access_token"]
    proxy = authserver.register(grant_types=["authorization_code", EXCHANGE], redirect_uri="http://127.0.0.1:2/cb")
    config = make_config(
        tmp_path,
        {
            "docs": {
                "url": protected.url,
                "auth": "token-exchange",
                "oauth": {
                    "issuer": authserver.issuer,
                    "client_id": proxy.client_id,
                    "client_secret": proxy.client_secret,
                },
            }
        },
    )
    server = config.servers["docs"]
    async with opened(config) as credentials:
        async with upstream(server, credentials.bearer(alice, server, own)) as connection:
            assert "result" in await connection.request("initialize", INITIALIZE)
            called = await connection.request("tools/call", {"name": "whoami", "arguments": {}})
    token = called["result"]["content"][0]["text"]
    claims = decode_unverified(token)[1]
    assert token != own and claims["aud"] == protected.url and claims["sub"] == "alice"
    assert claims["act"] == {"sub": proxy.client_id}
    assert f"Bearer {own}" not in protected.seen
