"""``LogSummary``: the first line of a kind at once, then at most one per interval, which
counts those held back; kinds apart; the table bounded."""

from __future__ import annotations

import logging

from aggregator import log_summary
from aggregator.log_summary import LogSummary


def test_a_flood_is_one_line_per_interval_with_a_count(caplog):
    now = [0.0]
    summary = LogSummary(logging.getLogger("aggregator.test"), logging.WARNING, 60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="aggregator.test"):
        logged = [summary.log("a", "refused %s", "one") for _ in range(5)]
        assert logged == [True, False, False, False, False]
        assert summary.log("b", "other kind")  # kinds apart
        now[0] = 59.9
        assert not summary.log("a", "refused %s", "again")
        now[0] = 60.0
        assert summary.log("a", "refused %s", "later")
        now[0] = 200.0
        assert summary.log("a", "refused %s", "quiet since")
    assert [r.getMessage() for r in caplog.records] == [
        "refused one",
        "other kind",
        "refused later (and 5 more like it since the last such line)",
        "refused quiet since",
    ]


def test_the_kinds_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(log_summary, "MAX_KINDS", 3)
    summary = LogSummary(logging.getLogger("aggregator.test"), clock=lambda: 0.0)
    for kind in range(10):
        summary.log(kind, "x")
    assert list(summary._kinds) == [7, 8, 9]
