"""A per-session server-everything behind `aggregator serve --http`, two concurrent
clients of the official Python SDK 1.x: what the proxy says of itself (instructions) and
what tasks/list gathers never involve another session's own connection."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import run_per_session_everything

pytestmark = pytest.mark.e2e
SCRIPT = Path(__file__).parent / "sdk1_per_session_tasks.py"


def test_instructions_and_tasks_list_stay_within_each_session(tmp_path, everything_js, python1):
    seen = run_per_session_everything(tmp_path, everything_js, python1, SCRIPT, timeout=90)
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
