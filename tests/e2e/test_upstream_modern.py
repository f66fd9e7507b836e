"""A modern (2026-07-28) server behind the proxy, over stdio and Streamable HTTP, used by
legacy clients: the official Python SDK 1.x and a raw JSON-RPC client. The server is
``tests/upstream_modern/server.py`` (the official SDK 2.x ``MCPServer``); the proxy finds
its era with ``server/discover`` ("auto") or is pinned to it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, RawProxy, fake, http_proxy, write_config
from tests.loopback import INIT, mcp_over_http

pytestmark = pytest.mark.e2e
HERE = ROOT / "tests" / "upstream_modern"
SERVER = HERE / "server.py"
CLIENT = HERE / "sdk1_client.py"
PYTHON2 = ROOT / ".venv" / "bin" / "python"  # the official Python SDK 2.x (serves both eras)


def stdio_table(protocol: str = "auto", steps_file: Path | None = None) -> str:
    table = f'[servers.m]\ncommand = "{PYTHON2}"\nargs = ["{SERVER}"]\nprotocol = "{protocol}"\n'
    if steps_file is not None:
        table += f'env = {{ FIXTURE_STEPS_FILE = "{steps_file}" }}\n'
    return table


def modern_http_server(steps_file: Path | None = None):
    """The modern server over Streamable HTTP on 127.0.0.1; yields its URL."""
    env = {"PATH": "/usr/bin:/bin"}
    if steps_file is not None:
        env["FIXTURE_STEPS_FILE"] = str(steps_file)
    return mcp_over_http([str(PYTHON2), str(SERVER), "http", "PORT"], env=env)


def sdk1(python1, *args):
    out = subprocess.run([str(python1), str(CLIENT), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def check(seen):
    assert seen["version"] == "2025-11-25"  # the proxy speaks legacy to a legacy client
    assert {"m__add", "m__slow", "m__grow", "m__region"} <= set(seen["tools"]) and "m__extra" not in seen["tools"]
    assert seen["add"] == {"result": 5}
    assert seen["slow"] == "done after 3 steps" and seen["progress"] == [1, 2, 3]
    assert seen["resource"] == "m+test://hello" and seen["read"] == "hello from a modern server"
    assert seen["prompt"] == "Please greet ada."
    assert "m__extra" in seen["after"]  # the list change came through the proxy's listen


@pytest.mark.parametrize("protocol", ["auto", "2026-07-28"])
def test_sdk1_over_stdio_to_a_modern_stdio_server(python1, tmp_path, protocol):
    config = write_config(tmp_path, stdio_table(protocol))
    check(sdk1(python1, "stdio", str(config), sys.executable))


def test_sdk1_over_http_to_a_modern_http_server(python1, tmp_path):
    with modern_http_server() as url:
        config = write_config(tmp_path, f'[servers.m]\nurl = "{url}"\n')
        with http_proxy(config) as (port, log):
            check(sdk1(python1, "http", f"http://127.0.0.1:{port}/mcp"))
        assert "protocol 2026-07-28; modern" in log.read_text()


def raw_session(proxy: RawProxy) -> None:
    assert proxy.request(0, "initialize", INIT["params"])["result"]["protocolVersion"]
    proxy.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')


def steps(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


def cancelled_stops_upstream(proxy: RawProxy, steps_file: Path) -> None:
    """A raw client cancels a slow call: the server stops working on it, the client gets
    no answer to it, and the next request is answered."""
    call = {"name": "m__slow", "arguments": {"steps": 50}, "_meta": {"progressToken": "p"}}
    proxy.send(json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": call}).encode() + b"\n")
    for _ in range(50):  # bounded: the first progress notices mean the call runs upstream
        if steps(steps_file) >= 2:
            break
        time.sleep(0.1)
    assert steps(steps_file) >= 2
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7, "reason": "test"}}
    proxy.send(json.dumps(cancel).encode() + b"\n")
    time.sleep(1.0)
    stopped_at = steps(steps_file)
    time.sleep(1.0)
    assert steps(steps_file) == stopped_at < 50  # it stopped upstream
    answer = proxy.request(8, "tools/call", {"name": "m__add", "arguments": {"a": 1, "b": 1}})
    assert answer["id"] == 8 and answer["result"]["structuredContent"] == {"result": 2}  # never an answer to 7


def test_raw_client_calls_and_cancels_through_stdio(tmp_path):
    steps_file = tmp_path / "steps"
    proxy = RawProxy(write_config(tmp_path, stdio_table(steps_file=steps_file)), "--log-level", "info")
    try:
        raw_session(proxy)
        listed = proxy.request(1, "tools/list")["result"]["tools"]
        assert "m__add" in [tool["name"] for tool in listed]
        cancelled_stops_upstream(proxy, steps_file)
    finally:
        code, log = proxy.close()
    assert code == 0 and "protocol 2026-07-28; modern" in log


def test_raw_client_calls_and_cancels_through_http(tmp_path):
    steps_file = tmp_path / "steps"
    with modern_http_server(steps_file) as url:
        config = write_config(tmp_path, f'[servers.m]\nurl = "{url}"\n')
        proxy = RawProxy(config, "--log-level", "info")
        try:
            raw_session(proxy)
            called = proxy.request(1, "tools/call", {"name": "m__region", "arguments": {"where": "eu-north"}})
            assert called["result"]["content"][0]["text"] == "eu-north via eu-north"  # Mcp-Param-Region sent
            cancelled_stops_upstream(proxy, steps_file)
        finally:
            code, log = proxy.close()
    assert code == 0, log


def test_a_modern_server_pinned_legacy_is_spoken_to_with_initialize(tmp_path):
    """The SDK 2.x server serves the legacy era too: pinned, the proxy never probes it."""
    proxy = RawProxy(write_config(tmp_path, stdio_table("2025-06-18")), "--log-level", "info")
    try:
        raw_session(proxy)
        answer = proxy.request(1, "tools/call", {"name": "m__add", "arguments": {"a": 20, "b": 22}})
        assert answer["result"]["structuredContent"] == {"result": 42}
    finally:
        code, log = proxy.close()
    assert code == 0 and "initialized (modern-fixture" in log and "protocol 2025-06-18" in log


def test_check_and_tools_show_each_servers_era(tmp_path):
    config = write_config(tmp_path, stdio_table() + fake("old", "echo"))
    run = [sys.executable, "-m", "aggregator"]
    out = subprocess.run([*run, "check", "--config", str(config)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.startswith("  ")}
    assert "modern 2026-07-28" in lines["m"] and "legacy 2025-11-25" in lines["old"]
    out = subprocess.run(
        [*run, "tools", "--json", "--config", str(config)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert json.loads(out.stdout)["servers"] == {
        "m": {"era": "modern", "protocol": "2026-07-28"},
        "old": {"era": "legacy", "protocol": "2025-11-25"},
    }
