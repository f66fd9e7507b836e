"""Policy end to end, against server-everything and mcp-server-git, over stdio, Streamable
HTTP and WebSocket: hidden items are absent on every method, name variants reach
nothing, and two clients with different tokens see different catalogs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import trio
import trio_websocket

from tests.e2e.conftest import RawProxy, events, http_proxy, initialize, post, websocket_requester, write_config
from tests.loopback import free_port, wait_listening

pytestmark = pytest.mark.e2e
READER = "reader-token-0123456789abcdef"
ADMIN = "admin-token-0123456789abcdef"
HIDDEN_CALLS = [
    "everything__echo",
    "echo",
    "EVERYTHING__echo",
    "everything__Echo",
    " everything__echo",
    "everything__echo\u200b",
    "ｅverything__echo",
    "everything__toggle-simulated-logging",
    "git__git_commit",
]


def policy_config(tmp_path, everything_js, git_repo):
    return write_config(
        tmp_path,
        f'''
[policy.tools]
deny = ["*simulated*"]

[servers.everything]
command = "node"
args = ["{everything_js}", "stdio"]
server_requests = ["roots"]
[servers.everything.tools]
deny = ["echo", "trigger-sampling-request"]
[servers.everything.tools.rename.get-sum]
name = "add"
description = "Adds two numbers."
[servers.everything.prompts]
deny = ["args-prompt"]
[servers.everything.resources]
deny = ["demo://resource/static/document/architecture.md"]
[servers.everything.templates]
deny = ["demo://resource/dynamic/blob/*"]

[servers.git]
command = "mcp-server-git"
args = ["--repository", "{git_repo}"]
[servers.git.tools]
deny = ["git_commit", "git_add", "git_reset"]

[http]
auth_tokens = ["{ADMIN}"]

[profiles.reader]
tokens = ["{READER}"]
[profiles.reader.tools]
read_only = true
''',
        startup_timeout=20.0,
        page_size=7,
    )


class Probe:
    """Ask the same questions over any front; `request` sends one and returns the answer."""

    def __init__(self, request):
        self.request = request
        self.next = 100

    def call(self, method, params):
        self.next += 1
        return self.request(self.next, method, params)

    def all_tools(self):
        names, cursor = [], None
        while True:
            page = self.call("tools/list", {"cursor": cursor} if cursor else {})["result"]
            names += [t["name"] for t in page["tools"]]
            cursor = page.get("nextCursor")
            if not cursor:
                return names

    def check_hidden_everywhere(self):
        names = self.all_tools()
        assert "everything__add" in names and "git__git_status" in names
        for hidden in (
            "everything__echo",
            "everything__get-sum",
            "everything__toggle-simulated-logging",
            "everything__trigger-sampling-request",
            "git__git_commit",
        ):
            assert hidden not in names
        absent = self.call("tools/call", {"name": "no__such_tool", "arguments": {}})["error"]
        for name in HIDDEN_CALLS:
            error = self.call("tools/call", {"name": name, "arguments": {"message": "x"}})["error"]
            assert (error["code"], error["message"].split(":")[0]) == (absent["code"], "Unknown tool"), name
        result = self.call("tools/call", {"name": "everything__add", "arguments": {"a": 1, "b": 2}})["result"]
        assert "3" in result["content"][0]["text"]
        prompts = [p["name"] for p in self.call("prompts/list", {})["result"]["prompts"]]
        assert "everything__args-prompt" not in prompts and "everything__simple-prompt" in prompts
        assert (
            self.call("prompts/get", {"name": "everything__args-prompt", "arguments": {"city": "x"}})["error"]["code"]
            == -32602
        )
        assert (
            self.call(
                "completion/complete",
                {
                    "ref": {"type": "ref/prompt", "name": "everything__args-prompt"},
                    "argument": {"name": "city", "value": ""},
                },
            )["error"]["code"]
            == -32602
        )
        resources = [r["uri"] for r in self.call("resources/list", {})["result"]["resources"]]
        secret = "everything+demo://resource/static/document/architecture.md"
        assert secret not in resources and resources
        for method in ("resources/read", "resources/subscribe"):
            for uri in (
                secret,
                "everything+demo://resource/dynamic/blob/1",
                "file:///etc/passwd",
                "demo://resource/static/document/architecture.md",
            ):
                assert self.call(method, {"uri": uri})["error"]["code"] == -32602, (method, uri)
        assert "result" in self.call("resources/read", {"uri": resources[0]})
        assert "result" in self.call("resources/read", {"uri": "everything+demo://resource/dynamic/text/1"})


def test_stdio_front(tmp_path, everything_js, git_repo):
    proxy = RawProxy(policy_config(tmp_path, everything_js, git_repo))
    try:
        proxy.request(
            1,
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {"sampling": {}},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        )
        Probe(proxy.request).check_hidden_everywhere()
    finally:
        code, log = proxy.close()
    assert code == 0, log


def test_http_front_and_profiles(tmp_path, everything_js, git_repo):
    config = policy_config(tmp_path, everything_js, git_repo)
    with http_proxy(config) as (port, log):
        sessions = {}
        for token in (ADMIN, READER):
            auth = {"authorization": f"Bearer {token}"}
            sessions[token] = (initialize(port, auth), auth)

        def requester(token):
            session, auth = sessions[token]

            def request(id, method, params):
                status, _, body = post(
                    port,
                    {"jsonrpc": "2.0", "id": id, "method": method, "params": params},
                    {**auth, "mcp-session-id": session},
                )
                assert status == 200, body
                # A log line of the call may come first, on the call's own event stream.
                [answer] = [m for m in events(body) if m.get("id") == id]
                return answer

            return request

        admin, reader = Probe(requester(ADMIN)), Probe(requester(READER))
        admin.check_hidden_everywhere()
        admin_tools, reader_tools = set(admin.all_tools()), set(reader.all_tools())
        assert reader_tools < admin_tools
        assert "git__git_status" in reader_tools and "git__git_create_branch" not in reader_tools
        # The reader cannot reach what its profile hides, even by name.
        error = reader.call("tools/call", {"name": "git__git_create_branch", "arguments": {}})["error"]
        assert error["code"] == -32602
        # A session belongs to its token: the reader's session id with the admin token is unknown.
        status, _, _ = post(
            port,
            {"jsonrpc": "2.0", "id": 1, "method": "ping"},
            {"authorization": f"Bearer {ADMIN}", "mcp-session-id": sessions[READER][0]},
        )
        assert status == 404
        # A profile has its own path too, and a token cannot use another profile's.
        status, _, _ = post(
            port,
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "x", "version": "0"},
                },
            },
            {"authorization": f"Bearer {ADMIN}"},
            path="/mcp/reader",
        )
        assert status == 403
    assert READER not in log.read_text() and ADMIN not in log.read_text()


async def test_websocket_front(tmp_path, everything_js, git_repo):
    config = policy_config(tmp_path, everything_js, git_repo)
    port = free_port()
    with open(tmp_path / "ws.log", "wb") as log:  # noqa: ASYNC230 - before any await
        process = subprocess.Popen(  # noqa: ASYNC220
            [
                sys.executable,
                "-m",
                "aggregator",
                "serve",
                "--ws",
                f"127.0.0.1:{port}",
                "--config",
                str(config),
            ],
            stdin=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        await trio.to_thread.run_sync(wait_listening, port, process)
        with trio.fail_after(60):
            async with trio_websocket.open_websocket_url(
                f"ws://127.0.0.1:{port}/mcp", extra_headers=[("authorization", f"Bearer {ADMIN}")]
            ) as socket:
                request = websocket_requester(socket)

                await request(
                    1,
                    "initialize",
                    {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "ws", "version": "0"}},
                )
                # The probe is synchronous: run it in a thread that calls back into trio.
                probe = Probe(lambda id, method, params: trio.from_thread.run(request, id, method, params))
                await trio.to_thread.run_sync(probe.check_hidden_everywhere)
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_explain_shows_what_hid_each_item(tmp_path, everything_js, git_repo):
    config = policy_config(tmp_path, everything_js, git_repo)
    out = subprocess.run(
        [sys.executable, "-m", "aggregator", "tools", "--config", str(config), "--profile", "reader", "--explain"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "profile reader" in out.stdout and "HIDDEN TOOLS" in out.stdout
    assert "everything:echo  hidden by servers.everything.tools.deny 'echo'" in out.stdout
    assert "git:git_commit  hidden by servers.git.tools.deny 'git_commit'" in out.stdout
    assert "hidden by profiles.reader.tools.read_only" in out.stdout
    assert "everything:toggle-simulated-logging  hidden by policy.tools.deny '*simulated*'" in out.stdout


def test_sampling_denied_for_a_server(tmp_path, everything_js):
    """P07: the client can sample, but this server may not ask it to."""
    config = write_config(
        tmp_path,
        f'''
[servers.everything]
command = "node"
args = ["{everything_js}", "stdio"]
server_requests = ["roots"]
''',
        startup_timeout=20.0,
    )
    proxy = RawProxy(config)
    try:
        proxy.request(
            1,
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {"sampling": {}},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        )
        answer = proxy.request(
            2, "tools/call", {"name": "everything__trigger-sampling-request", "arguments": {"prompt": "hi"}}
        )
        assert not any(n.get("method") == "sampling/createMessage" for n in proxy.notifications)
        text = json.dumps(answer)
        assert "not allowed by policy" in text, text
    finally:
        code, log = proxy.close()
    assert code == 0, log
