"""Token exchange (RFC 8693): the caller's token traded for one meant for the server, sent
to the server in its place, and kept until it is about to expire."""

from __future__ import annotations

import pytest

from aggregator.credentials import CredentialError, Principal
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
