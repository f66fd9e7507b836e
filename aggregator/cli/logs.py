"""How the command line logs to stderr: the level its ``--log-level`` names and the
format its ``--log-format`` names, plain text (the default) or one JSON object a line.

A JSON line holds ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger`` and
``message``, then the structured fields a log call passed in ``extra`` (the message
traffic's ``direction``, ``peer``, ``method``, ``id``, ``bytes``), and ``exception``
with the traceback's text when there is one. Nothing else of the record is written.
"""

from __future__ import annotations

import copy
import json
import logging
import sys
import time
from typing import Any

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# What every LogRecord has: the rest of its attributes came from ``extra``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


# Control characters (C0, DEL, C1) as escapes: what a peer sent (an id, a method, a server's
# stderr) cannot end a log line early, forge the next one or drive the reader's terminal.
_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))}


class TextFormatter(logging.Formatter):
    """The text format, one line per record: the values a message quotes (its ``args``)
    have their control characters escaped (the message's own text is the proxy's)."""

    def format(self, record: logging.LogRecord) -> str:
        args = record.args
        if args:
            record = copy.copy(record)
            if isinstance(args, tuple):
                record.args = tuple(_escaped(arg) for arg in args)
            elif isinstance(args, dict):
                record.args = {key: _escaped(value) for key, value in args.items()}
        return super().format(record)


def _escaped(value: object) -> object:
    if isinstance(value, str):
        return value.translate(_ESCAPES)
    if isinstance(value, BaseException):  # its text may quote what a peer sent
        return str(value).translate(_ESCAPES)
    return value  # (bytes show as their repr, escaped already; numbers as numbers)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_") and key not in line:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = record.stack_info
        # default=str: an extra that JSON cannot hold (a path, an exception) as its text.
        return json.dumps(line, ensure_ascii=False, default=str)


def _utc(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created * 1000) % 1000:03d}Z"


def setup_logging(level: str, log_format: str = "text") -> None:
    """Log to stderr at ``level`` (one of ``LEVELS``) in ``log_format`` (one of ``FORMATS``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    if level != "debug":
        # httpx logs every request it makes at info: one line per message to an HTTP server
        # (and so does the proxy's own client, for the POSTs it makes instead).
        logging.getLogger("httpx").setLevel(logging.WARNING)
        logging.getLogger("aggregator.upstreams.http_client").setLevel(logging.WARNING)
    # httpcore's traces (debug) quote a failed request's exception, which may hold a header's
    # value; what failed is logged by the proxy itself, its secrets masked.
    logging.getLogger("httpcore").setLevel(logging.INFO)
