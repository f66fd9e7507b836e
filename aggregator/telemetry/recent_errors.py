"""The last warnings and errors the proxy logged, for the status page (``/status``).

A logging handler on the ``aggregator`` logger that keeps the last ``RECENT_ERRORS``
records at WARNING and above, each as its time, level, logger and message (cut to
``MESSAGE_LIMIT`` characters). Tracebacks are left out: the log has them. What it keeps is
what the log says, so it holds no secret the log would not (servers' secrets are masked
before they are logged). Attached while the hub runs, so that hubs made one after
another (tests) leave no handler behind.

Repeats are one entry, so that a flood of one message cannot push the others out: a
record like one kept (same logger and level, same message once its numbers are put
aside) adds to that entry's ``count``, becomes its ``message`` and ``time`` (the last),
and moves it to the front; ``first`` is when it was first kept. A refusal of a request
(logged with ``extra=REFUSAL``) is kept by its logger and format string alone, so that
refusals of a thousand different paths are one entry, not a thousand.

Imports nothing of the proxy.
"""

from __future__ import annotations

import collections
import logging
import re
from typing import Any

RECENT_ERRORS = 100
MESSAGE_LIMIT = 1000
REFUSAL = {"refusal": True}  # `extra` of the log call that says a request was refused
_NUMBER = re.compile(r"\d+")


class RecentErrors(logging.Handler):
    def __init__(self, size: int = RECENT_ERRORS) -> None:
        super().__init__(logging.WARNING)
        self.size = size
        # Oldest first, by what makes two records repeats of one another.
        self.records: collections.OrderedDict[tuple[str, str, str], dict[str, Any]] = collections.OrderedDict()
        self._logger = logging.getLogger("aggregator")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string must not break logging
            message = str(record.msg)
        level = record.levelname.lower()
        alike = str(record.msg) if getattr(record, "refusal", False) else _NUMBER.sub("#", message[:MESSAGE_LIMIT])
        key = (record.name, level, alike)
        entry = self.records.pop(key, None)
        if entry is None:
            entry = {"level": level, "logger": record.name, "count": 0, "first": record.created}
        entry.update(time=record.created, message=message[:MESSAGE_LIMIT], count=entry["count"] + 1)
        self.records[key] = entry
        while len(self.records) > self.size:
            self.records.popitem(last=False)

    def attach(self) -> None:
        if self not in self._logger.handlers:
            self._logger.addHandler(self)

    def detach(self) -> None:
        self._logger.removeHandler(self)

    def snapshot(self) -> list[dict[str, Any]]:
        """The entries kept, the most recently logged first."""
        return [dict(entry) for entry in reversed(self.records.values())]
