"""A per-session server-everything behind `aggregator serve --http`, two concurrent
clients of the official Python SDK 1.x: what the proxy says of itself (instructions) and
what tasks/list gathers never involve another session's own connection."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, http_proxy, write_config

pytestmark = pytest.mark.e2e
PYTHON1 = ROOT / ".venv-mcp1" / "bin" / "python"
SCRIPT = Path(__file__).parent / "sdk1_per_session_tasks.py"


def test_instructions_and_tasks_list_stay_within_each_session(tmp_path, everything_js):
    if not PYTHON1.exists():
        pytest.fail(f"{PYTHON1} is missing: the README's test command creates it (mcp==1.30.0)")
    config = write_config(tmp_path, f'''
[servers.everything]
command = "node"
args = ["{everything_js}", "stdio"]
isolation = "per-session"
''', startup_timeout=20.0)
    with http_proxy(config, "--log-level", "info") as (port, log):
        run = subprocess.run([str(PYTHON1), str(SCRIPT), f"http://127.0.0.1:{port}/mcp"],
                             capture_output=True, text=True, timeout=90, cwd=ROOT)
        assert run.returncode == 0, run.stderr[-3000:] + log.read_text()[-3000:]
        seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["a_echo"] == "Echo: start my own"
    # The instructions name the server once, as configured: never a session's own connection.
    for who in ("a", "b"):
        instructions = seen[f"{who}_instructions"]
        assert instructions.count("## Server everything") == 1, instructions
        assert "everything@" not in instructions
    assert seen["a_instructions"] == seen["b_instructions"]
    # A's task is A's: listed to A, never to B, before and after B has its own connection.
    task = seen["a_task"]
    assert task.startswith("everything@") and task in seen["a_tasks"] and task in seen["a_tasks_after"]
    assert seen["b_tasks"] == [] and seen["b_tasks_own"] == []
