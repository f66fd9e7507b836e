"""The official Python SDK (2.x in both eras, and 1.x) calls the proxy with an OAuth
access token from an in-test authorization server; the proxy checks it, serves the call
through an HTTP upstream, and that upstream never sees the client's token."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.conftest import ROOT, http_proxy, write_config
from tests.e2e.recorder import Recorder
from tests.oauth import AuthServer

pytestmark = pytest.mark.e2e
CLIENT = ROOT / "tests" / "e2e" / "sdk_token_client.py"


@pytest.fixture
def servers():
    issuer, upstream = AuthServer(), Recorder()
    yield issuer, upstream
    issuer.close()
    upstream.close()


def run_client(python, port: int, token: str, *mode: str) -> dict:
    argv = [str(python), str(CLIENT), f"http://127.0.0.1:{port}/mcp", token, *mode]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_official_sdk_sends_a_valid_token_and_it_never_goes_upstream(tmp_path, servers, python1):
    issuer, upstream = servers
    config = write_config(
        tmp_path,
        f'''
[servers.up]
url = "http://127.0.0.1:{upstream.port}/mcp"
headers = {{ Authorization = "Bearer the-upstream-own-secret" }}

[auth]
resource = "http://127.0.0.1/mcp"
required_scopes = ["mcp"]

[[auth.issuers]]
issuer = "{issuer.issuer}"
''',
        startup_timeout=10.0,
    )
    token = issuer.mint(sub="sdk-user")
    with http_proxy(config) as (port, log):
        for python, mode in ((sys.executable, ("legacy",)), (sys.executable, ("2026-07-28",)), (python1, ())):
            out = run_client(python, port, token, *mode)
            assert out == {"tools": ["up__whoami"], "called": "ok"}, (mode, out)
        refused = run_client(sys.executable, port, issuer.mint(aud="https://other.example/mcp"), "legacy")
        assert "error" in refused, refused
    posts = [headers for method, headers, _ in upstream.requests if method == "POST"]
    assert posts and all(h["authorization"] == "Bearer the-upstream-own-secret" for h in posts)
    assert not any(token in json.dumps(h) for _, h, _ in upstream.requests)
    assert token not in log.read_text()


def test_the_official_sdk_goes_on_when_its_get_stream_ends_with_its_token(tmp_path, servers):
    # The proxy ends a GET stream when the token it was opened with expires; the SDK opens
    # it again with the token it sends now (a refreshed one), and its session goes on.
    import anyio
    import httpx2
    from mcp.client import Client
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    issuer, upstream = servers
    config = write_config(
        tmp_path,
        f'''
[servers.up]
url = "http://127.0.0.1:{upstream.port}/mcp"

[auth]
resource = "http://127.0.0.1/mcp"
required_scopes = ["mcp"]
leeway = 0.0

[[auth.issuers]]
issuer = "{issuer.issuer}"
''',
        startup_timeout=10.0,
    )
    minted: list[str] = []

    class Refreshing(httpx2.Auth):
        """A client whose token is refreshed often: each request carries a new one, good 2 s."""

        def auth_flow(self, request):
            minted.append(issuer.mint(sub="sdk-user", lifetime=2))
            request.headers["Authorization"] = f"Bearer {minted[-1]}"
            yield request

    async def session(port: int) -> list[str]:
        transport = streamable_http_client(
            f"http://127.0.0.1:{port}/mcp", http_client=create_mcp_http_client(auth=Refreshing())
        )
        with anyio.fail_after(30):
            async with Client(transport, mode="legacy", cache=None) as client:  # type: ignore[arg-type]
                said = []
                for _ in range(3):  # past the first tokens' exp, and the streams opened with them
                    await anyio.sleep(2.5)
                    called = await client.call_tool("up__whoami", {})
                    said.append(getattr(called.content[0], "text", ""))
                return said

    with http_proxy(config) as (port, log):
        assert anyio.run(session, port) == ["ok", "ok", "ok"]
        text = log.read_text()
    assert text.count("its GET stream ended: its access token expired") >= 2, text[-3000:]
    assert "Traceback" not in text
    assert not any(token in text for token in minted)
