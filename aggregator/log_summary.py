"""``LogSummary``: a line that may come in floods (refused requests, a failing token
endpoint) logged once, then at most once per interval per kind, with how many were held back.

The first line of a kind is logged at once; those that follow within the interval are only
counted, and the next one logged after it says how many there were. Kinds are few by
construction (a status, a server's name); the table is still bounded (``MAX_KINDS``: past
it, the oldest kind is forgotten). The clock is injected.

Imports nothing of the proxy.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

MAX_KINDS = 1024


class LogSummary:
    def __init__(
        self,
        logger: logging.Logger,
        level: int = logging.WARNING,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.level = level
        self.interval = interval
        self.clock = clock
        self._kinds: OrderedDict[Hashable, list[float]] = OrderedDict()  # kind -> [next line at, held back]

    def log(self, kind: Hashable, message: str, *args: object, **kwargs: object) -> bool:
        """Log ``message % args`` now if no line of ``kind`` was logged within the interval
        (saying how many were held back since the last), else count it; whether it was logged."""
        now = self.clock()
        state = self._kinds.get(kind)
        if state is not None and now < state[0]:
            state[1] += 1
            return False
        held = int(state[1]) if state is not None else 0
        if held:
            message += " (and %d more like it since the last such line)"
            args = (*args, held)
        self._kinds[kind] = [now + self.interval, 0]
        self._kinds.move_to_end(kind)
        while len(self._kinds) > MAX_KINDS:
            self._kinds.popitem(last=False)
        self.logger.log(self.level, message, *args, **kwargs)  # type: ignore[arg-type]
        return True
