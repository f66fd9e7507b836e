"""A client session as the router knows it (``ClientState``) and what the trio layer may read
of one (``SessionInfo``). Records only; the router's groups keep them in ``Router.clients``.
Sans-IO."""

from __future__ import annotations

from typing import Any, NamedTuple

import attrs

from aggregator.core.lifecycle.upstream_era import Era
from aggregator.core.records.links import Pending


@attrs.define(eq=False)
class ClientState:
    key: int
    initialize_seen: bool = False
    initialized: bool = False
    protocol_version: str | None = None
    capabilities: dict[str, Any] = attrs.field(factory=dict)
    client_info: dict[str, Any] = attrs.field(factory=dict)
    advertised: dict[str, Any] = attrs.field(factory=dict)
    in_flight: dict[Any, Pending] = attrs.field(factory=dict)
    log_level: str | None = None
    profile: str = "default"
    # The era it speaks: a modern one's requests each carry their own ``_meta`` (revision,
    # capabilities, client info, log level) and no initialize opens it. A Streamable HTTP
    # request of that era is a client of its own, for that one request.
    era: Era = Era.LEGACY
    # A modern client's last ``_meta`` that passed admission (a copy): the same again
    # needs no checking (``modern_callers``).
    envelope: dict[str, Any] | None = None
    # Who it is, as the front authenticated it (an HTTP bearer token's index; None on
    # stdio or without tokens): what the proxy's own request state is bound to.
    principal: Any = None
    stateless: bool = False  # a stateless HTTP request's client: no session outlives it
    # Its session's name on every replica (a digest of its sealed id): what the rests of its
    # cut results are bound to in the shared store. None: it has none.
    shared_name: str | None = None
    # What this client sees: its profile's catalog, or its own view once a per-session
    # server of its own has listed (``Router.views``).
    catalog: Any = None
    # Servers acting as each user whose own connection for this client ended or took too
    # long before it listed: its lists wait for them no more (``core.upstreams.own_listings``).
    unlisted: set[str] = attrs.field(factory=set)
    # Of those, the ``oauth`` ones whose user must grant access first: it sees their grant tool.
    granting: set[str] = attrs.field(factory=set)
    # The announcement count when it was given the lists (its initialize answer): a
    # list_changed notice queued up to then is already in what it was given.
    announced_upto: int = 0


class SessionInfo(NamedTuple):
    """What the trio layer may know of a client session: a snapshot, read-only."""

    profile: str
    protocol_version: str | None  # agreed at initialize; None before
    in_flight: int  # its requests not answered yet
    stateless: bool = False  # a stateless HTTP request's client: no session at all
    principal: Any = None  # who the front authenticated (never a token)
    # Its name on every replica (a digest of its sealed id, ``cluster.sealing.shared_name``);
    # None for a session only this replica knows.
    shared_name: str | None = None
