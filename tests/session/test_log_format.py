"""The JSON log format: one object a line, with the record's structured fields and its
traceback's text, and nothing that is not JSON."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from aggregator.cli.logs import JsonFormatter


def record(**kwargs: object) -> logging.LogRecord:
    base = {
        "name": "aggregator.x",
        "levelno": logging.ERROR,
        "levelname": "ERROR",
        "msg": "server %s: %d",
        "args": ("a", 3),
    }
    return logging.makeLogRecord({**base, **kwargs})


def test_one_line_with_the_fields():
    line = JsonFormatter().format(record(peer="server a", bytes=12, where=Path("/tmp/x"), created=0.5))
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "1970-01-01T00:00:00.500Z",
        "level": "error",
        "logger": "aggregator.x",
        "message": "server a: 3",
        "peer": "server a",
        "bytes": 12,
        "where": "/tmp/x",
    }


def test_a_traceback_is_a_field():
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        info = sys.exc_info()
    line = JsonFormatter().format(record(exc_info=info))
    assert "\n" not in line
    fields = json.loads(line)
    assert fields["exception"].startswith("Traceback") and "ValueError: bad\nthing" in fields["exception"]
    assert fields["message"] == "server a: 3"
