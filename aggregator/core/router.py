"""Routing between downstream sessions (clients) and upstreams (servers). Sans-IO.

``Router`` is the one entry (``handle``) and the queries the trio layer may ask. Its
state is kept by objects that own their part and its rules, wired once in its state
(``aggregator.core.state``), and by handler groups still combined with it as one class:

Owned objects (each given the tables it reads):

- ``requests.request_table.RequestTable``: every request in flight, its progress token
  and deadlines, and the one way out of every table (invariant 2);
- ``clients.client_requests.ClientRequests``: the handlers of a client's requests, by
  method, and whether startup is complete;
- ``requests.inflight.InFlight``: requests given up on and timed out, and when the
  router's clock has work next;
- ``requests.forwarding.Forwarding``: a request on its way upstream, or held for its
  per-session connection to start; whether new requests are still taken (``draining``);
- ``reverse.reverse_table.ReverseTable``: server-to-client requests in flight, URL-mode
  elicitations, the proxy-minted ids;
- ``reverse.reverse_requests.ReverseRequests``: a server's request routed to the one
  client it is for (or the call it came during), or answered at once;
- ``reverse.roots.Roots``: whose roots each server sees, and roots/list held for a client;
- ``catalogs.targets.Targets``: what a request names (``resolve``, ``describe``);
- ``catalogs.discovery.Search``: search mode's two tools, per profile's settings;
- ``catalogs.result_budget.ResultBudgets``: tool results cut, the rest kept and read back;
- ``clients.handshake.Handshake``: initialize, merged capabilities and instructions,
  the log levels to set upstream;
- ``notices.announcements.Announcements``: list_changed notices and their debounce;
- ``upstreams.answers.Answers``: an upstream's answer to a forwarded request, on its way
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

Handler groups (mixins over the shared state, by package):

- ``clients``: a client's messages, notifications, answers, connect, disconnect
  (``client_events``);
- ``upstreams``: an upstream's messages, its answers handed to ``Answers``, its
  notifications by a method table (``server_messages``); upstreams connected, ready,
  listed (what their lifecycles say, done), overloaded, lost, out between starts
  (``upstream_events``); servers removed and added on a live reload (``reconfigure``).

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
   (``aggregator.core.upstreams.outages``) is never "Unknown": the request waits for the server
   within its own timeout (a held ``Pending``, in ``client.in_flight`` and the deadlines,
   never in ``link.pending``: nothing was sent) or is answered ``unavailable`` with the
   server's state. Held requests are looked up again once the server is listed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aggregator.core import events
from aggregator.core.catalogs.catalog import Catalog
from aggregator.core.clients.client_events import ClientEvents
from aggregator.core.commands import (
    Answer,
    Command,
    DropUpstream,
    StartUpstream,
    StopUpstream,
    ToClient,
    ToServer,
    UpstreamServing,
    WaitForStartup,
)
from aggregator.core.era.upstream_era import INSTANCE_KEY
from aggregator.core.events import Event
from aggregator.core.settings import LinkSettings, RouterSettings
from aggregator.core.state import (
    ROOTS_HOLD_SECONDS,
    ClientState,
    Pending,
    ServerRequestPolicy,
    SessionInfo,
    UpstreamLink,
    proxy_error,
)
from aggregator.core.upstreams.reconfigure import Reconfigure
from aggregator.core.upstreams.server_messages import ServerMessages
from aggregator.core.upstreams.upstream_events import UpstreamEvents
from aggregator.core.upstreams.upstream_lifecycle import CONTROL_ID_PREFIX

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
    "StopUpstream",
    "ToClient",
    "ToServer",
    "UpstreamLink",
    "UpstreamServing",
    "WaitForStartup",
    "proxy_error",
]


class Router(
    ClientEvents,
    ServerMessages,
    Reconfigure,
    UpstreamEvents,
):
    """The router: events in through ``handle``, commands out as lists."""

    def __init__(
        self,
        catalog: Catalog,
        settings: RouterSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        profiles: dict[str, Catalog] | None = None,
        instance: str | None = None,
        server_request_policy: ServerRequestPolicy | None = None,
    ) -> None:
        settings = settings if settings is not None else RouterSettings()
        super().__init__(
            catalog,
            settings,
            clock=clock,
            profiles=profiles,
            instance=instance,
            server_request_policy=server_request_policy,
        )
        # The trio layer's clock asks these after every batch: the owner's own methods, bound.
        self.next_deadline = self.inflight.next_deadline  # when ``TimePassed`` has work next
        self.in_flight = self.inflight.in_flight  # client requests waiting for a server's answer
        self._notifications = self._notification_handlers()
        self._events = self._event_handlers()

    def handle(self, event: Event) -> list[Command]:
        """The one way in: what the trio layer saw happen (``core.events``), and the
        commands it must now execute, in order."""
        return self._events[type(event)](event)

    def _event_handlers(self) -> dict[type, Callable[[Any], list[Command]]]:
        """Each event's handler, by its type (the events' fields are the handlers' arguments)."""

        def quietly(act: Callable[[Any], object]) -> Callable[[Any], list[Command]]:
            def handler(event: Any) -> list[Command]:
                act(event)
                return []

            return handler

        return {
            events.ClientConnected: quietly(
                lambda e: self.client_connected(
                    e.key, e.profile, era=e.era, principal=e.principal, stateless=e.stateless
                )
            ),
            events.ClientMessage: self.client_message,
            events.ClientDecoded: lambda e: self.client_event(e.key, e.kind, e.message),
            events.ClientRefused: lambda e: self.client_refused(e.key, e.exc),
            events.ClientAnswerRefused: lambda e: self.refused_answer(e.key, e.exc),
            events.ClientDisconnected: lambda e: self.client_disconnected(e.key, e.answer),
            events.UpstreamConnected: lambda e: self.upstream_connected(
                e.server,
                target=e.target,
                init_timeout=e.init_timeout,
                capabilities=e.capabilities,
                modern_possible=e.modern_possible,
            ),
            events.ServerMessage: self.server_message_event,
            events.ServerDecoded: lambda e: self.server_decoded(e.server, e.decoded, e.related),
            events.ServerOversized: lambda e: self.server_oversized(e.server, e.head, e.limit),
            events.ServerReady: lambda e: self.server_ready(e.server, e.init_result),
            events.ServerItems: lambda e: self.server_items(e.server, e.kind, e.items),
            events.ServerListing: lambda e: self.server_listing(e.server, e.listing),
            events.ServerListed: lambda e: self.server_listed(e.server),
            events.ServerStreams: quietly(lambda e: self._server_streams(e.server, e.streams)),
            events.ServerCongested: quietly(lambda e: self._server_congested(e.server, e.reason)),
            events.ServerOverloaded: lambda e: self.server_overloaded(e.server, e.why),
            events.ServerLost: lambda e: self.server_lost(e.server, e.why),
            events.ServerDown: lambda e: self.server_down(e.server, e.reason, e.retry_in),
            events.LinkEnded: quietly(lambda e: self._link_ended(e.name)),
            events.OwnCallStarted: lambda e: self.control.own_call(e.server, e.method, e.params, e.caller),
            events.TimePassed: lambda e: self._time_passed(),
            events.StartupCompleted: quietly(lambda e: self._startup_completed()),
            events.DrainingStarted: quietly(lambda e: self._start_draining()),
            events.Abandoned: lambda e: self.inflight.abandon(e.why),
            events.ServerRemoved: lambda e: self.server_removed(e.server, e.why),
            events.ServerRestarting: lambda e: self.server_restarting(e.server, e.why),
            events.ServerReplaced: quietly(lambda e: self.server_replaced(e.server, e.why)),
            events.ServerAdded: quietly(lambda e: self.server_added(e.server)),
            events.CatalogsRenewed: lambda e: self.catalogs_renewed(e.servers, e.policies, e.catalog_hook),
            events.DiscoveryRenewed: lambda e: self.search.renew(e.discovery),
        }

    # --- what the trio layer tells and asks (it never writes the router's fields) ------

    def _time_passed(self) -> list[Command]:
        """Time out what is overdue and send the notices that are due; the proxy's own
        requests upstream last."""
        now = self.clock()
        return self.inflight.expire(now) + self.expire_own(now)

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
        return SessionInfo(client.profile, client.protocol_version, len(client.in_flight), client.stateless)

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

    def unwrap_call_tool(self, key: int, message: dict[str, Any]) -> None:
        """Search mode's ``call_tool`` call of client ``key`` becomes the call it names, in
        place, before anything looks at it (``core.catalogs.discovery``)."""
        self.search.unwrap_call_tool(key, message)

    def context_report(self) -> dict[str, dict[str, Any]]:
        """Per profile: its discovery mode, what tools/list holds now and its estimated tokens."""
        return self.search.context_report()

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
