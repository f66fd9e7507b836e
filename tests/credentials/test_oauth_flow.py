"""The authorization code flow with PKCE against real HTTP peers: the proxy's connection to
a protected MCP server is refused for want of the user's grant (the answer names the URL to
open), a program opens it, signs in and comes back through the callback on the proxy's HTTP
listener; then the server receives the user's token, and only theirs."""

from __future__ import annotations

import logging
from urllib.parse import parse_qs, urlsplit

import pytest
import trio

from aggregator.credentials import ConsentRequired, CredentialError, Principal
from tests.credentials.harness import INITIALIZE, consent, make_config, opened, proxy_listener, upstream

ALICE = Principal(issuer="https://idp.example", subject="alice")
BOB = Principal(issuer="https://idp.example", subject="bob")


async def _grant(credentials, config, principal=ALICE):
    """Ask for a token (none yet: the URL to open), consent, and come back; the
    authorization server's URL the connect page sent the browser to, and the callback's answer."""
    with pytest.raises(ConsentRequired) as asked:
        await credentials.authorization(principal, config.servers["docs"])
    seen: list[str] = []
    done = await consent(asked.value.url, seen=seen)
    return seen[0], done


async def test_the_whole_flow_from_a_refusal_to_the_users_token_upstream(tmp_path, auth_server, mcp):
    config = make_config(tmp_path, {"docs": {"url": mcp.url, "auth": "oauth"}})
    server = config.servers["docs"]
    assert server.isolation == "per-session"
    async with opened(config) as credentials, proxy_listener(config, credentials):
        # Before any grant: the request is answered with what to do, and nothing reached the server.
        async with upstream(server, credentials.bearer(ALICE, server)) as connection:
            refused = await connection.request("initialize", INITIALIZE)
        error = refused["error"]
        assert error["data"]["reason"] == "unauthorized" and error["data"]["source"] == "aggregator"
        connect = error["data"]["url"]
        # The proxy's own connect page, naming nobody: never the authorization server's URL.
        assert connect.startswith(f"http://{config.http.listen}/oauth/connect?flow=") and connect in error["message"]
        assert set(parse_qs(urlsplit(connect).query)) == {"flow"}
        assert mcp.seen == []
        seen: list[str] = []
        done = await consent(connect, seen=seen)
        url = seen[0]
        assert url.startswith(f"{auth_server.issuer}/authorize?")
        query = parse_qs(urlsplit(url).query)
        assert query["code_challenge_method"] == ["S256"] and query["resource"] == [mcp.url]
        assert query["redirect_uri"] == [f"http://{config.http.listen}/oauth/callback"]
        assert query["client_id"] == ["dyn-1"]  # registered dynamically: nothing was configured
        assert query["scope"] == ["mcp"]  # from the server's challenge metadata
        assert done.status_code == 200 and "Access granted" in done.text

        async with upstream(server, credentials.bearer(ALICE, server)) as connection:
            assert "result" in await connection.request("initialize", INITIALIZE)
            called = await connection.request("tools/call", {"name": "whoami", "arguments": {}})
        token = called["result"]["content"][0]["text"]
        assert auth_server.access[token]["user"] == "alice"
        assert auth_server.access[token]["audience"] == mcp.url
        assert mcp.seen[-1] == f"Bearer {token}"
        # Another user has no grant: their connection is refused, never served with Alice's token.
        with pytest.raises(ConsentRequired):
            await credentials.authorization(BOB, server)


async def test_no_code_or_token_is_logged(tmp_path, auth_server, mcp, caplog):
    caplog.set_level(logging.DEBUG)
    config = make_config(tmp_path, {"docs": {"url": mcp.url, "auth": "oauth"}})
    server = config.servers["docs"]
    async with opened(config) as credentials, proxy_listener(config, credentials):
        _, done = await _grant(credentials, config)
        assert done.status_code == 200
        async with upstream(server, credentials.bearer(ALICE, server)) as connection:
            await connection.request("initialize", INITIALIZE)
            await connection.request("tools/call", {"name": "whoami", "arguments": {}})
        await credentials.tokens.revoke("alice")
    # (httpx and httpcore log the test's own browser too, which sees the code in its URL)
    logged = "\n".join(record.getMessage() for record in caplog.records if record.name.startswith("aggregator"))
    assert "granted access" in logged and len(auth_server.issued) == 3
    for secret in auth_server.issued:
        assert secret not in logged


async def test_a_configured_client_is_used_rather_than_registering(tmp_path, auth_server, mcp):
    config = make_config(
        tmp_path,
        {
            "docs": {
                "url": mcp.url,
                "auth": "oauth",
                "oauth": {"client_id": "secret-client", "client_secret": "s3cret-s3cret", "scopes": ["mcp", "extra"]},
            }
        },
    )
    async with opened(config) as credentials, proxy_listener(config, credentials):
        url, done = await _grant(credentials, config)
        assert done.status_code == 200, done.text
        query = parse_qs(urlsplit(url).query)
        assert query["client_id"] == ["secret-client"] and query["scope"] == ["mcp extra"]
        assert auth_server.registered == []
        assert (await credentials.authorization(ALICE, config.servers["docs"])).startswith("Bearer at-")


async def test_a_client_id_metadata_document_when_the_server_takes_them(tmp_path, auth_server, mcp):
    auth_server.overrides["client_id_metadata_document_supported"] = True
    document = "https://proxy.example/oauth/client.json"
    config = make_config(tmp_path, {"docs": {"url": mcp.url, "auth": "oauth"}}, client_metadata_url=document)
    async with opened(config) as credentials, proxy_listener(config, credentials):
        url, done = await _grant(credentials, config)
        assert parse_qs(urlsplit(url).query)["client_id"] == [document]
        assert done.status_code == 200 and auth_server.registered == []


async def test_a_state_is_used_once(tmp_path, auth_server, mcp):
    config = make_config(tmp_path, {"docs": {"url": mcp.url, "auth": "oauth"}})
    async with opened(config) as credentials, proxy_listener(config, credentials):
        with pytest.raises(ConsentRequired) as asked:
            await credentials.authorization(ALICE, config.servers["docs"])
        done = await consent(asked.value.url)
        assert done.status_code == 200
        import httpx

        async with httpx.AsyncClient() as browser:
            again = await browser.get(str(done.request.url))  # the same code and state, replayed
            made_up = await browser.get(f"http://{config.http.listen}/oauth/callback?code=x&state=forged")
            posted = await browser.post(f"http://{config.http.listen}/oauth/callback")
        assert again.status_code == 400 and "already used" in again.text
        assert made_up.status_code == 400 and posted.status_code == 405
        assert auth_server.counts["authorization_code"] == 1  # the replay never reached the token endpoint


async def test_an_answer_from_another_issuer_is_refused(tmp_path, auth_server, mcp):
    auth_server.iss_value = "https://attacker.example"
    config = make_config(tmp_path, {"docs": {"url": mcp.url, "auth": "oauth"}})
    async with opened(config) as credentials, proxy_listener(config, credentials):
        _, done = await _grant(credentials, config)
        assert done.status_code == 400 and "authorization server it was sent to" in done.text
        assert auth_server.counts["authorization_code"] == 0


async def test_an_answer_without_iss_is_refused_when_the_server_promised_it(tmp_path, auth_server, mcp):
    auth_server.iss_in_response = False
    config = make_config(tmp_path, {"docs": {"url": mcp.url, "auth": "oauth"}})
    async with opened(config) as credentials, proxy_listener(config, credentials):
        _, done = await _grant(credentials, config)
        assert done.status_code == 400 and "iss" in done.text


async def test_a_server_that_refuses_the_stored_token_asks_for_consent_again(tmp_path, auth_server, mcp):
    config = make_config(tmp_path, {"docs": {"url": mcp.url, "auth": "oauth"}})
    server = config.servers["docs"]
    async with opened(config) as credentials, proxy_listener(config, credentials):
        await _grant(credentials, config)
        auth_server.access.clear()  # every token the server knew is gone
        async with upstream(server, credentials.bearer(ALICE, server)) as connection:
            refused = await connection.request("initialize", INITIALIZE)
        assert "/oauth/connect?flow=" in refused["error"]["data"]["url"]
        assert await credentials.vault.get(ALICE, "docs") is None


async def test_an_authorization_server_without_pkce_is_not_used(tmp_path, auth_server, mcp):
    auth_server.overrides["code_challenge_methods_supported"] = None
    config = make_config(tmp_path, {"docs": {"url": mcp.url, "auth": "oauth"}})
    async with opened(config) as credentials:
        with pytest.raises(CredentialError, match="PKCE"):
            await credentials.authorization(ALICE, config.servers["docs"])


async def test_pending_authorizations_are_bounded_per_user(tmp_path, auth_server, mcp):
    from aggregator.credentials.authorization import MAX_PENDING_PER_USER

    config = make_config(tmp_path, {"docs": {"url": mcp.url, "auth": "oauth"}})
    async with opened(config) as credentials:
        for _ in range(MAX_PENDING_PER_USER + 5):
            with pytest.raises(ConsentRequired):
                await credentials.authorization(ALICE, config.servers["docs"])
        assert credentials.flows.pending_count == MAX_PENDING_PER_USER
        with trio.fail_after(5):
            with pytest.raises(ConsentRequired):
                await credentials.authorization(BOB, config.servers["docs"])
        assert credentials.flows.pending_count == MAX_PENDING_PER_USER + 1


async def test_a_grant_the_vault_cannot_keep_is_refused_to_that_user_alone(tmp_path, auth_server, mcp, caplog):
    config = make_config(tmp_path, {"docs": {"url": mcp.url, "auth": "oauth"}})
    async with opened(config) as credentials, proxy_listener(config, credentials):
        assert credentials.vault is not None
        credentials.vault._db.execute("PRAGMA query_only = 1")  # every write fails, as on a full disk
        with caplog.at_level(logging.ERROR):
            _, done = await _grant(credentials, config)
        assert done.status_code == 400 and "Not granted" in done.text
        assert "token vault cannot be used now" in done.text and str(tmp_path) not in done.text
        assert "(credentials.vault) failed" in caplog.text
        with pytest.raises(ConsentRequired):  # nothing was kept: asked again, and the proxy goes on
            await credentials.authorization(ALICE, config.servers["docs"])
        credentials.vault._db.execute("PRAGMA query_only = 0")
        _, done = await _grant(credentials, config, BOB)
        assert done.status_code == 200 and "Access granted" in done.text


async def test_junk_callbacks_are_one_warning_then_one_per_interval_with_a_count(tmp_path, auth_server, mcp, caplog):
    config = make_config(tmp_path, {"docs": {"url": mcp.url, "auth": "oauth"}})
    async with opened(config) as credentials, proxy_listener(config, credentials):
        import httpx

        now = [0.0]
        assert credentials.callback is not None
        credentials.callback.failures.clock = lambda: now[0]
        with caplog.at_level(logging.WARNING, logger="aggregator.credentials.callback"):
            async with httpx.AsyncClient() as browser:
                for _ in range(2):
                    for n in range(5):
                        junk = await browser.get(f"http://{config.http.listen}/oauth/callback?code=x&state=junk{n}")
                        assert junk.status_code == 400
                    now[0] += 11
    said = [r.getMessage() for r in caplog.records if r.name == "aggregator.credentials.callback"]
    assert len(said) == 2, said
    assert "oauth callback:" in said[0] and "4 more like it" in said[1]


async def test_a_cookie_outside_ascii_on_the_callback_is_no_cookie(tmp_path, auth_server, mcp, caplog):
    config = make_config(tmp_path, {"docs": {"url": mcp.url, "auth": "oauth"}})
    async with opened(config) as credentials, proxy_listener(config, credentials):
        host, port = config.http.listen.rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(
                b"GET /oauth/callback?state=s&code=LIVECODE HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Cookie: aggregator-oauth=a.\xc3\xa9\r\nConnection: close\r\n\r\n"
            )
            answer = b""
            with trio.fail_after(5):
                while chunk := await stream.receive_some():
                    answer += chunk
    assert answer.startswith(b"HTTP/1.1 400"), answer[:100]
    assert "LIVECODE" not in caplog.text and "Traceback" not in caplog.text


async def test_an_internal_error_on_an_oauth_path_logs_the_path_only(tmp_path, auth_server, mcp, caplog):
    import httpx

    config = make_config(tmp_path, {"docs": {"url": mcp.url, "auth": "oauth"}})
    async with opened(config) as credentials, proxy_listener(config, credentials):
        assert credentials.callback is not None

        def broken(*args):
            raise RuntimeError("a bug")

        async def broken_later(*args):
            broken()

        credentials.callback.flows.complete = broken_later
        credentials.callback.pages.flows.waiting = broken
        async with httpx.AsyncClient() as browser:
            for path in ("/oauth/callback?state=s&code=LIVECODE", "/oauth/connect?flow=LIVEFLOW"):
                failed = await browser.get(f"http://{config.http.listen}{path}")
                assert failed.status_code == 500
                assert failed.headers["content-type"].startswith("text/html")
                assert failed.headers["content-security-policy"] and failed.headers["x-frame-options"] == "DENY"
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r.getMessage() for r in errors] == [
        "oauth: internal error in GET /oauth/callback; closing this connection only",
        "oauth: internal error in GET /oauth/connect; closing this connection only",
    ]
    assert "LIVECODE" not in caplog.text and "LIVEFLOW" not in caplog.text


async def test_junk_on_the_connect_page_is_one_warning_then_one_per_interval(tmp_path, auth_server, mcp, caplog):
    import httpx

    config = make_config(tmp_path, {"docs": {"url": mcp.url, "auth": "oauth"}})
    async with opened(config) as credentials, proxy_listener(config, credentials):
        now = [0.0]
        assert credentials.callback is not None
        credentials.callback.pages.failures.clock = lambda: now[0]
        with caplog.at_level(logging.WARNING, logger="aggregator.credentials.connect"):
            async with httpx.AsyncClient() as browser:
                for _ in range(2):
                    for n in range(5):
                        junk = await browser.get(f"http://{config.http.listen}/oauth/connect?flow=junk{n}")
                        assert junk.status_code == 400
                    now[0] += 11
    said = [r.getMessage() for r in caplog.records if r.name == "aggregator.credentials.connect"]
    assert len(said) == 2, said
    assert "oauth connect: GET /oauth/connect:" in said[0] and "4 more like it" in said[1]
