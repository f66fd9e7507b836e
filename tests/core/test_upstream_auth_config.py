"""A server's ``auth`` and ``[servers.NAME.oauth]``, and the ``[credentials]`` table: every
problem named by its key path, and a per-user credential always per-session."""

from __future__ import annotations

import base64

import pytest

from aggregator.config import structure_config
from aggregator.errors import ConfigError

KEY = base64.b64encode(b"k" * 32).decode()
URL = "https://docs.example/mcp"


def problems(raw, environ=None):
    with pytest.raises(ConfigError) as caught:
        structure_config(raw, environ=environ or {})
    return caught.value.problems


def test_static_is_the_default_and_changes_nothing():
    server = structure_config({"servers": {"docs": {"url": URL}}}, environ={}).servers["docs"]
    assert server.auth == "static" and server.isolation == "shared"


@pytest.mark.parametrize("auth", ["oauth", "token-exchange"])
def test_a_per_user_credential_makes_the_server_per_session(auth):
    oauth = {"issuer": "https://idp.example", "client_id": "proxy"} if auth == "token-exchange" else {}
    raw = {"credentials": {"vault_key": KEY}, "servers": {"docs": {"url": URL, "auth": auth, "oauth": oauth}}}
    assert structure_config(raw, environ={}).servers["docs"].isolation == "per-session"
    raw["servers"]["docs"]["isolation"] = "shared"
    assert any(p.startswith("servers.docs.isolation: a server with auth") for p in problems(raw))


def test_the_vault_key_is_required_for_oauth_and_named_by_its_path():
    raw = {"servers": {"docs": {"url": URL, "auth": "oauth"}}}
    assert problems(raw) == [
        'credentials.vault_key: required, as servers.docs (auth = "oauth") keeps users\' tokens in the vault: set it,'
        " or the AGGREGATOR_VAULT_KEY environment variable, to 32 random bytes in base64"
    ]
    assert structure_config(raw, environ={"AGGREGATOR_VAULT_KEY": KEY}).credentials.vault_key is None
    assert problems(raw, {"AGGREGATOR_VAULT_KEY": "c2hvcnQ="}) == [
        "credentials.vault_key: the AGGREGATOR_VAULT_KEY variable must be 32 bytes (AES-256) in base64, got 5 bytes;"
        " it is not shown"
    ]
    raw["credentials"] = {"vault_key": "not base64!"}
    assert problems(raw)[0].startswith("credentials.vault_key: is not base64")


@pytest.mark.parametrize(
    "server,expected",
    [
        ({"command": "x", "auth": "oauth"}, "servers.docs.auth: a stdio server takes its credentials"),
        ({"url": URL, "oauth": {"client_id": "x"}}, 'servers.docs.oauth: only for auth = "oauth" or "token-exchange"'),
        ({"url": URL, "auth": "token-exchange"}, 'servers.docs.oauth: auth = "token-exchange" needs'),
        (
            {"url": URL, "auth": "token-exchange", "oauth": {"issuer": "https://idp.example"}},
            "servers.docs.oauth.client_id",
        ),
        (
            {"url": URL, "auth": "oauth", "oauth": {"issuer": "https://idp.example"}},
            "servers.docs.oauth.issuer: only for",
        ),
        (
            {"url": URL, "auth": "oauth", "oauth": {"client_secret": "x"}},
            "servers.docs.oauth.client_secret: given without",
        ),
        ({"url": URL, "auth": "oauth", "oauth": {"scopes": ["a b"]}}, "servers.docs.oauth.scopes[0]:"),
        ({"url": URL, "auth": "oauth", "oauth": {"secret": "x"}}, "servers.docs.oauth.secret: unknown key"),
        (
            {"url": URL, "auth": "oauth", "headers": {"Authorization": "Bearer x"}},
            "servers.docs.headers.Authorization:",
        ),
        ({"url": URL, "auth": "basic"}, "servers.docs.auth: expected one of static, token-exchange, oauth"),
        (
            {
                "url": URL,
                "auth": "token-exchange",
                "oauth": {"client_id": "p", "token_endpoint": "http://idp.example/t"},
            },
            "servers.docs.oauth.token_endpoint: must be an https URL (http only on loopback)",
        ),
    ],
)
def test_server_problems_by_key_path(server, expected):
    found = problems({"credentials": {"vault_key": KEY}, "servers": {"docs": server}})
    assert any(p.startswith(expected) for p in found), found


def test_credentials_table_problems():
    found = problems(
        {
            "credentials": {
                "vault_key": KEY,
                "callback_path": "oauth",
                "redirect_uri": "http://proxy.example/cb",
                "client_metadata_url": "http://127.0.0.1/client.json",
                "fetch_timeout": 0,
                "sign_in_client_secret": "s3cret",
            }
        }
    )
    assert sorted(found) == [
        "credentials.callback_path: must start with /",
        "credentials.client_metadata_url: a client ID metadata document is served over https",
        "credentials.fetch_timeout: must be a finite number of seconds from 0.1 to 600, got 0.0",
        "credentials.redirect_uri: must be an https URL (http only on loopback)",
        "credentials.sign_in_client_secret: given without sign_in_client_id",
    ]
    assert not any("s3cret" in problem for problem in found)


@pytest.mark.parametrize(
    ("credentials", "expected"),
    [
        (
            {"redirect_uri": "http://127.0.0.1:8000/mcp"},
            "credentials.redirect_uri: its path /mcp collides with the MCP endpoint, http.path (/mcp)",
        ),
        (
            {"redirect_uri": "http://127.0.0.1:8000/mcp/team"},
            "credentials.redirect_uri: its path /mcp/team collides with profile team's endpoint (/mcp/team)",
        ),
        (
            {"redirect_uri": "https://proxy.example/sse"},
            "credentials.redirect_uri: its path /sse collides with the legacy SSE transport's http.sse_path (/sse)",
        ),
        (
            {"redirect_uri": "http://127.0.0.1:8000/messages"},
            "credentials.redirect_uri: its path /messages collides with the legacy SSE transport's"
            " http.messages_path (/messages)",
        ),
        (
            {"redirect_uri": "http://127.0.0.1:8000/oauth/connect"},
            "credentials.redirect_uri: its path /oauth/connect is where the connect page beside the callback is served",
        ),
        (
            {"redirect_uri": "http://127.0.0.1:8000/oauth/signed-in"},
            "credentials.redirect_uri: its path /oauth/signed-in is where the signed-in page beside the"
            " callback is served",
        ),
        (
            {"redirect_uri": "http://127.0.0.1:8000/status.json"},
            "credentials.redirect_uri: its path /status.json collides with an admin path (/status.json)",
        ),
        (
            {"callback_path": "/healthz"},
            "credentials.callback_path: its path /healthz collides with an admin path (/healthz)",
        ),
        (
            {"callback_path": "/mcp/callback", "redirect_uri": "http://127.0.0.1:8000/oauth/callback"},
            "credentials.callback_path: its path /mcp/callback puts a page at /mcp/connect, which collides with"
            " profile connect's endpoint (/mcp/connect)",
        ),
        (
            {"callback_path": "/.well-known/callback"},
            "credentials.callback_path: its path /.well-known/callback collides with the proxy's well-known metadata",
        ),
    ],
)
def test_the_callback_path_may_not_collide_with_the_proxys_own(credentials, expected):
    raw = {
        "http": {"listen": "127.0.0.1:8000"},
        "profiles": {"team": {}, "connect": {}},
        "credentials": {"vault_key": KEY, **credentials},
    }
    found = problems(raw)
    assert [problem for problem in found if problem.startswith("credentials.")] == [
        f"{expected}; the OAuth callback and its pages need paths of their own"
    ]


def test_a_callback_path_of_its_own_is_accepted():
    structure_config(
        {"credentials": {"vault_key": KEY, "redirect_uri": "https://proxy.example/auth/callback"}}, environ={}
    )
