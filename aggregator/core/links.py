"""An upstream as the router sees it (``UpstreamLink``, one per connection it routes to) and a
request in flight to it (``Pending``). Sans-IO."""

from __future__ import annotations

from typing import Any

import attrs

from aggregator.core import defaults
from aggregator.core.own_requests import OwnRequests
from aggregator.core.upstream_lifecycle import CONTROL_ID_PREFIX, UpstreamLifecycle


class Pending:
    """One request in flight to an upstream."""

    __slots__ = (
        "session",
        "client_id",
        "method",
        "server",
        "upstream_id",
        "client_token",
        "token",
        "deadline",
        "hard_deadline",
        "sent_at",
        "done",
        "extra",
        "meta",
    )

    def __init__(self, session: int, client_id: Any, method: str, server: str, upstream_id: int) -> None:
        self.session = session
        self.client_id = client_id
        self.method = method
        self.server = server
        self.upstream_id = upstream_id
        self.client_token: Any = None
        self.token: str | None = None  # the proxy's progress token upstream
        self.deadline = 0.0
        self.hard_deadline = 0.0
        self.sent_at = 0.0  # when it was sent upstream (for its duration); 0: not sent
        self.done = False
        self.extra: Any = None  # subscription key, Held; a modern call's params sent, or Parked
        self.meta: dict[str, Any] | None = None  # a modern caller's ``_meta`` for it; None: a legacy one


@attrs.define(eq=False)
class UpstreamLink:
    name: str
    prefix: str
    uri_prefix: str
    server: str = ""  # the configured server; differs from name for per-session links
    session: int | None = None  # the one client a per-session link belongs to
    request_timeout: float = defaults.REQUEST_TIMEOUT
    max_request_timeout: float = defaults.MAX_REQUEST_TIMEOUT
    timeout_resets_on_progress: bool = defaults.TIMEOUT_RESETS_ON_PROGRESS
    ready: bool = False
    next_id: int = 1  # of clients' requests forwarded to it
    pending: dict[int, Pending] = attrs.field(factory=dict)
    capabilities: dict[str, Any] = attrs.field(factory=dict)
    instructions: str | None = None
    protocol_version: str | None = None
    # Its era: ``protocol`` is "auto" or a pinned revision; ``era`` what a connection learnt
    # ("legacy", "modern"); ``modern``: the current connection speaks it (no session).
    modern: bool = False
    protocol: str = "auto"
    discover_timeout: float = defaults.DISCOVER_TIMEOUT
    era: str | None = None
    log_level: str | None = None  # what the proxy last asked this upstream for
    # It delivers what belongs to a request on that request's own stream (Streamable HTTP),
    # and the transport says which: a message that came any other way belongs to none.
    streams: bool = False
    # Why this upstream cannot take more input now (its queue is past its budget or it
    # reads nothing), as the trio layer reports it; None when it can.
    overloaded: str | None = None
    # Requests held until a per-session link is ready: (client key, message, params).
    waiting: list[tuple[int, dict[str, Any], dict[str, Any]]] = attrs.field(factory=list)
    # Clients' resources/subscribe to a modern server, answered once its new listen is
    # acknowledged (so an update right after the answer is not missed): (client, request id).
    acks: list[tuple[int, Any]] = attrs.field(factory=list)
    # It was told its roots changed and has not asked for them since: telling it again
    # says nothing new (a client's flood of changes reaches it once).
    roots_told: bool = False
    # The proxy's own requests to it (string ids, its lifecycle's and the router's), for
    # the link's whole life: ids never repeat, so an answer to an ended connection's is stale.
    own: OwnRequests[Any] = attrs.field(factory=lambda: OwnRequests(CONTROL_ID_PREFIX))
    lifecycle: UpstreamLifecycle | None = None  # the current connection's; None between connections
