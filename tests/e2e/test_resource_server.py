"""The proxy as a resource server in front of the suite's own authorization server
(``tests/authserver``, a process): tokens from a real authorization code flow are
accepted, by the official SDK too; expired, early, foreign, unpublished and wrong-audience
ones are refused with the challenge; a rotated key is fetched and accepted; a session
belongs to its user; the profile follows the user's groups."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.conftest import INIT, ROOT, http_proxy, initialize, post, write_config
from tests.e2e.recorder import Recorder

pytestmark = pytest.mark.e2e
RESOURCE = "http://127.0.0.1/mcp"
CLIENT = ROOT / "tests" / "e2e" / "sdk_token_client.py"
PING = {"jsonrpc": "2.0", "id": 2, "method": "ping"}


@pytest.fixture
def upstream():
    server = Recorder()
    yield server
    server.close()


def config_for(tmp_path, authserver, upstream):
    return write_config(
        tmp_path,
        f'''
[servers.up]
url = "http://127.0.0.1:{upstream.port}/mcp"

[auth]
resource = "{RESOURCE}"
scopes_supported = ["mcp"]
required_scopes = ["mcp"]
jwks_refresh_interval = 0.0

[[auth.issuers]]
issuer = "{authserver.issuer}"

[profiles.admins]
match = {{ groups = ["admins"] }}
''',
        startup_timeout=10.0,
    )


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def token_of(authserver, user: str = "alice", resource: str | None = RESOURCE, scope: str = "mcp") -> str:
    client = authserver.register()
    answer = authserver.code_flow(client, user=user, password=f"{user}-password", resource=resource, scope=scope)
    return str(answer["access_token"])


def test_tokens_from_a_real_flow_and_the_ones_refused(tmp_path, authserver, upstream):
    alice, bob = token_of(authserver), token_of(authserver, "bob")
    now_minted = {"aud": RESOURCE, "scope": "mcp", "sub": "minted"}
    with http_proxy(config_for(tmp_path, authserver, upstream)) as (port, log):
        # The metadata names the authorization server.
        status, _, body = post(port, None, path="/.well-known/oauth-protected-resource/mcp", method="GET")
        assert status == 200 and json.loads(body)["authorization_servers"] == [authserver.issuer]
        # Refused, each with the challenge that names the metadata.
        refused = {
            "no token": {},
            "for no named resource": bearer(token_of(authserver, resource=None)),
            "for another resource": bearer(authserver.mint({**now_minted, "aud": "urn:example:resource"})),
            "expired": bearer(authserver.mint({**now_minted, "exp": 1_000_000_000, "nbf": 999_999_000})),
            "not valid yet": bearer(authserver.mint({**now_minted, "nbf": 4_000_000_000, "exp": 4_000_000_300})),
            "another issuer": bearer(authserver.mint({**now_minted, "iss": "https://evil.example"})),
            "a key never published": bearer(authserver.mint(now_minted, unpublished=True)),
        }
        for what, headers in refused.items():
            status, answer_headers, _ = post(port, INIT, headers)
            assert status == 401, what
            assert (
                'resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource/mcp"'
                in (answer_headers["www-authenticate"])
            ), what
        status, answer_headers, _ = post(port, INIT, bearer(authserver.mint({**now_minted, "scope": "other"})))
        assert status == 403 and 'error="insufficient_scope"' in answer_headers["www-authenticate"]
        # A good token opens a session that is its user's alone.
        session = initialize(port, bearer(alice))
        assert post(port, PING, {**bearer(alice), "mcp-session-id": session})[0] == 200
        assert post(port, PING, {**bearer(bob), "mcp-session-id": session})[0] == 404
        # The profile follows the user's groups; the status shows who, never a token.
        initialize(port, bearer(bob))
        status, answer_headers, body = post(port, None, bearer(alice), path="/status.json", method="GET")
        assert status == 403 and 'scope="aggregator:admin"' in answer_headers["www-authenticate"]
        assert b"sessions" not in body  # a user of the MCP endpoint is no operator
        operator = token_of(authserver, scope="mcp aggregator:admin")
        status, _, body = post(port, None, bearer(operator), path="/status.json", method="GET")
        rows = {(row["profile"], row.get("principal")) for row in json.loads(body)["sessions"]}
        assert ("admins", f"alice ({authserver.issuer})") in rows and ("default", f"bob ({authserver.issuer})") in rows
        assert alice.encode() not in body and operator.encode() not in body
        # A rotated key: the proxy fetches the key set again and accepts the new token.
        authserver.rotate(drop_old=True)
        assert post(port, INIT, bearer(token_of(authserver)))[0] == 200
        text = log.read_text()
    assert alice not in text and bob not in text
    assert not any(alice in json.dumps(headers) for _, headers, _ in upstream.requests)


def test_the_official_sdk_with_a_token_from_the_flow(tmp_path, authserver, upstream, python1):
    token = token_of(authserver)
    with http_proxy(config_for(tmp_path, authserver, upstream)) as (port, _):
        for python, mode in ((sys.executable, ("2026-07-28",)), (python1, ())):
            argv = [str(python), str(CLIENT), f"http://127.0.0.1:{port}/mcp", token, *mode]
            run = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
            assert run.returncode == 0, run.stderr[-3000:]
            assert json.loads(run.stdout.strip().splitlines()[-1]) == {"tools": ["up__whoami"], "called": "ok"}
