"""The end-to-end modern server (``modern_server.py``, SDK 2.x) on its own, driven by the SDK 2.x
client (``sdk2_client.py``) in both eras over stdio and Streamable HTTP: every feature the
end-to-end tests rely on works without the proxy, so a failure through the proxy is the proxy's."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT
from tests.loopback import mcp_over_http

pytestmark = pytest.mark.e2e
HERE = Path(__file__).parent
SERVER = HERE / "modern_server.py"
CLIENT = HERE / "sdk2_client.py"
TOOLS = ["add", "ask_name", "bump", "cancellations", "echo", "grow", "roots", "slow", "summarize"]


def drive(mode: str, target: str) -> dict:
    out = subprocess.run(
        [sys.executable, str(CLIENT), mode, target], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@contextmanager
def server_over_http(log: Path):
    with open(log, "wb") as output, mcp_over_http([sys.executable, str(SERVER), "http", "PORT"], stderr=output) as url:
        yield url


def check(seen: dict, mode: str) -> None:
    assert seen["version"] == ("2025-11-25" if mode == "legacy" else mode)
    assert seen["tools"] == TOOLS
    assert (seen["add"], seen["echo"]) == ("5", "héllo")
    assert seen["slow"] == "done after 3 steps" and seen["progress"] == [1.0, 2.0, 3.0]
    assert seen["cancelled"] == 1  # the server saw the cancelled call end
    assert seen["ask_name"] == "hello ada"  # elicitation
    assert seen["summarize"] == "summary: short a long story"  # sampling
    assert seen["roots"] == "roots: file:///tmp/a, file:///tmp/b"
    assert seen["counter"] == "0" and seen["prompt"] == "Ahoy, ada!" and seen["completion"] == ["pirate", "plain"]
    assert seen["grown"] == "extra_1" and sorted([*TOOLS, "extra_1"]) == seen["tools_after"]
    changed = "ToolListChangedNotification" if mode == "legacy" else "ToolsListChanged"
    assert seen["tools_event"] == changed
    assert seen["resource_event"] == ["ResourceUpdated", "test://counter"]


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
def test_over_stdio(mode):
    check(drive(mode, f"{sys.executable} {SERVER}"), mode)


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
def test_over_streamable_http(tmp_path, mode):
    with server_over_http(tmp_path / "server.log") as url:
        check(drive(mode, url), mode)
