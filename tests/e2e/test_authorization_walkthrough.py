"""docs/authorization.md's "Try it locally" runs as written: its authorization server
command, its config and its proxy command (on free ports instead of 9000 and 8000, with a
git repository of its own), the challenge and metadata its curl lines show, and its client
command, for alice (an admin: every tool) and bob (only tools that say they only read)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.authserver.harness import start_authserver
from tests.e2e.conftest import ROOT, http_proxy, post
from tests.loopback import free_port

pytestmark = pytest.mark.e2e
PAGE = ROOT / "docs" / "authorization.md"


def section() -> tuple[list[str], str]:
    """The section's sh blocks, and its one toml block."""
    text = PAGE.read_text().split("## Try it locally", 1)[1].split("\n## ", 1)[0]
    [toml] = re.findall(r"```toml\n(.*?)\n```", text, re.S)
    return re.findall(r"```sh\n(.*?)\n```", text, re.S), toml


def test_the_local_walkthrough_runs_as_written(tmp_path: Path, git_repo: Path):
    (authserver, serve, curl, client), toml = section()
    issuer_port, proxy_port = free_port(), free_port()

    def ported(text: str) -> str:
        return text.replace("9000", str(issuer_port)).replace("8000", str(proxy_port))

    argv = shlex.split(ported(authserver))
    assert argv[:3] == [".venv/bin/python", "-m", "tests.authserver"]
    # The documented options, after the harness's own (--port 0, no users): the later win.
    with start_authserver(*argv[3:], users=()) as server:
        assert server.issuer == f"http://127.0.0.1:{issuer_port}"
        config = tmp_path / "local.toml"
        # "." is the reader's repository; here, one of the test's own.
        assert '"--repository", "."' in toml
        config.write_text(ported(toml).replace('"--repository", "."', f'"--repository", "{git_repo}"'))
        # http_proxy runs the documented command, on the port given.
        assert serve == ".venv/bin/aggregator serve --http 127.0.0.1:8000 --config local.toml"
        with http_proxy(config, port=proxy_port) as (port, _):
            assert "curl -si -X POST http://127.0.0.1:8000/mcp" in curl
            status, headers, _ = post(port, None, {"content-type": None, "accept": "*/*"})  # as curl sends it
            assert status == 401
            assert headers["www-authenticate"] == (
                f'Bearer resource_metadata="http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp", '
                'scope="mcp"'
            )
            assert "curl -s http://127.0.0.1:8000/.well-known/oauth-protected-resource/mcp" in curl
            _, _, body = post(port, None, path="/.well-known/oauth-protected-resource/mcp", method="GET")
            assert json.loads(body)["authorization_servers"] == [f"http://127.0.0.1:{issuer_port}"]
            seen = {}
            for user in ("alice", "bob"):
                argv = shlex.split(ported(client).replace('"alice"', f'"{user}"'))
                assert argv[:2] == [".venv/bin/python", "tests/e2e/sdk_oauth_client.py"]
                run = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=120, cwd=ROOT)
                seen[user] = json.loads(run.stdout.strip().splitlines()[-1])
    alice, bob = seen["alice"], seen["bob"]
    assert "error" not in alice and '"timezone": "UTC"' in alice["called"], alice
    assert {"time__get_current_time", "git__git_status", "git__git_commit"} <= set(alice["tools"]), alice
    assert set(bob["tools"]) < set(alice["tools"]) and "git__git_commit" not in bob["tools"], bob
