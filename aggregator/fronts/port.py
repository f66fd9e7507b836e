"""What a front needs of the hub: its ``ClientPort``.

A front never holds the router. It tells the hub what its client did (connected, sent a
line or a decoded message, sent what cannot be read, went idle, went away) and asks what
it must know to serve it (the session's state, how deep a message may nest, whether the
hub is shutting down); the hub routes each event and carries out what the router says.
The port says the timing of each: a stream front's lines (``client_message``,
``client_refused``) are queued and written at the reader's ``flush``, once per read;
a message decoded in a task of its own (an HTTP request: ``client_decoded``) is written
with what else that scheduler turn queues; everything else at once.

The hub is a ``ClientPort``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from aggregator.cluster.keys import KeyRing
    from aggregator.cluster.store import Store
    from aggregator.config import Config
    from aggregator.core.catalogs.catalog import Catalog
    from aggregator.core.router import SessionInfo
    from aggregator.hub.caps import Admission
    from aggregator.hub.drain import Drain
    from aggregator.jsonrpc.errors import RemoteProtocolError
    from aggregator.telemetry.tracing import Tracing
    from aggregator.transports.budget import ClientMemory
    from aggregator.transports.sink import ClientSink


class ClientPort(Protocol):
    """What a front needs of the hub (the hub is one)."""

    config: Config
    admission: Admission  # the connection and session caps every network front counts against
    client_memory: ClientMemory  # what all clients' queues hold together
    tracing: Tracing | None
    keys: KeyRing  # [cluster] keys: what seals a legacy session's id
    store: Store  # [cluster] store: what the replicas share (pub/sub between them)
    shutdown: Drain  # the drain: what is still admitted, when the listener closes

    # --- what a client did --------------------------------------------------------------

    def client_connected(self, sink: ClientSink, profile: str = "default", **kind: Any) -> int:
        """A new client, whose messages go to ``sink``; its key."""

    def client_adopted(
        self,
        sink: ClientSink,
        profile: str,
        *,
        principal: Any,
        access_token: str | None,
        protocol_version: str,
        capabilities: dict[str, Any],
        client_info: dict[str, Any],
        shared_name: str | None = None,
    ) -> int:
        """A legacy session initialized elsewhere (its id was sealed), taken over; its key.
        ValueError when ``profile`` is none of this proxy's."""

    def caller_token(self, key: int, token: str | None) -> None:
        """The client's latest request carried ``token``, its OAuth access token (None: none)."""

    async def client_message(self, key: int, raw: bytes) -> None:
        """A line read from a stream (stdio, WebSocket); written at the next ``flush``."""

    async def client_decoded(self, key: int, kind: int, message: dict[str, Any]) -> None:
        """A message decoded in a task of its own; written with this scheduler turn's."""

    def client_refused(self, key: int, exc: RemoteProtocolError, *, now: bool = False) -> None:
        """A message that could not be read, answered by ``exc``; at the next ``flush``, or ``now``."""

    def client_answer_refused(self, key: int, exc: RemoteProtocolError) -> None:
        """An answer to a server's request that could not be read: the server hears so now."""

    def client_cancelled(self, key: int, id: Any, reason: str) -> None:
        """Nobody will receive the answer of request ``id``: cancelled upstream now."""

    def client_finished(self, key: int) -> None:
        """Its input ended and its requests in flight ran out of time: cancelled and answered now."""

    def client_idle(self, key: int) -> bool:
        """Keep the client with nothing to do, if nothing of it is held; False: disconnect it."""

    def client_disconnected(self, key: int) -> None:
        """The client is gone: its work upstream is cancelled now."""

    async def flush(self, own: ClientSink | None = None) -> None:
        """Write what the read queued; then wait while ``own`` (the reader's queue) is backed up."""

    def write_now(self) -> None:
        """Write what is queued now, outside a reader's batch."""

    # --- what a front asks --------------------------------------------------------------

    def has_client(self, key: int) -> bool:
        """Whether client ``key`` is still connected."""

    def session_info(self, key: int) -> SessionInfo | None:
        """What is known of client ``key``'s session (None: no session now)."""

    def profile_catalog(self, profile: str) -> Catalog:
        """The merged catalog a profile's clients see."""

    @property
    def max_json_depth(self) -> int:
        """How deep a message a front decodes itself may nest."""

    @property
    def draining(self) -> bool:
        """Shutting down: not ready, and every response closes its connection (the sessions
        open are served until the drain ends)."""
