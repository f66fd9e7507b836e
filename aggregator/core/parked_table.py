"""The table of parked calls and what bounds it (``core.park_limits`` applies it). Pure data."""

from __future__ import annotations

from typing import Any


class ParkedTable(dict[int, Any]):
    """Parked call id -> its ``core.parked.Parked``; with the limits, the count of each
    principal's calls in the table and the latest deadline of each server's."""

    def __init__(self, max_calls: int, max_per_principal: int) -> None:
        super().__init__()
        self.max_calls = max_calls
        self.max_per_principal = max_per_principal
        self.by_principal: dict[Any, int] = {}  # principal -> its calls in the table
        self.expiry: dict[str, float] = {}  # link -> the latest deadline of its parked calls
