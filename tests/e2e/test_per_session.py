"""A per-session server-everything behind `aggregator serve --http`, with two concurrent
clients of the official Python SDK 1.x: what one session's own server makes, lists,
announces and updates reaches that session only, and goes when the session goes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import run_per_session_everything

pytestmark = pytest.mark.e2e
SCRIPT = Path(__file__).parent / "sdk1_per_session.py"


def test_a_per_session_servers_items_notices_and_updates_belong_to_its_session(tmp_path, everything_js, python1):
    seen = run_per_session_everything(tmp_path, everything_js, python1, SCRIPT, timeout=120, pass_log=True)
    made = "everything+demo://resource/session/a-notes.txt.gz"

    # Before its own connection a session sees the shared listing; after, its own server's.
    assert "everything__trigger-sampling-request" in seen["b_tools_before"]
    assert seen["b_switched"] and seen["b_told_tools_changed"]

    # A's server made a resource: A is told, lists it and reads it back.
    assert seen["a_made"][0]["uri"] == made
    assert made not in seen["a_resources_before"]
    assert seen["a_told_resources_changed"] and made in seen["a_resources_after"]
    assert seen["a_read_back"] == "notes that only client A made\n" * 20
    # B never sees it: not listed, not readable (its own server has no such resource).
    assert made not in seen["b_resources"] and made not in seen["b_resources_after"]
    assert seen["b_read"].startswith("error:") and "not found" in seen["b_read"]

    # Updates from A's own connection reach A, not B (subscribed to the same URI on its own).
    assert seen["a_updated"] and set(seen["a_updates"]) == {seen["document"]}
    foreign = [
        note
        for note in seen["b_notes_while_a_worked"]
        if note["method"].startswith("notifications/resources/") or note["method"].endswith("/list_changed")
    ]
    assert foreign == []

    # A leaves: its server process ends, B's goes on and B still works.
    assert len(seen["own_connections"]) == 2
    assert seen["a_process_gone"] and seen["b_process_alive"]
    assert seen["b_echo_after"] == "Echo: still here"
