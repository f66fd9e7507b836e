"""The official Python SDK 1.x (`mcp<2`), over every front the proxy has: stdio,
Streamable HTTP, the legacy HTTP+SSE transport and WebSocket."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, fake, http_proxy, write_config
from tests.loopback import free_port, wait_listening

pytestmark = pytest.mark.e2e
SCRIPT = Path(__file__).parent / "sdk1_client.py"


def drive(python1, *args):
    out = subprocess.run([str(python1), str(SCRIPT), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def check(seen):
    assert seen["server"] == "aggregator"
    assert "a__echo" in seen["tools"] and len(seen["tools"]) == len(set(seen["tools"]))
    assert "123456789012345678901234567890" in seen["echo"] and seen["is_text"]
    assert seen["sum"] == {"sum": 5}
    assert seen["resource"] == seen["read"] == "a+fake://doc/1"
    assert "Unknown tool" in seen["unknown"]


def test_stdio(python1, tmp_path):
    config = write_config(tmp_path, fake("a"), page_size=4)
    check(drive(python1, "stdio", str(config), sys.executable))


def test_http_sse_and_websocket(python1, tmp_path):
    config = write_config(tmp_path, fake("a"), page_size=4)
    http, ws = free_port(), free_port()
    with open(tmp_path / "proxy.log", "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aggregator",
                "serve",
                "--http",
                f"127.0.0.1:{http}",
                "--ws",
                f"127.0.0.1:{ws}",
                "--config",
                str(config),
            ],
            stdin=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            wait_listening(http, process)
            wait_listening(ws, process)
            check(drive(python1, "http", f"http://127.0.0.1:{http}/mcp"))
            check(drive(python1, "sse", f"http://127.0.0.1:{http}/sse"))
            check(drive(python1, "websocket", f"ws://127.0.0.1:{ws}/mcp"))
        finally:
            process.terminate()
            assert process.wait(timeout=15) == 0


def test_a_refused_call_over_sse_is_answered_on_the_stream(python1, tmp_path):
    """A request the proxy refuses (nested past the depth limit) but whose id it reads is
    answered on the session's event stream, where a 2024-11-05 client reads every answer:
    the SDK's call fails at once, and its session goes on."""
    config = write_config(tmp_path, fake("a"))
    with http_proxy(config) as (port, log):
        script = Path(__file__).parent / "sdk1_refused_sse.py"
        argv = [str(python1), str(script), f"http://127.0.0.1:{port}/sse"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=90, cwd=ROOT)
        assert out.returncode == 0, out.stderr[-3000:]
        seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["code"] == -32600 and "nested deeper than 128" in seen["message"], seen
    assert seen["seconds"] < 5, seen
    assert json.loads(seen["after"]) == {"n": 7}
    assert "Traceback" not in log.read_text()
