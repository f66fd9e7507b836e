"""Deadlines for requests in flight, as a heap with lazy deletion. Pure data.

Each entry is ``(when, sequence, item)``. An item is due only if it is still live and
its own ``deadline`` is still ``when``: moving a deadline (progress resets the timeout)
pushes a new entry and leaves the old one to be skipped, so nothing is ever searched.
Entries left behind by finished items are counted, and once they outnumber the live ones
the heap is rebuilt from the live entries: memory stays proportional to what is in
flight, even at a hundred thousand requests a second with minute-long timeouts.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any


class Deadlines:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Any]] = []
        self._sequence = itertools.count()
        self._stale = 0

    def push(self, when: float, item: Any) -> None:
        heapq.heappush(self._heap, (when, next(self._sequence), item))

    def move(self, when: float, item: Any) -> None:
        """Give a live item a new deadline (set ``item.deadline = when`` first)."""
        self._stale += 1
        self.push(when, item)

    def discard(self) -> None:
        """Note that one live item has finished (its entry is now stale)."""
        self._stale += 1
        if self._stale > 1024 and self._stale * 2 > len(self._heap):
            self._heap = [entry for entry in self._heap if _live(entry)]
            heapq.heapify(self._heap)
            self._stale = 0

    def next(self) -> float | None:
        """The earliest deadline still live, or None."""
        heap = self._heap
        while heap and not _live(heap[0]):
            heapq.heappop(heap)
            self._stale = max(0, self._stale - 1)
        return heap[0][0] if heap else None

    def pop_due(self, now: float) -> list[Any]:
        due = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if _live(entry):
                due.append(entry[2])
            else:
                self._stale = max(0, self._stale - 1)
        return due

    def __len__(self) -> int:
        return len(self._heap)


def _live(entry: tuple[float, int, Any]) -> bool:
    item = entry[2]
    return not item.done and item.deadline == entry[0]
