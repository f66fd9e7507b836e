"""The proxy's own requests to one upstream: their ids and what waits for each answer. Sans-IO.

A request the proxy makes for itself (``initialize``, a list page, a subscription, a log
level, a ``tasks/list`` for a gather) is not a client's: its answer is consumed inside the
proxy. Its id is a string ``<prefix><n>`` (numbered per connection), so an answer is told
apart from the answers to clients' requests, whose upstream ids are integers, without a
lookup. Each id maps to a *waiter* (whatever the owner needs to resume: a listing step, a
gather) and an absolute deadline; an answer, an expiry or the end of the connection hands
the waiter back to its owner exactly once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

W = TypeVar("W")


class Waiting(NamedTuple, Generic[W]):
    """What an own request left behind: the method it asked and what waits for its answer."""

    method: str
    waiter: W
    deadline: float
    id: str = ""  # the request's id, to cancel it upstream


class OwnRequests(Generic[W]):
    """Id allocation and the table ``id -> Waiting`` for one upstream connection."""

    __slots__ = ("prefix", "_count", "_waiting")

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._count = 0
        self._waiting: dict[str, Waiting[W]] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def open(self, method: str, params: dict[str, Any] | None, waiter: W, deadline: float) -> dict[str, Any]:
        """Register a request and return the message to send (``params`` left out when None)."""
        self._count += 1
        id = f"{self.prefix}{self._count}"
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            message["params"] = params
        self._waiting[id] = Waiting(method, waiter, deadline, id)
        return message

    def settle(self, id: Any) -> Waiting[W] | None:
        """The request an answer with ``id`` settles, forgotten now; None for an unknown
        id (never ours, answered twice, or already expired)."""
        return self._waiting.pop(id, None) if type(id) is str else None

    def peek(self, id: Any) -> Waiting[W] | None:
        """The request an answer with ``id`` would settle, left in the table."""
        return self._waiting.get(id) if type(id) is str else None

    def find(self, test: Callable[[W], bool]) -> Waiting[W] | None:
        """The first request whose waiter passes ``test``, left in the table."""
        return next((waiting for waiting in self._waiting.values() if test(waiting.waiter)), None)

    def expire(self, now: float) -> list[Waiting[W]]:
        """The requests whose deadline has passed, forgotten now (a late answer is dropped)."""
        if not self._waiting:
            return []
        late = [id for id, waiting in self._waiting.items() if waiting.deadline <= now]
        return [self._waiting.pop(id) for id in late]

    def next_deadline(self) -> float | None:
        if not self._waiting:
            return None
        return min(waiting.deadline for waiting in self._waiting.values())

    def drop_if(self, test: Callable[[W], bool]) -> list[Waiting[W]]:
        """Forget the requests whose waiter passes ``test`` (its owner gave up on them)."""
        gone = [id for id, waiting in self._waiting.items() if test(waiting.waiter)]
        return [self._waiting.pop(id) for id in gone]

    def clear(self) -> list[Waiting[W]]:
        """Forget every request (the connection ended); what waited for them."""
        waiting = list(self._waiting.values())
        self._waiting.clear()
        return waiting
