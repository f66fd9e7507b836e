"""What an upstream session needs of the hub that supervises it: its ``UpstreamPort``.

An upstream session never holds the router. It tells the hub what happened to its
connection (connected, a message, too large a message, backed up, lost, down) and asks it
to send a request of the proxy's own (an ``OwnCall``, which the hub settles); the hub
routes each event and carries out what the router says. The port says the timing of
each: what the reader hands over (``server_lines``, ``server_messages``: all that one read,
or one batch of decoded messages, held, in one call) is queued and written at the reader's
``flush``; everything else is carried out at once.

The hub is an ``UpstreamPort``; this package does not import the hub, which is above it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from aggregator.config import Config
from aggregator.core.commands import Answer
from aggregator.jsonrpc.framing import OversizedLine
from aggregator.transports.channel import ServerMessage

# async def connector(server_config, *, task_status) -> str: report a Channel through
# task_status, run until the server is gone, return why.
Connector = Callable[..., Awaitable[str]]


class OwnCall:
    """A request of the proxy's own (``UpstreamSession.request``), waiting for its answer."""

    __slots__ = ("event", "answer")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.answer: Answer | None = None

    def settle(self, answer: Answer) -> None:
        """Its answer came (the hub carries out the router's ``Answer``)."""
        if self.answer is None:
            self.answer = answer
            self.event.set()


class ServerReader(Protocol):
    """Where a server's reader hands what it reads (the hub, through ``UpstreamPort``).

    A reader hands over all that one read held in one call, not a call per message: a
    server that floods (log lines, progress) costs the proxy one routing per message and
    nothing more per message on the way to it.
    """

    def server_lines(self, name: str, lines: list[bytes | OversizedLine], limit: int) -> None:
        """The lines one read of stdio server ``name``'s output held, in order (an
        ``OversizedLine``: one over ``limit`` bytes, dropped); written at the next ``flush``."""

    def server_messages(self, name: str, batch: list[ServerMessage]) -> None:
        """Messages network server ``name`` sent, each decoded by its connection (or why it
        could not be) and tagged with the request on whose stream it came; written at the
        next ``flush``."""

    async def flush(self) -> None:
        """Write what the read queued."""


class UpstreamPort(ServerReader, Protocol):
    """What an upstream session needs of the hub (the hub is one)."""

    config: Config
    looking: bool  # a command's one look at the servers, which reports their failures itself
    # How upstreams are reached; None means by their configured transport.
    connector: Connector | None

    @property
    def max_json_depth(self) -> int:
        """How deep a message a network connection decodes may nest."""

    def upstream_connected(
        self,
        name: str,
        *,
        target: str,
        init_timeout: float,
        capabilities: dict[str, Any] | None,
        modern_possible: bool,
    ) -> None:
        """The connection is up: the router's lifecycle sends ``initialize`` now."""

    def server_streams(self, name: str, tagged: bool) -> None:
        """Whether the connection tags each message with the request it belongs to."""

    def server_congested(self, name: str, reason: str | None) -> int | None:
        """Its input is backed up (``reason``) or flowing again (None): its requests in
        flight, or None if nothing changed."""

    def server_overloaded(self, name: str, reason: str) -> None:
        """It has read nothing for its deadline: its requests in flight fail now."""

    def server_lost(self, name: str, reason: str) -> None:
        """The connection is lost: what waits for it fails now."""

    def server_down(self, name: str, reason: str, retry_in: float) -> None:
        """It starts again in ``retry_in`` seconds: its callers hear so now."""

    def server_held(self, name: str) -> bool:
        """Whether anything holds it: a client request in flight or held, a subscription or
        an open listen's resource."""

    async def server_dormant(self, name: str) -> bool:
        """It is stopped until a request needs it: list it from its cached listing; False
        when it has none (then it is started again as any server)."""

    def own_call_started(self, name: str, method: str, params: dict[str, Any] | None, call: OwnCall) -> None:
        """Send a request of the proxy's own, its answer settled on ``call``."""

    def server_settled(self, name: str) -> None:
        """This upstream is ready, or its first attempt failed."""
