"""Routing between downstream sessions (clients) and upstreams (servers). Sans-IO.

``Router`` is a facade: the methods the trio layer calls, over handler groups that each
own one part of the rules, combined as one class over one typed state
(``aggregator.core.state``):

- ``commands``: what the methods return (``Command``);
- ``client_events``: a client's messages, notifications, answers, connect, disconnect;
- ``handshake``: initialize, merged capabilities and instructions, log levels;
- ``modern_callers``: modern (2026-07-28) callers: admission, server/discover,
  subscriptions/listen, their answers stamped (``modern_results``);
- ``client_requests``: the handlers of client requests, by method;
- ``discovery``: search mode's two tools (``find_tools``, ``call_tool``), per profile;
- ``result_budget``: tool results cut to a profile's budget, the rest read back;
- ``targets``: what a request names (``resolve_target``, ``describe``);
- ``forwarding``: a request sent upstream, or held for a connection that starts;
- ``inflight``: the in-flight tables, timeouts, giving up;
- ``server_messages``: an upstream's responses and notifications (a method table);
- ``reverse_requests``: server-to-client requests (sampling, elicitation);
- ``parked``: a legacy server's requests during a modern caller's call, asked of it by
  an ``input_required`` result while the call waits upstream (``request_state``);
- ``input_bridge``: a modern server's ``input_required`` result for a legacy caller,
  asked of it as server-to-client requests, then the call retried;
- ``roots``: roots/list and roots changes;
- ``upstream_control``: the proxy's own requests to each upstream, one table per link
  for its lifecycle (``upstream_lifecycle``: handshake, listing) and the router's own;
- ``upstream_events``: upstreams ready, listed, overloaded, lost, out between starts;
- ``announcements``: list_changed notices and their debounce;
- ``reconfigure``: servers removed and added, catalogs renewed, on a live reload.

Theory of operation
-------------------
Events go in as method calls (a client sent these bytes; server S sent these bytes; S is
ready with this catalog; S was lost; a client went away; time passed) and commands come
out as lists (send this message to client session C; send that one to server S; re-list
S's tools). The trio layer executes the commands; nothing here awaits or blocks. Time is
read from an injected clock, so tests drive timeouts without sleeping.

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
   through ``_end``, which removes it from all of them: the tables hold exactly what is
   in flight.
3. A response whose id is not pending (late after a cancel or timeout, foreign, repeated)
   is dropped; so is progress for a token not in flight or from another server.
4. Names, URIs and task ids are looked up before anything is sent; an unknown one is
   -32602 from the proxy and reaches no upstream.
5. Server-to-client requests get proxy-minted ids per client, and the answer goes back
   under the upstream's own id. One that cannot be routed (``core.affinity``) is answered
   with an error at once; only a roots/list waits, for its client to initialize, within
   ``ROOTS_HOLD_SECONDS``.
6. Errors the proxy makes itself carry ``data.source = "aggregator"``, the server and a
   reason, so nobody mistakes them for an upstream's.
7. A name or URI that misses the catalog but belongs to a shared server between starts
   (``aggregator.core.outages``) is never "Unknown": the request waits for the server
   within its own timeout (a held ``Pending``, in ``client.in_flight`` and the deadlines,
   never in ``link.pending``: nothing was sent) or is answered ``unavailable`` with the
   server's state. Held requests are looked up again once the server is listed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aggregator.core.announcements import Announcements
from aggregator.core.catalog import Catalog
from aggregator.core.client_events import ClientEvents
from aggregator.core.client_requests import ClientRequests
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
from aggregator.core.discovery import Searching
from aggregator.core.forwarding import Forwarding
from aggregator.core.handshake import Handshake
from aggregator.core.inflight import InFlight
from aggregator.core.input_bridge import InputBridge
from aggregator.core.listen_acks import ListenAcks
from aggregator.core.modern_callers import ModernCallers
from aggregator.core.parked import ParkedCalls
from aggregator.core.reconfigure import Reconfigure
from aggregator.core.result_budget import ResultBudgets
from aggregator.core.reverse_requests import ReverseRequests
from aggregator.core.roots import Roots
from aggregator.core.server_messages import ServerMessages
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
from aggregator.core.targets import Targets
from aggregator.core.upstream_control import UpstreamControl
from aggregator.core.upstream_era import INSTANCE_KEY
from aggregator.core.upstream_events import UpstreamEvents
from aggregator.core.upstream_lifecycle import CONTROL_ID_PREFIX

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
    ModernCallers,
    ClientRequests,
    Searching,
    ResultBudgets,
    Targets,
    Forwarding,
    Handshake,
    ServerMessages,
    ReverseRequests,
    ParkedCalls,
    InputBridge,
    Roots,
    UpstreamControl,
    ListenAcks,
    Reconfigure,
    UpstreamEvents,
    Announcements,
    InFlight,
):
    """The router: events in as method calls, commands out as lists."""

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
        super().__init__(
            catalog,
            settings if settings is not None else RouterSettings(),
            clock=clock,
            profiles=profiles,
            instance=instance,
            server_request_policy=server_request_policy,
        )
        self._requests = self._request_handlers()
        self._notifications = self._notification_handlers()

    # --- what the trio layer tells and asks (it never writes the router's fields) ------

    def startup_completed(self) -> None:
        """Startup is over (every server listed, or the wait for them timed out): requests
        no longer wait for servers that have not listed yet."""
        self.startup_complete = True

    def start_draining(self) -> None:
        """Shutting down: what is in flight finishes, nothing new is taken."""
        self.draining = True

    def link_ended(self, name: str) -> None:
        """A per-session connection ended on its own (crashed, or could not start) before it
        was ready: forget it, so that its client's next request starts a fresh one."""
        link = self.links.get(name)
        if link is not None and link.session is not None and not link.ready:
            del self.links[name]

    def server_streams(self, name: str, streams: bool) -> None:
        """Whether this upstream's transport delivers what belongs to a request on that
        request's own stream (Streamable HTTP)."""
        link = self.links.get(name)
        if link is not None:
            link.streams = streams

    def server_congested(self, name: str, reason: str | None) -> int | None:
        """This upstream cannot take more input (``reason``) or can again (None): while it
        cannot, new requests to it are refused. Returns how many of its requests are in
        flight, or None if it is not known (any more)."""
        link = self.links.get(name)
        if link is None:
            return None
        link.overloaded = reason
        return len(link.pending)

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

    def profile_catalog(self, profile: str) -> Catalog:
        """What the clients of ``profile`` see (read it, never change it)."""
        return self.catalogs[profile]
