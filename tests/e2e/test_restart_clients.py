"""A real server (mcp-server-time) killed under two official-SDK clients (TypeScript and
Python 1.x, over Streamable HTTP) that keep calling its tool: while it restarts, and while
its restarts fail, each call gets reason ``unavailable`` with the server's state and
``retryAfter``, or the answer once it is back; never "Unknown tool"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import HERE, MANY, ROOT, http_proxy, post, write_config
from tests.loopback import free_port, wait_listening

pytestmark = pytest.mark.e2e

# The server, unless the flag file exists: then its start fails (exit 3) until it is gone.
WRAPPER = """import os, sys
if os.path.exists(sys.argv[1]):
    sys.exit(3)
os.execv(sys.executable, [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"])
"""


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_two_sdk_clients_see_a_restart_as_unavailable_never_unknown(tmp_path, python1):
    flag = tmp_path / "fail-to-start"
    wrapper = tmp_path / "time_server.py"
    wrapper.write_text(WRAPPER)
    config = write_config(
        tmp_path,
        f'''
[servers.time]
command = "{sys.executable}"
args = ["{wrapper}", "{flag}"]
''',
        restart_backoff_initial=0.2,
        restart_backoff_max=0.8,
    )
    with http_proxy(config) as (port, log):
        url = f"http://127.0.0.1:{port}/mcp"
        proxy_pid = int(next(p for p in Path("/proc").iterdir() if p.name.isdigit() and _is_proxy(p, port)).name)
        outputs = {"ts": tmp_path / "ts.out", "python": tmp_path / "python.out"}
        commands = {
            "ts": ["node", str(HERE / "ts_restart_client.mjs"), url, "time__get_current_time", "60"],
            "python": [str(python1), str(HERE / "sdk1_restart_client.py"), url, "time__get_current_time", "60"],
        }
        clients = {}
        try:
            for name, argv in commands.items():
                with open(outputs[name], "wb") as out:
                    clients[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
            # Both are calling it, and it answers.
            wait_for(
                lambda: all(any(o.get("ok") for o in lines(p)) for p in outputs.values()),
                60,
                "both clients' first answers",
            )
            [server_pid] = children(proxy_pid)
            flag.touch()  # its restarts fail until the flag goes
            os.kill(server_pid, signal.SIGKILL)
            wait_for(
                lambda: all(
                    sum(1 for o in lines(p) if "data" in o and o["data"] and "retryAfter" in o["data"]) >= 3
                    for p in outputs.values()
                ),
                30,
                "both clients to hear it is restarting",
            )
            flag.unlink()
            for name, client in clients.items():
                assert client.wait(timeout=60) == 0, outputs[name].read_text()[-3000:]
        finally:
            for client in clients.values():
                if client.poll() is None:
                    client.kill()
                    client.wait(timeout=10)
        for name, path in outputs.items():
            seen = lines(path)
            errors = [o for o in seen if "ok" not in o]
            assert seen[-1] == {"ok": True}, (name, seen[-5:])
            assert errors, name
            for error in errors:
                assert "Unknown tool" not in error["message"] and error["code"] != -32602, (name, error)
                assert error["data"]["source"] == "aggregator" and error["data"]["reason"] == "unavailable", error
                assert error["data"]["server"] == "time"
            told = [e["data"] for e in errors if "retryAfter" in e["data"]]
            assert told, (name, errors)
            for data in told:
                assert data["state"] in ("restarting", "failed", "starting"), data
                assert 0 <= data["retryAfter"] <= 0.8 and data["lastError"], data
            # Its failed starts are named: "the server exited with status 3".
            assert any(d["lastError"] == "the server exited with status 3" for d in told), (name, told)
        assert "Traceback" not in log.read_text()


def _is_proxy(proc: Path, port: int) -> bool:
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"aggregator" in argv and f"127.0.0.1:{port}".encode() in argv


# The server, unless the flag file exists: then its start hangs (an attempt under way).
SLOW_WRAPPER = """import os, sys, time
if os.path.exists(sys.argv[1]):
    time.sleep(60)
os.execv(sys.executable, [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"])
"""


def test_sigterm_answers_the_calls_held_for_a_restarting_server(tmp_path, python1):
    # Two SDK clients call a server whose restart is under way: their calls wait for it.
    # SIGTERM then: each client gets an error saying why, never a stream closed without a word.
    flag = tmp_path / "hang-at-start"
    wrapper = tmp_path / "time_server.py"
    wrapper.write_text(SLOW_WRAPPER)
    config = write_config(
        tmp_path,
        f'''
[servers.time]
command = "{sys.executable}"
args = ["{wrapper}", "{flag}"]
init_timeout = 90.0
request_timeout = 60.0
''',
        restart_backoff_initial=0.1,
        restart_backoff_max=0.1,
        drain_timeout=5.0,
    )
    port = free_port()
    log = tmp_path / "proxy.log"
    with open(log, "wb") as stderr:
        proxy = subprocess.Popen(
            [sys.executable, "-m", "aggregator", "serve", "--http", f"127.0.0.1:{port}", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stderr=stderr,
        )
    clients = None
    try:
        wait_listening(port, proxy)
        # Ready (listed), not merely initialized: killed while it lists, it "did not start".
        wait_for(lambda: post(port, None, path="/readyz", method="GET")[0] == 200, 30, "the server to be ready")
        [server_pid] = children(proxy.pid)
        flag.touch()
        os.kill(server_pid, signal.SIGKILL)
        wait_for(
            lambda: "lost" in log.read_text() and len(children(proxy.pid)) == 1 and children(proxy.pid) != [server_pid],
            30,
            "the restart attempt",
        )
        plan = {label: {"calls": [["time__get_current_time", {"timezone": "UTC"}]]} for label in "AB"}
        clients = subprocess.Popen(
            [str(python1), str(MANY), f"http://127.0.0.1:{port}/mcp", json.dumps(plan)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        time.sleep(4)  # both are connected and their calls wait for the server
        proxy.send_signal(signal.SIGTERM)
        out, err = clients.communicate(timeout=30)
        assert proxy.wait(timeout=15) == 0, log.read_text()[-3000:]
    finally:
        for process in (clients, proxy):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(timeout=10)
    assert clients.returncode == 0, err[-3000:]
    seen = json.loads(out.strip().splitlines()[-1])
    for label in "AB":
        [result] = seen[label]["results"]
        assert result["error"] is True, seen
        assert "The aggregator stopped before server 'time' was ready for tools/call" in result["text"], seen
