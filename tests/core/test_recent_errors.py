"""The status page's recent warnings and errors: repeats are one entry with a count, so a
flood of one message (a refused request, a server restarting) keeps the others."""

from __future__ import annotations

import logging

from aggregator.telemetry.recent_errors import REFUSAL, RecentErrors


def record(message: str, *args: object, name: str = "aggregator.x", refusal: bool = False) -> logging.LogRecord:
    made = logging.LogRecord(name, logging.WARNING, __file__, 1, message, args, None)
    if refusal:
        made.__dict__.update(REFUSAL)
    return made


def test_repeats_are_one_entry_with_a_count_and_the_last_message() -> None:
    kept = RecentErrors(size=3)
    kept.emit(record("server %s: exited with status %d", "a", 1))
    for attempt in range(5):
        kept.emit(record("server %s: restart %d failed", "b", attempt))
    entries = kept.snapshot()
    assert [entry["message"] for entry in entries] == ["server b: restart 4 failed", "server a: exited with status 1"]
    assert entries[0]["count"] == 5 and entries[1]["count"] == 1
    assert entries[0]["first"] <= entries[0]["time"]


def test_different_messages_stay_apart_and_the_oldest_goes_first() -> None:
    kept = RecentErrors(size=2)
    for name in ("a", "b", "c"):
        kept.emit(record("server %s: down", name))
    kept.emit(record("server %s: down", "b"))  # b again: the newest now
    assert [(e["message"], e["count"]) for e in kept.snapshot()] == [("server b: down", 2), ("server c: down", 1)]


def test_refusals_of_any_path_are_one_entry_and_evict_nothing() -> None:
    kept = RecentErrors(size=3)
    kept.emit(record("server %s: down", "a", name="aggregator.upstreams.session"))
    for index in range(120):
        path = f"/metrics{'x' * (index % 7)}?{chr(97 + index % 26)}"
        kept.emit(
            record("admin: refused %s %s: %s", "GET", path, "missing token", name="aggregator.ops.admin", refusal=True)
        )
    entries = kept.snapshot()
    assert len(entries) == 2
    assert entries[0]["count"] == 120 and entries[0]["message"].startswith("admin: refused GET /metrics")
    assert entries[1] == {**entries[1], "message": "server a: down", "count": 1}
