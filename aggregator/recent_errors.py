"""The last warnings and errors the proxy logged, for the status page (``/status``).

A logging handler on the ``aggregator`` logger that keeps the last ``RECENT_ERRORS``
records at WARNING and above, each as its time, level, logger and message (cut to
``MESSAGE_LIMIT`` characters). Tracebacks are left out: the log has them. What it keeps is
what the log says, so it holds no secret the log would not (servers' secrets are masked
before they are logged). Attached while the hub runs, so that hubs made one after
another (tests) leave no handler behind.

Imports nothing of the proxy.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

RECENT_ERRORS = 100
MESSAGE_LIMIT = 1000


class RecentErrors(logging.Handler):
    def __init__(self, size: int = RECENT_ERRORS) -> None:
        super().__init__(logging.WARNING)
        self.records: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)
        self._logger = logging.getLogger("aggregator")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string must not break logging
            message = str(record.msg)
        self.records.append(
            {
                "time": record.created,
                "level": record.levelname.lower(),
                "logger": record.name,
                "message": message[:MESSAGE_LIMIT],
            }
        )

    def attach(self) -> None:
        if self not in self._logger.handlers:
            self._logger.addHandler(self)

    def detach(self) -> None:
        self._logger.removeHandler(self)

    def snapshot(self) -> list[dict[str, Any]]:
        """The records kept, newest first."""
        return list(reversed(self.records))
