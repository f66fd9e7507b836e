"""What the hub needs of a client's queue: the ``ClientSink`` protocol.

Every front gives the hub one sink per client session: a stdio ``Outbox``, a Streamable
HTTP ``HttpSession``, a legacy SSE ``LegacySession``, a ``WebSocketSink``. The hub queues
the client's messages in it during a batch (``put_message``), writes every sink the batch
touched once at its end (``flush``), and when all clients together hold more than their
budget drops the one that has stopped reading longest (``blocked``, ``last_progress``,
``held``, ``shed``; see ``transports.budget``), and tells it when a request ended
unanswered (``request_ended``).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class ClientSink(Protocol):
    # Queued since the last flush: the hub's bookkeeping, so a sink is flushed once a batch.
    dirty: bool
    # Bytes waiting or being written, as counted in the budget of all clients.
    held: int

    def put_message(self, message: Any, related: Any = None) -> None:
        """Queue a message (a dict, or bytes already encoded); ``related`` is the id of the
        client's request it belongs to, if any. Never blocks, never writes."""

    def flush(self) -> None:
        """Start writing what was queued (and drop the client if it is past its budget)."""

    async def wait_writable(self) -> None:
        """For the client's own reader: wait while too much waits for the client."""

    async def wait_drained(self) -> None:
        """At shutdown: wait until what was queued so far is written (or returns at once)."""

    def blocked(self) -> bool:
        """Whether a write waits for the client to read."""

    def last_progress(self) -> float:
        """When a write to the client last got bytes out."""

    def shed(self, reason: str) -> None:
        """Drop the client to free memory; it hears ``reason``."""

    def request_ended(self, id: Any) -> None:
        """A request of this client ended without an answer (the client cancelled it). A
        front with a stream per request ends that stream; the others have nothing to do."""
