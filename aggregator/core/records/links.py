"""An upstream as the router sees it (``UpstreamLink``, one per connection it routes to) and a
client request in flight through the proxy (``Pending``, in its ``Phase``), with the records
its phases carry (a parked call, an input bridge). Sans-IO."""

from __future__ import annotations

import enum
from typing import Any, NamedTuple, TypeAlias

import attrs

from aggregator.core import defaults
from aggregator.core.lifecycle.own_requests import OwnRequests
from aggregator.core.lifecycle.upstream_era import Era
from aggregator.core.lifecycle.upstream_lifecycle import CONTROL_ID_PREFIX, UpstreamLifecycle
from aggregator.core.settings import LinkSettings


class Phase(enum.Enum):
    """Where one client request is (its ``Pending``): the table's states.

    ==================  ==============================  =============================
    phase               what it waits for               where it is kept
    ==================  ==============================  =============================
    SENT                its server's answer             link.pending, client.in_flight
    LISTING             its shared server, out, to be   client.in_flight, router.held
                        listed again (nothing sent)     and the deadlines
    STARTING            its session's own connection    client.in_flight,
                        to start (nothing sent)         link.waiting
    ASKING              its legacy client's answers to  client.in_flight and the
                        a modern server's questions     deadlines (nothing upstream)
                        (``core.era.input_bridge``)
    PARKED              its modern caller's retry with  link.pending and the parked
                        the input a legacy server       table: on no client
                        asked for (``core.era.parked``)
    ==================  ==============================  =============================

    A request leaves every table at once when it ends (``done``), whatever its phase.
    """

    SENT = "sent"
    LISTING = "listing"
    STARTING = "starting"
    ASKING = "asking"
    PARKED = "parked"


# The phases in which nothing of a request was sent upstream yet (a cancel tells no server).
UNSENT = frozenset((Phase.LISTING, Phase.STARTING))
_SENT = Phase.SENT  # (a module name: an enum class lookup costs five times as much, per request)


class Ask(NamedTuple):
    """A legacy server's request waiting for a modern caller's input (``core.era.parked``)."""

    upstream_id: Any  # the server's own id for it
    method: str
    params: dict[str, Any]


class Parked:
    """One call off its client, waiting for the caller's retry (or its deadline): the record
    of a ``Pending`` in phase PARKED (``core.era.parked``)."""

    __slots__ = ("id", "pending", "principal", "params", "asks", "final", "deadline", "done")

    def __init__(self, id: int, pending: Pending, principal: Any, params: dict[str, Any], deadline: float) -> None:
        self.id = id
        self.pending = pending
        self.principal = principal  # whose retry may resume it
        self.params = params  # what was sent upstream: what the state is bound to
        self.asks: dict[str, Ask] = {}  # by the key the caller answers under
        self.final: dict[str, Any] | None = None  # the server's answer to the call, come meanwhile
        self.deadline = deadline
        self.done = False


class Bridge:
    """One legacy caller's call to a modern server across its rounds of input
    (``core.era.input_bridge``): the ``bridge`` of each of its ``Pending`` records."""

    __slots__ = ("params", "rounds", "waiting", "asks", "answers", "state")

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params  # as first sent upstream (name, URI, progress token, _meta)
        self.rounds = 0
        self.waiting: Pending | None = None  # the call (phase ASKING), while its client is asked
        self.asks: dict[str, int | str] = {}  # key -> the proxy id of the question not answered yet
        self.answers: dict[str, Any] | None = None  # key -> the client's result (None: nothing asked)
        self.state: str | None = None  # the server's requestState, echoed on the retry


# Who a server's request during a call is for: a client's session, or a parked call (whose
# caller is on no session until it retries).
Caller: TypeAlias = "int | Parked"


class Pending:
    """One client request in flight through the proxy (its ``phase`` says where)."""

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
        "held_at",
        "done",
        "phase",
        "held",
        "params",
        "subscription",
        "parked",
        "bridge",
        "meta",
    )

    def __init__(self, session: int | None, client_id: Any, method: str, server: str, upstream_id: int) -> None:
        self.session = session  # its client; None while the call is parked (on no client)
        self.client_id = client_id
        self.method = method
        self.server = server
        self.upstream_id = upstream_id
        self.client_token: Any = None
        self.token: str | None = None  # the proxy's progress token upstream
        self.deadline = 0.0
        self.hard_deadline = 0.0
        self.sent_at = 0.0  # when it was sent upstream (for its duration); 0: not sent
        self.held_at: float | None = None  # when it was held for its server (``HeldRequests``)
        self.done = False
        self.phase = _SENT
        self.held: dict[str, Any] | None = None  # LISTING, STARTING: the request, routed once it can be
        # A call that may need input (tools/call, prompts/get, resources/read): its params as
        # sent upstream, what a state the proxy mints is bound to and what a retry resends.
        self.params: dict[str, Any] | None = None
        self.subscription: tuple[str, str] | None = None  # a resources/subscribe: what its failure undoes
        self.parked: Parked | None = None  # PARKED: the parked call (``core.era.parked``)
        self.bridge: Bridge | None = None  # a legacy caller's call to a modern server (``core.era.input_bridge``)
        self.meta: dict[str, Any] | None = None  # a modern caller's ``_meta`` for it; None: a legacy one

    def key(self) -> int:
        """The session of its client (a call that is not parked: on a session)."""
        session = self.session
        if session is None:
            raise AssertionError(f"a parked call has no session ({self.method})")
        return session

    def hold(self, phase: Phase, message: dict[str, Any]) -> None:
        """Nothing is sent yet: ``message`` waits for its server (``phase``: LISTING or STARTING)."""
        self.phase = phase
        self.held = message


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
    # Its era: ``protocol`` is "auto" or a pinned revision; ``learnt`` what a connection
    # learnt of the server's era (None: not known); ``speaks`` the current connection's.
    speaks: Era = Era.LEGACY
    protocol: str = "auto"
    discover_timeout: float = defaults.DISCOVER_TIMEOUT
    learnt: Era | None = None
    # Its user grants it access at a link (``auth = "oauth"``): a session whose own
    # connection ended asking for that grant sees the grant tool in its place.
    grants: bool = False
    log_level: str | None = None  # what the proxy last asked this upstream for
    # It delivers what belongs to a request on that request's own stream (Streamable HTTP),
    # and the transport says which: a message that came any other way belongs to none.
    streams: bool = False
    # Why this upstream cannot take more input now (its queue is past its budget or it
    # reads nothing), as the trio layer reports it; None when it can.
    overloaded: str | None = None
    # Requests held until a per-session link is ready: (client key, message, params).
    waiting: list[tuple[int, dict[str, Any], dict[str, Any]]] = attrs.field(factory=list)
    # Why they get no answer from it, when its connection could send no credential of its
    # user's: the error that says what the user must do (``Failed.refusal``).
    refusal: dict[str, Any] | None = None
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
    # A shared server nobody used for this many seconds is stopped (0: never), and when a
    # request of a client last ended there, or it was last listed (``core.upstreams.idle_stops``).
    idle_stop_after: float = 0.0
    used_at: float = 0.0


def configured_link(server: LinkSettings, prefix: str, uri_prefix: str) -> UpstreamLink:
    """A fresh link to a configured (shared) server, under its catalog's names for it
    (at startup, and when a reload adds or restarts it)."""
    return UpstreamLink(
        server.name,
        prefix,
        uri_prefix,
        request_timeout=server.request_timeout,
        max_request_timeout=server.max_request_timeout,
        timeout_resets_on_progress=server.timeout_resets_on_progress,
        server=server.name,
        protocol=server.protocol,
        # A server acting as each user: its first request waits for the user's credential
        # (a token exchange may take up to 80% of init_timeout), so its server/discover
        # waits as long as its handshake would, and the credential's own error comes first.
        discover_timeout=max(server.discover_timeout, server.init_timeout)
        if server.per_user
        else server.discover_timeout,
        idle_stop_after=server.idle_stop_after,
        grants=server.grants,
    )
