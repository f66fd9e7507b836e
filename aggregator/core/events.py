"""What the trio layer tells the router: the events ``Router.handle`` takes. Sans-IO.

Every event is a small attrs record; ``Router.handle(event)`` looks its handler up by the
event's type (one dict lookup) and returns the commands (``core.commands``) to execute.
Queries (``session_info``, ``describe``, ``next_deadline``, the catalogs...) are not
events: they change nothing and stay methods of the router.

Records are ``attrs.define`` with slots and no weakref slot, not frozen: a frozen attrs
instance costs about 2.5 times as much to build (measured: 356 ns against 138 ns, where a
named tuple costs 227 ns), and two of these are built per call on the hot path (the
client's request, the server's response). Nobody changes an event after building it.

This module imports nothing of the router's: the fronts, the hub and the upstream
sessions build events from it, and the router's packages read them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeAlias

import attrs

from aggregator.core.lifecycle.upstream_era import Era
from aggregator.core.settings import Discovery, LinkSettings
from aggregator.jsonrpc.errors import RemoteProtocolError

# --- clients ----------------------------------------------------------------------------


@attrs.define(weakref_slot=False)
class ClientConnected:
    """Client session ``key`` connected, for ``profile``'s catalog. ``era``: MODERN when its
    front knows it speaks a modern revision from its first message (else it may still turn
    out to, ``core.era.modern_callers``); ``principal``: who the front authenticated;
    ``stateless``: a stateless HTTP request's own client."""

    key: int
    profile: str = "default"
    era: Era = Era.LEGACY
    principal: Any = None
    stateless: bool = False
    # The session's name on every replica (a digest of its sealed id; None: it has none,
    # and what it leaves is served by this replica alone).
    shared_name: str | None = None


@attrs.define(weakref_slot=False)
class ClientAdopted:
    """Client session ``key`` connected already initialized: a legacy session opened on
    another replica, or before this one restarted, whose front read its immutable state
    from its sealed session id. Nothing goes upstream: the router takes it as the
    handshake left it (``protocol_version`` as agreed then, the client's ``capabilities``
    and ``client_info``), for ``profile``'s catalog, as ``principal``."""

    key: int
    profile: str
    principal: Any
    protocol_version: str
    capabilities: dict[str, Any]
    client_info: dict[str, Any]
    shared_name: str | None = None  # as for ``ClientConnected``


@attrs.define(weakref_slot=False)
class ClientMessage:
    """Client ``key`` sent ``raw`` (one JSON-RPC message, not decoded yet)."""

    key: int
    raw: bytes


@attrs.define(weakref_slot=False)
class ClientDecoded:
    """Client ``key`` sent ``message``, already decoded and classified as ``kind``
    (``decode_message``: a front or a plugin hook looked at it first)."""

    key: int
    kind: int
    message: dict[str, Any]


@attrs.define(weakref_slot=False)
class ClientRefused:
    """A message of client ``key`` could not be accepted (``exc`` says why and what to
    answer)."""

    key: int
    exc: RemoteProtocolError


@attrs.define(weakref_slot=False)
class ClientAnswerRefused:
    """Client ``key``'s refused message may have been its answer to a server's request:
    that server hears at once (the front answered the client itself)."""

    key: int
    exc: RemoteProtocolError


@attrs.define(weakref_slot=False)
class ClientDisconnected:
    """Client ``key`` went away. ``answer``: it stopped sending but may still read (end of
    input on stdio), so what it has in flight is answered with errors too."""

    key: int
    answer: bool = False


# --- upstreams --------------------------------------------------------------------------


@attrs.define(weakref_slot=False)
class UpstreamConnected:
    """A connection to ``server`` is up: its lifecycle starts the handshake, declaring
    ``capabilities`` (a per-session connection's client's) or the proxy's own.
    ``modern_possible``: its transport has a modern binding."""

    server: str
    target: str
    init_timeout: float
    capabilities: dict[str, Any] | None = None
    modern_possible: bool = True


@attrs.define(weakref_slot=False)
class ServerMessage:
    """Upstream ``server`` sent ``raw`` (one JSON-RPC message, not decoded yet);
    ``related``: the proxy's request whose stream carried it (Streamable HTTP)."""

    server: str
    raw: bytes
    related: int | None = None


@attrs.define(weakref_slot=False)
class ServerDecoded:
    """Upstream ``server`` sent a message its transport read and decoded already (a network
    server's, decoded once as it came off the wire, under the same limits): ``decoded`` is
    what ``decode_message`` returned for it, or the RemoteProtocolError it raised."""

    server: str
    decoded: tuple[int, dict[str, Any]] | RemoteProtocolError
    related: int | None = None


@attrs.define(weakref_slot=False)
class ServerOversized:
    """Upstream ``server`` sent a message over ``limit`` bytes; ``head`` is its start."""

    server: str
    head: bytes
    limit: int


@attrs.define(weakref_slot=False)
class ServerReady:
    """Upstream ``server`` finished its handshake with ``init_result``."""

    server: str
    init_result: dict[str, Any]


@attrs.define(weakref_slot=False)
class ServerItems:
    """Upstream ``server`` listed ``items`` of ``kind`` (tools, prompts, ...)."""

    server: str
    kind: str
    items: list[dict[str, Any]]


@attrs.define(weakref_slot=False)
class ServerListing:
    """Upstream ``server`` listed every kind at once (``listing``: kind -> items)."""

    server: str
    listing: dict[str, list[dict[str, Any]]]


@attrs.define(weakref_slot=False)
class ServerListed:
    """Upstream ``server``'s first listing is complete."""

    server: str


@attrs.define(weakref_slot=False)
class ServerStreams:
    """Whether upstream ``server``'s transport delivers what belongs to a request on that
    request's own stream (Streamable HTTP)."""

    server: str
    streams: bool


@attrs.define(weakref_slot=False)
class ServerCongested:
    """Upstream ``server`` cannot take more input (``reason``) or can again (None)."""

    server: str
    reason: str | None


@attrs.define(weakref_slot=False)
class ServerOverloaded:
    """Upstream ``server`` read nothing for its deadline: its requests in flight fail."""

    server: str
    why: str


@attrs.define(weakref_slot=False)
class ServerLost:
    """The connection to upstream ``server`` ended (``why``)."""

    server: str
    why: str


@attrs.define(weakref_slot=False)
class ServerDown:
    """Shared upstream ``server`` is out between starts (``reason``), the next in
    ``retry_in`` seconds."""

    server: str
    reason: str
    retry_in: float


@attrs.define(weakref_slot=False)
class ServerCached:
    """Shared upstream ``server`` is not started (``start = "lazy"``): its catalog is its
    cached ``listing`` (kind -> items, as it last listed them) until it is started."""

    server: str
    listing: dict[str, list[dict[str, Any]]]


@attrs.define(weakref_slot=False)
class LinkEnded:
    """A per-session connection ``name`` ended on its own before it was ready."""

    name: str


@attrs.define(weakref_slot=False)
class OwnCallStarted:
    """The trio layer asks ``server`` ``method`` with ``params`` for itself; the ``Answer``
    command names ``caller``."""

    server: str
    method: str
    params: dict[str, Any] | None
    caller: object


# --- the proxy's life -------------------------------------------------------------------


@attrs.define(weakref_slot=False)
class TimePassed:
    """The clock reached ``Router.next_deadline``: whatever timed out ends."""


@attrs.define(weakref_slot=False)
class StartupCompleted:
    """Every server listed, or the wait for them timed out: nothing waits for startup."""


@attrs.define(weakref_slot=False)
class DrainingStarted:
    """Shutting down: what is in flight finishes, nothing new is taken."""


@attrs.define(weakref_slot=False)
class Abandoned:
    """The proxy stops now (``why``): everything still in flight is answered with errors."""

    why: str


# --- reconfiguration (a live reload) ----------------------------------------------------


@attrs.define(weakref_slot=False)
class ServerRemoved:
    """``server`` is no longer configured (``why``)."""

    server: str
    why: str


@attrs.define(weakref_slot=False)
class ServerRestarting:
    """``server`` restarts with a changed configuration (``why``)."""

    server: str
    why: str


@attrs.define(weakref_slot=False)
class ServerReplaced:
    """``server``'s settings changed (``why``): its link starts over with them."""

    server: LinkSettings
    why: str


@attrs.define(weakref_slot=False)
class ServerAdded:
    """``server`` is newly configured."""

    server: LinkSettings


@attrs.define(weakref_slot=False)
class CatalogsRenewed:
    """Every profile's catalog is renewed over ``servers`` (config order) with each
    profile's policy (``policies``) and the plugins' ``catalog_hook``."""

    servers: Iterable[Any]
    policies: dict[str, Any]
    catalog_hook: Any = None


@attrs.define(weakref_slot=False)
class DiscoveryRenewed:
    """The search-mode settings of every profile changed (``discovery``: profile -> them)."""

    discovery: dict[str, Discovery]


@attrs.define(weakref_slot=False)
class KeptFetched:
    """What the shared store held for ``fetch`` (a ``FetchKept`` the router asked for):
    the rest's ``text`` (in pages of ``page_bytes``), kept for ``ttl`` seconds more, if it
    was there and readable in time; else None (missing, expired, or the store down)."""

    fetch: Any  # the FetchKept (``core.commands``)
    text: str | None
    page_bytes: int = 0
    ttl: float = 0.0


Event: TypeAlias = (
    ClientConnected
    | ClientAdopted
    | ClientMessage
    | ClientDecoded
    | ClientRefused
    | ClientAnswerRefused
    | ClientDisconnected
    | UpstreamConnected
    | ServerMessage
    | ServerDecoded
    | ServerOversized
    | ServerReady
    | ServerItems
    | ServerListing
    | ServerListed
    | ServerStreams
    | ServerCongested
    | ServerOverloaded
    | ServerLost
    | ServerDown
    | ServerCached
    | LinkEnded
    | OwnCallStarted
    | TimePassed
    | StartupCompleted
    | DrainingStarted
    | Abandoned
    | ServerRemoved
    | ServerRestarting
    | ServerReplaced
    | ServerAdded
    | CatalogsRenewed
    | DiscoveryRenewed
    | KeptFetched
)
