"""What the proxy sends to an HTTP upstream: its own credentials only, never a client's;
no redirects followed; a new session after the server forgets the old one."""

from __future__ import annotations

import json
import time
import uuid
from http.server import BaseHTTPRequestHandler

import pytest

from tests.e2e.conftest import TOKEN, http_proxy, initialize, post, write_config
from tests.loopback import serve_in_thread, stop_serving

pytestmark = pytest.mark.e2e


class Recorder:
    """A minimal Streamable HTTP MCP server that records every request's headers."""

    def __init__(self, redirect_to: int | None = None) -> None:
        self.requests: list[tuple[str, dict[str, str], dict]] = []
        self.sessions: set[str] = set()
        self.initializes = 0
        self.redirect_to = redirect_to
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                recorder.requests.append(("GET", {k.lower(): v for k, v in self.headers.items()}, {}))
                self.send_response(405)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_DELETE(self):
                recorder.requests.append(("DELETE", {k.lower(): v for k, v in self.headers.items()}, {}))
                recorder.sessions.discard(self.headers.get("mcp-session-id"))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                headers = {k.lower(): v for k, v in self.headers.items()}
                recorder.requests.append(("POST", headers, body))
                if recorder.redirect_to is not None:
                    self.send_response(307)
                    self.send_header("location", f"http://127.0.0.1:{recorder.redirect_to}/mcp")
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                method = body.get("method")
                extra = {}
                if method == "initialize":
                    recorder.initializes += 1
                    session = uuid.uuid4().hex
                    recorder.sessions.add(session)
                    extra["mcp-session-id"] = session
                    result = {
                        "protocolVersion": "2025-11-25",
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "recorder", "version": "1"},
                    }
                elif headers.get("mcp-session-id") not in recorder.sessions:
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                elif "id" not in body:
                    self.send_response(202)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                elif method == "tools/list":
                    result = {"tools": [{"name": "whoami", "inputSchema": {"type": "object"}}]}
                elif method == "tools/call":
                    result = {"content": [{"type": "text", "text": "ok"}]}
                else:
                    result = {}
                data = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for key, value in extra.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        self.server = serve_in_thread(Handler)
        self.port = self.server.server_address[1]

    def close(self) -> None:
        stop_serving(self.server)


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
