"""``aggregator status`` at a terminal: how a status.json reads, and durations. Pure."""

from __future__ import annotations

import time

import pytest

from aggregator.cli.status import duration, status_text

STATUS = {
    "version": "0.1.0",
    "uptime": 125.4,
    "ready": False,
    "readiness": {"ready": 1, "needed": 2, "configured": 2},
    "draining": False,
    "servers": [
        {"name": "a", "state": "ready", "uptime": 61, "restarts": 0, "era": "modern", "protocol": "2026-07-28"},
        {
            "name": "b",
            "state": "down",
            "uptime": None,
            "restarts": 3,
            "era": None,
            "last_error": "the server exited with status 1",
            "stderr": ["FATAL: API_KEY missing"],
        },
        {"name": "c", "state": "disabled", "transport": "stdio"},
        {"name": "d", "state": "per user", "transport": "streamable-http", "auth": "oauth", "sessions": 2},
    ],
    "sessions": [{"transport": "websocket", "profile": "reader", "protocol": "2025-11-25", "in_flight": 2, "age": 7}],
    "errors": [],
    "catalog": {
        "reader": {
            "exposed": {"tools": [{"name": "a__echo"}]},
            "hidden": {"tools": [{"server": "a", "original": "add", "rule": "profiles.reader.tools.deny 'add'"}]},
        }
    },
}


def test_status_text_says_what_is_down_and_why():
    lines = status_text(STATUS)
    assert lines[0] == "aggregator 0.1.0: not ready, 1 of 2 servers ready (2 needed), up for 2m 5s"
    text = "\n".join(lines)
    assert "  a                    ready     up 1m 1s  modern 2026-07-28" in lines
    assert "  b                    down      3 restarts" in lines
    assert "the server exited with status 1" in text and "[stderr] FATAL: API_KEY missing" in text
    assert "  c                    disabled" in lines
    assert "  d                    per user  2 sessions as their users" in lines
    assert "websocket" in text and "2 in flight" in text
    assert "PROFILE reader: 1 shown, 1 hidden" in lines
    assert "  a:add  hidden by profiles.reader.tools.deny 'add'" in lines
    assert "RECENT WARNINGS" not in text  # none to show


def test_status_text_shows_when_a_lazy_servers_start_failed_and_its_stderr():
    at = time.mktime((2026, 12, 5, 1, 2, 3, 0, 0, -1))
    lazy = {"name": "e", "state": "lazy", "last_error": "the server exited with status 3", "last_error_at": at}
    lines = status_text({**STATUS, "servers": [{**lazy, "stderr": ["fatal: no settings"]}]})
    assert "  e                    lazy" in lines
    assert f"  {'':<20} at 01:02:03: the server exited with status 3" in lines
    assert f"  {'':<20} [stderr] fatal: no settings" in lines


def test_status_text_when_draining():
    assert ": draining," in status_text({**STATUS, "draining": True})[0]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59.9, "59s"), (125, "2m 5s"), (7300, "2h 1m"), (90000, "1d 1h"), (None, "?")],
)
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_a_repeated_error_says_how_often() -> None:
    errors = [
        {"time": 0, "first": 0, "level": "warning", "logger": "aggregator.admin", "message": "refused", "count": 3},
        {"time": 0, "first": 0, "level": "error", "logger": "aggregator.upstream", "message": "down", "count": 1},
    ]
    text = "\n".join(status_text({**STATUS, "errors": errors}))
    assert "warning  refused (3 times)" in text and "error    down\n" in text + "\n"
