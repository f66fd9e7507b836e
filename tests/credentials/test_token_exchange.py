"""Token exchange (RFC 8693): the caller's token traded for one meant for the server, sent
to the server in its place, and kept until it is about to expire."""

from __future__ import annotations

import logging

import pytest

from aggregator.credentials import CredentialError, Principal
from aggregator.credentials.tokens import MAX_DESCRIPTION, described
from tests.credentials.harness import INITIALIZE, make_config, opened, upstream

ALICE = Principal(issuer="https://idp.example", subject="alice")


def _servers(auth_server, mcp, **oauth):
    return {
        "docs": {
            "url": mcp.url,
            "auth": "token-exchange",
            "oauth": {
                "issuer": auth_server.issuer,
                "client_id": "secret-client",
                "client_secret": "s3cret-s3cret",
                **oauth,
            },
        }
    }


async def test_the_server_gets_an_exchanged_token_never_the_callers(tmp_path, auth_server, mcp):
    config = make_config(tmp_path, _servers(auth_server, mcp))
    server = config.servers["docs"]
    assert server.isolation == "per-session"
    own = auth_server.mint("alice", "https://proxy.example/mcp")  # what the client sent the proxy
    async with opened(config) as credentials:
        assert credentials.vault is None  # nothing kept on disk for an exchange
        async with upstream(server, credentials.bearer(ALICE, server, own)) as connection:
            assert "result" in await connection.request("initialize", INITIALIZE)
            called = await connection.request("tools/call", {"name": "whoami", "arguments": {}})
        token = called["result"]["content"][0]["text"]
        assert token != own and f"Bearer {own}" not in mcp.seen
        assert auth_server.access[token] == {**auth_server.access[token], "user": "alice", "audience": mcp.url}
        # Cached per user and server until it is about to expire: one exchange for all of that.
        assert (
            credentials.exchange.exchanges == 1
            and auth_server.counts["urn:ietf:params:oauth:grant-type:token-exchange"] == 1
        )


async def test_an_exchange_the_server_refuses_fails_with_its_error_code(tmp_path, auth_server, mcp):
    config = make_config(tmp_path, _servers(auth_server, mcp))
    async with opened(config) as credentials:
        with pytest.raises(CredentialError, match="invalid_grant"):
            await credentials.authorization(ALICE, config.servers["docs"], "at-not-a-token-it-issued")


async def test_a_token_endpoint_given_directly_needs_no_metadata(tmp_path, auth_server, mcp):
    config = make_config(
        tmp_path, _servers(auth_server, mcp, issuer=None, token_endpoint=f"{auth_server.issuer}/token")
    )
    own = auth_server.mint("alice", "https://proxy.example/mcp")
    async with opened(config) as credentials:
        assert (await credentials.authorization(ALICE, config.servers["docs"], own)).startswith("Bearer at-")
    assert auth_server.counts["GET /.well-known/oauth-authorization-server"] == 0


async def test_a_failed_exchange_is_a_warning_once_a_minute_per_server_without_the_token(
    tmp_path, auth_server, mcp, caplog, monkeypatch
):
    config = make_config(tmp_path, _servers(auth_server, mcp))
    auth_server.echo_description = True  # it echoes the caller's token in its error_description
    own = auth_server.mint("alice", "https://proxy.example/mcp")
    auth_server.access.pop(own)  # no longer known there: refused, and echoed
    async with opened(config) as credentials:
        now = [1000.0]
        monkeypatch.setattr(credentials.exchange.failures, "clock", lambda: now[0])
        with caplog.at_level(logging.INFO, logger="aggregator.credentials"):
            for _ in range(3):
                with pytest.raises(CredentialError, match="invalid_grant") as refused:
                    await credentials.authorization(ALICE, config.servers["docs"], own)
                assert own not in str(refused.value) and "is not known here" in str(refused.value)
            now[0] += 61
            with pytest.raises(CredentialError):
                await credentials.authorization(ALICE, config.servers["docs"], own)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert all("server docs: the token exchange failed" in w and "invalid_grant" in w for w in warnings)
    assert "2 more like it" in warnings[1]
    assert own not in caplog.text


def test_an_error_description_is_cut_short_and_nothing_token_like_is_told():
    sent = {"subject_token": "short-but-ours", "grant_type": "x"}
    jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg"
    said = described(f"bad subject_token {jwt}; also short-but-ours", sent)
    assert jwt not in said and "short-but-ours" not in said and said.startswith(": bad subject_token [...]")
    long = described("word " * 1000, {})
    assert long.startswith(": word word") and len(long) == len(": ...") + MAX_DESCRIPTION
    assert described("a\x1b[31m", {}) == ""  # not printable: not told at all
    assert described(None, sent) == "" and described("", sent) == ""


async def test_a_slow_token_endpoint_ends_the_exchange_before_the_servers_handshake_times_out(
    tmp_path, auth_server, mcp
):
    import httpx
    import trio

    class Slow(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            await trio.sleep(30)
            raise AssertionError("not reached")

    servers = _servers(auth_server, mcp, issuer=None, token_endpoint=f"{auth_server.issuer}/token")
    servers["docs"]["init_timeout"] = 1.0  # the credential fetch (10 s by default) would outlast it
    config = make_config(tmp_path, servers)
    async with opened(config, Slow()) as credentials:
        started = trio.current_time()
        with trio.fail_after(5), pytest.raises(CredentialError, match="token exchange: no whole answer within 0.8s"):
            await credentials.authorization(ALICE, config.servers["docs"], "at-caller")
        assert trio.current_time() - started < 1.0
