"""What the proxy sends to an HTTP upstream: its own credentials only, never a client's;
no redirects followed; a new session after the server forgets the old one."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.conftest import TOKEN, http_proxy, initialize, post, write_config
from tests.e2e.recorder import Recorder

pytestmark = pytest.mark.e2e


@pytest.fixture
def recorder():
    server = Recorder()
    yield server
    server.close()


def test_client_credentials_never_reach_the_upstream(tmp_path, recorder):
    config = write_config(
        tmp_path,
        f'''
[servers.up]
url = "http://127.0.0.1:{recorder.port}/mcp"
headers = {{ Authorization = "Bearer the-upstream-own-secret" }}

[http]
auth_tokens = ["{TOKEN}"]
''',
        startup_timeout=10.0,
    )
    with http_proxy(config) as (port, log):
        client = {"authorization": f"Bearer {TOKEN}", "cookie": "sid=client-cookie"}
        session = initialize(port, client)
        status, _, body = post(
            port,
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "up__whoami", "arguments": {}}},
            {**client, "mcp-session-id": session},
        )
        assert status == 200 and json.loads(body)["result"]["content"][0]["text"] == "ok"
    posts = [headers for method, headers, _ in recorder.requests if method == "POST"]
    assert posts and all(h["authorization"] == "Bearer the-upstream-own-secret" for h in posts)
    assert all("cookie" not in h for h in posts)
    assert all(h.get("mcp-session-id") != session for h in posts)  # the client's session id stays here
    text = log.read_text()
    assert TOKEN not in text and "the-upstream-own-secret" not in text and "client-cookie" not in text


def test_redirects_are_not_followed(tmp_path):
    target = Recorder()
    redirecting = Recorder(redirect_to=target.port)
    try:
        config = write_config(
            tmp_path,
            f"""
[servers.up]
url = "http://127.0.0.1:{redirecting.port}/mcp"
headers = {{ Authorization = "Bearer do-not-leak" }}
""",
            startup_timeout=3.0,
        )
        with http_proxy(config) as (port, log):
            initialize(port)
        assert redirecting.requests and not target.requests
        assert "HTTP 307" in log.read_text()
    finally:
        target.close()
        redirecting.close()


def test_a_forgotten_session_is_started_again(tmp_path, recorder):
    config = write_config(
        tmp_path,
        f"""
[servers.up]
url = "http://127.0.0.1:{recorder.port}/mcp"
""",
        startup_timeout=10.0,
        restart_backoff_initial=0.05,
        restart_backoff_max=0.1,
    )
    with http_proxy(config) as (port, _):
        session = initialize(port)
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "up__whoami"}}
        assert "result" in json.loads(post(port, call, {"mcp-session-id": session})[2])
        recorder.sessions.clear()  # the server restarts and forgets every session
        answer = json.loads(post(port, call, {"mcp-session-id": session})[2])
        assert answer["error"]["data"]["reason"] == "unavailable"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            answer = json.loads(post(port, call, {"mcp-session-id": session})[2])
            if "result" in answer:
                break
            time.sleep(0.1)
        assert "result" in answer and recorder.initializes >= 2
