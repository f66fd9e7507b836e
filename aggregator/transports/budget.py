"""One memory budget for everything the proxy holds for its clients together. Sans-IO.

Each client has its own budget (``proxy.client_buffer_bytes``), but many clients that each
stay just under theirs would add up without end. So every client's queue (a stdio
``Outbox``, a Streamable HTTP or legacy SSE session, a WebSocket sink) also counts what it
holds in one shared ``ClientMemory``: it adds a message's bytes when it takes the message
in and subtracts them once they are written (what is being written still counts: it is
still in memory) or forgotten. That is two integer additions per message, no scan.

When ``total`` passes ``limit``, ``exceeded`` is called. The hub then drops the clients
that have stopped reading (a write to them waits and none of their bytes went out for a
moment), the longest stalled first, by the same path as a client past its own budget,
until the total is back under the limit (as Envoy's overload manager does); finding them
is the only scan, and it happens only then. Nobody is ever waited for, and a client that
reads is never dropped for the total.

A client that ends gives back everything it holds at once (``release_all``) and from
then on counts into a private, unlimited ``ClientMemory``: a write of it still in
progress that finishes later is not subtracted twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def _nothing() -> None:
    return None


class ClientMemory:
    __slots__ = ("total", "limit", "exceeded")

    def __init__(self, limit: float = math.inf, exceeded: Callable[[], None] = _nothing) -> None:
        self.total = 0  # bytes held for every client counted here
        self.limit = limit
        self.exceeded = exceeded  # called when an addition takes total past limit


def release_all(client: Any) -> None:
    """Give back what ``client`` (with ``held`` and ``memory``) holds; it counts nowhere after."""
    client.memory.total -= client.held
    client.held = 0
    client.memory = ClientMemory()
