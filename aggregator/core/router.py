"""Routing between downstream sessions (clients) and upstreams (servers). Sans-IO.

``Router`` is the one entry (``handle``) and the queries the trio layer may ask. It is one
class (its MRO is ``(Router, object)``): it holds the tables that several objects read
(links, clients, catalogs, outages, subscriptions, tasks, ...) and composes the objects
that own their part of the state and its rules, each given what it reads, wired once in
its constructor. None of them calls back into the router: what one needs of another above
it comes back as an outcome that the router (or the object above) acts on.

Owned objects (each given the tables it reads):

- ``requests.request_table.RequestTable``: every request in flight, its progress token
  and deadlines, and the one way out of every table (invariant 2);
- ``handlers.client_requests.ClientRequests``: the handlers of a client's requests, by
  method, and whether startup is complete;
- ``handlers.inflight.InFlight``: requests given up on and timed out, and when the
  router's clock has work next;
- ``requests.forwarding.Forwarding``: a request on its way upstream, or held for its
  per-session connection to start; whether new requests are still taken (``draining``);
- ``reverse.reverse_table.ReverseTable``: server-to-client requests in flight, URL-mode
  elicitations, the proxy-minted ids;
- ``handlers.reverse_requests.ReverseRequests``: a server's request routed to the one
  client it is for (or the call it came during), or answered at once;
- ``reverse.roots.Roots``: whose roots each server sees, and roots/list held for a client;
- ``catalogs.targets.Targets``: what a request names (``resolve``, ``describe``);
- ``catalogs.discovery.Search``: search mode's two tools, per profile's settings;
- ``catalogs.result_budget.ResultBudgets``: tool results cut, the rest kept and read back;
- ``clients.handshake.Handshake``: initialize, merged capabilities and instructions,
  the log levels to set upstream;
- ``notices.announcements.Announcements``: list_changed notices and their debounce;
- ``handlers.answers.Answers``: an upstream's answer to a forwarded request, on its way
  to its caller (rewritten, stamped, counted);
- ``upstreams.held_requests.HeldRequests``: a request for a shared server that is out,
  held for it or answered with its state (invariant 7);
- ``upstreams.upstream_control.UpstreamControl``: the proxy's own requests to each
  upstream (one table per link, for its lifecycle and the router's own: gathers,
  renewed subscriptions, log levels, a modern link's listen) and their earliest deadline;
  what a lifecycle says to do is handed back to the upstream events;
- ``era.modern_callers.ModernCallers``: modern (2026-07-28) callers' admission,
  server/discover, subscriptions/listen, answers stamped, per-request log levels;
- ``era.input_bridge.InputBridge``: a modern server's ``input_required`` asked of a
  legacy caller, then the call retried;
- ``era.modern_input.ModernInput``: a modern server's ``input_required`` for a modern
  caller, checked and its state wrapped; the caller's retry unwrapped and forwarded;
- ``era.parked.ParkedCalls``: a legacy server's requests gathered and asked of a modern
  caller by an ``input_required`` result, the call parked (within the bounds of its
  ``ParkedTable``) until the caller's retry resumes it.

Event handlers (objects over the tables above, composed by the router, lowest first):

- ``handlers.upstream_events.UpstreamEvents``: an upstream connected, ready, listed
  (what its lifecycle says, done), overloaded, lost, out between starts; a shared server
  listed releases the requests held for it as ``Resend`` outcomes;
- ``handlers.reconfigure.Reconfigure``: servers removed and added, catalogs renewed on a
  live reload (a server stopped through the upstream events, as if lost);
- ``handlers.client_events.ClientEvents``: a client's messages, notifications, answers,
  connect, disconnect; the requests an upstream event released, handled again
  (``resend``);
- ``handlers.server_messages.ServerMessages``: an upstream's messages, its answers
  handed to ``Answers``, its notifications by a method table; its own answers and lists
  changed, to the upstream events.

Theory of operation
-------------------
Events go in through ``Router.handle`` as records (``core.events``: a client sent these
bytes; server S sent these bytes; S is ready with this catalog; S was lost; a client went
away; time passed) and commands come out as lists (send this message to client session
C; send that one to server S; re-list S's tools). The trio layer executes the commands;
nothing here awaits or blocks. Time is read from an injected clock, so tests drive
timeouts without sleeping.

Invariants
----------
1. A client's request id is echoed back exactly, and only to that client. Upstream ids
   are minted here, per upstream, as increasing integers; the proxy's own requests
   (initialize, listing, gathers, renewed subscriptions) use string ids
   ``"aggregator-N"`` in the link's own table (``upstream_control``) and never reach
   this one. So ids from different clients can never collide upstream.
2. Every forwarded request is one ``Pending``, in ``link.pending`` (by upstream id) and in
   ``client.in_flight`` (by client id), and in ``progress`` if it asked for progress.
   Every exit (response, error, cancellation, timeout, client gone, upstream lost) goes
   through ``RequestTable.end``, which removes it from all of them: the tables hold exactly what is
   in flight.
3. A response whose id is not pending (late after a cancel or timeout, foreign, repeated)
   is dropped; so is progress for a token not in flight or from another server.
4. Names, URIs and task ids are looked up before anything is sent; an unknown one is
   -32602 from the proxy and reaches no upstream.
5. Server-to-client requests get proxy-minted ids per client, and the answer goes back
   under the upstream's own id. One that cannot be routed (``core.reverse.affinity``) is answered
   with an error at once; only a roots/list waits, for its client to initialize, within
   ``ROOTS_HOLD_SECONDS``.
6. Errors the proxy makes itself carry ``data.source = "aggregator"``, the server and a
   reason, so nobody mistakes them for an upstream's.
7. A name or URI that misses the catalog but belongs to a shared server between starts
   (``aggregator.core.catalogs.outages``) is never "Unknown": the request waits for the server
   within its own timeout (a held ``Pending``, in ``client.in_flight`` and the deadlines,
   never in ``link.pending``: nothing was sent) or is answered ``unavailable`` with the
   server's state. Held requests are looked up again once the server is listed.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from aggregator.core import events
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.catalogs.discovery import CALL_TOOL, Search
from aggregator.core.catalogs.outages import Outage
from aggregator.core.catalogs.result_budget import ResultBudgets
from aggregator.core.catalogs.session_catalog import SessionViews
from aggregator.core.catalogs.targets import Targets
from aggregator.core.clients.handshake import Handshake
from aggregator.core.commands import (
    Answer,
    Command,
    DropUpstream,
    StartUpstream,
    StopIdle,
    StopUpstream,
    ToClient,
    ToServer,
    UpstreamServing,
    WaitForStartup,
    WakeUpstream,
)
from aggregator.core.era.input_bridge import InputBridge
from aggregator.core.era.modern_callers import ModernCallers
from aggregator.core.era.modern_input import ModernInput
from aggregator.core.era.parked import ParkedCalls, ParkedTable
from aggregator.core.era.request_state import RequestStates
from aggregator.core.events import Event
from aggregator.core.handlers.answers import Answers
from aggregator.core.handlers.client_events import ClientEvents
from aggregator.core.handlers.client_requests import ClientRequests
from aggregator.core.handlers.inflight import InFlight
from aggregator.core.handlers.reconfigure import Reconfigure
from aggregator.core.handlers.reverse_requests import ReverseRequests
from aggregator.core.handlers.server_messages import ServerMessages
from aggregator.core.handlers.upstream_events import UpstreamEvents
from aggregator.core.lifecycle.upstream_era import INSTANCE_KEY
from aggregator.core.lifecycle.upstream_lifecycle import CONTROL_ID_PREFIX
from aggregator.core.notices.announcements import Announcements
from aggregator.core.notices.subscriptions import Listens, Subscriptions
from aggregator.core.records.clients import ClientState, SessionInfo
from aggregator.core.records.links import Pending, UpstreamLink, configured_link
from aggregator.core.replies import proxy_error
from aggregator.core.requests.forwarding import Forwarding, HeldWatcher
from aggregator.core.requests.request_table import RequestTable, Tallies
from aggregator.core.requests.tasks import TaskOwners
from aggregator.core.reverse.reverse_table import ReverseTable
from aggregator.core.reverse.roots import ROOTS_HOLD_SECONDS, Roots
from aggregator.core.settings import Discovery, LinkSettings, RouterSettings, ServerRequestPolicy
from aggregator.core.upstreams.held_requests import HeldRequests
from aggregator.core.upstreams.idle_stops import IdleStops
from aggregator.core.upstreams.own_listings import OwnListings
from aggregator.core.upstreams.upstream_control import UpstreamControl
from aggregator.mcp.constants import TOOLS

__all__ = [
    "CONTROL_ID_PREFIX",
    "INSTANCE_KEY",
    "ROOTS_HOLD_SECONDS",
    "Answer",
    "ClientState",
    "Command",
    "DropUpstream",
    "LinkSettings",
    "Pending",
    "Router",
    "RouterSettings",
    "ServerRequestPolicy",
    "SessionInfo",
    "StartUpstream",
    "StopIdle",
    "StopUpstream",
    "ToClient",
    "ToServer",
    "UpstreamLink",
    "UpstreamServing",
    "WaitForStartup",
    "WakeUpstream",
    "proxy_error",
]


class Router:
    """The router: events in through ``handle``, commands out as lists. It holds the tables
    its objects share and composes the objects; only they and it write those tables."""

    tasks: dict[str, int]  # exposed 2025-11-25 task id -> owning session
    task_owners: TaskOwners  # exposed modern (tasks extension) task id -> owning principal

    def __init__(
        self,
        catalog: Catalog,
        settings: RouterSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] | None = None,
        profiles: dict[str, Catalog] | None = None,
        instance: str | None = None,
        server_request_policy: ServerRequestPolicy | None = None,
    ) -> None:
        settings = settings if settings is not None else RouterSettings()
        servers = settings.servers
        self.catalog = catalog  # and one per profile (what its clients see), over one store of items:
        self.catalogs: dict[str, Catalog] = {"default": catalog, **(profiles or {})}
        self.clock = clock
        self.instance = instance if instance is not None else secrets.token_hex(8)
        self.links: dict[str, UpstreamLink] = {
            s.name: configured_link(s, catalog.naming[s.name].prefix, catalog.naming[s.name].uri_prefix)
            for s in servers
        }
        self.per_session = {s.name for s in servers if s.isolation == "per-session"}
        # Servers acting as each user (per-session, never connected without a user), and how
        # long a session's list waits for its own connection to one (``own_listings``).
        self.per_user = {s.name: s.init_timeout for s in servers if s.per_user}
        # Shared servers not listed (yet, or again): their state and what was seen of them
        # (a per-session server's names are known by its prefix while it is in here).
        self.outages: dict[str, Outage] = {s.name: Outage(s.name) for s in servers}
        self.start_takes: dict[str, float] = {}  # server -> how long its last start took
        self.clients: dict[int, ClientState] = {}
        self.max_in_flight = settings.max_in_flight
        self.max_json_depth = settings.max_json_depth  # enforced where messages are decoded
        self.server_requests = settings.server_requests
        self.server_request_policy: ServerRequestPolicy = (
            server_request_policy if server_request_policy is not None else lambda server, method, params: True
        )
        self.subscriptions = Subscriptions()  # keyed by link: (server or server@session, URI)
        self.listens = Listens()  # modern callers' open subscriptions/listen requests
        self.views = SessionViews()  # of the sessions whose own per-session connections listed
        self.tasks, self.task_owners = {}, TaskOwners()  # whose each task is (``core.requests.tasks``)
        # What resumes a parked call: under the cluster's keys, naming this replica, its expiry
        # in Unix time when a wall clock is given (the router's clock is this process's own).
        self.request_states = RequestStates(
            settings.input_required_timeout,
            settings.request_state_keys,
            settings.replica,
            None if wall_clock is None else (lambda at: at - clock() + wall_clock()),
        )
        self._own_objects(settings)
        self._event_objects()
        # The trio layer asks these: the owners' own methods, bound (the clock's after every batch).

        self.in_flight = self.inflight.in_flight  # client requests waiting for a server's answer
        self.client_idle = self.client_events.client_idle  # whether a client may stay between requests
        self._events = self._event_handlers()

    def handle(self, event: Event) -> list[Command]:
        """The one way in: what the trio layer saw happen (``core.events``), and the
        commands it must now execute, in order."""
        return self._events[type(event)](event)

    def _event_handlers(self) -> dict[type, Callable[[Any], list[Command]]]:
        """Each event's handler, by its type (the events' fields are the handlers' arguments)."""
        clients, servers, upstreams, reload = self.client_events, self.server_messages, self.upstreams, self.reconfigure
        resend = clients.resend  # what an upstream event released, handled again

        def quietly(act: Callable[[Any], object]) -> Callable[[Any], list[Command]]:
            def handler(event: Any) -> list[Command]:
                act(event)
                return []

            return handler

        return {
            events.ClientConnected: quietly(
                lambda e: clients.client_connected(
                    e.key,
                    e.profile,
                    era=e.era,
                    principal=e.principal,
                    stateless=e.stateless,
                    shared_name=e.shared_name,
                )
            ),
            events.ClientAdopted: clients.client_adopted,
            events.ClientMessage: clients.client_message,
            events.ClientDecoded: lambda e: clients.client_event(e.key, e.kind, e.message),
            events.ClientRefused: lambda e: clients.client_refused(e.key, e.exc),
            events.ClientAnswerRefused: lambda e: clients.refused_answer(e.key, e.exc),
            events.ClientDisconnected: lambda e: clients.client_disconnected(e.key, e.answer),
            events.UpstreamConnected: lambda e: resend(
                upstreams.upstream_connected(
                    e.server,
                    target=e.target,
                    init_timeout=e.init_timeout,
                    capabilities=e.capabilities,
                    modern_possible=e.modern_possible,
                )
            ),
            events.ServerMessage: servers.server_message_event,
            events.ServerDecoded: lambda e: servers.server_decoded(e.server, e.decoded, e.related),
            events.ServerOversized: lambda e: servers.server_oversized(e.server, e.head, e.limit),
            events.ServerReady: lambda e: upstreams.server_ready(e.server, e.init_result),
            events.ServerItems: lambda e: upstreams.server_items(e.server, e.kind, e.items),
            events.ServerListing: lambda e: resend(upstreams.server_listing(e.server, e.listing)),
            events.ServerListed: lambda e: resend(upstreams.server_listed(e.server)),
            events.ServerStreams: quietly(lambda e: self._server_streams(e.server, e.streams)),
            events.ServerCongested: quietly(lambda e: self._server_congested(e.server, e.reason)),
            events.ServerOverloaded: lambda e: upstreams.server_overloaded(e.server, e.why),
            events.ServerLost: lambda e: resend(
                [*upstreams.server_lost(e.server, e.why), *self.own_listings.release(e.server, lost=True)]
            ),
            events.ServerDown: lambda e: upstreams.server_down(e.server, e.reason, e.retry_in),
            events.ServerCached: lambda e: upstreams.server_cached(e.server, e.listing),
            events.LinkEnded: quietly(lambda e: self._link_ended(e.name)),
            events.OwnCallStarted: lambda e: self.control.own_call(e.server, e.method, e.params, e.caller),
            events.TimePassed: lambda e: self._time_passed(),
            events.StartupCompleted: quietly(lambda e: self._startup_completed()),
            events.DrainingStarted: quietly(lambda e: self._start_draining()),
            events.Abandoned: lambda e: self.inflight.abandon(e.why),
            events.ServerRemoved: lambda e: resend(reload.server_removed(e.server, e.why)),
            events.ServerRestarting: lambda e: resend(reload.server_restarting(e.server, e.why)),
            events.ServerReplaced: quietly(lambda e: reload.server_replaced(e.server, e.why)),
            events.ServerAdded: quietly(lambda e: reload.server_added(e.server)),
            events.CatalogsRenewed: lambda e: reload.catalogs_renewed(e.servers, e.policies, e.catalog_hook),
            events.DiscoveryRenewed: lambda e: self._discovery_renewed(e.discovery),
            events.KeptFetched: self._kept_fetched,
        }

    def _own_objects(self, settings: RouterSettings) -> None:
        """The objects that own a part of the state and its rules, each given the tables
        it reads (wired once, here)."""
        clock = self.clock
        self.targets = Targets(self.catalogs, self.links, self.outages, self.per_session)  # what requests name
        self.tallies = Tallies()  # what ended how (``core.requests.request_table``, its tallies)
        # Every client request in flight, its progress token and deadlines.
        self.requests = RequestTable(clock, self.links, self.clients, self.tallies, self.subscriptions)
        # Server-to-client requests in flight, under ids that name this replica in a cluster.
        self.reverse = ReverseTable(settings.max_in_flight, settings.reverse_replica)
        # A request on its way upstream, or held for its per-session connection to start.
        self.forwarding = Forwarding(
            self.links, self.per_session, self.requests, self.server_requests, settings.max_in_flight
        )
        # Lists held for a session's own connections to servers acting as each user.
        self.own_listings = OwnListings(
            self.per_user, self.links, self.clients, self.requests, self.forwarding, settings.max_in_flight, clock
        )
        # Requests for a shared server that is out: held for it, or answered with its state.
        self.held_requests = HeldRequests(
            self.links,
            self.clients,
            self.requests,
            self.outages,
            self.start_takes,
            self.forwarding,
            settings.max_in_flight,
            clock,
        )
        # Shared servers stopped when nobody uses them (``idle_stop_after``).
        self.idle = IdleStops(self.links, self.outages, self.requests.held, self.subscriptions, clock)
        # list_changed notices due, and when.
        self.announcements = Announcements(
            clock, settings.list_changed_debounce, self.clients, self.views, self.listens
        )
        discovery = dict(settings.discovery)  # profile -> its discovery settings
        # Tool results cut, their rest kept (and shared with the other replicas, with a store).
        self.budgets = ResultBudgets(clock, discovery, shared=settings.share_kept_results)
        self.search = Search(  # search mode, by the same settings
            discovery, self.clients, self.catalogs, self.links, self.budgets
        )
        self.handshake = Handshake(  # what the proxy says of itself
            self.links, self.catalog.separator, self.server_requests, self.instance, self.announcements
        )
        # The proxy's own requests to each upstream: its lifecycle's and the router's.
        self.control = UpstreamControl(
            self.links, self.clients, self.handshake, self.subscriptions, self.tasks, self.instance, clock
        )
        self._message_objects(settings)
        self._input_objects(settings)
        self._handling_objects()

    def _handling_objects(self) -> None:
        """The objects given most of the others: the handlers of client requests, and the
        timeouts over every table, wired last."""
        # The handlers of client requests, by method; whether startup is complete.
        self.client_requests = ClientRequests(
            links=self.links,
            per_session=self.per_session,
            targets=self.targets,
            forwarding=self.forwarding,
            own_listings=self.own_listings,
            handshake=self.handshake,
            search=self.search,
            budgets=self.budgets,
            modern=self.modern,
            modern_input=self.modern_input,
            parked=self.parked,
            answers=self.answers,
            control=self.control,
            subscriptions=self.subscriptions,
            tasks=self.tasks,
            task_owners=self.task_owners,
        )
        # Requests in flight given up on and timed out, and what else shares the one clock.
        self.inflight = InFlight(
            self.links,
            self.clients,
            self.requests,
            self.outages,
            self.control,
            self.parked,
            self.announcements,
            self.roots,
            self.input_bridge,
            self.modern,
            self.listens,
            self.own_listings,
            self.clock,
        )

    def _message_objects(self, settings: RouterSettings) -> None:
        """The objects a caller's request and its answer go through by era, wired as
        ``_own_objects``'s are."""
        # What the proxy does for modern (2026-07-28) callers that it does not for legacy sessions.
        self.modern = ModernCallers(
            self.clients,
            self.links,
            self.catalogs,
            self.views,
            self.listens,
            self.subscriptions,
            self.targets,
            self.forwarding,
            self.control,
            self.handshake,
            self.announcements,
            self.instance,
            settings.max_in_flight,
        )
        # An upstream's answer to a forwarded request, on its way to its caller.
        self.answers = Answers(
            self.requests,
            self.clients,
            self.tasks,
            self.task_owners,
            self.budgets,
            self.subscriptions,
            self.reverse,
            self.modern,
            settings.max_in_flight,
            self.clock,
        )

    def _input_objects(self, settings: RouterSettings) -> None:
        """The objects that carry what a server asks of a client (server-to-client
        requests, input_required in either era), wired as ``_own_objects``'s are."""
        clock = self.clock
        # A modern server's input_required for a modern caller, and the caller's retry.
        self.modern_input = ModernInput(
            self.requests, self.forwarding, self.request_states, self.server_requests, self.server_request_policy, clock
        )
        self.roots = Roots(  # whose roots each server sees, and roots/list held for a client
            settings.roots, settings.single_client, self.server_requests, self.links, self.clients, clock
        )
        # Calls parked while their modern callers provide what a legacy server asks.
        self.parked = ParkedCalls(
            ParkedTable(settings.max_parked_calls, settings.max_parked_per_principal),
            self.clients,
            self.links,
            self.requests,
            self.reverse,
            self.request_states,
            settings.max_in_flight,
            clock,
        )
        # Server-to-client requests, routed to the one client they are for, or answered.
        self.reverse_requests = ReverseRequests(
            self.clients,
            self.requests,
            self.reverse,
            self.roots,
            self.parked,
            self.tasks,
            self.server_requests,
            self.server_request_policy,
            settings.max_in_flight,
        )
        # A modern server's input_required asked of a legacy caller, then the call retried.
        self.input_bridge = InputBridge(
            self.clients,
            self.links,
            self.requests,
            self.reverse,
            self.roots,
            self.server_requests,
            self.server_request_policy,
            settings.max_in_flight,
            clock,
        )

    def _event_objects(self) -> None:
        """The handlers of events, lowest first: each is given the tables and objects it
        uses, and the ones below it."""
        # An upstream's life: connected, ready, listed, lost, out between starts.
        self.upstreams = UpstreamEvents(
            links=self.links,
            outages=self.outages,
            start_takes=self.start_takes,
            clients=self.clients,
            catalogs=self.catalogs,
            views=self.views,
            subscriptions=self.subscriptions,
            announcements=self.announcements,
            control=self.control,
            forwarding=self.forwarding,
            own_listings=self.own_listings,
            inflight=self.inflight,
            tallies=self.tallies,
            held_requests=self.held_requests,
            idle=self.idle,
            reverse=self.reverse,
            roots=self.roots,
            clock=self.clock,
        )
        # A live reload: servers removed, added, restarted; catalogs renewed.
        self.reconfigure = Reconfigure(
            links=self.links,
            outages=self.outages,
            start_takes=self.start_takes,
            per_session=self.per_session,
            per_user=self.per_user,
            catalogs=self.catalogs,
            views=self.views,
            subscriptions=self.subscriptions,
            announcements=self.announcements,
            requests=self.requests,
            held_requests=self.held_requests,
            upstreams=self.upstreams,
        )
        # A client session from connect to disconnect.
        self.client_events = ClientEvents(
            clients=self.clients,
            links=self.links,
            per_session=self.per_session,
            catalogs=self.catalogs,
            views=self.views,
            subscriptions=self.subscriptions,
            listens=self.listens,
            tasks=self.tasks,
            max_json_depth=self.max_json_depth,
            requests=self.requests,
            client_requests=self.client_requests,
            search=self.search,
            budgets=self.budgets,
            modern=self.modern,
            input_bridge=self.input_bridge,
            reverse=self.reverse,
            reverse_requests=self.reverse_requests,
            roots=self.roots,
            control=self.control,
            held_requests=self.held_requests,
            upstreams=self.upstreams,
            handshake=self.handshake,
        )
        # What an upstream says.
        self.server_messages = ServerMessages(
            links=self.links,
            clients=self.clients,
            subscriptions=self.subscriptions,
            tasks=self.tasks,
            max_json_depth=self.max_json_depth,
            requests=self.requests,
            answers=self.answers,
            input_bridge=self.input_bridge,
            modern_input=self.modern_input,
            modern=self.modern,
            reverse=self.reverse,
            reverse_requests=self.reverse_requests,
            control=self.control,
            upstreams=self.upstreams,
            client_events=self.client_events,
            clock=self.clock,
        )

    # --- what the trio layer tells and asks (it never writes the router's fields) ------

    def _time_passed(self) -> list[Command]:
        """Time out what is overdue and send the notices that are due; the proxy's own
        requests upstream last (what their lifecycles say, done)."""
        now = self.clock()
        out = self.client_events.resend(self.inflight.expire(now))
        if self.idle.at is not None and now >= self.idle.at:
            out += self.upstreams.stop_idle(now)
        own = self.upstreams.expire_own(now)
        return out + self.client_events.resend(own) if own else out

    def next_deadline(self) -> float | None:
        """When ``TimePassed`` has work next: a request times out, a notice is due, a
        server may have been idle long enough."""
        deadline = self.inflight.next_deadline()
        idle = self.idle.at
        if idle is not None and (deadline is None or idle < deadline):
            return idle
        return deadline

    def _discovery_renewed(self, discovery: dict[str, Discovery]) -> list[Command]:
        """New discovery settings (a reload): each profile whose clients now see another
        tools/list is told so."""
        out: list[Command] = []
        for profile in self.search.renew(discovery):
            out += self.announcements.announce([TOOLS], profile)
        return out

    def _startup_completed(self) -> None:
        """Startup is over (every server listed, or the wait for them timed out): requests
        no longer wait for servers that have not listed yet."""
        self.client_requests.startup_complete = True

    def _start_draining(self) -> None:
        """Shutting down: what is in flight finishes, nothing new is taken."""
        self.forwarding.draining = True

    @property
    def draining(self) -> bool:
        """Whether the proxy is shutting down (it takes nothing new)."""
        return self.forwarding.draining

    def _link_ended(self, name: str) -> None:
        """A per-session connection ended on its own (crashed, or could not start) before it
        was ready: forget it, so that its client's next request starts a fresh one."""
        link = self.links.get(name)
        self.own_listings.ended(name)
        if link is not None and link.session is not None and not link.ready:
            del self.links[name]

    def _server_streams(self, name: str, streams: bool) -> None:
        """Whether this upstream's transport delivers what belongs to a request on that
        request's own stream (Streamable HTTP)."""
        link = self.links.get(name)
        if link is not None:
            link.streams = streams

    def _server_congested(self, name: str, reason: str | None) -> None:
        """This upstream cannot take more input (``reason``) or can again (None): while it
        cannot, new requests to it are refused."""
        link = self.links.get(name)
        if link is not None:
            link.overloaded = reason

    def server_in_use(self, name: str) -> bool:
        """Whether a client request in flight or held, a subscription or an open listen's
        resource holds shared server ``name`` (what keeps it from idle stop)."""
        return self.idle.in_use(name)

    def in_flight_on(self, name: str) -> int | None:
        """How many client requests upstream connection ``name`` has in flight, or None if
        it is not known (any more)."""
        link = self.links.get(name)
        return None if link is None else len(link.pending)

    def session_info(self, key: int) -> SessionInfo | None:
        """What is known of a client session, or None if it is not connected (any more)."""
        client = self.clients.get(key)
        if client is None:
            return None
        return SessionInfo(
            client.profile,
            client.protocol_version,
            len(client.in_flight),
            client.stateless,
            client.principal,
            client.shared_name,
        )

    def in_flight_by_server(self) -> dict[str, int]:
        """Client requests waiting for each server's answer (a snapshot; a per-session
        connection's count under its server's key)."""
        counts: dict[str, int] = {}
        for link in self.links.values():
            server = link.server or link.name
            counts[server] = counts.get(server, 0) + len(link.pending)
        return counts

    def request_in_flight(self, key: int, id: Any) -> bool:
        """Whether this client already has a request with this id in flight."""
        client = self.clients.get(key)
        return client is not None and id in client.in_flight

    def describe(self, key: int, message: dict[str, Any]) -> tuple[str, str, str] | None:
        """(server, its own name or URI, the exposed one) client ``key``'s request is for, or
        None when it names nothing that client may use or the proxy answers it itself.
        Changes nothing (for plugins)."""
        client = self.clients.get(key)
        if client is None or self.search.answers_itself(key, message):
            return None
        return self.targets.describe(client, message)

    def watch_held(self, watcher: HeldWatcher) -> None:
        """``watcher`` sees what each held request sends once its server can take it (a
        per-session connection ready, a shared server listed again), as the caller of
        ``handle`` sees what a request sent at once (``core.requests.forwarding``, rule 4)."""
        self.forwarding.watch_held = watcher

    def unwrap_call_tool(self, key: int, message: dict[str, Any]) -> None:
        """Search mode's ``call_tool`` call of client ``key`` becomes the call it names, in
        place, before anything looks at it (``core.catalogs.discovery``)."""
        params = message.get("params")
        if type(params) is dict and params.get("name") == CALL_TOOL:  # else nothing to unwrap
            self.search.unwrap_call_tool(key, message)

    def context_report(self) -> dict[str, dict[str, Any]]:
        """Per profile: its discovery mode, what tools/list holds now and its estimated tokens."""
        return self.search.context_report()

    def _kept_fetched(self, event: events.KeptFetched) -> list[Command]:
        """The shared store answered a read of a kept rest (``core.catalogs.result_budget``):
        its caller is answered, if it is still here."""
        key = event.fetch.session
        client = self.clients.get(key)
        if client is None:
            return []
        return [ToClient(key, self.stamped(key, "resources/read", self.budgets.fetched(client, event)))]

    def stamped(self, key: int, method: str, message: dict[str, Any]) -> dict[str, Any]:
        """An answer made outside the router (a plugin's) for client ``key``'s request, as
        the client's era wants it: stamped for a modern caller, untouched for a legacy one."""
        return self.modern.stamped(key, method, message)

    def server_era(self, server: str) -> tuple[str, str] | None:
        """How the proxy speaks to ``server`` now: ("modern" or "legacy", the revision);
        None while it is not connected."""
        return self.control.server_era(server)

    def profile_catalog(self, profile: str) -> Catalog:
        """What the clients of ``profile`` see (read it, never change it)."""
        return self.catalogs[profile]
